"""The shared trainer: clipped PPO for every group's actors plus the critic, separate optimizers and rates."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from marl_ppo.algo.batch import AgentBatch
from marl_ppo.algo.losses import (
    mask_count,
    masked_mean,
    normalize_advantages,
    normalize_advantages_per_agent,
    policy_loss,
    value_loss,
)
from marl_ppo.algo.optim import clip_grad_norms, group_parts, make_optimizer
from marl_ppo.algo.sequences import Sequences, chunk_minibatches, critic_values, cut_batch, policy
from marl_ppo.algo.stats import (
    Evaluation,
    MinibatchMeans,
    TrainStats,
    batch_statistics,
    diagnostic_rows,
    lag_statistics,
    update_stats,
)
from marl_ppo.algo.turns import Turn, everyone, make_actor_update
from marl_ppo.config import SettledPPO
from marl_ppo.faults import NonFiniteError
from marl_ppo.models.team import TeamModel


class Trainer:
    """Runs `train_pi_iters` / `train_vf_iters` epochs of minibatch PPO over one batch per group (`ppo`
    settled: its epochs are numbers), once per turn of `ppo.actor_update` (`algo.turns`)."""

    def __init__(
        self, model: TeamModel, ppo: SettledPPO, *, generator: torch.Generator, optimizer: str = "adam"
    ) -> None:
        self.model = model
        self.ppo = ppo
        self.generator = generator
        self.actor_update = make_actor_update(
            ppo.actor_update,
            model,
            seed=_order_seed(generator.initial_seed()),
            clip_ratio=ppo.clip_ratio,
            lr=ppo.pi_lr,
            optimizer=optimizer,
        )
        """Whose actors learn in each turn of an update, in what order, with which optimizers (`algo.turns`)."""
        self.critic_optimizer = make_optimizer(model.critic_parameters(), lr=ppo.vf_lr, kind=optimizer)
        self.entropy_coef = ppo.entropy_coef
        """The entropy bonus's weight in the next update (`set_entropy_coef` follows ppo.entropy_schedule)."""
        self.updates = 0
        """Updates started by this trainer (named in non-finite errors)."""
        self._skips = 0
        self._means: MinibatchMeans | None = None
        """The update's minibatch means being gathered (`ppo.update_stats: minibatches`), else None."""

    @property
    def actor_optimizer(self) -> torch.optim.Optimizer:
        """The first actor optimizer: the only one of a simultaneous update (a sequential one has one per
        agent, all at the same learning rate; see `actor_update.optimizers`)."""
        return next(iter(self.actor_update.optimizers.values()))

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [*self.actor_update.optimizers.values(), self.critic_optimizer]

    def set_lr_scale(self, scale: float) -> None:
        """Set both learning rates to their configured values (`ppo.pi_lr`, `ppo.vf_lr`) times `scale`."""
        for optimizer in self._optimizers():
            base = self.ppo.vf_lr if optimizer is self.critic_optimizer else self.ppo.pi_lr
            for group in optimizer.param_groups:
                group["lr"] = base * scale

    def set_entropy_coef(self, coef: float) -> None:
        """The entropy bonus's weight from the next update on."""
        self.entropy_coef = coef

    def state_dict(self) -> dict[str, Any]:
        """The critic optimizer's state, the minibatch-shuffling generator's state and the actor update's
        (its optimizers' states; a sequential update's order generator)."""
        return {
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "generator": self.generator.get_state(),
            **self.actor_update.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` (the model's weights are restored separately)."""
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        self.generator.set_state(state["generator"])
        self.actor_update.load_state_dict(state)

    def prepare(self, batches: Mapping[str, AgentBatch], *, decoupled: bool = False) -> dict[str, Sequences]:
        """Update the value normalizers with the batch's returns, normalize advantages per group, and cut
        each group's batch into sequences (`algo.sequences`): chunks of one step for feed-forward
        networks, of `ppo.chunk_length` steps for recurrent ones.

        The sequences carry `value_ref` and `returns` in the critic's units: the acting-time values in
        the statistics before the update, the returns in those after it. `decoupled` (a batch one
        update behind under `ppo.lagged_ratio: decoupled`): the ratio's reference, the value clip's
        centre and the advantages' weights come from the networks at the start of the update
        (`_start_of_update`); otherwise they are the acting policy's, the acting values and 1.
        """
        length = self.ppo.chunk_length if self.model.recurrent else 1
        prepared = {}
        for name, batch in batches.items():
            norm = self.model.group(name).value_norm
            # the value clip's centre: the acting-time values in the units the critic's outputs are
            # in until its first step, those of the statistics before this batch's returns enter them
            values_old = norm.normalize(batch.values_old)
            returns = batch.returns[batch.alive]
            if bool(torch.isfinite(returns).all() & torch.isfinite(batch.advantages[batch.alive]).all()):
                norm.update(returns)
            else:  # raises, or skips this group's value-norm statistics
                self._nonfinite(f"GAE return or advantage in group '{name}'", "before any step")
            advantages = batch.advantages
            if self.ppo.normalize_advantages:
                advantages = _ADVANTAGE_NORMS[self.ppo.advantage_norm](advantages, batch.alive)
            sequences = cut_batch(
                batch,
                length=length,
                advantages=advantages,
                returns=norm.normalize(batch.returns),
                value_ref=values_old,
            )
            prepared[name] = self._start_of_update(name, sequences) if decoupled else sequences
        return prepared

    @torch.no_grad()
    def _start_of_update(self, name: str, batch: Sequences) -> Sequences:
        """Decoupled PPO's references: the start policy's log-probabilities of the batch's actions, the
        advantages' weights start / acting policy truncated at `ppo.behaviour_weight_max`, and the
        critic's start outputs (one forward of each network over the batch)."""
        actor, critic, _ = self.model.group(name)
        logp_start = policy(actor, batch).log_prob(batch.actions)
        weight = (logp_start - batch.logp_old).exp()
        if self.ppo.behaviour_weight_max is not None:
            weight = weight.clamp(max=self.ppo.behaviour_weight_max)
        return dataclasses.replace(
            batch,
            logp_ref=logp_start,
            weight=torch.where(batch.alive, weight, 1.0),  # absent agents' log-probs mean nothing
            value_ref=critic_values(critic, batch),
        )

    def update(self, batches: Mapping[str, AgentBatch], *, lagged: bool = False) -> TrainStats:
        """One PPO update on the groups' batches (raw advantages, return-unit values).

        `lagged`: the batches were collected by the policy one update behind this one (policy lag 1);
        `ppo.lagged_ratio` says how the update treats them. Not lagged, nothing of it is computed.
        """
        self.updates += 1
        self._skips = 0
        stats_in = batch_statistics(batches)
        decoupled = lagged and self.ppo.lagged_ratio == "decoupled"
        sequences = self.prepare(batches, decoupled=decoupled)
        probe = diagnostic_rows(sequences)  # the same rows before and after, so the deltas compare
        by_batch = self.ppo.update_stats == "batch"
        before = self._evaluate(probe) if by_batch or lagged else None
        lag = lag_statistics(probe, before, decoupled=decoupled) if before is not None and lagged else {}
        self._means = None if by_batch else MinibatchMeans()
        pi_epochs, pi_steps = 0, 0
        for turn in self.actor_update.turns(sequences):
            epochs, steps = self._epochs(turn)
            pi_epochs, pi_steps = max(pi_epochs, epochs), pi_steps + steps
        after = self._evaluate(probe) if self._means is None else self._means.evaluation()
        return update_stats(
            before if by_batch else None,
            after,
            stop_iter=pi_epochs,
            pi_steps=pi_steps,
            nonfinite_skips=self._skips,
            batch=stats_in,
            lag=lag,
            agents=self.actor_update.scalars(),
        )

    def _epochs(self, turn: Turn) -> tuple[int, int]:
        """A turn's actor and critic epochs over its prepared batches; the actor epochs begun and steps taken.

        The turn's actors stop at once when their KL from the start policy passes the bound (`_step`);
        the critic, when it learns in the turn, finishes its epochs.
        """
        ppo, batches = self.ppo, turn.batches
        pi_iters = ppo.train_pi_iters
        vf_iters = ppo.train_vf_iters if turn.critic else 0
        policy_active, pi_epochs, pi_steps = True, 0, 0
        for epoch in range(max(pi_iters, vf_iters)):
            train_vf = epoch < vf_iters
            if not (train_vf or (policy_active and epoch < pi_iters)):
                break
            begun = False
            for k, minibatch in enumerate(chunk_minibatches(batches, ppo.num_minibatches, self.generator)):
                train_pi = policy_active and epoch < pi_iters
                if not (train_pi or train_vf):
                    break
                trained_pi, stepped = self._step(
                    minibatch,
                    turn,
                    train_pi=train_pi,
                    train_vf=train_vf,
                    check_kl=pi_steps > 0,
                    where=(epoch, k),
                )
                if train_pi and not trained_pi:  # the KL stop: the actors sit out the rest
                    policy_active = False
                if trained_pi and not begun:
                    begun, pi_epochs = True, pi_epochs + 1
                pi_steps += int(trained_pi and stepped)
        return pi_epochs, pi_steps

    def _kl_exceeded(self, diagnostics: Mapping[str, dict[str, torch.Tensor]]) -> bool:
        """Whether the actors' approximate KL from the policy at the start of the update, on the
        minibatch about to be stepped on, exceeds 1.5 * target_kl in any group."""
        if self.ppo.target_kl is None:
            return False
        kls = torch.stack([terms["kl"] for terms in diagnostics.values() if "kl" in terms])
        return bool(kls.max() > 1.5 * self.ppo.target_kl)

    def _losses(
        self, batches: Mapping[str, Sequences], learners: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, dict[str, torch.Tensor]]]:
        """Summed actor and critic losses over groups, plus per-group diagnostics.

        `learners` (group -> `(A_g,)` bool, see `Turn.learners`): the agents whose actor terms enter the
        loss; a group not named (every group in a critic-only step) skips its actors' forward and its
        diagnostics hold only `loss_v`.
        """
        ppo = self.ppo
        loss_pi = torch.zeros(())
        loss_v = torch.zeros(())
        diagnostics: dict[str, dict[str, torch.Tensor]] = {}
        for name, batch in batches.items():
            actor, critic, _ = self.model.group(name)
            count = mask_count(batch.alive)  # the value loss's divisor
            diagnostics[name] = {}
            agents = learners.get(name)
            if agents is not None:
                acting = batch.alive & agents  # every live sample when every agent learns
                count_pi = mask_count(acting)  # one divisor for the actor's four means
                dist = policy(actor, batch)
                terms = policy_loss(
                    dist.log_prob(batch.actions),
                    batch.logp_ref,
                    batch.advantages,
                    acting,
                    clip_ratio=ppo.clip_ratio,
                    weights=batch.weight,
                    count=count_pi,
                )
                entropy = masked_mean(dist.entropy(), acting, count_pi)
                group_pi = terms.loss - self.entropy_coef * entropy
                loss_pi = loss_pi + group_pi
                diagnostics[name] = {
                    "kl": terms.approx_kl,
                    "clipfrac": terms.clipfrac,
                    "entropy": entropy.detach(),
                    "loss_pi": group_pi.detach(),
                }
            values = critic_values(critic, batch)
            group_v = value_loss(  # prepared batches hold the clip's centre and returns in the critic's units
                values,
                batch.value_ref,
                batch.returns,
                batch.alive,
                huber_delta=ppo.huber_delta,
                clip=ppo.value_clip,
                count=count,
            )
            loss_v = loss_v + group_v
            diagnostics[name]["loss_v"] = group_v.detach()
        return loss_pi, loss_v, diagnostics

    def _step(
        self,
        minibatch: Mapping[str, Sequences],
        turn: Turn,
        *,
        train_pi: bool,
        train_vf: bool,
        check_kl: bool,
        where: tuple[int, int],
    ) -> tuple[bool, bool]:
        """One optimizer step: whether the actors were in it, and whether it was taken (False when it
        was skipped for a non-finite loss or gradient).

        `check_kl`: the actors have stepped in this update, so before they step again the KL of the
        minibatch's forward (computed for the loss anyway) is checked against the bound; past it, the
        actors leave this step and every later one.
        """
        loss_pi, loss_v, diagnostics = self._losses(minibatch, turn.learners if train_pi else {})
        if train_pi and check_kl and self._kl_exceeded(diagnostics):
            train_pi = False
        if not (train_pi or train_vf):
            return False, False
        self._zero_grad()
        terms = [loss for loss, on in ((loss_pi, train_pi), (loss_v, train_vf)) if on]
        total = terms[0] if len(terms) == 1 else terms[0] + terms[1]
        total.backward()
        checked = [total.detach().reshape(1)]
        if train_pi:
            checked.append(self._clip(turn.optimizer, self.model.actors))
        if train_vf:
            checked.append(self._clip(self.critic_optimizer, self.model.critics))
        if not bool(torch.isfinite(torch.cat(checked)).all()):  # one check (one sync) per step
            self._nonfinite(
                self._culprit(diagnostics, train_pi, train_vf), f"epoch {where[0]}, minibatch {where[1]}"
            )
            return train_pi, False
        if train_pi:
            turn.optimizer.step()
        if train_vf:
            self.critic_optimizer.step()
        if self._means is not None:
            self._means.add(diagnostics, actor=train_pi, critic=train_vf)
        return train_pi, True

    def _zero_grad(self) -> None:
        for optimizer in self._optimizers():
            optimizer.zero_grad()

    def _clip(self, optimizer: torch.optim.Optimizer, networks: nn.ModuleList) -> torch.Tensor:
        """Clip the gradients of the optimizer over the groups' `networks` as `ppo.grad_clip` says: one
        norm over all of them, or one per group's network; the norms before (1-D)."""
        if self.ppo.grad_clip == "per_group":
            parts = group_parts(optimizer, networks)
            return clip_grad_norms(optimizer, self.ppo.max_grad_norm, parts=parts)
        return clip_grad_norms(optimizer, self.ppo.max_grad_norm)

    def _culprit(
        self, diagnostics: Mapping[str, dict[str, torch.Tensor]], train_pi: bool, train_vf: bool
    ) -> str:
        """Name the first non-finite term of a failed step: a group's loss, else its gradient."""
        for group, terms in diagnostics.items():
            for term, active in (("loss_pi", train_pi), ("loss_v", train_vf)):
                if active and term in terms and not bool(torch.isfinite(terms[term])):
                    return f"{term} ({float(terms[term])}) in group '{group}'"
        for group in self.model.group_names():
            actor, critic, _ = self.model.group(group)
            for name, module, active in (("actor", actor, train_pi), ("critic", critic, train_vf)):
                grads = [p.grad for p in module.parameters() if p.grad is not None]
                if active and grads and not bool(torch.isfinite(nn.utils.get_total_norm(grads))):
                    return f"{name} gradient in group '{group}'"
        return "gradient norm"

    def _nonfinite(self, what: str, where: str) -> None:
        """Raise NonFiniteError (ppo.on_nonfinite=error) or count a skipped step (skip)."""
        if self.ppo.on_nonfinite == "skip":
            self._skips += 1
            self._zero_grad()
            return
        raise NonFiniteError(
            f"non-finite {what} at update {self.updates} ({where}); no weights were changed by it. "
            "Lower ppo.pi_lr / ppo.vf_lr or scale the rewards, or set ppo.on_nonfinite=skip to drop such steps"
        )

    @torch.no_grad()
    def _evaluate(self, batches: Mapping[str, Sequences]) -> Evaluation:
        loss_pi, loss_v, diagnostics = self._losses(batches, everyone(batches))

        def mean(key: str) -> float:
            return float(sum(d[key] for d in diagnostics.values()) / len(diagnostics))

        return Evaluation(float(loss_pi), float(loss_v), mean("kl"), mean("entropy"), mean("clipfrac"))


def _order_seed(seed: int) -> int:
    """The seed of a sequential actor update's order, apart from the minibatch generator's `seed`."""
    return int(np.random.SeedSequence([seed, 37]).generate_state(1)[0])


_ADVANTAGE_NORMS = {"group": normalize_advantages, "agent": normalize_advantages_per_agent}
"""`ppo.advantage_norm`: over a group's live samples, or over each agent's."""
