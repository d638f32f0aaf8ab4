"""A team's feed-forward actors and critics computed in JAX, on weights read from torch once per update.

A compiled rollout (`rollout.jax_scan`) steps a JaxMARL env and the policy inside one XLA program, so
the policy's forward has to be JAX too. `JaxPolicy` reads the same numbers acting reads
(`models.acting.ActingMLP`: the first layer folded with the input normalisation and the agent id) into
JAX arrays (`params`, a pytree handed to the compiled function as an argument, so new weights need no
new compile) and computes what `ActingView.actor` and `ActingView.critic` compute for feed-forward
MLPs with Discrete actions: per group the masked, normalised logits of a Categorical and the critic's
values in its own units (`ValueNorm.denormalize` stays in torch, applied to the whole rollout at once).

Every other network (recurrent, CNN, Box or MultiDiscrete actions, bf16) is refused:
`unsupported_reason` (`plan.compiled`, where the run's plan reads it) gives the one-line reason, and
`JaxPolicy` raises `NotCompilable` with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from marl_ppo.envs.jax.runtime import jax_modules
from marl_ppo.models.acting import ActingMLP
from marl_ppo.models.distributions import MASKED_LOGIT
from marl_ppo.models.layers import AgentMLP
from marl_ppo.models.team import CRITIC_INPUTS, TeamModel
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


class MlpParams(NamedTuple):
    """An MLP's weights as acting's products read them, each layer `(copies, out, in)` and `(copies, out)`
    (copies 1: one map for every agent), and the first layer's `(A, out)` agent-id bias or None."""

    first: tuple[Any, Any]
    agent_bias: Any
    rest: tuple[tuple[Any, Any], ...]


@dataclasses.dataclass(frozen=True)
class GroupForm:
    """One group's actor and critic forms and how its critic reads its input."""

    actor: MlpForm
    critic: MlpForm
    critic_input: str
    """`ppo.critic`: `state`, `state+obs`, `obs` or `team`."""
    agents: int


class GroupParams(NamedTuple):
    """One group's actor and critic weights."""

    actor: MlpParams
    critic: MlpParams


def _mlp_form(mlp: AgentMLP) -> MlpForm:
    return MlpForm(
        normalized=mlp.norm_weight is not None,
        common_input=mlp.common_input,
        agents=mlp.num_agents,
        activation=ACTIVATION_NAMES[mlp.activation],
    )


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
                actor=_mlp_form(model.group(name).actor.net),
                critic=_mlp_form(model.group(name).critic.net),
                critic_input=_critic_input(model, name),
                agents=model.group(name).actor.net.num_agents,
            )
            for name in model.group_names()
        }

    def params(self) -> dict[str, GroupParams]:
        """The weights as they are now, copied into JAX arrays (read once per update: later changes
        to the torch parameters do not reach them)."""
        return {
            name: GroupParams(
                self._mlp_params(self.model.group(name).actor.net),
                self._mlp_params(self.model.group(name).critic.net),
            )
            for name in self.model.group_names()
        }

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
        return self.jnp.array(tensor.detach().to("cpu", torch.float32).numpy(), copy=True)

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
        return h

    def logits(self, name: str, params: Mapping[str, GroupParams], obs: Any, mask: Any | None) -> Any:
        """Group `name`'s Categorical logits `(..., A, n)`, normalised (log-probabilities, as
        `Categorical.logits`), masked actions at `MASKED_LOGIT` before normalising: probability 0."""
        jnp, jax = self.jnp, self.jax
        raw = self.mlp(self.forms[name].actor, params[name].actor, obs)
        if mask is not None and mask.shape[-1]:
            raw = jnp.where(mask, raw, jnp.float32(MASKED_LOGIT))
        return raw - jax.nn.logsumexp(raw, axis=-1, keepdims=True)

    def values(self, name: str, params: Mapping[str, GroupParams], state: Any, obs: Any) -> Any:
        """Group `name`'s critic values `(..., A)` in the critic's units (before `ValueNorm.denormalize`),
        from the team state `(..., S)` and the group's observations `(..., A, D)`."""
        jnp, form = self.jnp, self.forms[name]
        if form.critic_input in ("state", "team"):
            x = state
        elif form.critic_input == "obs":
            x = obs
        else:
            shared = jnp.broadcast_to(state[..., None, :], (*obs.shape[:-1], state.shape[-1]))
            x = jnp.concatenate([shared, obs], axis=-1)
        out = self.mlp(form.critic, params[name].critic, x)[..., 0]
        return jnp.broadcast_to(out, (*out.shape[:-1], form.agents))

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
