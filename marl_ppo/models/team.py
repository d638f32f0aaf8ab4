"""The team's networks: one actor module per group (per-agent or shared weights) and the critic per group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import gymnasium as gym
import torch
from torch import nn

from marl_ppo.algo.value_norm import ValueNorm
from marl_ppo.config import ExperimentConfig, ModelConfig
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.distributions import ActionDistribution, head_size, make_distribution
from marl_ppo.models.layers import AgentMLP

CriticInput = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _state_input(state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    return state.unsqueeze(-2).expand(*obs.shape[:-1], state.shape[-1])


def _state_obs_input(state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    return torch.cat([_state_input(state, obs), obs], dim=-1)


def _obs_input(state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
    return obs


CRITIC_INPUTS: dict[str, tuple[CriticInput, Callable[[GroupSpec, int], int]]] = {
    "state": (_state_input, lambda group, state_dim: state_dim),
    "state+obs": (_state_obs_input, lambda group, state_dim: state_dim + group.obs_dim),
    "obs": (_obs_input, lambda group, state_dim: group.obs_dim),
    "team": (_state_input, lambda group, state_dim: state_dim),
}


def _mlp(
    model: ModelConfig, *, agents: int, in_dim: int, out_dim: int, shared: bool, head_gain: float
) -> AgentMLP:
    return AgentMLP(
        num_agents=agents,
        in_dim=in_dim,
        out_dim=out_dim,
        hidden_sizes=model.hidden_sizes,
        activation=model.activation,
        input_layer_norm=model.input_layer_norm,
        shared=shared,
        orthogonal_init=model.orthogonal_init,
        head_gain=head_gain,
        precision=model.precision,
    )


class GroupActor(nn.Module):
    """The policies of one group's agents, evaluated together on `(..., A_g, obs_dim)`."""

    def __init__(
        self, group: GroupSpec, model: ModelConfig, *, shared: bool, library_distributions: bool = False
    ) -> None:
        super().__init__()
        self.action_space = group.action_space
        self.library_distributions = library_distributions
        """Build action distributions from torch.distributions instead of ours (`fast.distributions`)."""
        self.net = _mlp(
            model,
            agents=group.num_agents,
            in_dim=group.obs_dim,
            out_dim=head_size(group.action_space),
            shared=shared,
            head_gain=0.01,
        )
        if isinstance(group.action_space, gym.spaces.Box):
            copies = 1 if shared else group.num_agents
            self.log_std = nn.Parameter(
                torch.full((copies, head_size(group.action_space)), model.log_std_init)
            )
        else:
            self.log_std = None

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor | None = None) -> ActionDistribution:
        """The action distribution of every agent in the group; masked actions get probability 0."""
        return self.forward_encoded(self.encode(obs), action_mask)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The network's input for `obs` (parameter-free: see `AgentMLP.encode`)."""
        return self.net.encode(obs)

    def forward_encoded(
        self, encoded: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> ActionDistribution:
        """`forward` on `encode(obs)`."""
        if action_mask is not None and action_mask.shape[-1] == 0:
            action_mask = None
        output = self.net(encoded, encoded=True)
        return make_distribution(
            self.action_space, output, self.log_std, action_mask, library=self.library_distributions
        )


class GroupCritic(nn.Module):
    """Per-agent values of one group from the configured input (`state`, `state+obs`, `obs` or `team`)."""

    def __init__(
        self, group: GroupSpec, state_dim: int, kind: str, model: ModelConfig, *, shared: bool
    ) -> None:
        super().__init__()
        self.build_input, width = CRITIC_INPUTS[kind]
        self.num_agents = group.num_agents
        self.team = kind == "team"
        """One value per env step, V(state), given to every agent of the group: one network without an
        agent id, run once per row."""
        self.common_input = kind in ("state", "team")
        """Every agent's critic sees the same input: its first layer runs once per row (`forward_common`)."""
        self.net = _mlp(
            model,
            agents=1 if self.team else group.num_agents,
            in_dim=width(group, state_dim),
            out_dim=1,
            shared=shared,
            head_gain=1.0,
        )

    def forward(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Values in the critic's (possibly normalized) units, `(..., A_g)`."""
        return self.forward_encoded(self.encode(state, obs))

    def encode(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The network's input (parameter-free: see `AgentMLP.encode`): `(..., state_dim)` for a
        `state` or `team` critic, whose first layer runs once per row, else `(..., A_g, in)`."""
        return self.net.encode(state if self.common_input else self.build_input(state, obs))

    def forward_encoded(self, encoded: torch.Tensor) -> torch.Tensor:
        """`forward` on `encode(state, obs)`."""
        if not self.common_input:
            return self.net(encoded, encoded=True).squeeze(-1)
        values = self.net.forward_common(encoded, encoded=True).squeeze(-1)
        # a team value, (..., 1), is broadcast to the agents: their gradients sum into it
        return values.expand(*values.shape[:-1], self.num_agents) if self.team else values


class GroupNetworks(NamedTuple):
    """One group's networks."""

    actor: GroupActor
    critic: GroupCritic
    value_norm: ValueNorm


class TeamModel(nn.Module):
    """All actors and critics of a team, with a ValueNorm per group, reached by group name (`group`).

    The networks sit in ModuleLists in the team's group order, which names their weights in
    checkpoints (`actors.0....`)."""

    def __init__(self, spec: TeamSpec, config: ExperimentConfig) -> None:
        super().__init__()
        self.spec = spec
        self.actors = nn.ModuleList(
            GroupActor(
                g,
                config.model,
                shared=config.share_actor,
                library_distributions=not config.fast.distributions,
            )
            for g in spec.groups
        )
        self.critics = nn.ModuleList(
            GroupCritic(g, spec.state_dim, config.critic, config.model, shared=config.share_critic)
            for g in spec.groups
        )
        self.value_norms = nn.ModuleList(
            ValueNorm(enabled=config.ppo.value_norm, var_floor=config.ppo.value_norm_var_floor)
            for _ in spec.groups
        )
        self._names = tuple(g.name for g in spec.groups)
        # plain references to the modules above (not registered twice); the acting and learning
        # loops look groups up by name at every step
        self._groups = {
            name: GroupNetworks(actor, critic, norm)
            for name, actor, critic, norm in zip(
                self._names, self.actors, self.critics, self.value_norms, strict=True
            )
        }

    def group_names(self) -> tuple[str, ...]:
        """The groups' names in the team's group order (the order of actors, critics and value norms)."""
        return self._names

    def group(self, name: str) -> GroupNetworks:
        """The actor, critic and value normalizer of group `name`."""
        return self._groups[name]

    def distributions(
        self, obs: Mapping[str, torch.Tensor], masks: Mapping[str, torch.Tensor | None]
    ) -> dict[str, ActionDistribution]:
        """Per group, one distribution over its agents, respecting the group's action masks."""
        return {name: nets.actor(obs[name], masks[name]) for name, nets in self._groups.items()}

    def raw_values(self, state: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Critic outputs per group, in normalized units when value_norm is on."""
        return {name: nets.critic(state, obs[name]) for name, nets in self._groups.items()}

    def values(self, state: torch.Tensor, obs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Critic values per group in return units."""
        return {
            name: nets.value_norm.denormalize(nets.critic(state, obs[name]))
            for name, nets in self._groups.items()
        }
