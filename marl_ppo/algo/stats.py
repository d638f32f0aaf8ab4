"""What one update reports (`TrainStats`, logged under `train/`) and how it is computed: the
diagnostic rows the before/after evaluations run on, the batch's value statistics, and the lag's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from marl_ppo.algo.batch import AgentBatch
from marl_ppo.algo.losses import approx_kl, explained_variance, masked_mean
from marl_ppo.algo.sequences import Sequences, diagnostic_chunks


@dataclass(frozen=True)
class TrainStats:
    """Per-update metrics (logged under `train/`). Losses are summed over groups, diagnostics averaged."""

    loss_pi: float
    """Actor loss over the batch after the update (clipped surrogate minus entropy bonus). This and the
    other after-update diagnostics use the whole batch up to DIAGNOSTIC_ROWS agent-steps, else an even
    stride of env steps holding about that many. With `ppo.update_stats: minibatches`, this, loss_v,
    kl, entropy and clipfrac are instead the means over the update's steps of each minibatch's forward
    (the actors' terms over the steps the actors took, loss_v over the critic's)."""
    delta_loss_pi: float | None
    """loss_pi after minus before the update; None (not logged) with `ppo.update_stats: minibatches`."""
    loss_v: float
    """Value loss over the batch after the update (critic units)."""
    delta_loss_v: float | None
    """loss_v after minus before the update; None as delta_loss_pi."""
    kl: float
    """Approximate KL(old || new) over the batch after the update, from the policy the ratio is taken
    against: the acting policy, or with decoupled policy lag the policy at the start of the update (the
    update's own movement)."""
    entropy: float
    """Exact entropy of the updated policies, mean over live agent-steps."""
    clipfrac: float
    """Fraction of live samples whose ratio (as for kl) is outside the clip range after the update."""
    stop_iter: int
    """Actor epochs begun, an epoch counting once the actors enter one of its steps (fewer than
    train_pi_iters when the KL early stop fired)."""
    pi_steps: int
    """Actor minibatch steps taken: train_pi_iters * num_minibatches, fewer when the KL early stop
    fired (the step that crossed the bound is the last) or non-finite steps were skipped."""
    explained_variance: float
    """1 - Var(return - value) / Var(return), with the acting-time values."""
    value_mean: float
    """Mean critic value over the batch's live samples, in return units."""
    return_mean: float
    """Mean GAE return target over the batch's live samples."""
    nonfinite_skips: int = 0
    """Steps dropped this update for a NaN or inf loss, gradient or return (`ppo.on_nonfinite: skip`)."""
    kl_behaviour_start: float | None = None
    """With policy lag: approximate KL(acting policy || policy at the start of the update) over the
    diagnostic rows, how far the lag put the two apart; None (not logged) without lag."""
    behaviour_weight_mean: float | None = None
    """With policy lag and `ppo.lagged_ratio: decoupled`: the mean over live samples of the advantages'
    truncated weights start policy / acting policy; None (not logged) otherwise."""
    agents: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Per-agent diagnostics by full tag (`agents/<id>/...`) from a sequential actor update (HAPPO): each
    agent's turn in the order, the mean and spread of the factor it was handed, and its KL and clip
    fraction after its turn; empty otherwise."""

    def scalars(self) -> dict[str, float]:
        """Every statistic that applies to the run (None ones are left out) by full TensorBoard tag:
        `train/<field>`, and the per-agent ones under `agents/<id>/`."""
        values = {
            f"train/{field.name}": float(value)
            for field in dataclasses.fields(self)
            if field.name != "agents" and (value := getattr(self, field.name)) is not None
        }
        return {**values, **self.agents}


@dataclass(frozen=True)
class Evaluation:
    loss_pi: float
    loss_v: float
    kl: float
    entropy: float
    clipfrac: float


class MinibatchMeans:
    """The means over an update's minibatch steps of what each step's forward computed
    (`ppo.update_stats: minibatches`): the actors' loss, KL, entropy and clip fraction over the steps
    the actors took, the critic's loss over the critic's. Kept as tensors, read once at the end."""

    def __init__(self) -> None:
        self.actor: list[torch.Tensor] = []
        self.critic: list[torch.Tensor] = []

    def add(
        self, diagnostics: Mapping[str, Mapping[str, torch.Tensor]], *, actor: bool, critic: bool
    ) -> None:
        """One step taken: `diagnostics` per group as `Trainer._losses` returns them (the actors' terms
        in the groups whose actors were in the step); `actor` / `critic`, which of them stepped."""
        if actor:
            groups = [terms for terms in diagnostics.values() if "kl" in terms]
            self.actor.append(
                torch.stack(
                    [
                        torch.stack([terms["loss_pi"] for terms in groups]).sum(),
                        *(torch.stack([terms[key] for terms in groups]).mean() for key in _ACTOR_MEANS),
                    ]
                )
            )
        if critic:
            self.critic.append(torch.stack([terms["loss_v"] for terms in diagnostics.values()]).sum())

    def evaluation(self) -> Evaluation:
        """The means (NaN for a network that took no step)."""
        nan = float("nan")
        actor = torch.stack(self.actor).mean(0).tolist() if self.actor else [nan] * 4
        loss_v = float(torch.stack(self.critic).mean()) if self.critic else nan
        return Evaluation(actor[0], loss_v, *actor[1:])


_ACTOR_MEANS = ("kl", "entropy", "clipfrac")
"""The actors' terms averaged over groups (the loss is summed), in `Evaluation`'s order."""


def update_stats(
    before: Evaluation | None,
    after: Evaluation,
    *,
    stop_iter: int,
    pi_steps: int,
    nonfinite_skips: int,
    batch: Mapping[str, float],
    lag: Mapping[str, float] | None = None,
    agents: Mapping[str, float] | None = None,
) -> TrainStats:
    """An update's statistics from the diagnostics before and after it, as every learner reports them:
    the after-update values, their change over the update (None without `before`: `after` holds the
    minibatch means), the step counts, the batch's and the lag's."""
    return TrainStats(
        loss_pi=after.loss_pi,
        delta_loss_pi=None if before is None else after.loss_pi - before.loss_pi,
        loss_v=after.loss_v,
        delta_loss_v=None if before is None else after.loss_v - before.loss_v,
        kl=after.kl,
        entropy=after.entropy,
        clipfrac=after.clipfrac,
        stop_iter=stop_iter,
        pi_steps=pi_steps,
        nonfinite_skips=nonfinite_skips,
        agents=dict(agents or {}),
        **batch,
        **(lag or {}),
    )


def lag_statistics(
    probe: Mapping[str, Sequences], before: Evaluation, *, decoupled: bool
) -> dict[str, float]:
    """KL(acting || start policy) and, under decoupled lag, the mean advantage weight, over the probe rows."""
    if not decoupled:  # lagged_ratio: behaviour: the ratio's reference is the acting policy
        return {"kl_behaviour_start": before.kl}  # the start policy's KL from the ratio's reference
    kls = [approx_kl(b.logp_ref, b.logp_old, b.alive) for b in probe.values()]
    weights = [masked_mean(b.weight, b.alive) for b in probe.values()]
    return {
        "kl_behaviour_start": float(sum(kls) / len(kls)),
        "behaviour_weight_mean": float(sum(weights) / len(weights)),
    }


DIAGNOSTIC_ROWS = 8192
"""Agent-steps (an env step counts once per agent of every group) the before/after-update diagnostics
are computed on; more would only cost learner time, the more so the larger the team."""


def diagnostic_rows(batches: Mapping[str, Sequences]) -> Mapping[str, Sequences]:
    """The sequences, or an even stride of whole chunks holding at most DIAGNOSTIC_ROWS agent-steps when
    they hold more (chunks of one env step for feed-forward networks: rows)."""
    return diagnostic_chunks(batches, DIAGNOSTIC_ROWS)


def batch_statistics(batches: Mapping[str, AgentBatch]) -> dict[str, float]:
    values = torch.cat([b.values_old[b.alive] for b in batches.values()])
    returns = torch.cat([b.returns[b.alive] for b in batches.values()])
    mask = torch.ones_like(values, dtype=torch.bool)
    return {
        "explained_variance": explained_variance(values, returns, mask),
        "value_mean": float(values.mean()) if values.numel() else 0.0,
        "return_mean": float(returns.mean()) if returns.numel() else 0.0,
    }
