"""The rollout source boundary: what the training loop calls to get rollouts, and what it gets back.

`Collector` (acting in this process), `CompiledSource` (a JAX env's rollout as one compiled scan),
`RolloutWorkers` (acting in worker processes) and
`RayRolloutWorkers` (acting in Ray actors) are the rollout sources; the loop, checkpoints and resume see only this interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.rollout.buffer import RolloutBuffer


@dataclass
class EpisodeRecord:
    """One finished episode. `team_return` is the sum over agents of the episode's rewards."""

    team_return: float
    agent_returns: np.ndarray
    """Per-agent returns in the team's fixed agent order."""
    length: int
    end_step: int
    """Total env steps of the run when the episode ended."""
    won: bool | None = None
    """Whether the team won it, for an env whose episodes can be won (SMAX); else None."""


@dataclass
class RolloutResult:
    """What a rollout produced besides the buffer contents."""

    episodes: list[EpisodeRecord] = field(default_factory=list)
    last_values: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per group name `(E, A_g)`: values of the observations after the last step (return units)."""
    last_alive: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per group name `(E, A_g)` bool: the agents that act after the last step (a turn-based player
    that waits there does not; its unfinished last move is left out of the losses)."""
    env_steps: int = 0
    env_seconds: float = 0.0
    """Wall time spent inside the vector env's step (waiting on workers, for the subprocess env)."""
    act_seconds: float | None = None
    """Acting time where it is measured apart (rollout workers); None: the rest of the collect time."""
    perf: dict[str, float] = field(default_factory=dict)
    """Further figures of how the rollout was collected, logged as they are named (`perf/...`)."""


class RolloutSource(Protocol):
    """Fills rollout buffers from env copies and keeps the run's episode accounting across rollouts."""

    env_steps: int
    """Env steps of the rollouts handed out so far (one per copy per step)."""

    def start(self, seed: int) -> None:
        """Reset every env copy (copy i with `seed + i`) and clear the episode accounting."""
        ...

    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` (empty) with one rollout. `ahead`: the run needs another rollout after this
        one (a source that collects ahead of the learner may start it now)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Counters, unfinished episodes and the env arrays the next step reads, for a checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any], *, episodes: bool = True) -> None:
        """Restore `state_dict()`; `episodes=False` keeps only the step counter (the envs were reset)."""
        ...

    def env_states(self) -> list[bytes]:
        """Every env copy's pickled state (raises EnvStateError where an env cannot be pickled)."""
        ...

    def load_env_states(self, states: list[bytes]) -> None:
        """Replace the env copies by saved ones (trusted bytes only: unpickling runs code)."""
        ...

    def close(self) -> None:
        """Stop the env copies and any worker processes."""
        ...


class InProcessSource:
    """What a rollout source whose env copies are one vector env of this process (`Collector`,
    `CompiledSource`) does with them the same way: saves, loads and closes them."""

    venv: VectorEnv

    def env_states(self) -> list[bytes]:
        """Every env copy's pickled state (see `marl_ppo.envs.vector.state`)."""
        return self.venv.env_states()

    def load_env_states(self, states: list[bytes]) -> None:
        """Replace the env copies by saved ones (trusted bytes only: unpickling runs code)."""
        self.venv.load_env_states(states)

    def close(self) -> None:
        """Close the vector env."""
        self.venv.close()
