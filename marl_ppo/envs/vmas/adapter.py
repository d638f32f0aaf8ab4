"""VMAS as a native batched env: one simulator steps all E copies, and every array stays a torch tensor.

`VmasVectorEnv` has the vector-env interface (`spec`, `arrays`, `episode_over`, `reset`, `step`)
with `arrays` holding tensors on the simulator's device, so observations, actions and rewards never
pass through NumPy. VMAS does not reset finished copies itself; this class resets them after
keeping their final observations for the truncation bootstrap.

VMAS resets one copy per `reset_at` call, a Python-level call (dozens of small kernels on a GPU)
for each finished episode. Once a policy reaches its goals, copies end at different steps and
those calls can cost more than stepping the simulator. `FreshCopies` instead copies initial states
that a second simulator of the same scenario made for all its copies in one batched reset.

The same view of a copy's state (every tensor whose first dim is the copies) saves a simulator for
an exact resume where VMAS's scenarios cannot be pickled (`VmasVectorEnv.env_states`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.grouping import group_members
from marl_ppo.envs.spec import GroupSpec, TeamArrays, TeamSpec
from marl_ppo.envs.vector.state import EnvStateError, dump_env_state, load_env_state
from marl_ppo.envs.vmas.per_copy import (
    FreshCopies,
    load_copies,
    per_copy_tensor_paths,
    random_streams_kept,
    save_copies,
    vmas_streams,
)

VmasSpace: TypeAlias = gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.Box
"""The Gymnasium spaces of VMAS's observations and actions."""


def _to_gymnasium(space: Any) -> VmasSpace:
    """VMAS declares old-`gym` spaces; the framework speaks Gymnasium."""
    if hasattr(space, "n") and not hasattr(space, "nvec"):
        return gym.spaces.Discrete(int(space.n))
    if hasattr(space, "nvec"):
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec))
    return gym.spaces.Box(np.asarray(space.low), np.asarray(space.high), tuple(space.shape), np.float32)


class _Spaces:
    """The per-agent space lookups `group_members` expects, over a VMAS env."""

    def __init__(self, observation: dict[str, VmasSpace], action: dict[str, VmasSpace]) -> None:
        self.observation, self.action = observation, action

    def observation_space(self, agent: str) -> VmasSpace:
        return self.observation[agent]

    def action_space(self, agent: str) -> VmasSpace:
        return self.action[agent]


def vmas_team_spec(env: Any, env_id: str) -> TeamSpec:
    """Groups of identical agents; the global state is the concatenation of all observations."""
    agents = tuple(agent.name for agent in env.agents)
    spaces = _Spaces(
        {a: _to_gymnasium(env.observation_space[a]) for a in agents},
        {a: _to_gymnasium(env.action_space[a]) for a in agents},
    )
    groups = []
    for name, members in group_members(spaces, agents, None):
        obs_space = spaces.observation_space(members[0])
        if not isinstance(obs_space, gym.spaces.Box):
            raise EnvContractError(
                f"VMAS env '{env_id}': agent '{members[0]}' observes {obs_space}; a vector (Box) was expected"
            )
        obs_dim = int(np.prod(obs_space.shape))
        groups.append(GroupSpec(name, members, obs_space, spaces.action_space(members[0]), obs_dim))
    state_dim = sum(g.num_agents * g.obs_dim for g in groups)
    return TeamSpec(env_id, agents, tuple(groups), state_dim, state_from_env=False)


def _check_vmas_flags(env: Any, env_id: str) -> None:
    """Refuse, in one line, a batched factory's env that is not a VMAS env made as the adapter reads it."""
    if not hasattr(env, "num_envs") or not hasattr(env, "agents"):
        raise EnvContractError(
            f"env '{env_id}' is registered with batched=True, so its factory must return a VMAS "
            f"environment (vmas.make_env), not {type(env).__name__}; register other envs without batched"
        )
    missing = [
        flag for flag in ("dict_spaces", "terminated_truncated") if getattr(env, flag, None) is not True
    ]
    if missing:
        raise EnvContractError(
            f"env '{env_id}': its VMAS environment was made without {' and '.join(f'{m}=True' for m in missing)}; "
            "pass dict_spaces=True, terminated_truncated=True to vmas.make_env (the adapter reads spaces by "
            "agent name and keeps a time limit apart from a termination)"
        )


def allocate_tensors(spec: TeamSpec, num_envs: int, device: torch.device) -> TeamArrays[torch.Tensor]:
    """TeamArrays of zero tensors (masks all True) on `device`, leading dim `num_envs`."""
    return TeamArrays.allocate(spec, (num_envs,)).map(lambda array: torch.from_numpy(array).to(device))


