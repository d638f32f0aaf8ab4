"""What the learner knows about a team: agents in a fixed order, split into groups of identical spaces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class GroupSpec:
    """Agents whose observation and action spaces are identical; their tensors share an agent axis."""

    name: str
    agents: tuple[str, ...]
    observation_space: gym.Space
    action_space: gym.Space
    obs_dim: int
    """Length of the flattened observation vector fed to the networks."""
    mask_source: str | None = None
    """Where the agents' action masks come from: `obs` (a Dict observation with an `action_mask` key,
    PettingZoo's classic convention), `info` (`infos[agent]["action_mask"]`) or None (no masks)."""

    @property
    def num_agents(self) -> int:
        """Agents in the group (A_g)."""
        return len(self.agents)

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Per-agent shape of a stored action: () Discrete, (k,) MultiDiscrete, (d,) Box."""
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return ()
        if isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.Box):
            return (int(np.prod(space.shape)),)
        raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")

    @property
    def mask_dim(self) -> int:
        """Length of an agent's flat action mask (0 without masks): n, or sum(nvec) for MultiDiscrete."""
        if self.mask_source is None:
            return 0
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete):
            return int(space.n)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return int(space.nvec.sum())
        raise TypeError(f"action masks need a Discrete or MultiDiscrete action space, not {space!r}")

    @property
    def action_dtype(self) -> np.dtype:
        """int64 for discrete actions, float32 for Box."""
        return np.dtype(np.float32) if isinstance(self.action_space, gym.spaces.Box) else np.dtype(np.int64)


@dataclass(frozen=True)
class TeamSpec:
    """The whole team: fixed agent order, the groups, and the global state's size."""

    env_id: str
    agents: tuple[str, ...]
    groups: tuple[GroupSpec, ...]
    state_dim: int
    state_from_env: bool
    """True when the global state is the env's own `state()`; else concatenated observations."""
    image_pool: int = 1
    """Image observations (and an image state) are average-pooled over blocks of this many pixels."""

    @property
    def num_agents(self) -> int:
        """Agents in the team, over all groups."""
        return len(self.agents)

    def group_of(self, agent: str) -> tuple[int, int]:
        """(group index, index within the group) of an agent."""
        for g, group in enumerate(self.groups):
            if agent in group.agents:
                return g, group.agents.index(agent)
        raise KeyError(agent)


@dataclass
class TeamArrays:
    """Per-group arrays for one env (shapes `(A_g, ...)`) or E envs (`(E, A_g, ...)`), plus the state."""

    obs: list[np.ndarray]
    alive: list[np.ndarray]
    action_mask: list[np.ndarray]
    """Allowed actions for the next step, `(..., A_g, mask_dim)`; all True where the env gives no mask."""
    reward: list[np.ndarray]
    terminated: list[np.ndarray]
    truncated: list[np.ndarray]
    final_obs: list[np.ndarray]
    state: np.ndarray
    final_state: np.ndarray

    @classmethod
    def allocate(cls, spec: TeamSpec, lead: tuple[int, ...] = ()) -> TeamArrays:
        """Zero arrays (masks all True) for `spec` with leading dims `lead`."""

        def per_group(tail: Callable[[GroupSpec], tuple[int, ...]], dtype: Any) -> list[np.ndarray]:
            return [np.zeros(lead + (g.num_agents,) + tail(g), dtype=dtype) for g in spec.groups]

        return cls(
            obs=per_group(lambda g: (g.obs_dim,), np.float32),
            alive=per_group(lambda g: (), bool),
            action_mask=[np.ones(lead + (g.num_agents, g.mask_dim), bool) for g in spec.groups],
            reward=per_group(lambda g: (), np.float32),
            terminated=per_group(lambda g: (), bool),
            truncated=per_group(lambda g: (), bool),
            final_obs=per_group(lambda g: (g.obs_dim,), np.float32),
            state=np.zeros(lead + (spec.state_dim,), np.float32),
            final_state=np.zeros(lead + (spec.state_dim,), np.float32),
        )

    def row(self, index: int | slice) -> TeamArrays:
        """Views of env `index`, or of a slice of envs (for arrays allocated with one leading env dim)."""
        views: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            views[field.name] = [a[index] for a in value] if isinstance(value, list) else value[index]
        return TeamArrays(**views)
