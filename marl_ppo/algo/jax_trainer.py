"""The PPO update as one compiled JAX program (`fast.learner: jax`), for the runs whose rollout is compiled.

`JaxTrainer` is a `Trainer` whose epochs run in JAX: `prepare` (value normalisation, advantage
normalisation, cutting into rows) and the batch statistics stay torch's; then, per update, the
prepared rows, the training parameters, the Adam moments and the minibatch orders go to JAX once, one
jitted function runs every epoch's minibatch steps as a `lax.scan` and the before/after diagnostics
(or, with `ppo.update_stats: minibatches`, traces each step's terms for their means),
and the new weights, moments and step counts are written back into the torch parameters and
optimizers, so checkpoints, resume, evaluation and acting read them as they read torch's.

What each step computes is `Trainer._step`'s: the clipped policy loss with the entropy bonus, the
value loss (squared or Huber, value clip) under the same masks and divisors (`algo.losses`), the KL
stop (from the actors' second step on, a minibatch whose approximate KL passes 1.5 * target_kl takes
the actors out for the rest of the update while the critic finishes its epochs), each optimizer's
gradients clipped as `clip_grad_norms` clips them (one norm, or one per group), torch's Adam step
(eps 1e-5), and a step with a non-finite loss or gradient norm skipped (`ppo.on_nonfinite: skip`) or
raised after the update, which then changes no weight (`error`). The minibatch orders are drawn by the
trainer's generator as `chunk_minibatches` draws them, one permutation per epoch begun, so both
learners see the same minibatches; a minibatch shorter than the longest (rows that do not divide
evenly) is padded with rows that are not alive, which enter no sum and no count.

The networks' forward is that of the training parameters (`models.layers.AgentMLP`: LayerNorm without
affine, the first layer with the norm's weight and bias folded in and the agent-id columns as a
per-agent bias), so gradients reach every parameter torch's would. The numbers equal torch's to float32
rounding: the products sum in another order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from marl_ppo.algo.batch import AgentBatch
from marl_ppo.algo.optim import ADAM_EPS, group_parts, part_bounds
from marl_ppo.algo.sequences import Sequences
from marl_ppo.algo.stats import Evaluation, TrainStats, batch_statistics, diagnostic_rows, update_stats
from marl_ppo.algo.trainer import Trainer
from marl_ppo.config import ConfigError, SettledPPO
from marl_ppo.envs.jax.runtime import TensorMarks, jax_modules, marks_hold, tensor_marks
from marl_ppo.faults import NonFiniteError
from marl_ppo.models.distributions import MASKED_LOGIT
from marl_ppo.models.layers import AgentMLP
from marl_ppo.models.team import CRITIC_INPUTS, TeamModel
from marl_ppo.plan.compiled import ACTIVATION_NAMES, recurrent_reason, unsupported_reason


@dataclasses.dataclass(frozen=True)
class MlpIndex:
    """Where an `AgentMLP`'s parameters sit in its optimizer's parameter list, and its static form."""

    norm: tuple[int, int] | None
    """The indices of `norm_weight` and `norm_bias`, or None without an input LayerNorm."""
    weights: tuple[int, ...]
    biases: tuple[int, ...]
    in_dim: int
    agents: int
    agent_id: bool
    common_input: bool
    activation: str


@dataclasses.dataclass(frozen=True)
class GroupIndex:
    """One group's actor and critic, and how its critic reads its input (`ppo.critic`)."""

    actor: MlpIndex
    critic: MlpIndex
    critic_input: str
    agents: int
    masked: bool
    """The group's actions have masks (the logits of masked actions are set to MASKED_LOGIT)."""


