"""The `env` section: which environment a run trains on and how its observations are prepared."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveInt


@dataclass(frozen=True, config=STRICT)
class EnvConfig:
    id: str = "mpe2/simple_spread_v3"
    """Environment: a registered id (`family/name`), `package.module:callable` or `path/to/file.py:callable`."""
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments passed to the environment factory."""
    groups: dict[str, list[str]] | None = None
    """Agent groups by name (`{group: [agent, ...]}`; a name without its number, `red`, stands for
    every `red_<n>`); default: agents with identical spaces and the same name without the number form a group."""
    state: Literal["auto", "env", "concat"] = "auto"
    """Global state for the critic: `env` calls env.state(), `concat` concatenates all observations,
    `auto` uses env.state() when the env declares a state_space."""
    image_pool: PositiveInt | Literal["auto"] = "auto"
    """Average-pool image observations and states (Boxes of rank 3, HWC or CHW) over k x k pixel blocks;
    `auto` picks the smallest k that brings every image observation's longer side to at most 64 pixels
    (1 without images). For a CNN (model.encoder) uint8 frames stay uint8; for an MLP they become floats in [0, 1]."""
    greyscale: bool = False
    """Turn image observations (uint8 Boxes of rank 3) into one grey channel, 0.299 R + 0.587 G + 0.114 B,
    before `resize` and `frame_stack` (parallel envs; the state is left to `image_pool`)."""
    resize: tuple[PositiveInt, PositiveInt] | None = None
    """Resize image observations to `[height, width]` (Pillow): where both sides shrink, each output pixel
    is the mean of the source pixels whose centres fall in it; else bilinear. `image_pool: auto` then
    leaves them at that size and pools only an image state."""
    frame_stack: PositiveInt = 1
    """Each agent observes its last k processed frames stacked on the channel axis, newest last, with
    zero frames before its episode's first."""
    skip_check_wrappers: bool = True
    """Step an AEC-converted env without PettingZoo's OrderEnforcing/AssertOutOfBounds wrappers, which
    only assert what the adapter already guarantees, and without the observations the parallel
    wrapper computes before each agent's move and discards (same trajectories while the env's
    `observe()` only reads it; faster steps). false steps the env exactly as its factory built it."""
    shaped_reward: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the env's shaped reward (JaxMARL's Overcooked: 3 for an onion put in a pot or a dish
    picked up, 5 for a soup picked up) added to the reward the policy learns from, at the run's start;
    0: off. Episode returns, evaluations and `report` stay on the env's own reward. Only envs that
    report a shaped reward take it."""
    shaped_reward_steps: PositiveInt | None = None
    """The shaped reward's weight falls linearly from `shaped_reward` to 0 over this many env steps
    (read at each rollout's start, as JaxMARL's IPPO anneals it); null: it stays at `shaped_reward`."""
