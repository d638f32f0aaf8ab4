"""Action distributions for Discrete, MultiDiscrete and Box spaces, over `(..., A)` agent batches.

Small hand-rolled classes rather than torch.distributions: the hot path needs only sample,
log_prob, exact entropy and mode, without argument validation.
"""

from __future__ import annotations

import math
from typing import Protocol

import gymnasium as gym
import torch


class ActionDistribution(Protocol):
    """What the trainer and collector need from a policy's output."""

    def sample(self) -> torch.Tensor: ...
    def mode(self) -> torch.Tensor: ...
    def log_prob(self, actions: torch.Tensor) -> torch.Tensor: ...
    def entropy(self) -> torch.Tensor: ...


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


def head_size(space: gym.Space) -> int:
    """Network outputs needed to parameterise a distribution over `space`."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.Box):
        return int(math.prod(space.shape))
    raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")


class LibraryDistribution:
    """A `torch.distributions` distribution (or a product of categoricals) with the ActionDistribution
    interface: the same log-probabilities, entropies and modes as ours, samples drawn torch's way."""

    def __init__(self, parts: list[torch.distributions.Distribution], *, stacked: bool) -> None:
        self.parts = parts
        self.stacked = stacked
        """True for a MultiDiscrete product: one categorical per action dimension, on the last axis."""

    def sample(self) -> torch.Tensor:
        """One sample (per dimension, stacked, for a product)."""
        if self.stacked:
            return torch.stack([part.sample() for part in self.parts], dim=-1)
        return self.parts[0].sample()

    def mode(self) -> torch.Tensor:
        """Most likely action (the mean, for a Gaussian)."""
        if self.stacked:
            return torch.stack([part.mode for part in self.parts], dim=-1)
        return self.parts[0].mode

    def log_prob(self, actions: torch.Tensor) -> torch.Tensor:
        """log p(a), `(..., A)`; summed over a product's dimensions."""
        if self.stacked:
            return sum(part.log_prob(actions[..., k]) for k, part in enumerate(self.parts))
        return self.parts[0].log_prob(actions)

    def entropy(self) -> torch.Tensor:
        """Exact entropy, `(..., A)`; summed over a product's dimensions."""
        return sum(part.entropy() for part in self.parts)


def library_distribution(
    space: gym.Space, output: torch.Tensor, log_std: torch.Tensor | None, mask: torch.Tensor | None = None
) -> ActionDistribution:
    """`make_distribution` built from torch.distributions (`fast.distributions: false`)."""
    from torch.distributions import Categorical as TorchCategorical
    from torch.distributions import Independent, Normal

    def categorical(logits: torch.Tensor, part_mask: torch.Tensor | None) -> TorchCategorical:
        if part_mask is not None:
            logits = logits.masked_fill(~part_mask, MASKED_LOGIT)
        return TorchCategorical(logits=logits, validate_args=False)

    if isinstance(space, gym.spaces.Discrete):
        return LibraryDistribution([categorical(output, mask)], stacked=False)
    if isinstance(space, gym.spaces.MultiDiscrete):
        sizes = [int(n) for n in space.nvec.reshape(-1)]
        masks = torch.split(mask, sizes, dim=-1) if mask is not None else [None] * len(sizes)
        parts = [categorical(c, m) for c, m in zip(torch.split(output, sizes, dim=-1), masks, strict=True)]
        return LibraryDistribution(parts, stacked=True)
    if isinstance(space, gym.spaces.Box):
        assert log_std is not None
        normal = Normal(output, log_std.expand_as(output).exp(), validate_args=False)
        return LibraryDistribution([Independent(normal, 1, validate_args=False)], stacked=False)
    raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")


def make_distribution(
    space: gym.Space,
    output: torch.Tensor,
    log_std: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    *,
    library: bool = False,
) -> ActionDistribution:
    """Wrap the actor's raw output (and the action mask, for discrete spaces) in the fitting distribution:
    ours, or torch.distributions' with `library=True`."""
    if library:
        return library_distribution(space, output, log_std, mask)
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(output, mask)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(output, [int(n) for n in space.nvec.reshape(-1)], mask)
    if isinstance(space, gym.spaces.Box):
        assert log_std is not None
        return DiagGaussian(output, log_std)
    raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")
