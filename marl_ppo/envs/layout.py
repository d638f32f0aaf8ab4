"""How an observation (or the global state) becomes one flat row, and where its images lie in that row.

Every observation is stored as one flat row per agent, `(..., D)`. An `InputLayout` says what the row
is made of: vector parts (fed to the MLP trunk as they are) and image parts (stored pixel for pixel in
the image's own order, HWC or CHW, and given a CNN by `models/encoders.py`). Without an encoder the
whole row is one vector part, flattened as gymnasium flattens the space (a Box pixel by pixel).

Frames: an image part of a uint8 Box stays uint8 when an encoder reads it (`frames=True`): the
rollout buffer, the vector env's shared memory and the rollout workers store one byte per pixel, and
the model scales it to [0, 1]. A pooled frame is rounded back to uint8 (an error of at most half a
grey level). A row is uint8 only when every part of it is; a Dict with a float vector beside a uint8
image is stored as float32 (the image's values still 0..255, scaled inside the model).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np

AUTO_POOL_SIDE = 64
"""`env.image_pool: auto` brings every image observation's longer side (the state's, where no
observation is an image) to at most this many pixels..."""

AUTO_POOL_PIXELS = 64 * 64
"""...and the agents' image observations of one env step, all together, to at most this many pixels
(one 64x64 frame), since the learner's work grows with the pixels of every agent..."""

AUTO_POOL_MIN_SIDE = 16
"""...but the pixel budget never pools an image's longer side below this many pixels."""


def has_mask_in_obs(space: gym.Space) -> TypeGuard[gym.spaces.Dict]:
    """True for PettingZoo's masked observations: a Dict with `observation` and `action_mask` keys."""
    return isinstance(space, gym.spaces.Dict) and {"observation", "action_mask"} <= set(space.spaces)


def feature_space(space: gym.Space) -> gym.Space:
    """The part of an observation space the networks see (a masked Dict's `observation`)."""
    return space["observation"] if has_mask_in_obs(space) else space


