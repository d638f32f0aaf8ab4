"""The team's networks: one actor module per group (per-agent or shared weights) and the critic per group."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import gymnasium as gym
import torch
from torch import nn

from marl_ppo.algo.value_norm import ValueNorm
from marl_ppo.config import ExperimentConfig, ModelConfig
from marl_ppo.envs.layout import InputLayout, InputPart
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.distributions import ActionDistribution, head_size, make_distribution
from marl_ppo.models.encoders import FeatureEncoder
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


def _encoder(model: ModelConfig, layout: InputLayout | None, *, copies: int) -> FeatureEncoder | None:
    """A CNN encoder for an input whose layout has images (None otherwise: the MLP reads the row)."""
    if layout is None or not layout.has_image:
        return None
    return FeatureEncoder(
        layout,
        copies=copies,
        channels=model.cnn_channels,
        kernels=model.cnn_kernels,
        strides=model.cnn_strides,
        features=model.cnn_features,
        orthogonal_init=model.orthogonal_init,
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
        self.features = _encoder(model, group.obs_layout, copies=1 if shared else group.num_agents)
        """The CNN encoder of an image observation, in front of the MLP; None for a vector."""
        self.net = _mlp(
            model,
            agents=group.num_agents,
            in_dim=group.obs_dim if self.features is None else self.features.out_dim,
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
        """The network's input for `obs` (parameter-free: see `AgentMLP.encode`); with a CNN encoder,
        whose parameters learn, `obs` itself (the encoder runs in `forward_encoded`)."""
        return obs if self.features is not None else self.net.encode(obs)

    def forward_encoded(
        self, encoded: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> ActionDistribution:
        """`forward` on `encode(obs)`."""
        if action_mask is not None and action_mask.shape[-1] == 0:
            action_mask = None
        if self.features is not None:
            encoded = self.net.encode(self.features(encoded))
        output = self.net(encoded, encoded=True)
        return make_distribution(
            self.action_space, output, self.log_std, action_mask, library=self.library_distributions
        )


class GroupCritic(nn.Module):
    """Per-agent values of one group from the configured input (`state`, `state+obs`, `obs` or `team`)."""

    def __init__(
        self,
        group: GroupSpec,
        state_dim: int,
        kind: str,
        model: ModelConfig,
        *,
        shared: bool,
        state_layout: InputLayout | None = None,
    ) -> None:
        super().__init__()
        self.build_input, width = CRITIC_INPUTS[kind]
        self.num_agents = group.num_agents
        self.team = kind == "team"
        """One value per env step, V(state), given to every agent of the group: one network without an
        agent id, run once per row."""
        self.common_input = kind in ("state", "team")
        """Every agent's critic sees the same input: its first layer runs once per row (`forward_common`)."""
        self.state_dim = state_dim
        self.images = CriticImages.build(kind, group, state_layout, model, shared=shared or self.team)
        """The CNN encoders of the critic's image inputs; None where its inputs hold no image."""
        self.net = _mlp(
            model,
            agents=1 if self.team else group.num_agents,
            in_dim=width(group, state_dim) if self.images is None else self.images.out_dim,
            out_dim=1,
            shared=shared,
            head_gain=1.0,
        )

    def forward(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """Values in the critic's (possibly normalized) units, `(..., A_g)`."""
        return self.forward_encoded(self.encode(state, obs))

    def encode(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The network's input (parameter-free: see `AgentMLP.encode`): `(..., state_dim)` for a
        `state` or `team` critic, whose first layer runs once per row, else `(..., A_g, in)`. With CNN
        encoders, the raw inputs in one tensor (see `CriticImages.join`)."""
        if self.images is not None:
            return self.images.join(state, obs)
        return self.net.encode(state if self.common_input else self.build_input(state, obs))

    def forward_encoded(self, encoded: torch.Tensor) -> torch.Tensor:
        """`forward` on `encode(state, obs)`."""
        if self.images is not None:
            features = self.net.encode(self.images(encoded))
            if self.images.common:
                values = self.net.forward_common(features.squeeze(-2), encoded=True).squeeze(-1)
            else:
                values = self.net(features, encoded=True).squeeze(-1)
            return values.expand(*values.shape[:-1], self.num_agents) if self.team else values
        if not self.common_input:
            return self.net(encoded, encoded=True).squeeze(-1)
        values = self.net.forward_common(encoded, encoded=True).squeeze(-1)
        # a team value, (..., 1), is broadcast to the agents: their gradients sum into it
        return values.expand(*values.shape[:-1], self.num_agents) if self.team else values


class CriticImages(nn.Module):
    """The critic's CNN encoders: the state's and the observation's, as its input kind reads them.

    Its input travels through the update as one tensor (`join`): the state `(..., S)` for a `state`
    or `team` critic, the observations `(..., A, D)` for `obs`, and for `state+obs` the state followed
    by the A observations in one row `(..., S + A * D)` (the state is not copied per agent).
    """

    def __init__(
        self,
        state: FeatureEncoder | None,
        obs: FeatureEncoder | None,
        *,
        state_dim: int,
        agents: int,
        common: bool,
    ) -> None:
        super().__init__()
        self.state, self.obs = state, obs
        self.state_dim, self.agents = state_dim, agents
        self.common = common
        """The features are one row shared by every agent (`(..., 1, F)`, first layer run once)."""
        self.out_dim = (0 if state is None else state.out_dim) + (0 if obs is None else obs.out_dim)

    @classmethod
    def build(
        cls, kind: str, group: GroupSpec, layout: InputLayout | None, model: ModelConfig, *, shared: bool
    ) -> CriticImages | None:
        """The encoders of a critic of `kind`, or None where none of its inputs is an image."""
        reads_state, reads_obs = kind != "obs", kind in ("obs", "state+obs")
        images = (reads_state and layout is not None and layout.has_image) or (
            reads_obs and group.obs_layout is not None and group.obs_layout.has_image
        )
        if not images:
            return None
        copies = 1 if shared else group.num_agents

        def encoder(part_layout: InputLayout | None, size: int, copies: int) -> FeatureEncoder:
            return FeatureEncoder(
                part_layout if part_layout is not None else _one_vector(size),
                copies=copies,
                channels=model.cnn_channels,
                kernels=model.cnn_kernels,
                strides=model.cnn_strides,
                features=model.cnn_features,
                orthogonal_init=model.orthogonal_init,
            )

        state_dim = 0 if layout is None else layout.size
        common = kind in ("state", "team") and copies == 1
        return cls(
            encoder(layout, state_dim, copies) if reads_state else None,
            encoder(group.obs_layout, group.obs_dim, copies) if reads_obs else None,
            state_dim=state_dim,
            agents=group.num_agents,
            common=common,
        )

    def join(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The critic's raw inputs as one tensor with a leading row axis (see the class)."""
        if self.obs is None:
            return state
        if self.state is None:
            return obs
        flat = obs.flatten(-2)
        if state.dtype != flat.dtype:
            state, flat = state.float(), flat.float()
        return torch.cat([state, flat], dim=-1)

    def forward(self, joined: torch.Tensor) -> torch.Tensor:
        """Features `(..., A, out_dim)`, or `(..., 1, out_dim)` where `common`."""
        if self.obs is None:
            state = joined.unsqueeze(-2)
            if not self.common:
                state = state.expand(*joined.shape[:-1], self.agents, joined.shape[-1])
            return self.state(state)
        if self.state is None:
            return self.obs(joined)
        state, obs = joined[..., : self.state_dim].unsqueeze(-2), joined[..., self.state_dim :]
        obs = obs.unflatten(-1, (self.agents, -1))
        if self.state.copies > 1:  # per-agent weights: each agent's encoder reads the state
            state = state.expand(*obs.shape[:-1], state.shape[-1])
        state_features = self.state(state)  # shared weights: once per row, then given to every agent
        state_features = state_features.expand(*obs.shape[:-1], state_features.shape[-1])
        return torch.cat([state_features, self.obs(obs)], dim=-1)


def _one_vector(size: int) -> InputLayout:
    """The layout of an input without images: one vector part."""
    return InputLayout((InputPart(0, size),))


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
            GroupCritic(
                g,
                spec.state_dim,
                config.critic,
                config.model,
                shared=config.share_critic,
                state_layout=spec.state_layout,
            )
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