class JaxTrainer(Trainer):
    """`Trainer` with `update` run as one compiled JAX program (see the module); everything else, the
    optimizers and their state dicts included, is the torch trainer's."""

    def __init__(
        self, model: TeamModel, ppo: SettledPPO, *, generator: torch.Generator, optimizer: str = "adam"
    ) -> None:
        reason = unsupported_reason(model) or recurrent_reason(model)
        if reason is None and ppo.actor_update != "simultaneous":
            reason = f"ppo.actor_update={ppo.actor_update}; the JAX learner updates every actor at once"
        if reason is not None:
            reason = reason.replace("compiled rollout", "JAX learner")
            raise ConfigError(f"fast.learner=jax: {reason}; set fast.learner=torch")
        super().__init__(model, ppo, generator=generator, optimizer=optimizer)
        self.jax, self.jnp = jax_modules()
        self.pi_params = _params(self.actor_optimizer)
        self.v_params = _params(self.critic_optimizer)
        pi_at = {id(p): k for k, p in enumerate(self.pi_params)}
        v_at = {id(p): k for k, p in enumerate(self.v_params)}
        self.groups = {}
        for name in model.group_names():
            actor, critic, _ = model.group(name)
            self.groups[name] = GroupIndex(
                actor=_mlp_index(actor.net, pi_at),
                critic=_mlp_index(critic.net, v_at),
                critic_input=_critic_input(critic),
                agents=actor.net.num_agents,
                masked=False,
            )
        self.pi_parts = self._parts(self.actor_optimizer, model.actors)
        self.v_parts = self._parts(self.critic_optimizer, model.critics)
        self._programs: dict[tuple[tuple[bool, ...], tuple[tuple[bool, bool], ...]], Callable[..., Any]] = {}
        self._kept: tuple[tuple[Any, ...], TensorMarks] | None = None
        """The last update's new weights and Adam states as JAX arrays, and the marks of the torch
        tensors they were written into (`_inputs`)."""
        self.next_rollout: Callable[[Mapping[int, Any]], None] | None = None
        """Where set, called as soon as an update's program is dispatched with its new weights (JAX
        arrays, computed or on their way) under the `id` of the parameter each will be written into:
        a compiled rollout source starts the next rollout on them (`CompiledSource.launch`)."""

    def _parts(
        self, optimizer: torch.optim.Optimizer, networks: nn.ModuleList
    ) -> tuple[tuple[int, int], ...]:
        """The `[start, stop)` runs of the optimizer's parameters clipped apart (`ppo.grad_clip`)."""
        count = len(_params(optimizer))
        parts = group_parts(optimizer, networks) if self.ppo.grad_clip == "per_group" else []
        return tuple(part_bounds(parts, count))

    def update(self, batches: Mapping[str, AgentBatch], *, lagged: bool = False) -> TrainStats:
        """One PPO update on the groups' batches, as `Trainer.update` computes it (on-policy only)."""
        if lagged:
            raise ConfigError("fast.learner=jax: a lagged batch (rollout.policy_lag); set fast.learner=torch")
        self.updates += 1
        self._skips = 0
        sequences = self.prepare(batches)
        probe = diagnostic_rows(sequences)
        first = next(iter(sequences.values()))
        if first.alive.shape[0] != 1:
            raise ValueError("the JAX learner takes one-step chunks (feed-forward networks)")
        ppo = self.ppo
        epochs = max(ppo.train_pi_iters, ppo.train_vf_iters)
        chunks = first.num_chunks
        if not 1 <= ppo.num_minibatches <= chunks:
            raise ValueError(
                f"num_minibatches={ppo.num_minibatches} must be between 1 and the {chunks} sequence chunks"
            )
        start_state = self.generator.get_state()
        orders = [torch.randperm(chunks, generator=self.generator) for _ in range(epochs)]
        index, valid = _minibatch_index(orders, ppo.num_minibatches)
        epoch_of = np.repeat(np.arange(epochs), ppo.num_minibatches)
        masked = tuple(batch.inputs.action_mask.shape[-1] > 0 for batch in sequences.values())
        phases, steps = _phases(ppo.train_pi_iters, ppo.train_vf_iters, ppo.num_minibatches, index, valid)
        program = self._program(masked, phases)
        result = program(
            *self._inputs(),
            {
                "pi_lr": np.float32(self.actor_optimizer.param_groups[0]["lr"]),
                "v_lr": np.float32(self.critic_optimizer.param_groups[0]["lr"]),
                "entropy_coef": np.float32(self.entropy_coef),
            },
            {name: _rows(batch) for name, batch in sequences.items()},
            {name: _rows(batch) for name, batch in probe.items()} if ppo.update_stats == "batch" else {},
            steps,
        )
        (pi_params, v_params, pi_adam, v_adam), trace, before, after = result
        if self.next_rollout is not None:
            new = zip([*self.pi_params, *self.v_params], [*pi_params, *v_params], strict=True)
            self.next_rollout({id(param): value for param, value in new})
        stats_in = batch_statistics(batches)  # while the program runs (JAX dispatches it and returns)
        trained_pi, stepped, nonfinite = (
            np.asarray(trace[key]) for key in ("trained_pi", "stepped", "nonfinite")
        )
        # the epochs `Trainer._epochs` begins, each drawing its order: every critic epoch, and the
        # actors' until the KL stop (an epoch past the critic's is begun while the actors still learn)
        stopped = np.asarray(trace["stopped"])
        stop_epoch = int(epoch_of[np.argmax(stopped)]) if stopped.any() else epochs
        begun = max(ppo.train_vf_iters, min(ppo.train_pi_iters, stop_epoch + 1))
        self.generator.set_state(start_state)
        for _ in range(begun):
            torch.randperm(chunks, generator=self.generator)
        if nonfinite.any():
            if ppo.on_nonfinite == "error":
                step = int(np.argmax(nonfinite))
                where = f"epoch {step // ppo.num_minibatches}, minibatch {step % ppo.num_minibatches}"
                raise NonFiniteError(
                    f"non-finite loss or gradient at update {self.updates} ({where}); no weights were "
                    "changed by the update. Lower ppo.pi_lr / ppo.vf_lr or scale the rewards, or set "
                    "ppo.on_nonfinite=skip to drop such steps"
                )
            self._skips = int(nonfinite.sum())
        self._write(self.pi_params, pi_params, self.actor_optimizer, pi_adam)
        self._write(self.v_params, v_params, self.critic_optimizer, v_adam)
        self._kept = ((pi_params, v_params, pi_adam, v_adam), tensor_marks(self._tensors()))
        pi_epochs = len({int(epoch_of[k]) for k in np.flatnonzero(trained_pi)})
        by_batch = ppo.update_stats == "batch"
        return update_stats(
            _evaluation(before) if by_batch else None,
            _evaluation(after) if by_batch else _minibatch_means(trace, trained_pi & stepped),
            stop_iter=pi_epochs,
            pi_steps=int((trained_pi & stepped).sum()),
            nonfinite_skips=self._skips,
            batch=stats_in,
        )

    def _inputs(self) -> tuple[Any, ...]:
        """The weights and Adam states the program starts from: the JAX arrays the last update wrote
        back while no torch tensor they came into has changed since (a resume, a warm start or any
        in-place write changes a tensor's version), else NumPy copies of the torch tensors."""
        if self._kept is not None and marks_hold(self._kept[1], self._tensors()):
            return self._kept[0]
        self._kept = None
        return (
            [_numpy(p).copy() for p in self.pi_params],
            [_numpy(p).copy() for p in self.v_params],
            self._adam_state(self.actor_optimizer, self.pi_params),
            self._adam_state(self.critic_optimizer, self.v_params),
        )

    def _tensors(self) -> list[torch.Tensor]:
        """Every parameter and optimizer state tensor."""
        tensors: list[torch.Tensor] = [*self.pi_params, *self.v_params]
        for optimizer, params in (
            (self.actor_optimizer, self.pi_params),
            (self.critic_optimizer, self.v_params),
        ):
            for p in params:
                tensors.extend(
                    value for value in optimizer.state.get(p, {}).values() if torch.is_tensor(value)
                )
        return tensors

    def _adam_state(self, optimizer: torch.optim.Optimizer, params: Sequence[nn.Parameter]) -> dict[str, Any]:
        """The optimizer's moments and step count as NumPy arrays (zeros before its first step)."""
        states = [optimizer.state.get(p, {}) for p in params]
        steps = {float(state["step"]) for state in states if state}
        if len(steps) > 1 or (steps and not all(states)):
            raise ValueError("the JAX learner needs every parameter of an optimizer stepped alike")

        def moment(key: str) -> list[Any]:
            return [
                _numpy(state[key]).copy() if state else np.zeros(tuple(p.shape), np.float32)
                for p, state in zip(params, states, strict=True)
            ]

        return {
            "m": moment("exp_avg"),
            "v": moment("exp_avg_sq"),
            "step": np.float32(steps.pop() if steps else 0.0),
        }

    @torch.no_grad()
    def _write(
        self,
        params: Sequence[nn.Parameter],
        values: Sequence[Any],
        optimizer: torch.optim.Optimizer,
        adam: Mapping[str, Any],
    ) -> None:
        """Copy the new weights into the torch parameters, and the moments and step count into the
        optimizer's state (as torch's Adam keeps them; untouched while it has not stepped)."""
        step = float(np.asarray(adam["step"]))
        fused = bool(optimizer.param_groups[0].get("fused"))
        for k, p in enumerate(params):
            p.copy_(torch.from_numpy(np.array(values[k])))
            if step == 0.0:
                continue
            state = optimizer.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"].fill_(step)
            state["exp_avg"].copy_(torch.from_numpy(np.array(adam["m"][k])))
            state["exp_avg_sq"].copy_(torch.from_numpy(np.array(adam["v"][k])))

    def _program(self, masked: tuple[bool, ...], phases: tuple[tuple[bool, bool], ...]) -> Callable[..., Any]:
        """The jitted update for groups with (or without) action masks and `phases`, built once."""
        if (masked, phases) not in self._programs:
            groups = {
                name: dataclasses.replace(group, masked=m)
                for (name, group), m in zip(self.groups.items(), masked, strict=True)
            }
            self._programs[masked, phases] = self.jax.jit(
                _update_program(self.jax, self.jnp, groups, self.ppo, self.pi_parts, self.v_parts, phases)
            )
        return self._programs[masked, phases]


