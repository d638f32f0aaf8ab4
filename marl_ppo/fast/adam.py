"""Adam and gradient clipping over one contiguous buffer per network.

A small PPO minibatch step is bound by per-operation overhead, not arithmetic: with about twenty
parameter tensors per team, `clip_grad_norm_` takes one norm per tensor on CPU and Adam's multi-tensor
path falls back to per-tensor kernels there. `FlatAdam` moves a network's parameters into one buffer
(each parameter becomes a view into it) and their gradients into a second, so clipping is one norm
and one scale, and an Adam step is a handful of operations on one tensor. It is a
`torch.optim.Adam`: the same arithmetic, element for element, the same param groups and the same
per-parameter state dict, so checkpoints move between it and torch's Adam.

Its step skips torch's step wrapper (a profiler range and the step hooks) when no hook or profiler
would see it, which reads private torch names (`TORCH_INTERNALS`); on a torch without one of them it
keeps the wrapper, as any optimizer does.
"""

from __future__ import annotations

import importlib
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

_STATE_KEYS = ("exp_avg", "exp_avg_sq")
_UNSUPPORTED = {"amsgrad": False, "weight_decay": 0.0, "maximize": False}
"""Adam options FlatAdam's step does not implement, with the only values it accepts."""
IMPLEMENTATION_SETTINGS = ("foreach", "fused", "capturable", "differentiable")
"""Adam options that choose torch's code path, not the arithmetic: a loaded state dict keeps ours."""


TORCH_INTERNALS = (
    "torch.optim.optimizer._global_optimizer_pre_hooks",
    "torch.optim.optimizer._global_optimizer_post_hooks",
    "torch._C._autograd._profiler_enabled",
    "torch.optim.Optimizer.profile_hook_step",
)
"""The private torch names FlatAdam's step reads to skip torch's step wrapper: the global step hooks,
whether a profiler runs, and the wrapper itself (torch skips wrapping a step marked `hooked`)."""


def _lookup(dotted: str) -> Any:
    """The object a dotted name names (its longest importable prefix, then attributes), or None."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            found = getattr(found, name, None)
        return found
    return None


def missing_torch_internals() -> list[str]:
    """The names of `TORCH_INTERNALS` this torch lacks (empty: FlatAdam's step can skip the wrapper)."""
    return [name for name in TORCH_INTERNALS if _lookup(name) is None]


_GLOBAL_PRE_HOOKS, _GLOBAL_POST_HOOKS, _PROFILER_ENABLED, _PROFILE_HOOK_STEP = map(_lookup, TORCH_INTERNALS)
_SKIPS_WRAPPER = not missing_torch_internals()
"""Whether FlatAdam's step skips torch's wrapper when nothing would see it (else torch wraps it)."""


def part_bounds(parts: Sequence[int], count: int) -> list[tuple[int, int]]:
    """`[start, stop)` indices into `count` parameters of parts of `parts` parameters each (empty: one part)."""
    sizes = list(parts) or [count]
    if sum(sizes) != count or min(sizes) < 1:
        raise ValueError(f"optimizer parts {sizes} must be positive and add up to the {count} parameters")
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends, strict=True))


