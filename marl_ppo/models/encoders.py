"""Feature encoders in front of the MLP trunk: a flat input row `(..., A, D)` to features `(..., A, F)`.

The row's `InputLayout` (`envs/layout.py`) says where its images lie. Each image part goes through a
CNN of its own (convolutions with ReLU, then a linear layer with ReLU); vector parts pass through as
they are; the outputs are concatenated in row order. uint8 frames are scaled to [0, 1] here, so the
buffers keep one byte per pixel.

Per-agent weights (`copies == A`) are one grouped convolution per layer: the A agents' images are
stacked on the channel axis and each agent's filters see only its own image, one call for all of
them, as `layers.StackedLinear` does for the MLP. With `copies == 1` every agent's image is one more
row of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from marl_ppo.config import ConfigError, ModelConfig
from marl_ppo.envs.layout import InputLayout, InputPart
from marl_ppo.models.layers import Precision, StackedLinear, arithmetic, settled_precision

NO_GRAD_CHUNK = 1024
"""Rows of images a CNN evaluates at once without gradients (acting, diagnostics): bounds the
activations' memory whatever the batch; with gradients the minibatch is evaluated whole."""


@dataclass(frozen=True)
class CnnShape:
    """An image CNN's layers (`model.cnn_*`): each layer's output channels, kernel and stride, the
    features of the linear layer after them, and whether the weights start orthogonal."""

    channels: Sequence[int]
    kernels: Sequence[int]
    strides: Sequence[int]
    features: int
    orthogonal_init: bool = True
    padding: str = "same"
    """`same` (half the kernel on each side) or `valid` (none), as `model.cnn_padding`."""
    precision: Precision = "fp32"
    """`model.precision` settled: the convolutions and the linear layer in float32 or bfloat16 (`layers.arithmetic`)."""

    @classmethod
    def of(cls, model: ModelConfig) -> CnnShape:
        """The CNN `model` configures."""
        return cls(
            model.cnn_channels,
            model.cnn_kernels,
            model.cnn_strides,
            model.cnn_features,
            model.orthogonal_init,
            model.cnn_padding,
            settled_precision(model.precision),
        )

    def layers(self) -> zip[tuple[int, int, int]]:
        """(out_channels, kernel, stride) of each convolution, in order."""
        return zip(self.channels, self.kernels, self.strides, strict=True)


def conv_padding(kernel: int, padding: str) -> int:
    """Pixels a convolution pads each side with: half its kernel (`same`) or none (`valid`)."""
    return kernel // 2 if padding == "same" else 0