def _update_program(
    jax: Any,
    jnp: Any,
    groups: Mapping[str, GroupIndex],
    ppo: SettledPPO,
    pi_parts: Sequence[tuple[int, int]],
    v_parts: Sequence[tuple[int, int]],
    phases: Sequence[tuple[bool, bool]],
) -> Callable[..., Any]:
    """The update as a pure function of the weights, Adam states, rates, rows and minibatch orders;
    `phases`: whether the actors and whether the critic learn in each phase's steps.

    The steps run in two phases, each a `lax.scan`: the epochs both the actors and the critic learn
    in, then those only one of them does (the critic's beyond `train_pi_iters`, or the actors'
    beyond `train_vf_iters`). A step computes the gradients of the networks that can step in it: a
    critic-only step runs no actor forward, and once the KL stop has taken the actors out, the
    steps left run the critic's alone (`lax.cond`)."""
    lax = jax.lax

    def actor_terms(pi: Sequence[Any], data: Mapping[str, Any], entropy_coef: Any) -> Any:
        """The actors' loss summed over groups, and per group kl, entropy and clipfrac
        (`Trainer._losses` with every agent learning)."""
        loss = jnp.float32(0.0)
        kls, entropies, clipfracs = [], [], []
        for name, group in groups.items():
            rows = data[name]
            alive = rows["alive"]
            count = jnp.maximum(alive.sum(), 1).astype(jnp.float32)

            def mean(values: Any, alive: Any = alive, count: Any = count) -> Any:
                return jnp.where(alive, values, 0.0).sum() / count

            raw = _mlp(jnp, group.actor, pi, rows["obs"])
            if group.masked:
                raw = jnp.where(rows["action_mask"], raw, jnp.float32(MASKED_LOGIT))
            logits = raw - jax.nn.logsumexp(raw, axis=-1, keepdims=True)
            logp = jnp.take_along_axis(logits, rows["actions"][..., None], axis=-1)[..., 0]
            entropy = mean(-(logits * jnp.exp(logits)).sum(-1))
            log_ratio = logp - rows["logp_ref"]
            ratio = jnp.exp(log_ratio)
            advantages = rows["advantages"]
            clipped = jnp.clip(ratio, 1.0 - ppo.clip_ratio, 1.0 + ppo.clip_ratio)
            loss = loss + (
                -mean(jnp.minimum(ratio * advantages, clipped * advantages)) - entropy_coef * entropy
            )
            ratio, log_ratio = lax.stop_gradient(ratio), lax.stop_gradient(log_ratio)
            kls.append(mean((ratio - 1.0) - log_ratio))
            entropies.append(lax.stop_gradient(entropy))
            clipfracs.append(mean((jnp.abs(ratio - 1.0) > ppo.clip_ratio).astype(jnp.float32)))
        return loss, (jnp.stack(kls), jnp.stack(entropies), jnp.stack(clipfracs))

    def critic_loss(v: Sequence[Any], data: Mapping[str, Any]) -> Any:
        """The critics' value loss summed over groups (`value_loss`)."""
        loss = jnp.float32(0.0)
        for name, group in groups.items():
            rows = data[name]
            alive = rows["alive"]
            count = jnp.maximum(alive.sum(), 1).astype(jnp.float32)
            values = _critic(jnp, group, v, rows["state"], rows["obs"])
            error = _value_error(jnp, values, rows["returns"], ppo.huber_delta)
            if ppo.value_clip is not None:
                ref = rows["value_ref"]
                held = ref + jnp.clip(values - ref, -ppo.value_clip, ppo.value_clip)
                error = jnp.maximum(error, _value_error(jnp, held, rows["returns"], ppo.huber_delta))
            loss = loss + jnp.where(alive, error, 0.0).sum() / count
        return loss

    def evaluate(pi: Sequence[Any], v: Sequence[Any], data: Mapping[str, Any], entropy_coef: Any) -> Any:
        loss_pi, (kls, entropies, clipfracs) = actor_terms(pi, data, entropy_coef)
        loss_v = critic_loss(v, data)
        return jnp.stack([loss_pi, loss_v, kls.mean(), entropies.mean(), clipfracs.mean()])

    actor_gradient = jax.value_and_grad(actor_terms, has_aux=True)
    critic_gradient = jax.value_and_grad(critic_loss)
    no_kl = jnp.zeros(len(groups), jnp.float32)

    def zeros(params: Sequence[Any]) -> list[Any]:
        return [jnp.zeros_like(p) for p in params]

    def make_step(with_pi: bool, with_vf: bool) -> Callable[..., Any]:
        """A scan step of a phase whose steps may train the actors (`with_pi`, until the KL stop) and
        train the critic (`with_vf`)."""

        def gradients(wants_pi: Any, pi: Any, v: Any, minibatch: Any, entropy_coef: Any) -> Any:
            def both() -> Any:
                (loss_pi, terms), pi_grads = actor_gradient(pi, minibatch, entropy_coef)
                loss_v, v_grads = critic_gradient(v, minibatch) if with_vf else (jnp.float32(0.0), zeros(v))
                return pi_grads, v_grads, loss_pi, loss_v, terms

            def critic_only() -> Any:
                loss_v, v_grads = critic_gradient(v, minibatch) if with_vf else (jnp.float32(0.0), zeros(v))
                return zeros(pi), v_grads, jnp.float32(0.0), loss_v, (no_kl, no_kl, no_kl)

            if not with_pi:
                return critic_only()
            return lax.cond(wants_pi, both, critic_only)

        def step(carry: Any, x: Any, entropy_coef: Any, rates: Any, data: Any) -> Any:
            pi, v, pi_adam, v_adam, active, pi_steps = carry
            index, valid = x["index"], x["valid"]
            minibatch = {
                name: {
                    key: (value[index] & valid[:, None]) if key == "alive" else value[index]
                    for key, value in rows.items()
                }
                for name, rows in data.items()
            }
            wants_pi = active & with_pi
            pi_grads, v_grads, loss_pi, loss_v, terms = gradients(wants_pi, pi, v, minibatch, entropy_coef)
            kls = terms[0]
            train_vf = jnp.bool_(with_vf)
            exceeded = jnp.bool_(False)
            if ppo.target_kl is not None:
                exceeded = (pi_steps > 0) & (kls.max() > 1.5 * ppo.target_kl)
            train_pi = wants_pi & ~exceeded
            total = jnp.where(train_pi, loss_pi, 0.0) + jnp.where(train_vf, loss_v, 0.0)
            finite = jnp.isfinite(total)
            if with_pi:
                pi_grads, pi_norms = _clip(jnp, pi_grads, pi_parts, ppo.max_grad_norm)
                finite = finite & (~train_pi | jnp.isfinite(pi_norms).all())
            if with_vf:
                v_grads, v_norms = _clip(jnp, v_grads, v_parts, ppo.max_grad_norm)
                finite = finite & jnp.isfinite(v_norms).all()
            if with_pi:
                new_pi, new_pi_adam = _adam(jnp, pi, pi_grads, pi_adam, rates["pi_lr"])
                pi, pi_adam = _choose(jax, train_pi & finite, (new_pi, new_pi_adam), (pi, pi_adam))
            if with_vf:
                new_v, new_v_adam = _adam(jnp, v, v_grads, v_adam, rates["v_lr"])
                v, v_adam = _choose(jax, finite, (new_v, new_v_adam), (v, v_adam))
            trace = {
                "trained_pi": train_pi,
                "stepped": (train_pi | train_vf) & finite,
                "nonfinite": (train_pi | train_vf) & ~finite,
                "stopped": wants_pi & exceeded,
                "trained_vf": train_vf & finite,
                # what the step's forward measured, for `ppo.update_stats: minibatches`
                "terms": jnp.stack([loss_pi, loss_v, *(values.mean() for values in terms)]),
            }
            carry = (pi, v, pi_adam, v_adam, active & ~(wants_pi & exceeded), pi_steps + (train_pi & finite))
            return carry, trace

        return step

    def update(
        pi: list[Any],
        v: list[Any],
        pi_adam: dict[str, Any],
        v_adam: dict[str, Any],
        rates: Mapping[str, Any],
        data: Mapping[str, Any],
        probe: Mapping[str, Any],
        steps: Sequence[Mapping[str, Any]],
    ) -> Any:
        entropy_coef = rates["entropy_coef"]
        by_batch = ppo.update_stats == "batch"
        before = evaluate(pi, v, probe, entropy_coef) if by_batch else jnp.zeros(5, jnp.float32)
        carry = (pi, v, pi_adam, v_adam, jnp.bool_(True), jnp.int32(0))
        traces = []
        for (with_pi, with_vf), xs in zip(phases, steps, strict=True):
            step = make_step(with_pi, with_vf)
            carry, trace = lax.scan(lambda c, x, step=step: step(c, x, entropy_coef, rates, data), carry, xs)
            traces.append(trace)
        pi, v, pi_adam, v_adam, _, _ = carry
        after = evaluate(pi, v, probe, entropy_coef) if by_batch else jnp.zeros(5, jnp.float32)
        joined = {key: jnp.concatenate([trace[key] for trace in traces]) for key in traces[0]}
        return (pi, v, pi_adam, v_adam), joined, before, after

    return update


