"""The vector env boundary: what the collector and the evaluator call on E env copies."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import torch

from marl_ppo.envs.spec import Array, TeamArrays, TeamSpec


@runtime_checkable
class VectorEnv(Protocol[Array]):
    """E copies of one env, stepped together, with auto-reset, writing into preallocated `arrays`.

    After `step`, `arrays` holds per copy the step's rewards and flags, `final_obs` / `final_state`
    as the step returned them (before any reset, for the truncation bootstrap), and `obs` / `state` /
    `alive` / `action_mask` ready for the next action: a new episode's first where `episode_over`.
    Implemented by `SyncVectorEnv`, `SubprocessVectorEnv` (`Array` is `np.ndarray`) and `VmasVectorEnv`
    (`torch.Tensor`); a bare `VectorEnv` is any of them.
    """

    spec: TeamSpec
    num_envs: int
    arrays: TeamArrays[Array]
    """Per-group `(E, A_g, ...)` arrays keyed by group name: NumPy arrays, or torch tensors where `tensor_io`."""
    tensor_io: bool
    """True when `arrays` are torch tensors on the simulator's device and `step` takes torch actions;
    False when both are NumPy arrays."""

    @property
    def episode_over(self) -> Array:
        """`(E,)` bools: the copy's episode ended at the last step (and it was reset)."""
        ...

    def reset(self, seed: int) -> TeamArrays[Array]:
        """Reset copy i with `seed + i`; later auto-resets continue each copy's own RNG."""
        ...

    def step(self, actions: Mapping[str, Array]) -> TeamArrays[Array]:
        """Step every copy with `actions[group]` of shape `(E, A_g, ...)`, resetting the copies that ended."""
        ...

    def env_states(self) -> list[bytes]:
        """Every copy's complete state, for an exact resume (raises EnvStateError where it cannot)."""
        ...

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Replace the copies by the ones `env_states` saved (trusted bytes only)."""
        ...

    def close(self) -> None:
        """Release the copies (and any worker processes)."""
        ...


@runtime_checkable
class WinsEpisodes(Protocol):
    """A vector env whose episodes end won or not (SMAX): the stepper records each episode's outcome."""

    @property
    def episode_won(self) -> torch.Tensor:
        """`(E,)` bools: the copy's episode ended at the last step with a win."""
        ...
