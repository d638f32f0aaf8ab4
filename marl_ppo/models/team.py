"""The team's networks: one actor module per group (per-agent or shared weights) and the critic per group."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

import gymnasium as gym
import torch
from torch import nn

from marl_ppo.config import ConfigError, ExperimentConfig, ModelConfig
from marl_ppo.envs.layout import InputLayout, InputPart
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.distributions import ActionDistribution, head_size, make_distribution
from marl_ppo.models.encoders import CnnShape, FeatureEncoder, ReusedFeatures
from marl_ppo.models.layers import AgentMLP, StackedLinear, settled_precision
from marl_ppo.models.recurrent import MemoryLayout, StackedRecurrent, Stateless
from marl_ppo.models.value_norm import ValueNorm

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
    model: ModelConfig,
    *,
    agents: int,
    in_dim: int,
    out_dim: int,
    shared: bool,
    head_gain: float,
    hidden_sizes: tuple[int, ...] | None = None,
    common_input: bool = False,
    activate_output: bool = False,
) -> AgentMLP:
    return AgentMLP(
        num_agents=agents,
        in_dim=in_dim,
        out_dim=out_dim,
        hidden_sizes=model.hidden_sizes if hidden_sizes is None else hidden_sizes,
        activation=model.activation,
        input_layer_norm=model.input_layer_norm,
        shared=shared,
        orthogonal_init=model.orthogonal_init,
        head_gain=head_gain,
        precision=settled_precision(model.precision),
        common_input=common_input,
        activate_output=activate_output,
    )


class NetworkParts(NamedTuple):
    """A network as `net -> core -> head`: the MLP, the carry's core and the output layer.

    Feed-forward: the MLP ends in the output layer, the core is `Stateless` and the head the identity.
    Recurrent: the MLP is the trunk (its last hidden layer, activated, as output), the core the cell."""

    net: AgentMLP
    core: StackedRecurrent | Stateless
    head: StackedLinear | nn.Identity


def _network(
    model: ModelConfig,
    *,
    recurrent: str | None,
    agents: int,
    in_dim: int,
    out_dim: int,
    shared: bool,
    head_gain: float,
    library_cell: bool,
    common_input: bool = False,
) -> NetworkParts:
    """A feed-forward MLP (`recurrent` None), or trunk (the hidden layers, activated) -> `gru` or
    `lstm` cell (`model.recurrent_size`, stepped by torch's own cell where `library_cell`) -> linear
    head."""
    if recurrent is None:
        mlp = _mlp(
            model,
            agents=agents,
            in_dim=in_dim,
            shared=shared,
            common_input=common_input,
            out_dim=out_dim,
            head_gain=head_gain,
        )
        return NetworkParts(mlp, Stateless(), nn.Identity())
    copies = 1 if shared else agents
    trunk = _mlp(
        model,
        agents=agents,
        in_dim=in_dim,
        shared=shared,
        common_input=common_input,
        out_dim=model.hidden_sizes[-1],
        head_gain=math.sqrt(2.0),  # a hidden layer: the trunk's other layers' gain
        hidden_sizes=model.hidden_sizes[:-1],
        activate_output=True,
    )
    core = StackedRecurrent(
        recurrent,
        copies=copies,
        in_dim=model.hidden_sizes[-1],
        hidden=model.recurrent_size,
        orthogonal_init=model.orthogonal_init,
        library_cell=library_cell,
    )
    head = StackedLinear(copies, model.recurrent_size, out_dim)
    if model.orthogonal_init:
        head.reset_orthogonal(head_gain)
    return NetworkParts(trunk, core, head)


def _encoder(model: ModelConfig, layout: InputLayout | None, *, copies: int) -> FeatureEncoder | None:
    """A CNN encoder for an input whose layout has images (None otherwise: the MLP reads the row)."""
    if layout is None or not layout.has_image:
        return None
    return FeatureEncoder(layout, copies=copies, cnn=CnnShape.of(model))


class GroupActor(nn.Module):
    """The policies of one group's agents, evaluated together over a sequence `(L, B, A_g, ...)`.

    One way in for every actor: observations, masks, the carry and the episode flags in; the action
    distributions and the carry after the sequence out. Acting is a sequence of one step. A
    feed-forward actor's carry is empty, `(B, A_g, 0)`, and passes through unchanged.
    """

    def __init__(
        self, group: GroupSpec, model: ModelConfig, *, shared: bool, library_cell: bool = False
    ) -> None:
        """`library_cell`: a recurrent actor steps torch's own cell (`fast.recurrent_cell: false`)."""
        super().__init__()
        self.action_space = group.action_space
        self.features: FeatureEncoder | ReusedFeatures | None = _encoder(
            model, group.obs_layout, copies=1 if shared else group.num_agents
        )
        """The CNN encoder of an image observation, in front of the MLP; None for a vector."""
        in_dim = group.obs_dim if self.features is None else self.features.out_dim
        self.net, self.core, self.head = _network(
            model,
            recurrent=model.recurrent,
            agents=group.num_agents,
            in_dim=in_dim,
            out_dim=head_size(group.action_space),
            shared=shared,
            head_gain=0.01,
            library_cell=library_cell,
        )
        self.log_std: nn.Parameter | None = None
        """The Gaussian's state-independent log standard deviations (Box actions only)."""
        if isinstance(group.action_space, gym.spaces.Box):
            copies = 1 if shared else group.num_agents
            self.log_std = nn.Parameter(
                torch.full((copies, head_size(group.action_space)), model.log_std_init)
            )

    @property
    def carry_size(self) -> int:
        """Numbers in one agent's carry (0 for a feed-forward actor)."""
        return self.core.state_size

    def forward(
        self,
        obs: torch.Tensor,
        action_mask: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[ActionDistribution, torch.Tensor]:
        """The distributions `(L, B, A)` over a sequence of observations `(L, B, A, obs_dim)` from the
        carry `(B, A, S)`, and the carry after it. `is_first` `(L, B, A)`: the agent's episode starts
        at the step (its carry resets first); `acted`: it acts there (its carry advances only then).
        Masked actions (`action_mask` `(L, B, A, mask_dim)`, mask_dim 0 without masks) get probability 0."""
        return self.forward_with(self.net, obs, action_mask, carry, is_first, acted)

    def forward_with(
        self,
        net: Callable[[torch.Tensor], torch.Tensor],
        obs: torch.Tensor,
        action_mask: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[ActionDistribution, torch.Tensor]:
        """`forward` with `net` in the MLP's place: the MLP itself, or acting's form of it
        (`models.acting.ActingMLP`)."""
        features = net(obs if self.features is None else self.features(obs))
        outputs, carry = self.core(features, carry, is_first, acted)
        return self._distribution(self.head(outputs), action_mask), carry

    def _distribution(self, output: torch.Tensor, action_mask: torch.Tensor) -> ActionDistribution:
        mask = None if action_mask.shape[-1] == 0 else action_mask
        return make_distribution(self.action_space, output, self.log_std, mask)


class GroupCritic(nn.Module):
    """Per-agent values of one group from the configured input (`state`, `state+obs`, `obs` or `team`),
    over a sequence `(L, B, ...)`, called as `GroupActor` is: inputs, carry and flags in, values and
    the carry after the sequence out (an empty carry for a feed-forward critic)."""

    def __init__(
        self,
        group: GroupSpec,
        state_dim: int,
        kind: str,
        model: ModelConfig,
        *,
        shared: bool,
        state_layout: InputLayout | None = None,
        library_cell: bool = False,
    ) -> None:
        """`library_cell`: a recurrent critic steps torch's own cell (`fast.recurrent_cell: false`)."""
        super().__init__()
        self.build_input, width = CRITIC_INPUTS[kind]
        self.num_agents = group.num_agents
        self.team = kind == "team"
        """One value per env step, V(state), given to every agent of the group: one network without an
        agent id, run once per row."""
        self.common_input = kind in ("state", "team")
        """Every agent's critic sees the same input: its first layer runs once per row (`AgentMLP`'s
        `common_input`)."""
        self.state_dim = state_dim
        self.images = CriticImages.build(kind, group, state_layout, model, shared=shared or self.team)
        """The CNN encoders of the critic's image inputs; None where its inputs hold no image."""
        in_dim = width(group, state_dim) if self.images is None else self.images.out_dim
        self.net, self.core, self.head = _network(
            model,
            recurrent=model.recurrent if model.critic_recurrent else None,
            agents=1 if self.team else group.num_agents,
            in_dim=in_dim,
            out_dim=1,
            shared=shared,
            head_gain=1.0,
            library_cell=library_cell,
            common_input=self.common_input if self.images is None else self.images.common,
        )

    @property
    def carry_rows(self) -> int:
        """Rows of carry per env copy: the group's agents, or 1 for a team critic."""
        return 1 if self.team else self.num_agents

    @property
    def carry_size(self) -> int:
        """Numbers in one row's carry (0 for a feed-forward critic)."""
        return self.core.state_size

    def forward(
        self,
        state: torch.Tensor,
        obs: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Values `(L, B, A)` in the critic's (possibly normalized) units over a sequence of states
        `(L, B, state_dim)` and observations `(L, B, A, obs_dim)`, from the carry `(B, rows, S)`, and
        the carry after it. A team critic's one row starts afresh where every agent's episode starts
        and advances where any agent acts."""
        return self.forward_with(self.net, state, obs, carry, is_first, acted)

    def forward_with(
        self,
        net: Callable[[torch.Tensor], torch.Tensor],
        state: torch.Tensor,
        obs: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` with `net` in the MLP's place: the MLP itself, or acting's form of it
        (`models.acting.ActingMLP`)."""
        if self.team:
            is_first, acted = is_first.all(-1, keepdim=True), acted.any(-1, keepdim=True)
        outputs, carry = self.core(net(self._features(state, obs)), carry, is_first, acted)
        return self._per_agent(self.head(outputs).squeeze(-1)), carry

    def _features(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        """The MLP's input: the state alone where every agent's critic sees it (`(..., state_dim)`),
        else per agent `(..., A, in)`; with images, the CNN encoders' features."""
        if self.images is None:
            return state if self.common_input else self.build_input(state, obs)
        features: torch.Tensor = self.images(self.images.join(state, obs))
        return features.squeeze(-2) if self.images.common else features

    def _per_agent(self, values: torch.Tensor) -> torch.Tensor:
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
        obs: FeatureEncoder | ReusedFeatures | None,
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
            layout = part_layout if part_layout is not None else _one_vector(size)
            return FeatureEncoder(layout, copies=copies, cnn=CnnShape.of(model))

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
        features: torch.Tensor
        if self.obs is None:
            assert self.state is not None  # `build` makes an encoder for at least one input
            state = joined.unsqueeze(-2)
            if not self.common:
                state = state.expand(*joined.shape[:-1], self.agents, joined.shape[-1])
            features = self.state(state)
            return features
        if self.state is None:
            features = self.obs(joined)
            return features
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
        library_cell = not config.fast.recurrent_cell
        self.actors = nn.ModuleList(
            GroupActor(g, config.model, shared=config.model.share_actor, library_cell=library_cell)
            for g in spec.groups
        )
        self.critics = nn.ModuleList(
            GroupCritic(
                g,
                spec.state_dim,
                config.ppo.critic,
                config.model,
                shared=config.model.share_critic,
                state_layout=spec.state_layout,
                library_cell=library_cell,
            )
            for g in spec.groups
        )
        self.value_norms = nn.ModuleList(
            ValueNorm(enabled=config.ppo.value_norm, var_floor=config.ppo.value_norm_var_floor)
            for _ in spec.groups
        )
        if config.model.shared_cnn:
            for group, actor, critic in zip(spec.groups, self.actors, self.critics, strict=True):
                _share_cnn(group.name, cast(GroupActor, actor), cast(GroupCritic, critic))
        self._names = tuple(g.name for g in spec.groups)
        # plain references to the modules above (not registered twice); the acting and learning
        # loops look groups up by name at every step
        self._groups = {
            name: GroupNetworks(cast(GroupActor, actor), cast(GroupCritic, critic), cast(ValueNorm, norm))
            for name, actor, critic, norm in zip(
                self._names, self.actors, self.critics, self.value_norms, strict=True
            )
        }

    @property
    def recurrent(self) -> bool:
        """Whether the actors (and perhaps the critics) carry a recurrent state."""
        return any(nets.actor.carry_size > 0 for nets in self._groups.values())

    def memory_layout(self) -> dict[str, MemoryLayout]:
        """Per group, the sizes of the carries a rollout stores (zero for feed-forward networks)."""
        return {
            name: MemoryLayout(nets.actor.carry_size, nets.critic.carry_rows, nets.critic.carry_size)
            for name, nets in self._groups.items()
        }

    def critic_parameters(self) -> list[nn.Parameter]:
        """The critics' parameters that are not the actors' (a shared CNN learns with the actors)."""
        actors = {id(p) for p in self.actors.parameters()}
        return [p for p in self.critics.parameters() if id(p) not in actors]

    def group_names(self) -> tuple[str, ...]:
        """The groups' names in the team's group order (the order of actors, critics and value norms)."""
        return self._names

    def group(self, name: str) -> GroupNetworks:
        """The actor, critic and value normalizer of group `name`."""
        return self._groups[name]


def _share_cnn(name: str, actor: GroupActor, critic: GroupCritic) -> None:
    """Give the critic the actor's CNN of the observations (`model.shared_cnn`), evaluated once for both."""
    if actor.features is None or critic.images is None or critic.images.obs is None:
        raise ConfigError(
            f"model.shared_cnn=true but group '{name}' observes no image for a CNN to share; "
            "set model.shared_cnn=false"
        )
    assert isinstance(actor.features, FeatureEncoder)
    reused = ReusedFeatures(actor.features)
    actor.features = reused
    critic.images.obs = reused