def _mlp(jnp: Any, index: MlpIndex, params: Sequence[Any], x: Any) -> Any:
    """`AgentMLP.forward` on the training parameters: `(B, A, in)`, or `(B, in)` with `common_input`,
    to `(B, A, out)`."""
    if index.norm is not None:
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        x = (x - mean) / jnp.sqrt(var + 1e-5)  # F.layer_norm's eps
    full = params[index.weights[0]]
    weight, bias = full[..., : index.in_dim], params[index.biases[0]]
    if index.norm is not None:  # `AgentMLP.first_layer`: the norm's affine folded into the weights
        norm_weight, norm_bias = params[index.norm[0]], params[index.norm[1]]
        bias = bias + (weight @ norm_bias[..., None])[..., 0]
        weight = weight * norm_weight[:, None, :]
    agent_bias = full[0, :, index.in_dim :].T if index.agent_id else None
    copies, out_dim = weight.shape[:2]
    if index.common_input:
        if copies == 1:
            h = (x @ weight[0].T + bias[0])[..., None, :]
            h = (
                h + agent_bias
                if agent_bias is not None
                else jnp.broadcast_to(h, (*h.shape[:-2], index.agents, out_dim))
            )
        else:
            flat = x @ weight.reshape(copies * out_dim, -1).T + bias.reshape(-1)
            h = flat.reshape(*flat.shape[:-1], copies, out_dim)
    else:
        h = _linear(jnp, x, weight, bias)
        if agent_bias is not None:
            h = h + agent_bias
    for w, b in zip(index.weights[1:], index.biases[1:], strict=True):
        h = jnp.tanh(h) if index.activation == "tanh" else jnp.maximum(h, 0)
        h = _linear(jnp, h, params[w], params[b])
    return h


