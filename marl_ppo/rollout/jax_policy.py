"""A team's actors and critics computed in JAX, on weights read from torch or handed over by the JAX learner.

A compiled rollout (`rollout.jax_scan`) steps a JaxMARL env and the policy inside one XLA program, so
the policy's forward has to be JAX too. `JaxPolicy.weights` reads the networks' parameters as torch
holds them into JAX arrays (a pytree handed to the compiled function as an argument, so new weights
need no new compile), or takes them from JAX arrays already holding their new values (the JAX
learner's outputs, `weights(new)`); `fold` turns them, inside the program, into the numbers acting
reads (`AgentMLP.first_layer`: the first layer folded with the input LayerNorm's affine map, the
agent-id columns split off as a per-agent bias), and the forward computes one step of what
`ActingView.actor` and `ActingView.critic` compute, with
Discrete actions: per group the masked, normalised logits of a Categorical and the critic's values in
its own units (`ValueNorm.denormalize` stays in torch, applied to the whole rollout at once).

Each network is `mlp -> core -> head` as `models.team.NetworkParts` builds it. A feed-forward network is
its MLP alone and its carry `(..., rows, 0)` passes through unchanged; a GRU network's MLP is its trunk
(the last layer activated), then torch's GRU cell equations (`StackedRecurrent.cell`, gate order r, z,
n) on the carry, zeroed first where `is_first` (an episode starts there), then the linear head. Every
agent of a JaxMARL env acts at every step, so the carry always advances. A team critic's one row starts
afresh where every agent's episode starts, as `GroupCritic` resets it.

Every other network (LSTM, CNN, Box or MultiDiscrete actions, bf16) is refused: `unsupported_reason`
(`plan.compiled`, where the run's plan reads it) gives the one-line reason, and `JaxPolicy` raises
`NotCompilable` with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from marl_ppo.envs.jax.runtime import jax_modules
from marl_ppo.models.distributions import MASKED_LOGIT
from marl_ppo.models.layers import AgentMLP, StackedLinear
from marl_ppo.models.recurrent import StackedRecurrent
from marl_ppo.models.team import CRITIC_INPUTS, GroupActor, GroupCritic, TeamModel
from marl_ppo.plan.compiled import ACTIVATION_NAMES, unsupported_reason


class NotCompilable(ValueError):
    """The model has a network the JAX forward does not cover; the message is the one-line reason."""


@dataclasses.dataclass(frozen=True)
class MlpForm:
    """What an MLP's forward does besides its weights (static: part of the compiled program)."""

    normalized: bool
    """The input passes through a LayerNorm without affine first (`AgentMLP.normalized`)."""
    in_dim: int
    """The input's width (the first layer's columns after it are the agent id's)."""
    agent_id: bool
    """The first layer reads a one-hot agent id after the input (`AgentMLP.add_agent_id`)."""
    common_input: bool
    """The input is one row every agent sees, `(..., in)`, rather than one per agent."""
    agents: int
    activation: str
    activate_output: bool
    """The last layer is a hidden layer (a recurrent network's trunk): activated like the others."""


class MlpParams(NamedTuple):
    """An MLP's weights as acting's products read them, each layer `(copies, out, in)` and `(copies, out)`
    (copies 1: one map for every agent), and the first layer's `(A, out)` agent-id bias or None."""

    first: tuple[Any, Any]
    agent_bias: Any
    rest: tuple[tuple[Any, Any], ...]


@dataclasses.dataclass(frozen=True)
class NetForm:
    """A network's static form: its MLP's, and whether a GRU core and a linear head follow it."""

    mlp: MlpForm
    recurrent: bool


class GruParams(NamedTuple):
    """A GRU cell's weights as `StackedRecurrent` holds them: `(copies, 3 * hidden, in)` and
    `(copies, 3 * hidden)` for the input's product, the same with `hidden` inputs for the carry's."""

    input: tuple[Any, Any]
    carried: tuple[Any, Any]


class NetParams(NamedTuple):
    """A network's weights: its MLP, and for a recurrent network its cell and head (None without)."""

    mlp: MlpParams
    cell: GruParams | None
    head: tuple[Any, Any] | None


