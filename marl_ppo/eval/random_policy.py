"""The uniform random policy: the floor a result is read against, and the opponent of `eval.vs_random`."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.envs.spec import GroupSpec, TeamArrays, TeamSpec


class RandomActing:
    """The uniform random policy as the stepping loop drives it (`rollout.stepper.Acting`): no state."""

    def __init__(self, spec: TeamSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, uniform actions among the allowed ones."""
        return random_actions(self.spec, arrays, self.device)

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Nothing to carry."""


def random_actions(spec: TeamSpec, arrays: TeamArrays, device: torch.device) -> dict[str, torch.Tensor]:
    """Per group, an action for every agent drawn uniformly among its allowed ones (Box: uniform in its bounds)."""
    return {
        group.name: _random_group(group, _mask(arrays, group.name, device), device) for group in spec.groups
    }


def _mask(arrays: TeamArrays, name: str, device: torch.device) -> torch.Tensor:
    mask = arrays.groups[name].action_mask
    return mask.to(device) if isinstance(mask, torch.Tensor) else torch.from_numpy(mask).to(device)


def _uniform_index(mask: torch.Tensor) -> torch.Tensor:
    """One index per row of a `(..., n)` boolean mask, uniform over its True entries (all, where none is)."""
    weights = mask.float()
    weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, torch.ones_like(weights))
    flat = torch.multinomial(weights.reshape(-1, weights.shape[-1]), 1)
    return flat.reshape(mask.shape[:-1])


def _random_group(group: GroupSpec, mask: torch.Tensor, device: torch.device) -> torch.Tensor:
    space, lead = group.action_space, mask.shape[:-1]
    if isinstance(space, gym.spaces.Discrete):
        full = mask if group.mask_dim else torch.ones((*lead, int(space.n)), dtype=torch.bool, device=device)
        return _uniform_index(full)
    if isinstance(space, gym.spaces.MultiDiscrete):
        sizes = [int(n) for n in space.nvec.reshape(-1)]
        if not group.mask_dim:
            mask = torch.ones((*lead, sum(sizes)), dtype=torch.bool, device=device)
        return torch.stack([_uniform_index(part) for part in torch.split(mask, sizes, dim=-1)], -1)
    low = torch.as_tensor(np.clip(space.low, -1.0, 1.0).reshape(-1), device=device)  # unbounded: [-1, 1]
    high = torch.as_tensor(np.clip(space.high, -1.0, 1.0).reshape(-1), device=device)
    return (low + (high - low) * torch.rand((*lead, low.numel()), device=device)).float()