def is_image(space: gym.Space) -> TypeGuard[gym.spaces.Box]:
    """A Box of rank 3: an image, (height, width, channels) as PettingZoo's pixels or (channels, height, width)."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def channels_last(shape: tuple[int, ...]) -> bool:
    """Whether a rank-3 image shape is HWC (else CHW): the channel axis is the shorter of the two ends,
    HWC where they tie (PettingZoo's and Gymnasium's convention)."""
    return shape[-1] <= shape[0]


def pool_image(image: np.ndarray, factor: int) -> np.ndarray:
    """Average-pool an image (HWC or CHW) over factor x factor blocks (edges cropped) to float32; uint8
    is scaled to [0, 1] (the MLP's input without an encoder)."""
    pooled = _pool_float(image, factor)
    return pooled / 255.0 if image.dtype == np.uint8 else pooled


def pool_frame(image: np.ndarray, factor: int, last: bool) -> np.ndarray:
    """Average-pool a uint8 image (HWC when `last`, else CHW) over factor x factor blocks, rounded to uint8
    (to nearest, ties to even, as `np.rint` of the mean).

    Sums in integers, rows of each block first: several times faster than a float mean over the
    block axes on Butterfly's frames (that mean was most of pistonball's step), and exactly equal to it.
    An image stored column-major (pistonball's state is a transposed view) is pooled in its memory
    order, 20 times faster than across it.
    """
    hwc = image if last else np.moveaxis(image, 0, -1)
    pooled = (
        _pool_hwc(hwc.transpose(1, 0, 2), factor).transpose(1, 0, 2)
        if hwc.strides[0] < hwc.strides[1]
        else _pool_hwc(hwc, factor)
    )
    return pooled if last else np.moveaxis(pooled, -1, 0)


def _pool_hwc(hwc: np.ndarray, factor: int) -> np.ndarray:
    height, width, channels = hwc.shape
    h, w = height // factor, width // factor
    rows = (
        hwc[: h * factor, : w * factor].reshape(h, factor, w * factor, channels).sum(axis=1, dtype=np.uint32)
    )
    sums = np.add.reduceat(rows, np.arange(0, w * factor, factor), axis=1)  # then each block's columns
    n = factor * factor
    mean, rest = np.divmod(sums, n)
    up = (2 * rest > n) | ((2 * rest == n) & (mean % 2 == 1))
    pooled: np.ndarray = (mean + up).astype(np.uint8)
    return pooled


def pooled_shape(shape: tuple[int, ...], factor: int) -> tuple[int, int, int]:
    """The shape of a rank-3 image after `factor` x `factor` pooling of its two spatial axes."""
    if channels_last(shape):
        return (shape[0] // factor, shape[1] // factor, shape[2])
    return (shape[0], shape[1] // factor, shape[2] // factor)


@dataclass(frozen=True)
class InputPart:
    """A contiguous slice of a flat input row: a vector, or an image stored in its own axis order."""

    offset: int
    size: int
    key: str | None = None
    """The Dict key it comes from (None for the whole observation)."""
    shape: tuple[int, ...] | None = None
    """The stored image's shape (after pooling), HWC or CHW; None for a vector part."""
    pool: int = 1
    """Pooling factor applied to the image before it is stored."""
    frames: bool = False
    """Stored as uint8 grey levels 0..255, scaled to [0, 1] inside the model."""

    @property
    def is_image(self) -> bool:
        """Whether a CNN reads this part."""
        return self.shape is not None

    @property
    def chw(self) -> tuple[int, int, int]:
        """(channels, height, width) of an image part, the order convolutions read."""
        assert self.shape is not None
        height, width, channels = (
            self.shape if channels_last(self.shape) else (*self.shape[1:], self.shape[0])
        )
        return (channels, height, width)


@dataclass(frozen=True)
class InputLayout:
    """The parts of a flat input row, in row order, and the dtype the row is stored in."""

    parts: tuple[InputPart, ...]

    @property
    def size(self) -> int:
        """Length of the flat row (D)."""
        return sum(part.size for part in self.parts)

    @property
    def has_image(self) -> bool:
        """Whether any part is an image (a CNN encoder applies)."""
        return any(part.is_image for part in self.parts)

    @property
    def dtype(self) -> np.dtype:
        """uint8 when every part is a stored frame, else float32."""
        uint8 = bool(self.parts) and all(part.frames for part in self.parts)
        return np.dtype(np.uint8) if uint8 else np.dtype(np.float32)

    def then(self, other: InputLayout) -> InputLayout:
        """This layout followed by `other` in one row (a concatenated state, a `state+obs` critic input)."""
        shifted = tuple(replace(part, offset=part.offset + self.size) for part in other.parts)
        return InputLayout(self.parts + shifted)


def layout_of(space: gym.Space, *, pool: int, frames: bool) -> InputLayout:
    """The layout of an observation of `space` (its features, without a masked Dict's `action_mask`).

    Without `frames` (no encoder) the row is one vector part as gymnasium flattens the space, an image
    pooled to float values in [0, 1] where `pool > 1`. With `frames`, every image (the Box itself, or a
    Dict's image entries) is its own image part, uint8 kept as uint8.
    """
    space = feature_space(space)
    if not frames:
        if is_image(space) and pool > 1:
            return InputLayout((InputPart(0, math.prod(pooled_shape(space.shape, pool)), pool=pool),))
        size = int(np.prod(space.shape)) if isinstance(space, gym.spaces.Box) else gym.spaces.flatdim(space)
        return InputLayout((InputPart(0, size),))
    entries = space.spaces.items() if isinstance(space, gym.spaces.Dict) else [(None, space)]
    parts, offset = [], 0
    for key, sub in entries:
        part = _part(key, sub, offset, pool)
        parts.append(part)
        offset += part.size
    return InputLayout(tuple(parts))


def _part(key: str | None, space: gym.Space, offset: int, pool: int) -> InputPart:
    if not is_image(space):
        return InputPart(offset, gym.spaces.flatdim(space), key)
    shape = pooled_shape(space.shape, pool)
    if min(shape) < 1:
        raise ValueError(
            f"env.image_pool={pool} leaves nothing of a {space.shape} image; use a smaller factor"
        )
    frames = space.dtype == np.uint8
    return InputPart(offset, math.prod(shape), key, shape, pool, frames)


def auto_pool(spaces: Iterable[gym.Space], state: gym.Space | None) -> int:
    """The `env.image_pool: auto` factor for the agents' observation `spaces` (one per agent) and the
    `state`: the smallest that brings every image's longer side to at most `AUTO_POOL_SIDE` pixels and
    the pixels of all the images to at most `AUTO_POOL_PIXELS`, short of pooling a longer side below
    `AUTO_POOL_MIN_SIDE`; the state's alone where no observation is an image; 1 without images."""
    images = [_spatial(s.shape) for space in spaces for s in _images(feature_space(space))]
    if not images and state is not None:
        images = [_spatial(s.shape) for s in _images(state)]
    if not images:
        return 1
    longest = max(max(sides) for sides in images)
    factor = max(1, math.ceil(longest / AUTO_POOL_SIDE))
    coarsest = max(1, min(max(sides) for sides in images) // AUTO_POOL_MIN_SIDE)
    while factor < coarsest and _pooled_pixels(images, factor) > AUTO_POOL_PIXELS:
        factor += 1
    return factor


def _pooled_pixels(images: list[tuple[int, int]], factor: int) -> int:
    return sum((height // factor) * (width // factor) for height, width in images)


def _images(space: gym.Space) -> list[gym.spaces.Box]:
    if is_image(space):
        return [space]
    if isinstance(space, gym.spaces.Dict):
        return [s for s in space.spaces.values() if is_image(s)]
    return []


def _spatial(shape: tuple[int, ...]) -> tuple[int, int]:
    return (shape[0], shape[1]) if channels_last(shape) else (shape[1], shape[2])


def flatten_value(layout: InputLayout, space: gym.Space, value: Any) -> np.ndarray:
    """One observation (or state) of `space` as the flat row `layout` describes, in the row's dtype
    or, for a single vector part, as the env gave it (cast by the assignment into the stored row)."""
    if len(layout.parts) == 1 and layout.parts[0].key is None:
        return _flatten_part(layout.parts[0], space, value)
    rows = []
    for part in layout.parts:
        if part.key is None or not isinstance(space, gym.spaces.Dict):
            raise TypeError(f"a layout of several parts flattens a Dict space by key, got {space!r}")
        rows.append(_flatten_part(part, space[part.key], value[part.key]))
    return np.concatenate([row.astype(layout.dtype, copy=False) for row in rows])


def _flatten_part(part: InputPart, space: gym.Space, value: Any) -> np.ndarray:
    if part.is_image:
        image = np.asarray(value)
        if part.pool > 1:
            image = (
                pool_frame(image, part.pool, channels_last(image.shape))
                if part.frames
                else _pool_float(image, part.pool)
            )
        return image.reshape(-1)
    if part.pool > 1:  # an image without an encoder: pooled to floats, uint8 in [0, 1]
        return pool_image(np.asarray(value), part.pool).reshape(-1)
    if isinstance(space, gym.spaces.Box):
        return np.asarray(value).astype(np.float32, copy=False).reshape(-1)
    return np.asarray(gym.spaces.flatten(space, value), dtype=np.float32)


def _pool_float(image: np.ndarray, factor: int) -> np.ndarray:
    """Average-pool a float image of either axis order, keeping its values (no scaling)."""
    last = channels_last(image.shape)
    hwc = np.asarray(image if last else np.moveaxis(image, 0, -1), dtype=np.float32)
    height, width, channels = hwc.shape
    h, w = height // factor, width // factor
    pooled = hwc[: h * factor, : w * factor].reshape(h, factor, w, factor, channels).mean(axis=(1, 3))
    return pooled if last else np.moveaxis(pooled, -1, 0)