class MlpWeights(NamedTuple):
    """An MLP's parameters as torch holds them: each layer's `(copies, out, in)` weight and `(copies,
    out)` bias (the first layer's inputs followed by the agent-id columns where it reads one), and the
    input LayerNorm's `(copies, in)` weight and bias, or None."""

    layers: tuple[tuple[Any, Any], ...]
    norm: tuple[Any, Any] | None


class NetWeights(NamedTuple):
    """A network's parameters as torch holds them (`NetParams` before `JaxPolicy.fold`)."""

    mlp: MlpWeights
    cell: GruParams | None
    head: tuple[Any, Any] | None


@dataclasses.dataclass(frozen=True)
class GroupForm:
    """One group's actor and critic forms and how its critic reads its input."""

    actor: NetForm
    critic: NetForm
    critic_input: str
    """`ppo.critic`: `state`, `state+obs`, `obs` or `team`."""
    agents: int


class GroupParams(NamedTuple):
    """One group's actor and critic weights."""

    actor: NetParams
    critic: NetParams


class GroupWeights(NamedTuple):
    """One group's actor and critic parameters as torch holds them (`GroupParams` before `fold`)."""

    actor: NetWeights
    critic: NetWeights


def _mlp_form(mlp: AgentMLP) -> MlpForm:
    return MlpForm(
        normalized=mlp.norm_weight is not None,
        in_dim=mlp.in_dim,
        agent_id=mlp.add_agent_id,
        common_input=mlp.common_input,
        agents=mlp.num_agents,
        activation=ACTIVATION_NAMES[mlp.activation],
        activate_output=mlp.activate_output,
    )


def _net_form(network: GroupActor | GroupCritic) -> NetForm:
    return NetForm(_mlp_form(network.net), recurrent=isinstance(network.core, StackedRecurrent))


def _net_tensors(network: GroupActor | GroupCritic) -> NetWeights:
    """A network's parameters as `NetWeights` of the torch tensors themselves."""
    mlp, core, head = network.net, network.core, network.head
    norm = None
    if mlp.norm_weight is not None and mlp.norm_bias is not None:
        norm = (mlp.norm_weight, mlp.norm_bias)
    weights = MlpWeights(tuple((layer.weight, layer.bias) for layer in mlp.linears), norm)
    if not isinstance(core, StackedRecurrent):
        return NetWeights(weights, None, None)
    assert isinstance(head, StackedLinear)  # a recurrent network's head (`models.team._network`)
    cell = GruParams(input=(core.weight_ih, core.bias_ih), carried=(core.weight_hh, core.bias_hh))
    return NetWeights(weights, cell, (head.weight, head.bias))


def _critic_input(model: TeamModel, name: str) -> str:
    critic = model.group(name).critic
    if critic.team:
        return "team"
    if critic.common_input:
        return "state"
    return "state+obs" if critic.build_input is CRITIC_INPUTS["state+obs"][0] else "obs"


