"""Adam and gradient clipping over one contiguous buffer per network.

A small PPO minibatch step is bound by per-operation overhead, not arithmetic: with about twenty
parameter tensors per team, `clip_grad_norm_` takes one norm per tensor on CPU and Adam's multi-tensor
path falls back to per-tensor kernels there. `FlatAdam` moves a network's parameters into one buffer
(each parameter becomes a view into it) and binds their gradients to views of a second buffer, so
clipping is one norm and one scale, and an Adam step is a handful of operations on one tensor.
The arithmetic is Adam's, element for element; the state dict keeps torch's per-parameter layout, so
checkpoints do not depend on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

_STATE_KEYS = ("exp_avg", "exp_avg_sq")


def part_bounds(parts: Sequence[int], count: int) -> list[tuple[int, int]]:
    """`[start, stop)` indices into `count` parameters of parts of `parts` parameters each (empty: one part)."""
    sizes = list(parts) or [count]
    if sum(sizes) != count or min(sizes) < 1:
        raise ValueError(f"optimizer parts {sizes} must be positive and add up to the {count} parameters")
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends, strict=True))


class FlatAdam:
    """`torch.optim.Adam` over a list of parameters held in one flat buffer, their gradients in another.

    Autograd accumulates into an existing `.grad` in place, so once each gradient is a view of the flat
    gradient buffer a backward pass fills it directly. `bind()` re-establishes the views when something
    outside replaced a parameter's data or gradient (`module.to()`, `zero_grad(set_to_none=True)`).
    `parts` counts the parameters, in order, of each part that `clip_grad_norms` clips apart (each
    part is a contiguous slice of the flat buffers); empty: the parameters are one part.
    """

    def __init__(
        self, params: Iterable[nn.Parameter], *, lr: float, eps: float, parts: Sequence[int] = ()
    ) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("FlatAdam needs at least one parameter")
        bounds = part_bounds(parts, len(self.params))
        first = self.params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in self.params):
            raise ValueError("FlatAdam needs parameters of one dtype on one device")
        self._slices = []
        offset = 0
        for p in self.params:
            self._slices.append((offset, offset + p.numel()))
            offset += p.numel()
        with torch.no_grad():
            self.data = torch.cat([p.detach().reshape(-1) for p in self.params])
        self.grad = torch.zeros_like(self.data)
        self._part_slices = [(self._slices[start][0], self._slices[stop - 1][1]) for start, stop in bounds]
        self._flat = nn.Parameter(self.data)  # shares the buffer; the optimizer's only parameter
        self._flat.grad = self.grad
        self.optimizer = torch.optim.Adam([self._flat], lr=lr, eps=eps, foreach=False)
        self.bind()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def bind(self) -> None:
        """Point every parameter's data and gradient at its slice of the flat buffers.

        A parameter whose data was replaced has its current values copied into the buffer first; a
        gradient that was replaced or dropped is discarded (call between steps).
        """
        with torch.no_grad():
            for p, (start, stop) in zip(self.params, self._slices, strict=True):
                if p.device != self.data.device or p.dtype != self.data.dtype:
                    raise RuntimeError(
                        f"a parameter moved to {p.device}/{p.dtype} after its optimizer was built on "
                        f"{self.data.device}/{self.data.dtype}; move the model before building the Trainer"
                    )
                data = self.data[start:stop].view_as(p)
                if p.data_ptr() != data.data_ptr():
                    data.copy_(p.detach())
                    p.data = data
                grad = self.grad[start:stop].view_as(p)
                if p.grad is None or p.grad.data_ptr() != grad.data_ptr():
                    p.grad = grad

    def zero_grad(self) -> None:
        self.grad.zero_()

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor:
        """Scale the gradients to global norm `max_norm` when larger (None: leave them); return the norm before."""
        norm = torch.linalg.vector_norm(self.grad)
        if max_norm is not None:
            # the same coefficient as nn.utils.clip_grad_norm_
            self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def clip_grad_norms(self, max_norm: float | None) -> torch.Tensor:
        """Scale each part's gradients to norm `max_norm` when larger (None: leave them); return the
        parts' norms before, in order."""
        norms = torch.stack(
            [torch.linalg.vector_norm(self.grad[start:stop]) for start, stop in self._part_slices]
        )
        if max_norm is not None:
            coefficients = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
            for (start, stop), coefficient in zip(self._part_slices, coefficients, strict=True):
                self.grad[start:stop].mul_(coefficient)
        return norms

    def step(self) -> None:
        """One Adam step on the flat buffer.

        `torch.optim.Adam`'s single-tensor arithmetic, operation for operation (the same numbers), but
        without `Optimizer.step`'s per-call bookkeeping, which on CPU can cost more than the arithmetic
        for the small networks of a PPO minibatch step. The state lives in the wrapped
        optimizer, so its state dict and learning rate work as before.
        """
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state[self._flat]
        if not state:  # as torch initializes it: the step count on the CPU, zero moments
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(self.data)
            state["exp_avg_sq"] = torch.zeros_like(self.data)
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        state["step"] += 1
        step = state["step"].item()
        exp_avg.lerp_(self.grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(self.grad, self.grad, value=1 - beta2)
        step_size = group["lr"] / (1 - beta1**step)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(group["eps"])
        self.data.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's state dict for the original parameter list (one entry per parameter)."""
        inner = self.optimizer.state_dict()
        group = {k: v for k, v in inner["param_groups"][0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        state: dict[int, dict[str, torch.Tensor]] = {}
        flat_state = inner["state"].get(0)
        if flat_state is not None:
            for i, (p, (start, stop)) in enumerate(zip(self.params, self._slices, strict=True)):
                entry = {"step": flat_state["step"].clone()}
                for key in _STATE_KEYS:
                    entry[key] = flat_state[key][start:stop].view_as(p).clone()
                state[i] = entry
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a per-parameter Adam state dict, from `state_dict()` or from `torch.optim.Adam`."""
        groups = state_dict["param_groups"]
        indices = [i for group in groups for i in group["params"]]
        if len(indices) != len(self.params):
            raise ValueError(
                f"optimizer state holds {len(indices)} parameters but the model has {len(self.params)}; "
                "the checkpoint was written for a different model configuration"
            )
        ours = self.optimizer.param_groups[0]
        group = {k: v for k, v in groups[0].items() if k != "params"}
        for setting in ("foreach", "fused", "capturable", "differentiable"):
            if setting in ours:
                group[setting] = ours[setting]
        group["params"] = [0]
        saved = state_dict["state"]
        flat_state = {}
        if saved:
            entries = [saved.get(i) for i in indices]
            steps = {float(e["step"]) for e in entries if e is not None}
            if len(steps) != 1:
                raise ValueError(
                    f"optimizer state mixes Adam step counts {sorted(steps)}; it cannot be flattened"
                )
            # a parameter torch's Adam never stepped (it had no gradient) starts from zero moments
            moments = {
                key: torch.cat(
                    [
                        torch.zeros(p.numel()) if e is None else e[key].detach().reshape(-1).cpu()
                        for p, e in zip(self.params, entries, strict=True)
                    ]
                ).to(self.data)
                for key in _STATE_KEYS
            }
            flat_state = {0: {"step": torch.tensor(steps.pop(), dtype=torch.float32), **moments}}
        self.optimizer.load_state_dict({"state": flat_state, "param_groups": [group]})
