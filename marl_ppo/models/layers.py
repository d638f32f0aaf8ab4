"""Agent-stacked MLPs: one weight set per agent along an agent axis, evaluated as one batched computation.

Inputs are `(..., A, in)`. With `shared=False` each of the A agents has its own weights
(`(A, out, in)` tensors, one `baddbmm` per layer, no Python loop over agents). With `shared=True`
one weight set serves all A agents and a one-hot agent id is appended to the input.

The first layer is computed in a cheaper, mathematically identical form:
- the input LayerNorm's affine is folded into the first layer's weights,
  `W (n * g + beta) + b = (W * g) n + (W beta + b)`, so the normalized input `n` needs no gradient
  (no input-gradient matmul, no LayerNorm backward);
- the one-hot agent id is never concatenated: its columns of `W` are added as a per-agent bias;
- a network built with `common_input=True` reads one input shared by all agents (a critic's global
  state), `(..., in) -> (..., A, out)`, and computes the first layer once per row instead of once per
  agent.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from marl_ppo.config import ConfigError

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`(..., A, in) -> (..., A, out)` with `(copies, out, in)` weights and `(copies, out)` biases:
    one map broadcast over the agents (`copies == 1`) or one per agent (`copies == A`)."""
    if weight.shape[0] == 1:
        return F.linear(x, weight.squeeze(0), bias.squeeze(0))  # a view of the weights: cheap backward
    lead, (agents, in_dim) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, agents, in_dim).transpose(0, 1)  # (A, B, in)
    out = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))  # (A, B, out)
    return out.transpose(0, 1).reshape(*lead, agents, -1)


