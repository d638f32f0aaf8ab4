"""Action distributions over `(..., A)` agent batches, written out: Categorical, MultiCategorical and a
diagonal Gaussian with only what PPO needs (sample, mode, log_prob, exact entropy), no argument
validation, and Gumbel-max sampling. `fast.distributions: false` uses torch.distributions instead
(`marl_ppo.models.distributions.library_distribution`)."""

from __future__ import annotations

import math

import torch

MASKED_LOGIT = -1e9
"""Logit given to a masked action: its probability is exactly 0 and it is never sampled."""


class Categorical:
    """One categorical per agent; logits `(..., A, n)`, actions `(..., A)` int64; optional bool mask `(..., A, n)`."""

    def __init__(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        if mask is not None:
            logits = logits.masked_fill(~mask, MASKED_LOGIT)
        self.log_probs = logits - logits.logsumexp(-1, keepdim=True)

    def sample(self) -> torch.Tensor:
        """Gumbel-max sample."""
        uniform = torch.rand_like(self.log_probs).clamp_(1e-20, 1.0)
        return (self.log_probs - torch.log(-torch.log(uniform))).argmax(-1)

    def mode(self) -> torch.Tensor:
        """Most likely action."""
        return self.log_probs.argmax(-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """log p(a), `(..., A)`."""
        return self.log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def entropy(self) -> torch.Tensor:
        """Exact entropy, `(..., A)`."""
        return -(self.log_probs.exp() * self.log_probs).sum(-1)


class MultiCategorical:
    """Independent categoricals per action dimension; actions `(..., A, k)` int64."""

    def __init__(self, logits: torch.Tensor, sizes: list[int], mask: torch.Tensor | None = None) -> None:
        masks = torch.split(mask, sizes, dim=-1) if mask is not None else [None] * len(sizes)
        self.parts = [
            Categorical(c, m) for c, m in zip(torch.split(logits, sizes, dim=-1), masks, strict=True)
        ]

    def sample(self) -> torch.Tensor:
        """One sample per dimension."""
        return torch.stack([part.sample() for part in self.parts], dim=-1)

    def mode(self) -> torch.Tensor:
        """Most likely action per dimension."""
        return torch.stack([part.mode() for part in self.parts], dim=-1)

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Sum of the dimensions' log-probabilities."""
        return sum(part.log_prob(actions[..., k]) for k, part in enumerate(self.parts))

    def entropy(self) -> torch.Tensor:
        """Sum of the dimensions' exact entropies."""
        return sum(part.entropy() for part in self.parts)


class DiagGaussian:
    """Diagonal Gaussian; mean `(..., A, d)`, log_std broadcastable to it; actions `(..., A, d)`."""

    def __init__(self, mean: torch.Tensor, log_std: torch.Tensor) -> None:
        self.mean = mean
        self.log_std = log_std.expand_as(mean)

    def sample(self) -> torch.Tensor:
        """Reparameterised sample (unclipped; the env adapter clips to the Box bounds)."""
        return self.mean + self.log_std.exp() * torch.randn_like(self.mean)

    def mode(self) -> torch.Tensor:
        """The mean."""
        return self.mean

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """Sum over action dimensions of the Gaussian log-density."""
        z = (actions - self.mean) * torch.exp(-self.log_std)
        return (-0.5 * z.pow(2) - self.log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self) -> torch.Tensor:
        """Exact differential entropy."""
        return (self.log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1)
