"""The only loop that calls `env.step`: fills a RolloutBuffer with one rollout of every env copy."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.rollout.buffer import GroupStep, RolloutBuffer
from marl_ppo.rollout.memory import RecurrentMemory
from marl_ppo.rollout.source import EpisodeRecord, Policy, RolloutResult


class Collector:
    """Runs the policy in the vector env, keeping per-episode return accounting across rollouts."""

    def __init__(
        self,
        venv: VectorEnv,
        model: Policy,
        device: torch.device,
        memory: RecurrentMemory | None = None,
    ) -> None:
        """`memory`: the live states of a recurrent policy over the venv's copies (`make_memory`);
        None for feed-forward networks."""
        self.venv = venv
        self.model = model
        self.device = device
        self.memory = memory
        spec = venv.spec
        # column of each group's agents in the team's agent order, for per-agent returns
        self._tensor_io = venv.tensor_io
        where = venv.arrays.state.device if self._tensor_io else torch.device("cpu")
        self._columns = {
            g.name: torch.tensor([spec.agents.index(a) for a in g.agents], device=where) for g in spec.groups
        }
        self._returns = torch.zeros((venv.num_envs, spec.num_agents), dtype=torch.float64, device=where)
        self._lengths = torch.zeros(venv.num_envs, dtype=torch.int64, device=where)
        self.env_steps = 0
        """Env steps taken so far over all copies (one per copy per step)."""

    def start(self, seed: int) -> None:
        """Reset every env copy (env i gets `seed + i`) and clear episode accounting."""
        self.venv.reset(seed)
        if self.memory is not None:
            self.memory.start()
        self._returns[:] = 0.0
        self._lengths[:] = 0

    def close(self) -> None:
        """Close the vector env."""
        self.venv.close()

    def env_states(self) -> list[bytes]:
        """Every env copy's pickled state (see `marl_ppo.envs.vector.state`)."""
        return self.venv.env_states()

    def load_env_states(self, states: list[bytes]) -> None:
        """Replace the env copies by saved ones (trusted bytes only: unpickling runs code)."""
        self.venv.load_env_states(states)

    def state_dict(self) -> dict[str, Any]:
        """Counters, the unfinished episodes' returns and lengths, and the env arrays the next step reads."""
        state = {
            "env_steps": self.env_steps,
            "returns": self._returns.cpu().clone(),
            "lengths": self._lengths.cpu().clone(),
            "arrays": _arrays_state(self.venv.arrays),
        }
        if self.memory is not None:  # the recurrent states the next step reads
            state["memory"] = self.memory.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], *, episodes: bool = True) -> None:
        """Restore `state_dict()`; `episodes=False` keeps only the step counter (the envs were reset instead)."""
        self.env_steps = int(state["env_steps"])
        if not episodes:
            return
        self._returns.copy_(state["returns"])
        self._lengths.copy_(state["lengths"])
        _load_arrays(self.venv.arrays, state["arrays"])
        if self.memory is not None:
            self.memory.load_state_dict(state["memory"])

    def _to_torch(self, array: np.ndarray | torch.Tensor) -> torch.Tensor:
        """A copy on the learner's device (env arrays are overwritten by the next step)."""
        if isinstance(array, torch.Tensor):
            return array.to(self.device, copy=True)
        return torch.from_numpy(array.copy()).to(self.device)

    @torch.no_grad()
    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` (which must be empty) with `buffer.steps` steps of every env. `ahead` (whether
        the run needs another rollout) matters only to collectors that run ahead of the learner."""
        arrays = self.venv.arrays
        result = RolloutResult()
        while not buffer.full:
            groups = arrays.groups
            obs = {name: self._to_torch(group.obs) for name, group in groups.items()}
            alive = {name: self._to_torch(group.alive) for name, group in groups.items()}
            masks = {name: self._to_torch(group.action_mask) for name, group in groups.items()}
            state = self._to_torch(arrays.state)
            memory = self.memory
            dists = (
                self.model.distributions(obs, masks)
                if memory is None
                else memory.distributions(obs, masks, alive)
            )
            actions = {name: dist.sample() for name, dist in dists.items()}
            logp = {name: dist.log_prob(actions[name]) for name, dist in dists.items()}
            values = self.model.values(state, obs) if memory is None else memory.values(state, obs, alive)
            sent = actions if self._tensor_io else {name: a.cpu().numpy() for name, a in actions.items()}
            started = time.perf_counter()
            self.venv.step(sent)
            result.env_seconds += time.perf_counter() - started
            if any(group.truncated.any() for group in groups.values()):
                final_obs = {name: self._to_torch(group.final_obs) for name, group in groups.items()}
                final_state = self._to_torch(arrays.final_state)
                final_values = (
                    self.model.values(final_state, final_obs)
                    if memory is None
                    else memory.final_values(
                        final_state, final_obs
                    )  # from the critics' states after the step
                )
            else:
                final_values = {name: torch.zeros_like(v) for name, v in values.items()}
            steps = {
                name: GroupStep(
                    obs=obs[name],
                    alive=alive[name],
                    action_mask=masks[name],
                    actions=actions[name],
                    logp=logp[name],
                    values=values[name],
                    rewards=group.reward,
                    terminated=group.terminated,
                    truncated=group.truncated,
                    final_values=final_values[name],
                )
                for name, group in groups.items()
            }
            buffer.add(state, steps, None if memory is None else memory.records())
            self._account(result)
            if memory is not None:
                memory.advance(arrays, self.venv.episode_over)
        next_state = self._to_torch(arrays.state)
        next_obs = {name: self._to_torch(g.obs) for name, g in arrays.groups.items()}
        result.last_alive = {name: self._to_torch(g.alive) for name, g in arrays.groups.items()}
        if self.memory is None:
            result.last_values = self.model.values(next_state, next_obs)
        else:
            result.last_values = self.memory.values(next_state, next_obs, result.last_alive)
        result.env_steps = buffer.steps * self.venv.num_envs
        return result

    def _account(self, result: RolloutResult) -> None:
        arrays = self.venv.arrays
        for name, group in arrays.groups.items():
            self._returns[:, self._columns[name]] += torch.as_tensor(
                group.reward, device=self._returns.device
            )
        self._lengths += 1
        self.env_steps += self.venv.num_envs
        over = torch.as_tensor(self.venv.episode_over, device=self._returns.device)
        if not over.any():
            return
        finished = torch.nonzero(over).flatten()
        returns = self._returns[finished].cpu().numpy()  # only finished episodes' totals, for the logs
        lengths = self._lengths[finished].tolist()
        for agent_returns, length in zip(returns, lengths, strict=True):
            result.episodes.append(
                EpisodeRecord(float(agent_returns.sum()), agent_returns, length, self.env_steps)
            )
        self._returns[finished] = 0.0
        self._lengths[finished] = 0


def _arrays_state(arrays: TeamArrays) -> dict[str, Any]:
    """CPU tensor copies of every array of the vector env's arrays (numpy or torch), keyed by field."""

    def copy(value: np.ndarray | torch.Tensor) -> torch.Tensor:
        return value.cpu().clone() if isinstance(value, torch.Tensor) else torch.from_numpy(value.copy())

    saved = arrays.map(copy)
    return {
        "groups": {
            name: {f.name: getattr(group, f.name) for f in dataclasses.fields(group)}
            for name, group in saved.groups.items()
        },
        "state": saved.state,
        "final_state": saved.final_state,
    }


def _load_arrays(arrays: TeamArrays, state: dict[str, Any]) -> None:
    """Write saved tensors into the vector env's arrays in place (they may be shared memory)."""

    def load(target: np.ndarray | torch.Tensor, saved: torch.Tensor) -> None:
        if tuple(target.shape) != tuple(saved.shape):
            raise ValueError(
                f"saved env arrays have shape {tuple(saved.shape)}, expected {tuple(target.shape)}"
            )
        if isinstance(target, torch.Tensor):
            target.copy_(saved)
        else:
            target[...] = saved.numpy()

    for name, group in arrays.groups.items():
        for field in dataclasses.fields(group):
            load(getattr(group, field.name), state["groups"][name][field.name])
    load(arrays.state, state["state"])
    load(arrays.final_state, state["final_state"])