def _linear(jnp: Any, x: Any, weight: Any, bias: Any) -> Any:
    """`stacked_linear`: `(B, A, in) -> (B, A, out)` with one map (copies 1) or one per agent."""
    if weight.shape[0] == 1:
        return x @ weight[0].T + bias[0]
    return jnp.einsum("bai,aoi->bao", x, weight) + bias


def _critic(jnp: Any, group: GroupIndex, params: Sequence[Any], state: Any, obs: Any) -> Any:
    """`GroupCritic.forward` of a feed-forward critic: values `(B, A)` in its units."""
    if group.critic_input in ("state", "team"):
        x = state
    elif group.critic_input == "obs":
        x = obs
    else:
        x = jnp.concatenate(
            [jnp.broadcast_to(state[:, None, :], (*obs.shape[:-1], state.shape[-1])), obs], -1
        )
    out = _mlp(jnp, group.critic, params, x)[..., 0]
    return jnp.broadcast_to(out, (out.shape[0], group.agents))


def _value_error(jnp: Any, prediction: Any, targets: Any, huber_delta: float | None) -> Any:
    """`value_loss`'s error: half the squared error, or the Huber loss with `huber_delta`."""
    diff = prediction - targets
    if huber_delta is None:
        return 0.5 * jnp.square(diff)
    size = jnp.abs(diff)
    return jnp.where(size < huber_delta, 0.5 * jnp.square(diff), huber_delta * (size - 0.5 * huber_delta))


