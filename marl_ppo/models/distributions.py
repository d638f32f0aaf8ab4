"""Action distributions for Discrete, MultiDiscrete and Box spaces, over `(..., A)` agent batches, from
torch.distributions (without argument validation): `make_distribution`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, cast

import gymnasium as gym
import torch
from torch.distributions import Categorical, Independent, Normal

MASKED_LOGIT = -1e9
"""Logit given to a masked action: its probability is exactly 0 and it is never sampled."""


class ActionDistribution(Protocol):
    """What the trainer and collector need from a policy's output."""

    def sample(self) -> torch.Tensor: ...
    def mode(self) -> torch.Tensor: ...
    def log_prob(self, actions: torch.Tensor) -> torch.Tensor: ...
    def entropy(self) -> torch.Tensor: ...


def head_size(space: gym.Space) -> int:
    """Network outputs needed to parameterise a distribution over `space`."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(space.nvec.sum())
    if isinstance(space, gym.spaces.Box):
        return int(math.prod(space.shape))
    raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")


class TorchDistribution:
    """A `torch.distributions` distribution, or a product of categoricals (MultiDiscrete), with the
    ActionDistribution interface: log-probabilities and entropies per agent, `(..., A)`."""

    def __init__(self, parts: Sequence[torch.distributions.Distribution], *, stacked: bool) -> None:
        self.parts = list(parts)
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
            return cast(
                torch.Tensor, sum(part.log_prob(actions[..., k]) for k, part in enumerate(self.parts))
            )
        return self.parts[0].log_prob(actions)

    def entropy(self) -> torch.Tensor:
        """Exact entropy, `(..., A)`; summed over a product's dimensions."""
        return cast(torch.Tensor, sum(part.entropy() for part in self.parts))


def make_distribution(
    space: gym.Space, output: torch.Tensor, log_std: torch.Tensor | None, mask: torch.Tensor | None = None
) -> ActionDistribution:
    """Wrap the actor's raw output (and the action mask, for discrete spaces) in the fitting distribution."""

    def categorical(logits: torch.Tensor, part_mask: torch.Tensor | None) -> Categorical:
        if part_mask is not None:
            logits = logits.masked_fill(~part_mask, MASKED_LOGIT)
        return Categorical(logits=logits, validate_args=False)

    if isinstance(space, gym.spaces.Discrete):
        return TorchDistribution([categorical(output, mask)], stacked=False)
    if isinstance(space, gym.spaces.MultiDiscrete):
        sizes = [int(n) for n in space.nvec.reshape(-1)]
        masks = torch.split(mask, sizes, dim=-1) if mask is not None else [None] * len(sizes)
        parts = [categorical(c, m) for c, m in zip(torch.split(output, sizes, dim=-1), masks, strict=True)]
        return TorchDistribution(parts, stacked=True)
    if isinstance(space, gym.spaces.Box):
        assert log_std is not None
        normal = Normal(output, log_std.expand_as(output).exp(), validate_args=False)
        return TorchDistribution([Independent(normal, 1, validate_args=False)], stacked=False)
    raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")
