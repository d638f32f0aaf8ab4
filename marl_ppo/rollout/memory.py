"""The live carries of E env copies while a policy acts (collector and evaluation).

Per group it keeps the actors' carry `(E, A_g, S)`, the critics' `(E, rows, S)` and each agent's
`is_first` flag. A step reads them (`distributions`, `values`, each through the caller's
`ActingView` of the model, built once for the rollout or evaluation), records them as the step's
`GroupMemory` for the buffer, and `advance` keeps the stepped carries and flags the agents whose
episode starts next: those that terminated or truncated, and every agent of a copy whose episode
ended. The reset itself happens in the networks, from the flag, as it does in training. A
feed-forward network's carry is empty (`S = 0`), so every policy acts through this one path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from marl_ppo.envs.spec import TeamArrays
from marl_ppo.models.acting import ActingView
from marl_ppo.models.distributions import ActionDistribution
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import GroupMemory


def _on(value: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, device=device)


def _either(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """`a | b` as a tensor on `device` (one NumPy operation where both are NumPy arrays)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return torch.from_numpy(a | b).to(device)
    return _on(a, device) | _on(b, device)


class FirstStep:
    """The distributions `(E, A)` of a one-step sequence's `(1, E, A)` ones: the step axis dropped."""

    def __init__(self, dist: ActionDistribution) -> None:
        self.dist = dist

    def sample(self) -> torch.Tensor:
        """One action per agent, `(E, A, ...)`."""
        return self.dist.sample()[0]

    def mode(self) -> torch.Tensor:
        """The most likely action per agent."""
        return self.dist.mode()[0]

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities `(E, A)` of `actions` `(E, A, ...)`."""
        return self.dist.log_prob(actions.unsqueeze(0))[0]

    def entropy(self) -> torch.Tensor:
        """Entropies `(E, A)`."""
        return self.dist.entropy()[0]


class PolicyMemory:
    """The carries and episode flags of `num_envs` env copies for `model`'s groups."""

    def __init__(self, model: TeamModel, num_envs: int, device: torch.device) -> None:
        self.num_envs, self.device = num_envs, device
        self.layout = model.memory_layout()
        spec = model.spec
        self.live = {
            g.name: GroupMemory.allocate(g, self.layout[g.name], (num_envs,), device) for g in spec.groups
        }
        """Per group the flags and the carries into the next step."""
        self._out = {
            g.name: torch.zeros((num_envs, g.num_agents), dtype=torch.bool, device=device)
            for g in spec.groups
        }
        """Per group `(E, A_g)`: the agent ended in this episode and has not acted since."""
        self._actor_next: dict[str, torch.Tensor] = {}
        self._critic_next: dict[str, torch.Tensor] = {}
        self._acted: dict[str, torch.Tensor] = {}
        self.start()

    def start(self) -> None:
        """Every copy starts an episode: states zero, every agent's `is_first` set."""
        for record in self.live.values():
            record.is_first.fill_(True)
            record.actor_state.zero_()
            record.critic_state.zero_()
        for out in self._out.values():
            out.zero_()
        self._actor_next, self._critic_next, self._acted = {}, {}, {}

    def records(self) -> dict[str, GroupMemory]:
        """This step's memory records for the buffer (the live tensors; the buffer copies them)."""
        return dict(self.live)

    def distributions(
        self,
        policy: ActingView,
        obs: Mapping[str, torch.Tensor],
        masks: Mapping[str, torch.Tensor],
        alive: Mapping[str, torch.Tensor],
    ) -> dict[str, ActionDistribution]:
        """Per group the action distributions `(E, A_g)` of this step; the stepped actor states, and
        `alive` itself (so it must be a copy the env step does not overwrite), are kept for `advance`."""
        dists: dict[str, ActionDistribution] = {}
        for name, record in self.live.items():
            dist, self._actor_next[name] = policy.actor(
                name,
                obs[name].unsqueeze(0),
                masks[name].unsqueeze(0),
                record.actor_state,
                record.is_first.unsqueeze(0),
                alive[name].unsqueeze(0),
            )
            dists[name] = FirstStep(dist)
            self._acted[name] = alive[name]
        return dists

    def values(
        self,
        policy: ActingView,
        state: torch.Tensor,
        obs: Mapping[str, torch.Tensor],
        alive: Mapping[str, torch.Tensor],
    ) -> dict[str, torch.Tensor]:
        """Per group the values `(E, A_g)` of this step in return units; the stepped critic states are
        kept for `advance` and `final_values`."""
        values = {}
        for name, record in self.live.items():
            raw, self._critic_next[name] = _critic_step(
                policy, name, state, obs[name], record.critic_state, record.is_first, alive[name]
            )
            values[name] = policy.denormalize(name, raw)
        return values

    def final_values(
        self, policy: ActingView, final_state: torch.Tensor, final_obs: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """V(final state, final obs) of the step just taken, from the critics' states after it (for
        the truncation bootstrap; the states are not kept)."""
        values = {}
        for name, record in self.live.items():
            acting = torch.ones_like(record.is_first)
            raw, _ = _critic_step(
                policy, name, final_state, final_obs[name], self._critic_next[name], ~acting, acting
            )
            values[name] = policy.denormalize(name, raw)
        return values

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """After the env step (`distributions` acted at it): keep the stepped states and flag the agents
        whose episode starts next: those that ended, every agent of a copy whose episode ended, and
        every agent of a group whose agents are all out (each ended and has not acted since) with one
        ending here, where the group's episode ends for a team critic as it does in `algo.gae`."""
        over = _on(episode_over, self.device).reshape(-1, 1)
        continuing = ~over
        for name, record in self.live.items():
            group = arrays.groups[name]
            if name in self._actor_next and record.actor_state.numel():  # a feed-forward carry is empty
                record.actor_state.copy_(self._actor_next[name])
            if name in self._critic_next and record.critic_state.numel():
                record.critic_state.copy_(self._critic_next[name])
            done = _either(group.terminated, group.truncated, self.device)
            out = done | (self._out[name] & ~self._acted[name])
            group_over = out.all(-1, keepdim=True) & done.any(-1, keepdim=True)
            record.is_first.copy_(done | over | group_over)
            self._out[name] = out & continuing
        self._actor_next, self._critic_next, self._acted = {}, {}, {}

    def state_dict(self) -> dict[str, Any]:
        """The live flags and states, as CPU tensors keyed by group and field."""
        return {
            name: {
                "is_first": r.is_first.cpu().clone(),
                "actor": r.actor_state.cpu().clone(),
                "critic": r.critic_state.cpu().clone(),
                "out": self._out[name].cpu().clone(),
            }
            for name, r in self.live.items()
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        for name, record in self.live.items():
            saved = state[name]
            for target, key in (
                (record.is_first, "is_first"),
                (record.actor_state, "actor"),
                (record.critic_state, "critic"),
                (self._out[name], "out"),
            ):
                if tuple(saved[key].shape) != tuple(target.shape):
                    raise ValueError(
                        f"saved recurrent {key} state of group '{name}' has shape {tuple(saved[key].shape)}, "
                        f"expected {tuple(target.shape)}"
                    )
                target.copy_(saved[key])
        self._actor_next, self._critic_next, self._acted = {}, {}, {}


def _critic_step(
    policy: ActingView,
    name: str,
    state: torch.Tensor,
    obs: torch.Tensor,
    carried: torch.Tensor,
    is_first: torch.Tensor,
    alive: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of group `name`'s critic: raw values `(E, A_g)` and the stepped state."""
    raw, stepped = policy.critic(
        name, state.unsqueeze(0), obs.unsqueeze(0), carried, is_first.unsqueeze(0), alive.unsqueeze(0)
    )
    return raw[0], stepped


def make_memory(model: TeamModel, num_envs: int, device: torch.device) -> PolicyMemory:
    """The live carries of `model` acting in `num_envs` env copies."""
    return PolicyMemory(model, num_envs, device)