class StackedLinear(nn.Module):
    """`copies` independent linear maps; `copies == 1` is one map broadcast over the agent axis."""

    def __init__(self, copies: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.copies = copies
        self.weight = nn.Parameter(torch.empty(copies, out_dim, in_dim))
        self.bias = nn.Parameter(torch.zeros(copies, out_dim))
        bound = 1.0 / math.sqrt(in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def reset_orthogonal(self, gain: float) -> None:
        """Orthogonal weights with `gain` for every copy, zero bias."""
        with torch.no_grad():
            for weight in self.weight:
                nn.init.orthogonal_(weight, gain)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, in) -> (..., A, out)`."""
        return stacked_linear(x, self.weight, self.bias)


class AgentMLP(nn.Module):
    """MLP over `(..., A, in)` with per-agent (stacked) or shared weights; returns `(..., A, out)`."""

    def __init__(
        self,
        *,
        num_agents: int,
        in_dim: int,
        out_dim: int,
        hidden_sizes: Sequence[int],
        activation: str,
        input_layer_norm: bool,
        shared: bool,
        orthogonal_init: bool,
        head_gain: float,
        precision: str = "fp32",
        common_input: bool = False,
        activate_output: bool = False,
    ) -> None:
        super().__init__()
        self.common_input = common_input
        """The input is one row every agent sees, `(..., in)`, rather than one per agent."""
        self.activate_output = activate_output
        """The output layer is a hidden layer (a recurrent network's trunk): activated like the others."""
        self.precision = precision
        """`fp32`, `bf16` (the layers' products and activations in bfloat16, see `_arithmetic`) or
        `auto` (`bf16` where the input's device computes it natively, see `resolve_precision`)."""
        self.num_agents = num_agents
        self.in_dim = in_dim
        self.add_agent_id = shared and num_agents > 1
        copies = 1 if shared else num_agents
        width = in_dim + (num_agents if self.add_agent_id else 0)
        use_norm = input_layer_norm and in_dim > 1  # LayerNorm of a single feature is always 0
        self.norm_weight = nn.Parameter(torch.ones(copies, in_dim)) if use_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(copies, in_dim)) if use_norm else None
        sizes = [width, *hidden_sizes, out_dim]
        linears = [StackedLinear(copies, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        self.layers = nn.ModuleList(linears)
        self._linears = tuple(linears)
        """The same layers, typed (plain references; the ModuleList registers them)."""
        self.activation: Callable[[torch.Tensor], torch.Tensor] = _ACTIVATIONS[activation]
        if orthogonal_init:
            for layer in linears[:-1]:
                layer.reset_orthogonal(math.sqrt(2.0))
            linears[-1].reset_orthogonal(head_gain)
        self._held: _Weights | None = None
        """The weights as the forward reads them, while `held_weights` holds them (else None)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, in) -> (..., A, out)`; with `common_input`, `(..., in) -> (..., A, out)`: every
        agent's output for one input they all see, as if it were expanded to `(..., A, in)`."""
        held = self._held if self._held is not None and not torch.is_grad_enabled() else None
        weight, bias, agent_bias = self._first_layer() if held is None else held.first
        grid = _as_is if held is None else held.grid
        x = grid(self._normalized(x))
        with self._arithmetic(x) if grid is _as_is else contextlib.nullcontext():
            if not self.common_input:
                h = grid(stacked_linear(x, weight, bias))
                h = h if agent_bias is None else grid(h + agent_bias.to(h.dtype))
                return self._output(self._rest(h) if held is None else self._rest_held(h, held))
            if self._linears[0].copies == 1:
                h = grid(F.linear(x, weight.squeeze(0), bias.squeeze(0))).unsqueeze(-2)
                if agent_bias is not None:
                    h = grid(h + agent_bias.to(h.dtype))
                else:
                    h = h.expand(*h.shape[:-2], self.num_agents, h.shape[-1])
            else:
                out_dim = weight.shape[1]
                h = grid(F.linear(x, weight.reshape(self.num_agents * out_dim, -1), bias.reshape(-1)))
                h = h.unflatten(-1, (self.num_agents, out_dim))
            return self._output(self._rest(h) if held is None else self._rest_held(h, held))

    def hold_weights(self) -> None:
        """Compute the weights as `forward` reads them (the first layer's folded form, the others'
        views) once, and read them in every forward without gradients until `release_weights`. For
        acting, where many small forwards run between two changes of the weights; in float32 the
        outputs are the same, bit for bit, since the same operations make the same weights. The
        parameters must not change while held (a rollout runs no update).

        Under `bf16` on a GPU the held weights are the bfloat16 copies autocast would make at every
        product. On a CPU they are float32 tensors of bfloat16 values and the forward keeps every
        product's input and output, and every activation, on bfloat16's grid (`_bf16_grid`): the
        numbers of autocast's bfloat16 layers up to the order of a product's sums, in float32
        products, which CPUs without matrix units (and those with them, on acting's few rows) run
        about twice as fast as bfloat16 ones."""
        with torch.no_grad():
            weight, bias, agent_bias = self._first_layer()
            rest = tuple(_linear_form(layer.weight, layer.bias) for layer in self._linears[1:])
            grid: Callable[[torch.Tensor], torch.Tensor] = _as_is
            if resolve_precision(self.precision, weight.device) == "bf16":
                grid = _bf16_grid if weight.device.type == "cpu" else _as_is
                cast = _bf16_grid if grid is _bf16_grid else torch.Tensor.bfloat16
                weight, bias = cast(weight), cast(bias)
                agent_bias = None if agent_bias is None else cast(agent_bias)
                rest = tuple((cast(w), cast(b)) for w, b in rest)
        self._held = _Weights((weight, bias, agent_bias), rest, grid)

    def release_weights(self) -> None:
        """Read the parameters again at every forward (`hold_weights`)."""
        self._held = None

    def _arithmetic(self, x: torch.Tensor) -> contextlib.AbstractContextManager[Any]:
        """`arithmetic`: the output is float32 (`forward` casts it), so distributions and losses
        compute as before."""
        return arithmetic(self.precision, x.device)

    def _normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the first layer reads it: LayerNorm without its affine (which lives in the first
        layer's weights), or `x` unchanged. Row by row, so a minibatch's rows equal the whole batch's."""
        return F.layer_norm(x, x.shape[-1:]) if self.norm_weight is not None else x

    def _first_layer(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The first layer's effective `(copies, out, in)` weights and `(copies, out)` biases, and the
        `(A, out)` per-agent bias standing in for the one-hot agent id (None without ids)."""
        first, in_dim = self._linears[0], self.in_dim
        weight: torch.Tensor = first.weight[..., :in_dim]
        bias: torch.Tensor = first.bias
        if self.norm_weight is not None and self.norm_bias is not None:
            bias = bias + (weight @ self.norm_bias.unsqueeze(-1)).squeeze(-1)
            weight = weight * self.norm_weight.unsqueeze(1)
        # contiguous: a transposed (A, out) bias made each broadcast add slow and gave its output an
        # agent-innermost layout, which the next layer then copied back and the tanh passes crossed
        agent_bias = first.weight[0, :, in_dim:].T.contiguous() if self.add_agent_id else None
        return weight, bias, agent_bias

    def _output(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's output in float32, activated where it is a hidden layer."""
        h = h.float()
        return self.activation(h) if self.activate_output else h

    def _rest(self, h: torch.Tensor) -> torch.Tensor:
        """The layers after the first, on the first layer's pre-activation `(..., A, hidden)`."""
        # the tuple, not `self.layers[1:]`: slicing a ModuleList builds a new module per call
        for layer in self._linears[1:]:
            h = layer(self.activation(h))
        return h

    def _rest_held(self, h: torch.Tensor, held: _Weights) -> torch.Tensor:
        """`_rest` with the held weights (`_linear_form`): the same products, on the held grid."""
        grid = held.grid
        for weight, bias in held.rest:
            h = grid(self.activation(h))
            h = grid(F.linear(h, weight, bias) if weight.dim() == 2 else stacked_linear(h, weight, bias))
        return h


class _Weights(NamedTuple):
    """An AgentMLP's weights as its forward reads them (`AgentMLP.hold_weights`)."""

    first: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
    """`AgentMLP._first_layer()`"""
    rest: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    """The later layers' `_linear_form`s."""
    grid: Callable[[torch.Tensor], torch.Tensor]
    """What each product's input and output pass through: `_as_is`, or `_bf16_grid` (bf16 on a CPU)."""


def _as_is(t: torch.Tensor) -> torch.Tensor:
    return t


def _bf16_grid(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to the nearest bfloat16 value, kept in float32."""
    return t.bfloat16().float()


def _linear_form(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stacked layer's weights as `stacked_linear` hands them to its product: one map's `(out, in)`
    and `(out,)` views (copies == 1), else the `(copies, out, in)` and `(copies, out)` tensors."""
    return (weight.squeeze(0), bias.squeeze(0)) if weight.shape[0] == 1 else (weight, bias)


def arithmetic(precision: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context a network's layers run in under `model.precision`. With `bf16`, torch's autocast:
    matrix products and convolutions take bfloat16 copies of their float32 weights and return
    bfloat16, so the activations between them are bfloat16 too. Weights, gradients (autocast casts
    them back) and optimizer state stay float32; the network casts its output to float32."""
    if resolve_precision(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is `bf16` where `device` computes bfloat16 products natively (a GPU with bfloat16
    tensor cores, a CPU with AVX512-BF16 or AMX), else `fp32`; `fp32` and `bf16` stay as they are."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


@functools.cache
def native_bf16(device: torch.device) -> bool:
    """Whether `device` has bfloat16 matrix instructions (emulated bfloat16 is slower than float32)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's own CPU probes
        return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
    return False


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available; `cuda` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "host.device=cuda but no CUDA device is available; use host.device=cpu or host.device=auto"
        )
    return torch.device(name)
