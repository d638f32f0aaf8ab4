"""Running statistics for value normalization (MAPPO's ValueNorm), stored as module buffers."""

from __future__ import annotations

import torch
from torch import nn


class ValueNorm(nn.Module):
    """Exact running mean/variance of value targets; the critic learns `(return - mean) / std`.

    The variance is floored at `var_floor` when dividing (MAPPO's ValueNorm clamps it at 1e-2, so
    std >= 0.1): with sparse rewards, a long run of zero returns would otherwise shrink the std until a
    first reward of 0.9 becomes a target of hundreds. Disabled (`enabled=False`) it is the identity,
    so callers never branch on it.
    """

    # buffers (float64 scalars, registered in __init__): the targets' running mean, variance and count
    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, *, enabled: bool, var_floor: float = 1e-2) -> None:
        super().__init__()
        self.enabled = enabled
        self.var_floor = var_floor
        self.register_buffer("mean", torch.zeros((), dtype=torch.float64))
        self.register_buffer("var", torch.ones((), dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, values: torch.Tensor) -> None:
        """Merge a batch of targets into the running statistics (parallel-variance formula)."""
        if not self.enabled or values.numel() == 0:
            return
        batch = values.detach().to(torch.float64).reshape(-1)
        batch_mean, batch_var, n = batch.mean(), batch.var(unbiased=False), float(batch.numel())
        total = self.count + n
        delta = batch_mean - self.mean
        self.var.copy_(
            (self.var * self.count + batch_var * n + delta.pow(2) * self.count * n / total) / total
        )
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        """Running standard deviation, at least sqrt(var_floor) (float64 scalar)."""
        return torch.sqrt(self.var.clamp_min(self.var_floor))

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """Return units -> the critic's units."""
        if not self.enabled:
            return values
        return ((values - self.mean) / self.std).to(values.dtype)

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """The critic's units -> return units."""
        if not self.enabled:
            return values
        return (values * self.std + self.mean).to(values.dtype)
