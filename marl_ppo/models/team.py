"""The team's networks: one actor module per group (per-agent or shared weights) and the critic per group."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import gymnasium as gym
import torch
from torch import nn

from marl_ppo.config import ExperimentConfig, ModelConfig
from marl_ppo.envs.layout import InputLayout, InputPart
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.distributions import ActionDistribution, head_size, make_distribution
from marl_ppo.models.encoders import CnnShape, FeatureEncoder
from marl_ppo.models.layers import AgentMLP, StackedLinear
from marl_ppo.models.recurrent import MemoryLayout, StackedRecurrent
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
        precision=model.precision,
    )


class RecurrentParts(NamedTuple):
    """A recurrent network: the MLP trunk (its last hidden layer as output), the cell and the head."""

    trunk: AgentMLP
    core: StackedRecurrent
    head: StackedLinear


def _recurrent(
    model: ModelConfig, *, agents: int, in_dim: int, out_dim: int, shared: bool, head_gain: float
) -> RecurrentParts:
    """trunk (the hidden layers, activated) -> recurrent cell (`model.recurrent_size`) -> linear head."""
    copies = 1 if shared else agents
    trunk = _mlp(
        model,
        agents=agents,
        in_dim=in_dim,
        out_dim=model.hidden_sizes[-1],
        shared=shared,
        head_gain=math.sqrt(2.0),  # a hidden layer: the trunk's other layers' gain
        hidden_sizes=model.hidden_sizes[:-1],
    )
    core = StackedRecurrent(
        model.recurrent,
        copies=copies,
        in_dim=model.hidden_sizes[-1],
        hidden=model.recurrent_size,
        orthogonal_init=model.orthogonal_init,
    )
    head = StackedLinear(copies, model.recurrent_size, out_dim)
    if model.orthogonal_init:
        head.reset_orthogonal(head_gain)
    return RecurrentParts(trunk, core, head)


def _encoder(model: ModelConfig, layout: InputLayout | None, *, copies: int) -> FeatureEncoder | None:
    """A CNN encoder for an input whose layout has images (None otherwise: the MLP reads the row)."""
    if layout is None or not layout.has_image:
        return None
    return FeatureEncoder(layout, copies=copies, cnn=CnnShape.of(model))


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
        in_dim = group.obs_dim if self.features is None else self.features.out_dim
        sizes = dict(agents=group.num_agents, in_dim=in_dim, out_dim=head_size(group.action_space))
        self.core: StackedRecurrent | None = None
        """The recurrent cell between `net` (then the trunk) and `head`; None: feed-forward."""
        self.head: StackedLinear | None = None
        if model.recurrent is None:
            self.net = _mlp(model, **sizes, shared=shared, head_gain=0.01)
        else:
            self.net, self.core, self.head = _recurrent(model, **sizes, shared=shared, head_gain=0.01)
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
        if self.core is not None:
            raise TypeError("a recurrent actor needs its state: call unroll_encoded")
        return self._distribution(self.net(self._mlp_input(encoded), encoded=True), action_mask)

    def _mlp_input(self, encoded: torch.Tensor) -> torch.Tensor:
        """The MLP's encoded input: `encoded` itself, or the CNN encoder's features of the raw rows."""
        return encoded if self.features is None else self.net.encode(self.features(encoded))

    @property
    def state_size(self) -> int:
        """Numbers in one agent's recurrent state (0 for a feed-forward actor)."""
        return 0 if self.core is None else self.core.state_size

    def unroll_encoded(
        self,
        encoded: torch.Tensor,
        action_mask: torch.Tensor | None,
        state: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[ActionDistribution, torch.Tensor]:
        """The distributions over a sequence `(L, B, A, in)` of encoded observations, from `state`
        `(B, A, S)`, and the state after it (see `StackedRecurrent.unroll` for `is_first` and `acted`)."""
        outputs, state = self._unroll_outputs(encoded, state, is_first, acted)
        return self._distribution(outputs, action_mask), state

    def step_encoded(
        self,
        encoded: torch.Tensor,
        action_mask: torch.Tensor | None,
        state: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[ActionDistribution, torch.Tensor]:
        """One step of `unroll_encoded` on `(B, A, ...)` inputs: the distributions `(B, A)` and the state."""
        outputs, state = self._unroll_outputs(
            encoded.unsqueeze(0), state, is_first.unsqueeze(0), acted.unsqueeze(0)
        )
        return self._distribution(outputs[0], action_mask), state

    def _unroll_outputs(
        self, encoded: torch.Tensor, state: torch.Tensor, is_first: torch.Tensor, acted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.net.activation(self.net(self._mlp_input(encoded), encoded=True))
        outputs, state = self.core.unroll(features, state, is_first, acted)
        return self.head(outputs), state

    def _distribution(self, output: torch.Tensor, action_mask: torch.Tensor | None) -> ActionDistribution:
        if action_mask is not None and action_mask.shape[-1] == 0:
            action_mask = None
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
        in_dim = width(group, state_dim) if self.images is None else self.images.out_dim
        sizes = dict(agents=1 if self.team else group.num_agents, in_dim=in_dim, out_dim=1)
        self.core: StackedRecurrent | None = None
        """The recurrent cell between `net` (then the trunk) and `head`; None: feed-forward."""
        self.head: StackedLinear | None = None
        if model.critic_recurrent:
            self.net, self.core, self.head = _recurrent(model, **sizes, shared=shared, head_gain=1.0)
        else:
            self.net = _mlp(model, **sizes, shared=shared, head_gain=1.0)

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
        if self.core is not None:
            raise TypeError("a recurrent critic needs its state: call unroll_encoded")
        return self._per_agent(self._trunk(encoded).squeeze(-1))

    @property
    def state_rows(self) -> int:
        """Rows of recurrent state per env copy: the group's agents, or 1 for a team critic."""
        return 1 if self.team else self.num_agents

    @property
    def state_size(self) -> int:
        """Numbers in one row's recurrent state (0 for a feed-forward critic)."""
        return 0 if self.core is None else self.core.state_size

    def unroll_encoded(
        self, encoded: torch.Tensor, state: torch.Tensor, is_first: torch.Tensor, acted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Values `(L, B, A)` over a sequence of encoded inputs from `state` `(B, rows, S)`, and the
        state after it. A team critic's one row starts afresh where every agent's episode starts and
        advances where any agent acts. A feed-forward critic returns `state` unchanged."""
        if self.core is None:
            return self.forward_encoded(encoded), state
        if self.team:
            is_first, acted = is_first.all(-1, keepdim=True), acted.any(-1, keepdim=True)
        features = self.net.activation(self._trunk(encoded))
        outputs, state = self.core.unroll(features, state, is_first, acted)
        return self._per_agent(self.head(outputs).squeeze(-1)), state

    def _trunk(self, encoded: torch.Tensor) -> torch.Tensor:
        """The MLP on the encoded input (through the CNN encoders first, where there are images),
        `(..., A or 1, out)`."""
        if self.images is not None:
            features = self.net.encode(self.images(encoded))
            if self.images.common:
                return self.net.forward_common(features.squeeze(-2), encoded=True)
            return self.net(features, encoded=True)
        if not self.common_input:
            return self.net(encoded, encoded=True)
        return self.net.forward_common(encoded, encoded=True)

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
        for module in self.modules():  # `fast.recurrent_cell`: our stacked step or torch's cells
            if isinstance(module, StackedRecurrent):
                module.library_cell = not config.fast.recurrent_cell
        self._names = tuple(g.name for g in spec.groups)
        # plain references to the modules above (not registered twice); the acting and learning
        # loops look groups up by name at every step
        self._groups = {
            name: GroupNetworks(actor, critic, norm)
            for name, actor, critic, norm in zip(
                self._names, self.actors, self.critics, self.value_norms, strict=True
            )
        }

    @property
    def recurrent(self) -> bool:
        """Whether the actors (and perhaps the critics) carry a recurrent state."""
        return any(actor.core is not None for actor in self.actors)

    def memory_layout(self) -> dict[str, MemoryLayout]:
        """Per group, the sizes of the recurrent states a rollout stores (empty without recurrence)."""
        if not self.recurrent:
            return {}
        return {
            name: MemoryLayout(nets.actor.state_size, nets.critic.state_rows, nets.critic.state_size)
            for name, nets in self._groups.items()
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
