"""VMAS as a native batched env: one simulator steps all E copies, and every array stays a torch tensor.

`VmasVectorEnv` has the vector-env interface (`spec`, `arrays`, `episode_over`, `reset`, `step`)
with `arrays` holding tensors on the simulator's device, so observations, actions and rewards never
pass through NumPy. VMAS does not reset finished copies itself; this class resets them after
keeping their final observations for the truncation bootstrap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.envs.pettingzoo import TeamArrays, group_members
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.envs.state import dump_env_state, load_env_state


def _to_gymnasium(space: Any) -> gym.Space:
    """VMAS declares old-`gym` spaces; the framework speaks Gymnasium."""
    if hasattr(space, "n") and not hasattr(space, "nvec"):
        return gym.spaces.Discrete(int(space.n))
    if hasattr(space, "nvec"):
        return gym.spaces.MultiDiscrete(np.asarray(space.nvec))
    return gym.spaces.Box(np.asarray(space.low), np.asarray(space.high), tuple(space.shape), np.float32)


class _Spaces:
    """The per-agent space lookups `group_members` expects, over a VMAS env."""

    def __init__(self, observation: dict[str, gym.Space], action: dict[str, gym.Space]) -> None:
        self.observation, self.action = observation, action

    def observation_space(self, agent: str) -> gym.Space:
        return self.observation[agent]

    def action_space(self, agent: str) -> gym.Space:
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
        obs_dim = int(np.prod(obs_space.shape))
        groups.append(GroupSpec(name, members, obs_space, spaces.action_space(members[0]), obs_dim))
    state_dim = sum(g.num_agents * g.obs_dim for g in groups)
    return TeamSpec(env_id, agents, tuple(groups), state_dim, state_from_env=False)


def allocate_tensors(spec: TeamSpec, num_envs: int, device: torch.device) -> TeamArrays:
    """TeamArrays of zero tensors (masks all True) on `device`, leading dim `num_envs`."""
    numpy_arrays = TeamArrays.allocate(spec, (num_envs,))

    def convert(value: Any) -> Any:
        if isinstance(value, list):
            return [convert(item) for item in value]
        return torch.from_numpy(value).to(device)

    return TeamArrays(**{name: convert(value) for name, value in vars(numpy_arrays).items()})


class VmasVectorEnv:
    """All E copies of a VMAS scenario in one simulator; `arrays` are tensors on its device."""

    tensor_io = True
    """Actions go in and results come out as torch tensors on `device`."""

    def __init__(self, env: Any, env_id: str) -> None:
        self.env = env
        self.spec = vmas_team_spec(env, env_id)
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.arrays = allocate_tensors(self.spec, self.num_envs, self.device)
        self.episode_over = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        for alive in self.arrays.alive:
            alive.fill_(True)  # VMAS agents never leave

    def reset(self, seed: int) -> TeamArrays:
        """Seed the simulator and reset every copy."""
        self.env.seed(seed)
        self._write_obs(self.arrays.obs, self.env.reset())
        self._write_state(self.arrays.state, self.arrays.obs)
        self.episode_over.zero_()
        return self.arrays

    def step(self, actions: Sequence[torch.Tensor]) -> TeamArrays:
        """Step all copies with per-group `(E, A_g, ...)` tensors; reset the copies whose episode ended."""
        arrays = self.arrays
        action_dict = {}
        for g, group in enumerate(self.spec.groups):
            group_actions = actions[g]
            if isinstance(group.action_space, gym.spaces.Box):
                low = torch.as_tensor(group.action_space.low, device=self.device)
                high = torch.as_tensor(group.action_space.high, device=self.device)
                group_actions = torch.maximum(torch.minimum(group_actions, high), low)
            for i, agent in enumerate(group.agents):
                action_dict[agent] = group_actions[:, i]
        observations, rewards, terminated, truncated, _ = self.env.step(action_dict)
        terminated = terminated.reshape(self.num_envs)
        truncated = truncated.reshape(self.num_envs) & ~terminated
        for g, group in enumerate(self.spec.groups):
            for i, agent in enumerate(group.agents):
                arrays.reward[g][:, i] = rewards[agent].reshape(self.num_envs)
            arrays.terminated[g].copy_(terminated.unsqueeze(1).expand_as(arrays.terminated[g]))
            arrays.truncated[g].copy_(truncated.unsqueeze(1).expand_as(arrays.truncated[g]))
        self._write_obs(arrays.final_obs, observations)
        self._write_state(arrays.final_state, arrays.final_obs)
        torch.logical_or(terminated, truncated, out=self.episode_over)
        finished = torch.nonzero(self.episode_over).flatten().tolist()  # indices for reset_at (a few ints)
        if len(finished) == self.num_envs:
            observations = self.env.reset()  # copies with a common time limit end together: one batched reset
        elif finished:
            observations = self._reset_at(finished)
        for obs, final in zip(arrays.obs, arrays.final_obs, strict=True):
            obs.copy_(final)
        if finished:
            self._write_obs(arrays.obs, observations)
        self._write_state(arrays.state, arrays.obs)
        return arrays

    def _reset_at(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Reset the copies `indices`; return every copy's observations, computed once.

        VMAS's `reset_at` computes the observations of all copies on each call, so resetting k
        copies one by one cost k full observation passes: with 1,024 copies and a policy that
        ends episodes at different steps, rollouts became 7x slower. Observations depend only on
        each copy's own state, so computing them once after all resets gives the same arrays.
        """
        for index in indices:
            self.env.reset_at(index, return_observations=False)
        (observations,) = self.env.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False
        )
        return observations

    def env_states(self) -> list[bytes]:
        """The simulator's complete state as one blob; raises EnvStateError when it cannot be pickled."""
        return [dump_env_state(self.env)]

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Replace the simulator by the one `env_states` saved (trusted bytes only: unpickling runs code)."""
        if len(states) != 1:
            raise ValueError(f"got {len(states)} env states for one batched simulator")
        self.env = load_env_state(states[0])

    def close(self) -> None:
        """Nothing to release (the simulator lives in this process)."""

    def _write_obs(self, target: list[torch.Tensor], observations: dict[str, torch.Tensor]) -> None:
        for g, group in enumerate(self.spec.groups):
            for i, agent in enumerate(group.agents):
                target[g][:, i] = observations[agent].reshape(self.num_envs, -1)

    def _write_state(self, target: torch.Tensor, obs: list[torch.Tensor]) -> None:
        torch.cat([o.reshape(self.num_envs, -1) for o in obs], dim=1, out=target)