def conv_output_side(side: int, kernel: int, stride: int, padding: str = "same") -> int:
    """A spatial side after a convolution (`same`: never below 1 pixel; `valid`: 0 where the kernel
    is wider than the side)."""
    return max(0, (side + 2 * conv_padding(kernel, padding) - kernel) // stride + 1)


class ImageEncoder(nn.Module):
    """A CNN over one image part of the row, `copies` weight sets: `(B, copies, D_part) -> (B, copies, F)`."""

    def __init__(self, part: InputPart, *, copies: int, cnn: CnnShape) -> None:
        super().__init__()
        self.part = part
        self.copies = copies
        self.scale = 1.0 / 255.0 if part.frames else 1.0
        self.precision = cnn.precision
        in_channels, height, width = part.chw
        self.convs = nn.ModuleList()
        convs: list[nn.Conv2d] = []
        for out_channels, kernel, stride in cnn.layers():
            conv = nn.Conv2d(
                in_channels * copies,
                out_channels * copies,
                kernel,
                stride,
                padding=conv_padding(kernel, cnn.padding),
                groups=copies,
            )
            self.convs.append(conv)
            convs.append(conv)
            in_channels = out_channels
            height = conv_output_side(height, kernel, stride, cnn.padding)
            width = conv_output_side(width, kernel, stride, cnn.padding)
            if min(height, width) < 1:
                raise ConfigError(
                    f"image input {part.key or 'observation'!r} ({part.chw[1]}x{part.chw[2]}) is too small for "
                    f"model.cnn_kernels {tuple(cnn.kernels)} without padding; set model.cnn_padding=same or "
                    "smaller kernels"
                )
        self._convs = tuple(convs)
        """The same convolutions, typed (plain references; the ModuleList registers them)."""
        self.flat_dim = in_channels * height * width
        self.linear = StackedLinear(copies, self.flat_dim, cnn.features)
        self.out_dim = cnn.features
        if cnn.orthogonal_init:
            for conv in convs:
                _orthogonal_per_copy(conv, copies, math.sqrt(2.0))
            self.linear.reset_orthogonal(math.sqrt(2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(B, copies, D_part)` stored pixels (HWC or CHW) -> `(B, copies, F)` float32 features."""
        rows = x.shape[0]
        image = x.unflatten(-1, self.part.shape)
        if self.part.shape != self.part.chw:  # HWC as stored -> CHW as convolutions read
            image = image.permute(0, 1, 4, 2, 3)
        h = image.reshape(rows, -1, *self.part.chw[1:])
        with arithmetic(self.precision, h.device):
            if self.precision == "bf16":
                # pixels straight to bfloat16 (exact up to 256) and the scale in the first filters:
                # one pass over the frames where float32 and autocast's cast would take three
                first, *rest = self._convs
                h = F.relu(first._conv_forward(h.to(torch.bfloat16), first.weight * self.scale, first.bias))
            else:
                h, rest = h.float() * self.scale, list(self._convs)
            for conv in rest:
                h = F.relu(conv(h))
            h = h.reshape(rows, self.copies, -1)
            return F.relu(self.linear(h)).float()


def _orthogonal_per_copy(conv: nn.Conv2d, copies: int, gain: float) -> None:
    """Orthogonal filters with `gain` for each copy's block of output channels, zero bias."""
    with torch.no_grad():
        for block in conv.weight.chunk(copies, dim=0):
            nn.init.orthogonal_(block, gain)
        if conv.bias is not None:
            conv.bias.zero_()


class FeatureEncoder(nn.Module):
    """Each image part of a row through its CNN, vector parts as they are, concatenated in row order.

    `forward` takes `(..., A, D)` rows, where `A == copies` (per-agent weights) or `copies == 1`
    (one set for every row), and returns `(..., A, out_dim)` float32 features.
    """

    def __init__(self, layout: InputLayout, *, copies: int, cnn: CnnShape) -> None:
        super().__init__()
        self.layout = layout
        self.copies = copies
        self.images = nn.ModuleDict()
        out_dim = 0
        for index, part in enumerate(layout.parts):
            if part.is_image:
                encoder = ImageEncoder(part, copies=copies, cnn=cnn)
                self.images[str(index)] = encoder
                out_dim += encoder.out_dim
            else:
                out_dim += part.size
        self.out_dim = out_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, D) -> (..., A, out_dim)`."""
        lead, agents = x.shape[:-2], x.shape[-2]
        rows = x.reshape(-1, agents, x.shape[-1]) if self.copies > 1 else x.reshape(-1, 1, x.shape[-1])
        outputs = []
        for index, part in enumerate(self.layout.parts):
            piece = rows[..., part.offset : part.offset + part.size]
            if part.is_image:
                encoder = cast(ImageEncoder, self.images[str(index)])  # only ImageEncoders are put there
                outputs.append(self._images(encoder, piece))
            else:
                outputs.append(piece.float())
        features = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
        return features.reshape(*lead, agents, self.out_dim)

    @staticmethod
    def _images(encoder: ImageEncoder, piece: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or piece.shape[0] <= NO_GRAD_CHUNK:
            features: torch.Tensor = encoder(piece)
            return features
        return torch.cat([encoder(chunk) for chunk in piece.split(NO_GRAD_CHUNK)])


class ReusedFeatures(nn.Module):
    """A FeatureEncoder that two networks read (`model.shared_cnn`): called again on the same input
    (the same memory, shape and strides, unmodified since, in the same grad mode), it returns the
    features it computed last instead of running its CNN a second time.

    It holds the last input, so that memory cannot be reused by another tensor while it is compared
    against, and the last output, whose autograd graph then serves both readers' losses."""

    def __init__(self, encoder: FeatureEncoder) -> None:
        super().__init__()
        self.encoder = encoder
        self.copies, self.out_dim = encoder.copies, encoder.out_dim
        self._last: tuple[tuple[object, ...], torch.Tensor, torch.Tensor] | None = None
        self.runs = 0
        """CNN evaluations so far (what the reuse saves shows in tests)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`FeatureEncoder.forward`, computed once for two calls on the same input."""
        key = (x.data_ptr(), x.shape, x.stride(), x.dtype, x.device, x._version, torch.is_grad_enabled())
        if self._last is not None and self._last[0] == key:
            return self._last[2]
        features: torch.Tensor = self.encoder(x)
        self.runs += 1
        self._last = (key, x, features)
        return features


def has_cnn(model: nn.Module) -> bool:
    """Whether `model` holds a CNN encoder."""
    return any(isinstance(module, nn.Conv2d) for module in model.modules())


def conv_activation_floats(layout: InputLayout, cnn: CnnShape) -> int:
    """Floats one row's image parts produce across the convolutions (the input as float, each layer's
    output): what a batch keeps per row for the backward pass, for the memory estimate."""
    total = 0
    for part in layout.parts:
        if not part.is_image:
            continue
        in_channels, height, width = part.chw
        total += in_channels * height * width
        for out_channels, kernel, stride in cnn.layers():
            height = conv_output_side(height, kernel, stride, cnn.padding)
            width = conv_output_side(width, kernel, stride, cnn.padding)
            total += 2 * out_channels * height * width  # the convolution's output and its ReLU's
    return total
