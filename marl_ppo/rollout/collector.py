"""The collector: fills a RolloutBuffer with one rollout of every env copy, stepping them through the
one stepping loop (`rollout.stepper`) and storing each step as it goes.

Each rollout acts through a `RolloutActing` (the stepper's `Acting`) of its own: the policy's
`ActingView` built for it, the buffer it fills and the step being taken."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.models.acting import ActingView
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import GroupStep, RolloutBuffer
from marl_ppo.rollout.memory import PolicyMemory, make_memory
from marl_ppo.rollout.opponents import Opponents
from marl_ppo.rollout.shaping import WEIGHT_TAG, RewardShaping
from marl_ppo.rollout.source import EpisodeRecord, InProcessSource, RolloutResult
from marl_ppo.rollout.stepper import Finished, Stepper, to_tensor


@dataclasses.dataclass(frozen=True)
class _Acted:
    """What the policy read and chose at the step being taken: the buffer stores it once the step's
    rewards and flags are in."""

    state: torch.Tensor
    obs: dict[str, torch.Tensor]
    alive: dict[str, torch.Tensor]
    masks: dict[str, torch.Tensor]
    actions: dict[str, torch.Tensor]
    logp: dict[str, torch.Tensor]
    values: dict[str, torch.Tensor]


class Collector(InProcessSource):
    """Runs the policy in the vector env, keeping per-episode return accounting across rollouts."""

    def __init__(self, venv: VectorEnv, model: TeamModel, device: torch.device) -> None:
        self.venv = venv
        self.device = device
        self.model = model
        """The policy that acts: each rollout reads its weights once (`ActingView`)."""
        self.memory = make_memory(model, venv.num_envs, device)
        """The policy's live carries over the venv's copies."""
        self.stepper = Stepper(venv)
        self.env_steps = 0
        """Env steps taken so far over all copies (one per copy per step)."""
        self.opponents: Opponents | None = None
        """Where set, they play the agents the learner does not in each copy (a league)."""
        self.shaping: RewardShaping | None = None
        """Where set, the env's shaped reward is added to the rewards stored (the venv reports one)."""

    def start(self, seed: int) -> None:
        """Reset every env copy (env i gets `seed + i`) and clear episode accounting."""
        self.stepper.reset(seed)
        self.memory.start()

    def state_dict(self) -> dict[str, Any]:
        """Counters, the unfinished episodes' returns and lengths, and the env arrays the next step reads."""
        return {
            "env_steps": self.env_steps,
            **self.stepper.state_dict(),
            "arrays": arrays_state(self.venv.arrays),
            "memory": self.memory.state_dict(),  # the carries the next step reads
        }

    def load_state_dict(self, state: dict[str, Any], *, episodes: bool = True) -> None:
        """Restore `state_dict()`; `episodes=False` keeps only the step counter (the envs were reset instead)."""
        self.env_steps = int(state["env_steps"])
        if not episodes:
            return
        self.stepper.load_state_dict(state)
        load_arrays(self.venv.arrays, state["arrays"])
        self.memory.load_state_dict(state["memory"])

    @torch.no_grad()
    def collect(self, buffer: RolloutBuffer, *, ahead: bool = True) -> RolloutResult:
        """Fill `buffer` (which must be empty) with `buffer.steps` steps of every env. `ahead` (whether
        the run needs another rollout) matters only to collectors that run ahead of the learner."""
        result = RolloutResult()
        env_seconds = self.stepper.env_seconds
        policy = ActingView(self.model)  # no update runs during a rollout
        acting = RolloutActing(policy, self.memory, buffer, self.device, self.opponents)
        if self.shaping is not None:
            weight = self.shaping.weight_at(self.env_steps)
            acting.shaped = (weight, self.venv)
            result.perf[WEIGHT_TAG] = weight
        if self.opponents is not None:
            self.opponents.begin_rollout()
        while not buffer.full:
            ended = self.stepper.step(acting)
            self.env_steps += self.venv.num_envs
            if self.opponents is not None:
                self.opponents.episodes_ended(ended)
            result.episodes.extend(self._record(episode) for episode in ended)
        result.env_seconds = self.stepper.env_seconds - env_seconds
        arrays = self.venv.arrays
        next_state = to_tensor(arrays.state, self.device)
        next_obs = {name: to_tensor(g.obs, self.device) for name, g in arrays.groups.items()}
        result.last_alive = {name: to_tensor(g.alive, self.device) for name, g in arrays.groups.items()}
        result.last_values = self.memory.values(policy, next_state, next_obs, result.last_alive)
        result.env_steps = buffer.steps * self.venv.num_envs
        return result

    def _record(self, episode: Finished) -> EpisodeRecord:
        returns = episode.agent_returns
        return EpisodeRecord(float(returns.sum()), returns, episode.length, self.env_steps, episode.won)


