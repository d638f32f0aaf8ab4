"""Rollout storage: preallocated, time-major `(T, E, A_g, ...)` tensors per agent group. It only stores."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.recurrent import MemoryLayout


class BufferFull(RuntimeError):
    """Raised by `add` once all `T` steps are written; call `reset()` before the next rollout."""


ArrayLike = torch.Tensor | np.ndarray

_DTYPES = {"float32": torch.float32, "int64": torch.int64, "uint8": torch.uint8}


@dataclass(frozen=True)
class GroupStep:
    """One group's step as the collector records it: `(E, A_g, ...)` per field, named as in GroupStorage."""

    obs: ArrayLike
    alive: ArrayLike
    action_mask: ArrayLike
    actions: ArrayLike
    logp: ArrayLike
    values: ArrayLike
    rewards: ArrayLike
    terminated: ArrayLike
    truncated: ArrayLike
    final_values: ArrayLike


_STEP_FIELDS = tuple(f.name for f in dataclasses.fields(GroupStep))


@dataclass(frozen=True)
class GroupStorage:
    """One group's rollout tensors; every field is `(T, E, A_g, ...)`. Each GroupStep field is stored in
    the field of the same name."""

    obs: torch.Tensor
    actions: torch.Tensor
    logp: torch.Tensor
    values: torch.Tensor
    final_values: torch.Tensor
    """V(final obs/state) where the step truncated (for the bootstrap); unused elsewhere."""
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    alive: torch.Tensor
    action_mask: torch.Tensor
    """Allowed actions when the action was chosen, `(T, E, A_g, mask_dim)` (mask_dim 0 without masks)."""

    @classmethod
    def allocate(cls, group: GroupSpec, steps: int, num_envs: int, device: torch.device) -> GroupStorage:
        """Zeroed storage for one group."""
        lead = (steps, num_envs, group.num_agents)

        def zeros(*tail: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.zeros(lead + tail, dtype=dtype, device=device)

        return cls(
            obs=zeros(group.obs_dim, dtype=_DTYPES[group.obs_dtype.name]),
            actions=zeros(*group.action_shape, dtype=_DTYPES[group.action_dtype.name]),
            logp=zeros(),
            values=zeros(),
            final_values=zeros(),
            rewards=zeros(),
            terminated=zeros(dtype=torch.bool),
            truncated=zeros(dtype=torch.bool),
            alive=zeros(dtype=torch.bool),
            action_mask=zeros(group.mask_dim, dtype=torch.bool),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every field's tensor, in field order."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


@dataclass(frozen=True)
class GroupMemory:
    """One group's carries and episode flags: `(E, ...)` for one step as the collector records it,
    `(T, E, ...)` stored. A feed-forward network's carries are empty (size 0)."""

    is_first: torch.Tensor
    """`(..., A_g)` bool: the agent's episode starts at this step (its state is reset before the step:
    after its own termination or truncation, and for every agent after the copy's episode ended)."""
    actor_state: torch.Tensor
    """`(..., A_g, S_actor)`: the actor's state carried into the step, before that reset."""
    critic_state: torch.Tensor
    """`(..., rows, S_critic)`: the critic's state carried into the step (rows: A_g, or 1 for a team
    critic; S_critic is 0 for a feed-forward critic)."""

    @classmethod
    def allocate(
        cls, group: GroupSpec, layout: MemoryLayout, lead: tuple[int, ...], device: torch.device
    ) -> GroupMemory:
        """Zeroed memory for one group with leading dims `lead` (`(T, E)` in a buffer)."""
        agents = (*lead, group.num_agents)
        return cls(
            is_first=torch.zeros(agents, dtype=torch.bool, device=device),
            actor_state=torch.zeros((*agents, layout.actor_size), device=device),
            critic_state=torch.zeros((*lead, layout.critic_rows, layout.critic_size), device=device),
        )

    def tensors(self) -> list[torch.Tensor]:
        """Every field's tensor, in field order."""
        return [getattr(self, f.name) for f in dataclasses.fields(self)]


class RolloutBuffer:
    """Per-group storages keyed by group name, plus the per-env global state `(T, E, S)`; `add` raises when full."""

    def __init__(
        self,
        spec: TeamSpec,
        steps: int,
        num_envs: int,
        device: torch.device | str = "cpu",
        memory: Mapping[str, MemoryLayout] | None = None,
    ) -> None:
        """`memory` (`TeamModel.memory_layout()`): per group, the sizes of the carries to store; None:
        a feed-forward network's empty carries."""
        self.spec = spec
        self.steps = steps
        self.num_envs = num_envs
        self.device = torch.device(device)
        self.groups = {g.name: GroupStorage.allocate(g, steps, num_envs, self.device) for g in spec.groups}
        self.memory = {
            g.name: GroupMemory.allocate(
                g,
                MemoryLayout(0, g.num_agents, 0) if memory is None else memory[g.name],
                (steps, num_envs),
                self.device,
            )
            for g in spec.groups
        }
        """Per group, the carries and episode flags of each step."""
        self.state = torch.zeros(
            (steps, num_envs, spec.state_dim), dtype=_DTYPES[spec.state_dtype.name], device=self.device
        )
        self.episode_over = torch.zeros((steps, num_envs), dtype=torch.bool, device=self.device)
        """`(T, E)`: the copy's episode ended at this step (the team critic's episode ends there too)."""
        self.pos = 0

    @property
    def full(self) -> bool:
        """True once all `steps` have been written."""
        return self.pos >= self.steps

    def reset(self) -> None:
        """Start writing at step 0 again (old contents are overwritten, never read)."""
        self.pos = 0

    def add(
        self,
        state: ArrayLike,
        groups: Mapping[str, GroupStep],
        memory: Mapping[str, GroupMemory],
        *,
        episode_over: ArrayLike,
    ) -> None:
        """Write one step of every env: team `state` `(E, S)`, every group's step and memory records,
        and `episode_over` `(E,)` (the copy's episode ended at this step)."""
        if self.full:
            raise BufferFull(
                f"rollout buffer holds {self.steps} steps and is full; call reset() before adding more"
            )
        t = self.pos
        self.state[t].copy_(_tensor(state))
        self.episode_over[t].copy_(_tensor(episode_over))
        for name, storage in self.groups.items():
            step = groups[name]
            for field in _STEP_FIELDS:
                getattr(storage, field)[t].copy_(_tensor(getattr(step, field)))
        for name, stored in self.memory.items():
            for target, value in zip(stored.tensors(), memory[name].tensors(), strict=True):
                target[t].copy_(_tensor(value))
        self.pos += 1

    def add_rollout(
        self,
        state: torch.Tensor,
        groups: Mapping[str, GroupStorage],
        memory: Mapping[str, GroupMemory],
        *,
        episode_over: torch.Tensor,
    ) -> None:
        """Write all `T` steps at once into the empty buffer: what `add` writes step by step, each
        field stacked `(T, E, ...)` (a compiled rollout's records)."""
        if self.pos:
            raise BufferFull(
                f"add_rollout writes all {self.steps} steps of an empty buffer, but {self.pos} are written; "
                "call reset() first"
            )
        _write(self.state, state, "state")
        _write(self.episode_over, episode_over, "episode_over")
        for name, storage in self.groups.items():
            for field in dataclasses.fields(storage):
                _write(
                    getattr(storage, field.name), getattr(groups[name], field.name), f"{name}.{field.name}"
                )
        for name, stored in self.memory.items():
            for field in dataclasses.fields(stored):
                _write(getattr(stored, field.name), getattr(memory[name], field.name), f"{name}.{field.name}")
        self.pos = self.steps

    def tensors(self) -> list[torch.Tensor]:
        """Every `(T, E, ...)` tensor of the buffer, in a fixed order (the state, the episode ends, then
        group by group, then the recurrent memory group by group)."""
        stored = [tensor for storage in self.groups.values() for tensor in storage.tensors()]
        memory = [tensor for record in self.memory.values() for tensor in record.tensors()]
        return [self.state, self.episode_over, *stored, *memory]


def _tensor(value: ArrayLike) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def _write(target: torch.Tensor, value: torch.Tensor, name: str) -> None:
    """Copy `value` into `target` of the same shape (no broadcasting: a wrong shape is an error)."""
    if tuple(value.shape) != tuple(target.shape):
        raise ValueError(
            f"rollout field '{name}' has shape {tuple(value.shape)}, the buffer {tuple(target.shape)}"
        )
    target.copy_(value)
