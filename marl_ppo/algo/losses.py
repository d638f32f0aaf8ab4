"""PPO loss terms as pure functions over masked `(N, A)` tensors; they return named terms."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor, count: torch.Tensor | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set (0 when nothing is); masked-out entries may hold anything.

    `count` is `mask_count(mask)`, for callers that take several means under one mask.
    """
    total = torch.where(mask, values, 0.0).sum()
    return total / (mask_count(mask) if count is None else count)


def mask_count(mask: torch.Tensor) -> torch.Tensor:
    """The number of set entries as a float tensor, at least 1 (the divisor of `masked_mean`)."""
    return mask.sum().clamp_min(1).to(torch.get_default_dtype())


@dataclass(frozen=True)
class PolicyTerms:
    """Clipped surrogate loss and its diagnostics."""

    loss: torch.Tensor
    approx_kl: torch.Tensor
    """Estimate of KL(old || new): mean of (ratio - 1) - log ratio."""
    clipfrac: torch.Tensor
    """Fraction of samples whose ratio left [1 - clip, 1 + clip]."""


def policy_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    alive: torch.Tensor,
    *,
    clip_ratio: float,
    weights: torch.Tensor | None = None,
    count: torch.Tensor | None = None,
) -> PolicyTerms:
    """PPO's clipped surrogate objective, negated, over live samples (`count`: see masked_mean).

    The ratio is `exp(logp - logp_old)`; `weights` (no gradient) scale each sample's clipped term:
    decoupled PPO takes the ratio against the policy at the start of the update and weights the
    terms by start policy / acting policy. None: every sample weighs 1.
    """
    count = mask_count(alive) if count is None else count
    log_ratio = logp - logp_old
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1.0 - clip_ratio, 1.0 + clip_ratio) * advantages)
    if weights is not None:
        surrogate = weights * surrogate
    with torch.no_grad():
        approx_kl = _k3(ratio, log_ratio, alive, count)
        clipfrac = masked_mean(((ratio - 1.0).abs() > clip_ratio).float(), alive, count)
    return PolicyTerms(-masked_mean(surrogate, alive, count), approx_kl, clipfrac)


def approx_kl(
    logp: torch.Tensor, logp_old: torch.Tensor, alive: torch.Tensor, count: torch.Tensor | None = None
) -> torch.Tensor:
    """Estimate of KL(old || new) from the sampled actions' log-probabilities: the mean over live
    samples of (ratio - 1) - log ratio, unbiased and never negative (`count`: see masked_mean)."""
    log_ratio = logp - logp_old
    return _k3(log_ratio.exp(), log_ratio, alive, count)


def _k3(
    ratio: torch.Tensor, log_ratio: torch.Tensor, alive: torch.Tensor, count: torch.Tensor | None
) -> torch.Tensor:
    return masked_mean((ratio - 1.0) - log_ratio, alive, count)


def value_loss(
    values: torch.Tensor,
    values_old: torch.Tensor,
    targets: torch.Tensor,
    alive: torch.Tensor,
    *,
    huber_delta: float | None,
    clip: float | None,
    count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Squared or Huber error to `targets`, pessimistic over the clipped value when `clip` is set
    (`count`: see masked_mean)."""

    def error(prediction: torch.Tensor) -> torch.Tensor:
        if huber_delta is None:
            return 0.5 * (prediction - targets).pow(2)
        return F.huber_loss(prediction, targets, delta=huber_delta, reduction="none")

    loss = error(values)
    if clip is not None:
        clipped = values_old + (values - values_old).clamp(-clip, clip)
        loss = torch.max(loss, error(clipped))
    return masked_mean(loss, alive, count)


def normalize_advantages(advantages: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Standardize one group's advantages over its live samples."""
    mean = masked_mean(advantages, alive)
    var = masked_mean((advantages - mean).pow(2), alive)
    return (advantages - mean) / (var.sqrt() + 1e-8)


def normalize_advantages_per_agent(advantages: torch.Tensor, alive: torch.Tensor) -> torch.Tensor:
    """Standardize each agent's advantages (a column of `(N, A)`) over its own live samples."""
    count = alive.sum(0).clamp_min(1).to(advantages.dtype)
    mean = torch.where(alive, advantages, 0.0).sum(0) / count
    var = torch.where(alive, (advantages - mean).pow(2), 0.0).sum(0) / count
    return (advantages - mean) / (var.sqrt() + 1e-8)


def explained_variance(predictions: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(targets - predictions) / Var(targets) over masked entries (nan when targets are constant)."""
    residual = targets - predictions
    mean_t = masked_mean(targets, mask)
    var_t = masked_mean((targets - mean_t).pow(2), mask)
    mean_r = masked_mean(residual, mask)
    var_r = masked_mean((residual - mean_r).pow(2), mask)
    return float("nan") if var_t.item() == 0 else float(1.0 - var_r / var_t)