def _clip(jnp: Any, grads: Sequence[Any], parts: Sequence[tuple[int, int]], max_norm: float | None) -> Any:
    """`clip_grad_norms`: each part's gradients scaled to norm `max_norm` where larger (torch's
    `clip_grad_norm_`: by max_norm / (norm + 1e-6), at most 1), and the parts' norms before."""
    grads = list(grads)
    norms = []
    for start, stop in parts:
        # torch's `get_total_norm`: each tensor's norm, then the norm of those
        norm = jnp.linalg.norm(jnp.stack([jnp.linalg.norm(g.ravel()) for g in grads[start:stop]]))
        norms.append(norm)
        if max_norm is not None:
            scale = jnp.minimum(max_norm / (norm + 1e-6), 1.0)
            grads[start:stop] = [g * scale for g in grads[start:stop]]
    return grads, jnp.stack(norms)


def _adam(jnp: Any, params: Sequence[Any], grads: Sequence[Any], state: Mapping[str, Any], lr: Any) -> Any:
    """One step of torch's Adam (betas 0.9, 0.999, eps 1e-5, no weight decay) in its single-tensor
    order: `p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)`."""
    beta1, beta2 = 0.9, 0.999
    step = state["step"] + 1.0
    correction1 = 1.0 - beta1**step
    correction2_sqrt = jnp.sqrt(1.0 - beta2**step)
    step_size = lr / correction1
    new_params, ms, vs = [], [], []
    for p, g, m, v in zip(params, grads, state["m"], state["v"], strict=True):
        m = m + (g - m) * (1.0 - beta1)  # torch's lerp
        v = v * beta2 + (1.0 - beta2) * g * g
        new_params.append(p - step_size * (m / (jnp.sqrt(v) / correction2_sqrt + ADAM_EPS)))
        ms.append(m)
        vs.append(v)
    return new_params, {"m": ms, "v": vs, "step": step}