class JaxPolicy:
    """`model`'s groups as JAX computes them: `params()` reads the current weights, the methods are pure
    functions of those params and the step's arrays, to call inside `jax.jit`."""

    def __init__(self, model: TeamModel) -> None:
        """Raises `NotCompilable` (with `unsupported_reason`'s line) for a model it does not cover."""
        reason = unsupported_reason(model)
        if reason is not None:
            raise NotCompilable(reason)
        self.jax, self.jnp = jax_modules()
        self.model = model
        self.forms = {
            name: GroupForm(
                actor=_net_form(model.group(name).actor),
                critic=_net_form(model.group(name).critic),
                critic_input=_critic_input(model, name),
                agents=model.group(name).actor.net.num_agents,
            )
            for name in model.group_names()
        }

    def tensors(self) -> dict[str, GroupWeights]:
        """The torch parameters the forward reads, per group (the leaves of `weights()`)."""
        return {
            name: GroupWeights(
                _net_tensors(self.model.group(name).actor), _net_tensors(self.model.group(name).critic)
            )
            for name in self.model.group_names()
        }

    def weights(self, new: Mapping[int, Any] | None = None) -> dict[str, GroupWeights]:
        """The parameters as JAX arrays, moved over in one batch: copies of the torch tensors as they are
        now (later changes to them do not reach the copies), or where `new` has an array under a
        tensor's `id`, that array (the value the tensor is about to take)."""
        new = new or {}

        def array(tensor: torch.Tensor) -> Any:
            if id(tensor) in new:
                return new[id(tensor)]
            # a copy: JAX arrays are immutable, while the optimizer updates the parameters in place
            return tensor.detach().to("cpu", torch.float32).numpy().copy()

        return self.jax.device_put(self.jax.tree.map(array, self.tensors()))  # type: ignore[no-any-return]

    def holds(self, weights: Mapping[str, GroupWeights]) -> bool:
        """Whether the torch parameters equal `weights` (a rollout run on them is the one they would run)."""
        pairs = zip(self.jax.tree.leaves(self.tensors()), self.jax.tree.leaves(weights), strict=True)
        return all(torch.equal(tensor.detach().cpu(), torch.from_dlpack(array)) for tensor, array in pairs)

    def params(self) -> dict[str, GroupParams]:
        """The current weights as the forward reads them (`fold(weights())`), for calls outside a program."""
        return self.fold(self.weights())

    def fold(self, weights: Mapping[str, GroupWeights]) -> dict[str, GroupParams]:
        """The parameters as the forward reads them: each MLP's first layer as `AgentMLP.first_layer`
        gives it (folded with the LayerNorm's affine map, its agent-id columns an `(A, out)` bias);
        pure JAX, to call at the start of a compiled program."""
        return {
            name: GroupParams(
                self._fold_net(form.actor, weights[name].actor),
                self._fold_net(form.critic, weights[name].critic),
            )
            for name, form in self.forms.items()
        }

    def _fold_net(self, form: NetForm, weights: NetWeights) -> NetParams:
        mlp, (first_weight, first_bias) = form.mlp, weights.mlp.layers[0]
        weight, bias = first_weight[..., : mlp.in_dim], first_bias
        if weights.mlp.norm is not None:
            norm_weight, norm_bias = weights.mlp.norm
            bias = bias + (weight @ norm_bias[..., None])[..., 0]
            weight = weight * norm_weight[:, None, :]
        agent_bias = first_weight[0, :, mlp.in_dim :].T if mlp.agent_id else None
        folded = MlpParams((weight, bias), agent_bias, tuple(weights.mlp.layers[1:]))
        return NetParams(folded, weights.cell, weights.head)

    def mlp(self, form: MlpForm, params: MlpParams, x: Any) -> Any:
        """`ActingMLP`'s output `(..., A, out)` for `x` `(..., A, in)`, or `(..., in)` with `common_input`."""
        jnp = self.jnp
        if form.normalized:
            mean = x.mean(-1, keepdims=True)
            var = jnp.square(x - mean).mean(-1, keepdims=True)
            x = (x - mean) / jnp.sqrt(var + 1e-5)  # F.layer_norm's eps
        weight, bias = params.first
        if form.common_input:
            h = _linear(jnp, x[..., None, :], weight, bias, common=True)
            h = jnp.broadcast_to(h, (*h.shape[:-2], form.agents, h.shape[-1]))
        else:
            h = _linear(jnp, x, weight, bias, common=False)
        if params.agent_bias is not None:
            h = h + params.agent_bias
        for layer_weight, layer_bias in params.rest:
            h = _linear(jnp, _activate(jnp, form.activation, h), layer_weight, layer_bias, common=False)
        return _activate(jnp, form.activation, h) if form.activate_output else h

    def net(self, form: NetForm, params: NetParams, x: Any, carry: Any, is_first: Any) -> tuple[Any, Any]:
        """One step of a network: its output `(..., rows, out)` and the carry after the step. `carry`
        `(..., rows, S)` is the carry into the step, `is_first` `(..., rows)` where it resets first (a
        feed-forward network's carry, `S = 0`, is returned as it came)."""
        h = self.mlp(form.mlp, params.mlp, x)
        if not form.recurrent:
            return h, carry
        assert params.cell is not None and params.head is not None
        state = self.gru(params.cell, h, self.jnp.where(is_first[..., None], 0.0, carry))
        weight, bias = params.head
        return _linear(self.jnp, state, weight, bias, common=False), state

    def gru(self, cell: GruParams, x: Any, h: Any) -> Any:
        """`StackedRecurrent.cell`'s GRU step: the next carry `(..., A, hidden)` from the input `x`
        `(..., A, in)` and the carry `h`."""
        jax, jnp = self.jax, self.jnp
        in_r, in_z, in_n = jnp.split(_linear(jnp, x, *cell.input, common=False), 3, axis=-1)
        h_r, h_z, h_n = jnp.split(_linear(jnp, h, *cell.carried, common=False), 3, axis=-1)
        reset = jax.nn.sigmoid(in_r + h_r)
        update = jax.nn.sigmoid(in_z + h_z)
        candidate = jnp.tanh(in_n + reset * h_n)
        return (1.0 - update) * candidate + update * h

    def logits(
        self,
        name: str,
        params: Mapping[str, GroupParams],
        obs: Any,
        mask: Any | None,
        carry: Any,
        is_first: Any,
    ) -> tuple[Any, Any]:
        """Group `name`'s Categorical logits `(..., A, n)`, normalised (log-probabilities, as
        `Categorical.logits`), masked actions at `MASKED_LOGIT` before normalising: probability 0; and
        the actor's carry after the step (`carry` `(..., A, S)`, reset where `is_first` `(..., A)`)."""
        jnp, jax = self.jnp, self.jax
        raw, carry = self.net(self.forms[name].actor, params[name].actor, obs, carry, is_first)
        if mask is not None and mask.shape[-1]:
            raw = jnp.where(mask, raw, jnp.float32(MASKED_LOGIT))
        return raw - jax.nn.logsumexp(raw, axis=-1, keepdims=True), carry

    def values(
        self, name: str, params: Mapping[str, GroupParams], state: Any, obs: Any, carry: Any, is_first: Any
    ) -> tuple[Any, Any]:
        """Group `name`'s critic values `(..., A)` in the critic's units (before `ValueNorm.denormalize`),
        from the team state `(..., S)` and the group's observations `(..., A, D)`, and the critic's carry
        after the step (`carry` `(..., rows, S_c)`, reset where `is_first` `(..., A)`: for a team
        critic's one row, where every agent's is)."""
        jnp, form = self.jnp, self.forms[name]
        if form.critic_input in ("state", "team"):
            x = state
        elif form.critic_input == "obs":
            x = obs
        else:
            shared = jnp.broadcast_to(state[..., None, :], (*obs.shape[:-1], state.shape[-1]))
            x = jnp.concatenate([shared, obs], axis=-1)
        if form.critic_input == "team":
            is_first = is_first.all(-1, keepdims=True)
        out, carry = self.net(form.critic, params[name].critic, x, carry, is_first)
        out = out[..., 0]
        return jnp.broadcast_to(out, (*out.shape[:-1], form.agents)), carry

    def sample(self, key: Any, logits: Any) -> tuple[Any, Any]:
        """Actions `(..., A)` drawn from normalised `logits` with `key`, and their log-probabilities."""
        jax, jnp = self.jax, self.jnp
        actions = jax.random.categorical(key, logits, axis=-1)
        return actions, log_prob(jnp, logits, actions)


def log_prob(jnp: Any, logits: Any, actions: Any) -> Any:
    """The log-probabilities `(..., A)` of integer `actions` under normalised `logits` `(..., A, n)`."""
    return jnp.take_along_axis(logits, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _linear(jnp: Any, x: Any, weight: Any, bias: Any, *, common: bool) -> Any:
    """`x @ W.T + b` with `(copies, out, in)` weights: one map (copies 1) or one per agent on `x`'s
    agent axis; `common`: `x` is `(..., 1, in)`, the same row for every copy's map."""
    if weight.shape[0] == 1:
        return x @ weight[0].T + bias[0]
    if common:
        return jnp.einsum("...i,aoi->...ao", x[..., 0, :], weight) + bias
    return jnp.einsum("...ai,aoi->...ao", x, weight) + bias


def _activate(jnp: Any, name: str, h: Any) -> Any:
    return jnp.tanh(h) if name == "tanh" else jnp.maximum(h, 0)
