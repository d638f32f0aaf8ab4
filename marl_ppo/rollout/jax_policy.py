"""A team's actors and critics computed in JAX, on weights read from torch once per update.

A compiled rollout (`rollout.jax_scan`) steps a JaxMARL env and the policy inside one XLA program, so
the policy's forward has to be JAX too. `JaxPolicy` reads the same numbers acting reads
(`models.acting.ActingMLP`: the first layer folded with the input normalisation and the agent id) into
JAX arrays (`params`, a pytree handed to the compiled function as an argument, so new weights need no
new compile) and computes one step of what `ActingView.actor` and `ActingView.critic` compute, with
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
from marl_ppo.models.acting import ActingMLP
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


def _mlp_form(mlp: AgentMLP) -> MlpForm:
    return MlpForm(
        normalized=mlp.norm_weight is not None,
        common_input=mlp.common_input,
        agents=mlp.num_agents,
        activation=ACTIVATION_NAMES[mlp.activation],
        activate_output=mlp.activate_output,
    )


def _net_form(network: GroupActor | GroupCritic) -> NetForm:
    return NetForm(_mlp_form(network.net), recurrent=isinstance(network.core, StackedRecurrent))


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

    def params(self) -> dict[str, GroupParams]:
        """The weights as they are now, copied into JAX arrays (read once per update: later changes
        to the torch parameters do not reach them), moved over in one batch."""
        copies = {
            name: GroupParams(
                self._net_params(self.model.group(name).actor),
                self._net_params(self.model.group(name).critic),
            )
            for name in self.model.group_names()
        }
        return self.jax.device_put(copies)  # type: ignore[no-any-return]

    def _net_params(self, network: GroupActor | GroupCritic) -> NetParams:
        core, head = network.core, network.head
        if not isinstance(core, StackedRecurrent):
            return NetParams(self._mlp_params(network.net), None, None)
        assert isinstance(head, StackedLinear)  # a recurrent network's head (`models.team._network`)
        cell = GruParams(
            input=(self._array(core.weight_ih), self._array(core.bias_ih)),
            carried=(self._array(core.weight_hh), self._array(core.bias_hh)),
        )
        return NetParams(
            self._mlp_params(network.net), cell, (self._array(head.weight), self._array(head.bias))
        )

    def _mlp_params(self, mlp: AgentMLP) -> MlpParams:
        acting = ActingMLP(mlp)
        weight, bias, agent_bias = acting.first
        rest = (
            tuple(layer.weight for layer in mlp.linears[1:]),
            tuple(layer.bias for layer in mlp.linears[1:]),
        )
        return MlpParams(
            first=(self._array(weight), self._array(bias)),
            agent_bias=None if agent_bias is None else self._array(agent_bias),
            rest=tuple((self._array(w), self._array(b)) for w, b in zip(*rest, strict=True)),
        )

    def _array(self, tensor: torch.Tensor) -> Any:
        # a copy: JAX arrays are immutable, while the optimizer updates the parameters in place
        return tensor.detach().to("cpu", torch.float32).numpy().copy()

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
