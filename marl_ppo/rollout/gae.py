"""Generalized advantage estimation as pure functions over time-major tensors."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and return targets for time-major `(T, ...)` tensors of identical shape.

    `next_values[t]` is the value of the state after step t (at a truncation: of the final
    observation, read before any reset). `terminated` zeroes that bootstrap; `done`
    (terminated or truncated) stops the lambda-trace from flowing back across an episode end.
    """
    shape = rewards.shape
    for name, tensor in (
        ("values", values),
        ("next_values", next_values),
        ("terminated", terminated),
        ("done", done),
    ):
        if tensor.shape != shape:
            raise ValueError(f"compute_gae: {name} has shape {tuple(tensor.shape)}, rewards {tuple(shape)}")
    if len(shape) == 0:
        raise ValueError("compute_gae: inputs need a leading time dimension")
    if not (0.0 < gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"compute_gae: need 0 < gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_done = 1.0 - done.to(rewards.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    decay = gamma * lam * not_done
    advantages = torch.empty_like(rewards)
    running = torch.zeros_like(rewards[0])
    for t in range(shape[0] - 1, -1, -1):
        running = deltas[t] + decay[t] * running
        advantages[t] = running
    return advantages, advantages + values


def bootstrap_values(
    values: torch.Tensor, last_values: torch.Tensor, final_values: torch.Tensor, truncated: torch.Tensor
) -> torch.Tensor:
    """`next_values` for compute_gae: V of the following step, or V(final obs) where the step truncated.

    `values` is `(T, ...)`, `last_values` the values after the last step `(...)`, `final_values`
    `(T, ...)` holds V(final obs/state) wherever `truncated` is set (elsewhere it is ignored).
    """
    if last_values.shape != values.shape[1:]:
        raise ValueError(
            f"bootstrap_values: last_values has shape {tuple(last_values.shape)}, expected {tuple(values.shape[1:])}"
        )
    following = torch.cat([values[1:], last_values.unsqueeze(0)], dim=0)
    return torch.where(truncated, final_values, following)