class FlatAdam(torch.optim.Adam):
    """`torch.optim.Adam` over parameters held in one flat buffer, their gradients in another.

    The buffers are made at construction: each parameter's data and gradient become views of them,
    and autograd accumulates into an existing `.grad` in place, so a backward pass fills the flat
    gradient directly. Build it after the model is on its device and dtype. A parameter whose data
    or gradient something outside replaced (`module.to()`, `zero_grad(set_to_none=True)` on the
    module) is copied back into the buffers at the next clip, or at a step that no clip preceded; a
    parameter left without a gradient steps with a zero one. Takes a list of parameters (one param group).
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        lr: float,
        eps: float,
        betas: tuple[float, float] = (0.9, 0.999),
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("FlatAdam needs at least one parameter")
        if not all(isinstance(p, torch.Tensor) for p in params):
            raise TypeError("FlatAdam takes a list of parameters, not param groups")
        first = params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in params):
            raise ValueError("FlatAdam needs parameters of one dtype on one device")
        super().__init__(params, lr=lr, betas=betas, eps=eps, foreach=False)
        self._params = params
        self._slices = []
        offset = 0
        for p in params:
            self._slices.append((offset, offset + p.numel()))
            offset += p.numel()
        with torch.no_grad():
            self.flat_data = torch.cat([p.detach().reshape(-1) for p in params])
        """Every parameter's values, in order; each parameter's data is a view of its slice."""
        self.flat_grad = torch.zeros_like(self.flat_data)
        """Every parameter's gradient, laid out as `flat_data`; each `.grad` is a view of its slice."""
        self._moments: dict[str, torch.Tensor] = {}
        self._step_count: torch.Tensor | None = None
        self._part_slices: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        self._grads = [
            self.flat_grad[start:stop].view_as(p)
            for p, (start, stop) in zip(params, self._slices, strict=True)
        ]
        for p, grad, (start, stop) in zip(params, self._grads, self._slices, strict=True):
            p.data = self.flat_data[start:stop].view_as(p)
            p.grad = grad
        self._data_pointers = [p.data_ptr() for p in params]
        self._gathered = False
        """A clip has just brought the buffers up to date: the step that follows it need not check again."""

    def _gather(self) -> None:
        """Bring replaced parameter data or gradients back into the flat buffers (a check when none was)."""
        self._gathered = True
        if all(p.grad is g for p, g in zip(self._params, self._grads, strict=True)) and all(
            p.data_ptr() == pointer for p, pointer in zip(self._params, self._data_pointers, strict=True)
        ):
            return
        with torch.no_grad():
            for i, (p, (start, stop)) in enumerate(zip(self._params, self._slices, strict=True)):
                if p.device != self.flat_data.device or p.dtype != self.flat_data.dtype:
                    raise RuntimeError(
                        f"a parameter moved to {p.device}/{p.dtype} after its optimizer was built on "
                        f"{self.flat_data.device}/{self.flat_data.dtype}; move the model before building the optimizer"
                    )
                data = self.flat_data[start:stop].view_as(p)
                if p.data_ptr() != data.data_ptr():
                    data.copy_(p.detach())
                    p.data = data
                grad = self._grads[i]
                if p.grad is not grad:
                    if p.grad is None:
                        grad.zero_()
                    else:
                        grad.copy_(p.grad)
                    p.grad = grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the flat gradient buffer (the gradients stay views of it, whatever `set_to_none` says)."""
        self._gathered = False
        self.flat_grad.zero_()

    def clip_grad_norm(self, max_norm: float | None, parts: Sequence[int] = ()) -> torch.Tensor:
        """Scale each part's gradients to norm `max_norm` when larger (None: leave them); the parts'
        norms before, 1-D. `parts` counts each part's parameters, in order; empty: all are one part."""
        self._gather()
        if not parts:
            norm = torch.linalg.vector_norm(self.flat_grad)
            if max_norm is not None:
                # the same coefficient as nn.utils.clip_grad_norm_
                self.flat_grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
            return norm.reshape(1)
        bounds = self._part_slices.get(tuple(parts))
        if bounds is None:
            bounds = self._part_slices[tuple(parts)] = [
                (self._slices[start][0], self._slices[stop - 1][1])
                for start, stop in part_bounds(parts, len(self._params))
            ]
        norms = torch.stack([torch.linalg.vector_norm(self.flat_grad[start:stop]) for start, stop in bounds])
        if max_norm is not None:
            coefficients = torch.clamp(max_norm / (norms + 1e-6), max=1.0)
            for (start, stop), coefficient in zip(bounds, coefficients, strict=True):
                self.flat_grad[start:stop].mul_(coefficient)
        return norms

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Adam step on the flat buffer (`_flat_step`).

        Step hooks (this optimizer's or global ones) and a running profiler see it as any optimizer's
        step: then it goes through torch's own step wrapper. Without them it skips that wrapper, whose
        profiler range costs more than the step's arithmetic on a small network. On a torch that lacks
        one of `TORCH_INTERNALS` torch wraps this method as any optimizer's, and it only steps.
        """
        if _HOOKED_FLAT_STEP is not None and self._observed():
            return _HOOKED_FLAT_STEP(self, closure)
        return self._flat_step(closure)

    def _observed(self) -> bool:
        """Whether a step hook (this optimizer's or a global one) or a running profiler would see a step."""
        return bool(
            self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _GLOBAL_PRE_HOOKS
            or _GLOBAL_POST_HOOKS
            or _PROFILER_ENABLED()
        )

    @torch.no_grad()
    def _flat_step(self, closure: Callable[[], float] | None = None) -> float | None:
        """`torch.optim.Adam`'s single-tensor arithmetic, operation for operation (the same numbers), on
        one tensor instead of one per parameter."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if not self._gathered:
            self._gather()
        self._gathered = False
        group = self.param_groups[0]
        if self._step_count is None:
            self._start_state()
        assert self._step_count is not None
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = self._moments["exp_avg"], self._moments["exp_avg_sq"]
        self._step_count += 1
        step = self._step_count.item()
        exp_avg.lerp_(self.flat_grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(self.flat_grad, self.flat_grad, value=1 - beta2)
        step_size = group["lr"] / (1 - beta1**step)
        denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(group["eps"])
        self.flat_data.addcdiv_(exp_avg, denom, value=-step_size)
        return loss

    def _start_state(self, step: float = 0.0, moments: dict[str, torch.Tensor] | None = None) -> None:
        """Flat state (as torch initializes it: the step count on the CPU, zero moments unless given),
        and each parameter's state entry as views of it."""
        self._step_count = torch.tensor(step, dtype=torch.float32)
        self._moments = moments or {key: torch.zeros_like(self.flat_data) for key in _STATE_KEYS}
        for p, (start, stop) in zip(self._params, self._slices, strict=True):
            self.state[p] = {
                "step": self._step_count,
                **{key: self._moments[key][start:stop].view_as(p) for key in _STATE_KEYS},
            }

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam's state dict: one entry per parameter, each tensor its own copy."""
        saved = super().state_dict()
        saved["state"] = {i: {k: v.clone() for k, v in entry.items()} for i, entry in saved["state"].items()}
        return saved

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a per-parameter Adam state dict, from `state_dict()` or from `torch.optim.Adam`."""
        groups = state_dict["param_groups"]
        indices = [i for group in groups for i in group["params"]]
        if len(indices) != len(self._params) or len(groups) != 1:
            raise ValueError(
                f"optimizer state holds {len(indices)} parameters in {len(groups)} group(s) but the model "
                f"has {len(self._params)} in one; the checkpoint was written for a different model configuration"
            )
        group = {**groups[0]}
        for setting, value in _UNSUPPORTED.items():
            if group.get(setting, value) != value:
                raise ValueError(f"FlatAdam cannot resume Adam state with {setting}={group[setting]!r}")
        for setting in IMPLEMENTATION_SETTINGS:
            if setting in self.param_groups[0]:
                group[setting] = self.param_groups[0][setting]
        saved = state_dict["state"]
        entries = [saved.get(i) for i in group["params"]]
        steps = {float(e["step"]) for e in entries if e is not None}
        if len(steps) > 1:
            raise ValueError(
                f"optimizer state mixes Adam step counts {sorted(steps)}; it cannot be flattened"
            )
        super().load_state_dict({"state": {}, "param_groups": [group]})
        self.state.clear()
        self._step_count, self._moments = None, {}
        if steps:
            # a parameter torch's Adam never stepped (it had no gradient) starts from zero moments
            moments = {
                key: torch.cat(
                    [
                        torch.zeros(p.numel()) if e is None else e[key].detach().reshape(-1).cpu()
                        for p, e in zip(self._params, entries, strict=True)
                    ]
                ).to(self.flat_data)
                for key in _STATE_KEYS
            }
            self._start_state(steps.pop(), moments)


_HOOKED_FLAT_STEP: Callable[..., float | None] | None = None
"""`FlatAdam._flat_step` inside torch's step wrapper (profiler range, step hooks); None: torch wraps
`FlatAdam.step` itself."""
if _SKIPS_WRAPPER:
    _HOOKED_FLAT_STEP = _PROFILE_HOOK_STEP(FlatAdam._flat_step)
    # torch wraps an optimizer class's `step` in its profiler-and-hooks wrapper unless it is marked as
    # wrapped already; `FlatAdam.step` calls that wrapper itself when something would see it
    FlatAdam.step.hooked = True  # type: ignore[attr-defined]