COPY_STATE = "vmas per-copy tensors"
"""`kind` of a VMAS state saved as tensors (`VmasVectorEnv.env_states`)."""


class SlowResetWarning(UserWarning):
    """A VMAS scenario's finished copies are reset one at a time (VMAS's `reset_at`). A scenario's
    author makes them fast by keeping per-copy state in tensors whose first dimension is the copies."""


class VmasVectorEnv:
    """All E copies of a VMAS scenario in one simulator; `arrays` are tensors on its device."""

    tensor_io = True
    """Actions go in and results come out as torch tensors on `device`."""

    def __init__(self, env: Any, env_id: str, make_spare: Callable[[], Any] | None = None) -> None:
        """`make_spare` builds a second simulator like `env` (any seed) whose batched resets supply
        the initial states of finished copies (`FreshCopies`); without it, or where the scenario
        fails `FreshCopies.check`, finished copies are reset one at a time."""
        _check_vmas_flags(env, env_id)
        self.env = env
        self.spec = vmas_team_spec(env, env_id)
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.arrays = allocate_tensors(self.spec, self.num_envs, self.device)
        self.episode_over = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        for group in self.arrays.groups.values():
            group.alive.fill_(True)  # VMAS agents never leave
        self._make_spare = make_spare
        self._fresh: FreshCopies | None = None
        """Built at the first partial reset; None until then and where copying is off."""
        self._fresh_off = make_spare is None

    def reset(self, seed: int) -> TeamArrays[torch.Tensor]:
        """Seed the simulator and reset every copy."""
        self.env.seed(seed)
        self._write_obs("obs", self.env.reset())
        self._write_state(self.arrays.state, "obs")
        self.episode_over.zero_()
        if self._fresh is not None:
            self._fresh.discard()  # new episodes come from the seeded stream, not from before
        return self.arrays

    def step(self, actions: Mapping[str, torch.Tensor]) -> TeamArrays[torch.Tensor]:
        """Step all copies with per-group `(E, A_g, ...)` tensors; reset the copies whose episode ended."""
        arrays = self.arrays
        action_dict = {}
        for group in self.spec.groups:
            group_actions = actions[group.name]
            if isinstance(group.action_space, gym.spaces.Box):
                low = torch.as_tensor(group.action_space.low, device=self.device)
                high = torch.as_tensor(group.action_space.high, device=self.device)
                group_actions = torch.maximum(torch.minimum(group_actions, high), low)
            for i, agent in enumerate(group.agents):
                action_dict[agent] = group_actions[:, i]
        observations, rewards, terminated, truncated, _ = self.env.step(action_dict)
        terminated = terminated.reshape(self.num_envs)
        truncated = truncated.reshape(self.num_envs) & ~terminated
        for group in self.spec.groups:
            out = arrays.groups[group.name]
            for i, agent in enumerate(group.agents):
                out.reward[:, i] = rewards[agent].reshape(self.num_envs)
            out.terminated.copy_(terminated.unsqueeze(1).expand_as(out.terminated))
            out.truncated.copy_(truncated.unsqueeze(1).expand_as(out.truncated))
        self._write_obs("final_obs", observations)
        self._write_state(arrays.final_state, "final_obs")
        torch.logical_or(terminated, truncated, out=self.episode_over)
        finished = torch.nonzero(self.episode_over).flatten()
        if len(finished) == self.num_envs:  # copies with a common time limit end together: one batched reset
            self._write_obs("obs", self.env.reset())
        else:
            for group_arrays in arrays.groups.values():
                group_arrays.obs.copy_(group_arrays.final_obs)
            if len(finished):
                self._reset_some(finished)
        self._write_state(arrays.state, "obs")
        return arrays

    def _reset_some(self, indices: torch.Tensor | Sequence[int]) -> None:
        """Start new episodes in the copies `indices` and write their first observations into each group's `obs`."""
        fresh = self._fresh_copies()
        if fresh is not None:
            index = torch.as_tensor(indices, device=self.device)
            try:
                observations = fresh.copy_into(self.env, index)
            except LookupError as err:  # the scenario grew or dropped a tensor since the check
                self._turn_off_fresh_copies(str(err))
            else:
                self._write_obs("obs", observations, index)
                return
        self._write_obs("obs", self._reset_at(indices))

    def _fresh_copies(self) -> FreshCopies | None:
        if self._fresh is None and not self._fresh_off:
            assert self._make_spare is not None
            # building and checking the spare draws nothing from the run's random streams
            with random_streams_kept(self.env):
                fresh = FreshCopies(self._make_spare())
                reason = fresh.check()
            if reason is None:
                self._fresh = fresh
            else:
                self._turn_off_fresh_copies(reason)
        return self._fresh

    def _turn_off_fresh_copies(self, reason: str) -> None:
        self._fresh, self._fresh_off = None, True
        warnings.warn(
            f"{self.spec.env_id}: finished env copies are reset one at a time, which is slower with many "
            f"copies (the run's numbers are the same); fewer copies (rollout.num_envs) shorten each reset. "
            f"Why: the scenario keeps state that cannot be copied from a fresh simulator ({reason})",
            SlowResetWarning,
            stacklevel=3,
        )

    def _reset_at(self, indices: torch.Tensor | Sequence[int]) -> dict[str, torch.Tensor]:
        """Reset the copies `indices` with VMAS's own `reset_at`; return every copy's observations.

        VMAS's `reset_at` computes the observations of all copies on each call, so resetting k
        copies one by one would cost k full observation passes. Observations depend only on each
        copy's own state, so computing them once after all resets gives the same arrays.
        """
        for index in torch.as_tensor(indices).tolist():
            self.env.reset_at(index, return_observations=False)
        return self._observe()

    def _observe(self) -> dict[str, torch.Tensor]:
        observations: dict[str, torch.Tensor]
        (observations,) = self.env.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False
        )
        return observations

    def env_states(self) -> list[bytes]:
        """The simulator's complete state as one blob; raises EnvStateError when it can be saved
        neither whole nor copy by copy.

        A simulator that pickles is saved whole. VMAS's own scenarios do not (their classes and
        entities' lambdas have no importable name); where the scenario passes `FreshCopies.check`,
        its state is every tensor whose first dim is the copies, so those tensors are saved instead,
        with VMAS's random streams and the spare simulator's unused fresh copies."""
        try:
            return [dump_env_state(self.env)]
        except EnvStateError as err:
            fresh = self._fresh_copies()
            if fresh is None:
                raise EnvStateError(
                    f"{err}; nor could its copies be saved as tensors (the scenario keeps state elsewhere)"
                ) from None
            saved = {
                "kind": COPY_STATE,
                "env": save_copies(self.env, per_copy_tensor_paths(self.env, self.num_envs)),
                "fresh": fresh.state_dict(),
                "vmas_random_state": vmas_streams(self.env),
            }
            return [dump_env_state(saved)]

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Restore what `env_states` saved (trusted bytes only: unpickling runs code). A whole
        simulator replaces this one, whose new episodes then come from a freshly reset spare; saved
        tensors are written into this simulator and its spare."""
        if len(states) != 1:
            raise ValueError(f"got {len(states)} env states for one batched simulator")
        saved = load_env_state(states[0])
        if not (isinstance(saved, dict) and saved.get("kind") == COPY_STATE):
            self.env = saved
            if self._fresh is not None:
                self._fresh.discard()
            return
        fresh = self._fresh_copies()
        if fresh is None:
            raise EnvStateError(
                "the saved copies need a spare simulator, and this scenario's failed its check"
            )
        with random_streams_kept(self.env):  # tensors that only stepping creates, drawing from no stream
            torch.manual_seed(0)
            self.env.step(self.env.get_random_actions())
        try:
            load_copies(self.env, saved["env"])
            fresh.load_state_dict(saved["fresh"])
        except LookupError as err:
            raise EnvStateError(f"{err}; resume with the run's own env settings") from None
        if saved["vmas_random_state"] is not None:  # VMAS's streams, as the saved run had them
            self.env.vmas_random_state[:] = saved["vmas_random_state"]

    def close(self) -> None:
        """Nothing to release (the simulator lives in this process)."""

    def _write_obs(self, field: str, observations: dict[str, torch.Tensor], rows: Any = slice(None)) -> None:
        """Write every agent's observations into the copies `rows` of each group's `field` array."""
        for group in self.spec.groups:
            target = getattr(self.arrays.groups[group.name], field)
            for i, agent in enumerate(group.agents):
                target[rows, i] = observations[agent].reshape(-1, target.shape[-1])

    def _write_state(self, target: torch.Tensor, field: str) -> None:
        """The groups' `field` observations (`obs` or `final_obs`), concatenated into `target`."""
        obs = [getattr(group, field).reshape(self.num_envs, -1) for group in self.arrays.groups.values()]
        torch.cat(obs, dim=1, out=target)