def _choose(jax: Any, condition: Any, taken: Any, kept: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: jax.numpy.where(condition, a, b), taken, kept)


def _params(optimizer: torch.optim.Optimizer) -> list[nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _mlp_index(mlp: AgentMLP, at: Mapping[int, int]) -> MlpIndex:
    """Where `mlp`'s parameters sit in its optimizer's list (`at`: parameter id -> index)."""
    norm = None
    if mlp.norm_weight is not None and mlp.norm_bias is not None:
        norm = (at[id(mlp.norm_weight)], at[id(mlp.norm_bias)])
    return MlpIndex(
        norm=norm,
        weights=tuple(at[id(layer.weight)] for layer in mlp.linears),
        biases=tuple(at[id(layer.bias)] for layer in mlp.linears),
        in_dim=mlp.in_dim,
        agents=mlp.num_agents,
        agent_id=mlp.add_agent_id,
        common_input=mlp.common_input,
        activation=ACTIVATION_NAMES[mlp.activation],
    )


def _critic_input(critic: Any) -> str:
    if critic.team:
        return "team"
    if critic.common_input:
        return "state"
    return "state+obs" if critic.build_input is CRITIC_INPUTS["state+obs"][0] else "obs"


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy()


def _rows(batch: Sequences) -> dict[str, np.ndarray]:
    """What the losses read of a prepared group's rows, as numpy arrays, the one-step axis dropped."""
    inputs = batch.inputs
    fields = {
        "obs": inputs.obs,
        "state": inputs.state,
        "action_mask": inputs.action_mask,
        "actions": batch.actions,
        "alive": batch.alive,
        "advantages": batch.advantages,
        "returns": batch.returns,
        "logp_ref": batch.logp_ref,
        "value_ref": batch.value_ref,
    }
    rows = {}
    for key, tensor in fields.items():
        array = tensor[0].detach().cpu()
        if key == "actions":
            rows[key] = array.to(torch.int32).numpy()
        elif array.dtype == torch.bool:
            rows[key] = array.numpy()
        else:
            rows[key] = array.to(torch.float32).numpy()
    return rows


def _minibatch_index(orders: Sequence[torch.Tensor], num_minibatches: int) -> tuple[np.ndarray, np.ndarray]:
    """Each step's row indices `(steps, size)` as `chunk_minibatches` splits each epoch's order
    (`tensor_split`), padded to the longest part with row 0 marked invalid, and the valid marks."""
    parts = [part.numpy() for order in orders for part in torch.tensor_split(order, num_minibatches)]
    size = max(len(part) for part in parts)
    index = np.zeros((len(parts), size), dtype=np.int32)
    valid = np.zeros((len(parts), size), dtype=bool)
    for k, part in enumerate(parts):
        index[k, : len(part)] = part
        valid[k, : len(part)] = True
    return index, valid


def _phases(
    pi_iters: int, vf_iters: int, num_minibatches: int, index: np.ndarray, valid: np.ndarray
) -> tuple[tuple[tuple[bool, bool], ...], list[dict[str, np.ndarray]]]:
    """The update's phases (whether the actors and whether the critic learn in its steps) and each
    phase's steps: the epochs both learn in, then those of the one with more epochs."""
    both = min(pi_iters, vf_iters) * num_minibatches
    phases, steps = [(True, True)], [{"index": index[:both], "valid": valid[:both]}]
    if pi_iters != vf_iters:
        phases.append((pi_iters > vf_iters, vf_iters > pi_iters))
        steps.append({"index": index[both:], "valid": valid[both:]})
    return tuple(phases), steps


def _evaluation(values: Any) -> Evaluation:
    loss_pi, loss_v, kl, entropy, clipfrac = (float(x) for x in np.asarray(values))
    return Evaluation(loss_pi, loss_v, kl, entropy, clipfrac)


def _minibatch_means(trace: Mapping[str, Any], actor_stepped: np.ndarray) -> Evaluation:
    """`MinibatchMeans.evaluation` from the steps' traced terms (loss_pi, loss_v, kl, entropy,
    clipfrac): the actors' over the steps they took, loss_v over the critic's (NaN over none)."""
    terms = np.asarray(trace["terms"], dtype=np.float64)
    critic_stepped = np.asarray(trace["trained_vf"])
    nan = float("nan")
    actor = terms[actor_stepped].mean(0) if actor_stepped.any() else np.full(5, nan)
    loss_v = float(terms[critic_stepped, 1].mean()) if critic_stepped.any() else nan
    return Evaluation(float(actor[0]), loss_v, float(actor[2]), float(actor[3]), float(actor[4]))
