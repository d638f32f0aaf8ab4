"""The usual preprocessing of image observations, as env options: greyscale, resize and frame stacking
(`env.greyscale`, `env.resize`, `env.frame_stack`).

They act on every agent's image observation (a uint8 Box of rank 3, HWC or CHW) of a parallel env,
in that order, before the adapter stores it: a frame is converted to one grey channel, resized to
`(height, width)`, and the agent's last `k` processed frames are stacked on the channel axis,
newest last, with zero frames before its episode's first (as SB3's `VecFrameStack` and SuperSuit's
`frame_stack_v1` fill them). The global state is left to `env.image_pool`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo.utils.wrappers import BaseParallelWrapper
from PIL import Image

from marl_ppo.config import ConfigError, EnvConfig
from marl_ppo.envs.layout import channels_last


@dataclass(frozen=True)
class FrameOptions:
    """What happens to each image observation: grey, resized to `resize` `(height, width)`, `stack` frames."""

    greyscale: bool = False
    resize: tuple[int, int] | None = None
    stack: int = 1

    @classmethod
    def of(cls, env: EnvConfig) -> FrameOptions:
        """The options an env config sets."""
        return cls(env.greyscale, env.resize, env.frame_stack)

    @property
    def active(self) -> bool:
        """Whether any preprocessing is asked for."""
        return self.greyscale or self.resize is not None or self.stack > 1


def with_frame_options(env: Any, options: FrameOptions) -> Any:
    """`env` with its image observations preprocessed as `options` say (unchanged when none is set)."""
    if not options.active:
        return env
    from marl_ppo.envs.adapters.aec import is_aec

    if is_aec(env):
        raise ConfigError(
            "env.greyscale, env.resize and env.frame_stack apply to parallel envs; this env is turn-based (AEC): "
            "preprocess its observations in its factory instead"
        )
    return FramePreprocess(env, options)


class FramePreprocess(BaseParallelWrapper):
    """A parallel env whose agents' image observations are greyscaled, resized and stacked."""

    def __init__(self, env: Any, options: FrameOptions) -> None:
        super().__init__(env)
        self.options = options
        self._frames = {
            agent: _FrameShape.of(agent, env.observation_space(agent), options)
            for agent in env.possible_agents
        }
        self._stacks: dict[str, np.ndarray] = {}

    def observation_space(self, agent: str) -> gym.spaces.Box:
        """The processed image's space: uint8, the source's axis order, `stack` times its channels."""
        return self._frames[agent].space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        """Reset the env; every agent's stack starts from zero frames."""
        observations, infos = self.env.reset(seed=seed, options=options)
        self._stacks = {}
        return self._observe(observations), infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the env; an agent that terminates or truncates starts its next episode from zero frames."""
        observations, rewards, terminations, truncations, infos = self.env.step(actions)
        processed = self._observe(observations)
        for agent in observations:
            if terminations.get(agent) or truncations.get(agent):
                self._stacks.pop(agent, None)
        return processed, rewards, terminations, truncations, infos

    def _observe(self, observations: dict[str, Any]) -> dict[str, np.ndarray]:
        """Every agent's processed, stacked frame; the frames of one shape are converted in one batch."""
        by_shape: dict[tuple[int, ...], list[str]] = {}
        for agent, frame in observations.items():
            by_shape.setdefault(np.shape(frame), []).append(agent)
        out = {}
        for agents in by_shape.values():
            shape = self._frames[agents[0]]
            frames = shape.convert(np.stack([np.asarray(observations[a]) for a in agents]), self.options)
            for agent, frame in zip(agents, frames, strict=True):
                out[agent] = self._push(agent, frame)
        return out

    def _push(self, agent: str, frame: np.ndarray) -> np.ndarray:
        """The agent's stack with `frame` as its newest (last) channels."""
        shape = self._frames[agent]
        if self.options.stack == 1:
            return frame
        stack = self._stacks.get(agent)
        if stack is None:
            stack = np.zeros(shape.space.shape, dtype=np.uint8)
        # a new array each step, never written after (read-only), so it is handed out without a copy
        if shape.last:
            stacked = np.concatenate([stack[..., frame.shape[-1] :], frame], axis=-1)
        else:
            stacked = np.concatenate([stack[frame.shape[0] :], frame], axis=0)
        stacked.flags.writeable = False
        self._stacks[agent] = stacked
        return stacked


@dataclass(frozen=True)
class _FrameShape:
    """One agent's image: its axis order and its processed space."""

    last: bool
    """HWC (else CHW)."""
    space: gym.spaces.Box

    @classmethod
    def of(cls, agent: str, space: gym.Space, options: FrameOptions) -> _FrameShape:
        """Check that `space` is a uint8 image and size the processed one."""
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 3 and space.dtype == np.uint8):
            raise ConfigError(
                f"env.greyscale/resize/frame_stack need uint8 image observations (a Box of rank 3); agent "
                f"'{agent}' observes {space}; unset them for this env"
            )
        last = channels_last(space.shape)
        height, width, channels = space.shape if last else (*space.shape[1:], space.shape[0])
        if options.greyscale and channels >= 3:
            channels = 1
        if options.resize is not None:
            height, width = options.resize
        channels *= options.stack
        shape = (height, width, channels) if last else (channels, height, width)
        return cls(last, gym.spaces.Box(0, 255, shape, dtype=np.uint8))

    def convert(self, frames: np.ndarray, options: FrameOptions) -> np.ndarray:
        """`(N, ...)` frames in the source's axis order, greyscaled and resized (not stacked), by Pillow."""
        hwc = frames if self.last else frames.transpose(0, 2, 3, 1)
        if not (options.greyscale and hwc.shape[-1] >= 3) and (
            options.resize is None or tuple(hwc.shape[1:3]) == options.resize
        ):
            return frames
        out = np.stack([_convert_frame(frame, options) for frame in hwc])
        return np.ascontiguousarray(out if self.last else out.transpose(0, 3, 1, 2))


def _convert_frame(frame: np.ndarray, options: FrameOptions) -> np.ndarray:
    """One `(H, W, C)` frame greyscaled and resized by Pillow: `(H', W', C')`.

    Grey is Pillow's "L" conversion of the first three channels (ITU-R 601-2 luma, 0.299 R + 0.587 G +
    0.114 B, rounded). Shrinking both sides is Pillow's box filter: each source pixel counts toward the
    output pixel its centre falls in, and every output pixel is the rounded mean of its source pixels;
    otherwise the resize is bilinear. Three channels resize as one RGB image, other counts channel by
    channel.
    """
    if options.greyscale and frame.shape[-1] >= 3:
        planes = [Image.fromarray(np.ascontiguousarray(frame[..., :3])).convert("L")]
    elif frame.shape[-1] == 3:
        planes = [Image.fromarray(np.ascontiguousarray(frame))]
    else:
        planes = [Image.fromarray(np.ascontiguousarray(frame[..., c])) for c in range(frame.shape[-1])]
    if options.resize is not None and tuple(frame.shape[:2]) != options.resize:
        height, width = options.resize
        shrinking = height <= frame.shape[0] and width <= frame.shape[1]
        kind = Image.Resampling.BOX if shrinking else Image.Resampling.BILINEAR
        planes = [plane.resize((width, height), kind) for plane in planes]
    arrays = [np.asarray(plane) for plane in planes]
    return arrays[0] if arrays[0].ndim == 3 else np.stack(arrays, axis=-1)
