"""What the learner knows about a team: agents in a fixed order, split into groups of identical spaces."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import gymnasium as gym
import numpy as np

from marl_ppo.envs.layout import InputLayout

ActionSpace: TypeAlias = gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.Box
"""The action spaces the learner supports."""


@dataclass(frozen=True)
class GroupSpec:
    """Agents whose observation and action spaces are identical; their tensors share an agent axis."""

    name: str
    agents: tuple[str, ...]
    observation_space: gym.Space
    action_space: ActionSpace
    obs_dim: int
    """Length of the flattened observation vector fed to the networks."""
    mask_source: str | None = None
    """Where the agents' action masks come from: `obs` (a Dict observation with an `action_mask` key,
    PettingZoo's classic convention), `info` (`infos[agent]["action_mask"]`) or None (no masks)."""
    obs_layout: InputLayout | None = None
    """Where the images lie in the flat observation and how it is stored; None: one float32 vector."""

    @property
    def obs_dtype(self) -> np.dtype:
        """How observations are stored: uint8 frames (see `envs/layout.py`) or float32."""
        return np.dtype(np.float32) if self.obs_layout is None else self.obs_layout.dtype

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
    state_layout: InputLayout | None = None
    """Where the images lie in the flat global state and how it is stored; None: one float32 vector."""

    @property
    def state_dtype(self) -> np.dtype:
        """How the global state is stored: uint8 frames or float32."""
        return np.dtype(np.float32) if self.state_layout is None else self.state_layout.dtype

    @property
    def has_image(self) -> bool:
        """Whether an observation or the state holds an image laid out for a CNN encoder."""
        state_image = self.state_layout is not None and self.state_layout.has_image
        return state_image or any(g.obs_layout is not None and g.obs_layout.has_image for g in self.groups)

    @property
    def num_agents(self) -> int:
        """Agents in the team, over all groups."""
        return len(self.agents)

    def group_of(self, agent: str) -> tuple[GroupSpec, int]:
        """The group of an agent and its index within the group."""
        for group in self.groups:
            if agent in group.agents:
                return group, group.agents.index(agent)
        raise KeyError(agent)

    def group(self, name: str) -> GroupSpec:
        """The group called `name`."""
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)


class _Indexable(Protocol):
    """What the records need of an array: a view by index."""

    def __getitem__(self, index: Any, /) -> Any: ...


Array = TypeVar("Array", bound=_Indexable)
"""`np.ndarray` for envs stepped through NumPy, `torch.Tensor` for batched simulators (VMAS)."""


@dataclass(frozen=True)
class GroupArrays(Generic[Array]):
    """One group's arrays of a step, `(A_g, ...)` for one env copy or `(E, A_g, ...)` for E copies.

    The record is fixed; the arrays are written in place (they may be views of shared memory).
    """

    obs: Array
    """Observations the next action is chosen from (zeros for absent agents)."""
    alive: Array
    """Agents present and acting at the next step."""
    action_mask: Array
    """Allowed actions for the next step, `(..., A_g, mask_dim)`; all True where the env gives no mask."""
    reward: Array
    terminated: Array
    truncated: Array
    final_obs: Array
    """The step's observations before any reset (for the truncation bootstrap)."""

    @classmethod
    def allocate(cls, group: GroupSpec, lead: tuple[int, ...] = ()) -> GroupArrays[np.ndarray]:
        """Zero arrays (masks all True) for `group` with leading dims `lead`."""
        shape = (*lead, group.num_agents)
        return GroupArrays(
            obs=np.zeros((*shape, group.obs_dim), group.obs_dtype),
            alive=np.zeros(shape, bool),
            action_mask=np.ones((*shape, group.mask_dim), bool),
            reward=np.zeros(shape, np.float32),
            terminated=np.zeros(shape, bool),
            truncated=np.zeros(shape, bool),
            final_obs=np.zeros((*shape, group.obs_dim), group.obs_dtype),
        )

    def map(self, fn: Callable[[Array], Any]) -> GroupArrays[Any]:
        """`fn` applied to every array (views, copies, conversions), in field order."""
        return GroupArrays(**{f.name: fn(getattr(self, f.name)) for f in dataclasses.fields(self)})


@dataclass(frozen=True)
class TeamArrays(Generic[Array]):
    """A step's arrays of every group, keyed by group name in the team's group order, plus the state."""

    groups: dict[str, GroupArrays[Array]]
    state: Array
    """The global state the next action is chosen from, `(..., state_dim)`."""
    final_state: Array
    """The step's global state before any reset (for the truncation bootstrap)."""

    @classmethod
    def allocate(cls, spec: TeamSpec, lead: tuple[int, ...] = ()) -> TeamArrays[np.ndarray]:
        """Zero arrays (masks all True) for `spec` with leading dims `lead`."""
        return TeamArrays(
            groups={g.name: GroupArrays.allocate(g, lead) for g in spec.groups},
            state=np.zeros((*lead, spec.state_dim), spec.state_dtype),
            final_state=np.zeros((*lead, spec.state_dim), spec.state_dtype),
        )

    def map(self, fn: Callable[[Array], Any]) -> TeamArrays[Any]:
        """`fn` applied to every array, group by group and then the states."""
        return TeamArrays(
            groups={name: group.map(fn) for name, group in self.groups.items()},
            state=fn(self.state),
            final_state=fn(self.final_state),
        )

    def row(self, index: int | slice) -> TeamArrays[Array]:
        """Views of env `index`, or of a slice of envs (for arrays allocated with one leading env dim)."""
        return self.map(lambda array: array[index])


@dataclass(frozen=True)
class BatchedLayout:
    """The layout of a batched simulator (VMAS, JaxMARL), which holds every env copy in one object and
    reports its team layout (`TeamSpec`) only once it is built."""

    own_threads: bool = False
    """The simulator computes on a thread pool of its own (JAX's), beside torch's."""


EnvLayout: TypeAlias = TeamSpec | BatchedLayout
"""What a run knows of its env before building its copies: the team layout read from one probe copy,
or, for a batched simulator, that it is one."""
