"""The trainer's optimizers, ours or torch's Adam (`fast.optimizer`), and gradient-norm clipping for any of them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from marl_ppo.fast.adam import IMPLEMENTATION_SETTINGS, FlatAdam, part_bounds

ADAM_EPS = 1e-5


def make_optimizer(params: Iterable[nn.Parameter], *, lr: float, kind: str) -> torch.optim.Optimizer:
    """Adam (eps 1e-5) over `params`: `flat_adam` (ours), or torch's `adam`, `adam_foreach`, `adam_fused`.

    Build it after the model is on its device and dtype (`flat_adam` moves the parameters into one buffer).
    """
    if kind == "flat_adam":
        return FlatAdam(params, lr=lr, eps=ADAM_EPS)
    options: dict[str, dict[str, Any]] = {
        "adam": {"foreach": False},
        "adam_foreach": {"foreach": True},
        "adam_fused": {"fused": True},
    }
    if kind not in options:
        raise ValueError(f"unknown optimizer '{kind}'; expected flat_adam, {', '.join(options)}")
    optimizer = torch.optim.Adam(params, lr=lr, eps=ADAM_EPS, **options[kind])
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    return optimizer


def _keep_implementation(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    """A saved state dict with the optimizer's own code path (foreach, fused, ...), not the saver's."""
    ours = optimizer.param_groups[0]
    groups = [
        {**group, **{key: ours[key] for key in IMPLEMENTATION_SETTINGS if key in ours}}
        for group in state_dict["param_groups"]
    ]
    return {**state_dict, "param_groups": groups}


def clip_grad_norms(
    optimizer: torch.optim.Optimizer, max_norm: float | None, *, parts: Sequence[int] = ()
) -> torch.Tensor:
    """Scale the gradients of `optimizer`'s parameters, part by part, to norm `max_norm` where larger
    (None: leave them); the parts' norms before, 1-D.

    `parts` counts each part's parameters, in the optimizer's order; empty: all of them are one part
    (global clipping). FlatAdam takes each part's norm over its slice of one buffer; any other
    optimizer's parameters are clipped by `nn.utils.clip_grad_norm_` (foreach).
    """
    if isinstance(optimizer, FlatAdam):
        return optimizer.clip_grad_norm(max_norm, parts)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norms = []
    for start, stop in part_bounds(parts, len(params)):
        part = params[start:stop]
        if max_norm is None:
            norms.append(nn.utils.get_total_norm([p.grad for p in part if p.grad is not None], foreach=True))
        else:
            norms.append(nn.utils.clip_grad_norm_(part, max_norm, foreach=True))
    return torch.stack(norms)