class RolloutActing:
    """One rollout's `Acting`: samples every agent's action with the rollout's `ActingView`, and once
    the env has stepped stores the step in `buffer` and carries the policy's memory on."""

    _acted: _Acted
    """What the policy read and chose at the step being taken (set by `act`, stored by `advance`)."""

    def __init__(
        self,
        policy: ActingView,
        memory: PolicyMemory,
        buffer: RolloutBuffer,
        device: torch.device,
        opponents: Opponents | None = None,
    ) -> None:
        self.policy, self.memory, self.buffer, self.device = policy, memory, buffer, device
        self.opponents = opponents
        self.shaped: tuple[float, Any] | None = None
        """`(weight, venv)`: store `reward + weight * venv.shaped_reward` (`rollout.shaping`)."""

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Sample every agent's action; keep what the buffer will store."""
        groups = arrays.groups
        obs = {name: to_tensor(group.obs, self.device) for name, group in groups.items()}
        alive = {name: to_tensor(group.alive, self.device) for name, group in groups.items()}
        masks = {name: to_tensor(group.action_mask, self.device) for name, group in groups.items()}
        state = to_tensor(arrays.state, self.device)
        dists = self.memory.distributions(self.policy, obs, masks, alive)
        actions = {name: dist.sample() for name, dist in dists.items()}
        logp = {name: dist.log_prob(actions[name]) for name, dist in dists.items()}
        values = self.memory.values(self.policy, state, obs, alive)
        trained = alive
        if self.opponents is not None:  # their agents' steps stay out of training
            actions, learner = self.opponents.act(obs, masks, alive, actions)
            trained = {name: flags & learner[name] for name, flags in alive.items()}
        self._acted = _Acted(state, obs, trained, masks, actions, logp, values)
        return actions

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """After the env step: store the step, then carry the policy on."""
        acted, buffer = self._acted, self.buffer
        groups = arrays.groups
        if any(group.truncated.any() for group in groups.values()):
            final_obs = {name: to_tensor(group.final_obs, self.device) for name, group in groups.items()}
            final_state = to_tensor(arrays.final_state, self.device)
            # from the critics' carries after the step
            final_values = self.memory.final_values(self.policy, final_state, final_obs)
        else:
            final_values = {name: torch.zeros_like(v) for name, v in acted.values.items()}
        rewards = {name: group.reward for name, group in groups.items()}
        if self.shaped is not None:
            weight, venv = self.shaped
            rewards = {name: reward + weight * venv.shaped_reward[name] for name, reward in rewards.items()}
        steps = {
            name: GroupStep(
                obs=acted.obs[name],
                alive=acted.alive[name],
                action_mask=acted.masks[name],
                actions=acted.actions[name],
                logp=acted.logp[name],
                values=acted.values[name],
                rewards=rewards[name],
                terminated=group.terminated,
                truncated=group.truncated,
                final_values=final_values[name],
            )
            for name, group in groups.items()
        }
        buffer.add(
            acted.state, steps, self.memory.records(), episode_over=to_tensor(episode_over, buffer.device)
        )
        self.memory.advance(arrays, episode_over)
        if self.opponents is not None:
            self.opponents.advance(arrays, episode_over)


def arrays_state(arrays: TeamArrays) -> dict[str, Any]:
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


def load_arrays(arrays: TeamArrays, state: dict[str, Any]) -> None:
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
