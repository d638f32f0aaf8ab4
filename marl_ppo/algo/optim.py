"""The trainer's optimizers: Adam with gradient-norm clipping, global or per part, ours or torch's (`fast.optimizer`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from marl_ppo.fast.adam import FlatAdam, part_bounds


class Optimizer(Protocol):
    """What the trainer calls on an optimizer (FlatAdam and LibraryAdam provide it)."""

    param_groups: list[dict[str, Any]]

    def bind(self) -> None:
        """Make ready for a step after something outside may have replaced parameter data or gradients."""
        ...

    def zero_grad(self) -> None: ...

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor:
        """Scale the gradients to global norm `max_norm` when larger (None: leave them); the norm before."""
        ...

    def clip_grad_norms(self, max_norm: float | None) -> torch.Tensor:
        """Scale each part's gradients to norm `max_norm` when larger (None: leave them); the norms before."""
        ...

    def step(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class LibraryAdam:
    """torch.optim.Adam and nn.utils.clip_grad_norm_, behind the trainer's Optimizer interface."""

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        lr: float,
        eps: float,
        implementation: str,
        parts: Sequence[int] = (),
    ) -> None:
        self.params = list(params)
        self.parts = [self.params[start:stop] for start, stop in part_bounds(parts, len(self.params))]
        options = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
        self.optimizer = torch.optim.Adam(self.params, lr=lr, eps=eps, **options[implementation])
        self._foreach = implementation != "single"

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def bind(self) -> None:
        """Nothing to bind: torch's Adam holds the parameters themselves."""

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def clip_grad_norm(self, max_norm: float | None) -> torch.Tensor:
        grads = [p.grad for p in self.params if p.grad is not None]
        if max_norm is None:
            return nn.utils.get_total_norm(grads, foreach=self._foreach)
        return nn.utils.clip_grad_norm_(self.params, max_norm, foreach=self._foreach)

    def clip_grad_norms(self, max_norm: float | None) -> torch.Tensor:
        if max_norm is None:
            return torch.stack(
                [nn.utils.get_total_norm([p.grad for p in part if p.grad is not None]) for part in self.parts]
            )
        return torch.stack(
            [nn.utils.clip_grad_norm_(part, max_norm, foreach=self._foreach) for part in self.parts]
        )

    def step(self) -> None:
        self.optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore an Adam state dict (from this class, FlatAdam or torch.optim.Adam)."""
        groups = [{**group} for group in state_dict["param_groups"]]
        ours = self.optimizer.param_groups[0]
        for group in groups:
            for setting in ("foreach", "fused", "capturable", "differentiable"):
                if setting in ours:
                    group[setting] = ours[setting]
        self.optimizer.load_state_dict({"state": state_dict["state"], "param_groups": groups})


def make_optimizer(
    params: Iterable[nn.Parameter], *, lr: float, kind: str, parts: Sequence[int] = ()
) -> Optimizer:
    """Adam (eps 1e-5) over `params`: `flat_adam` (ours), or torch's `adam`, `adam_foreach`, `adam_fused`.

    `parts` counts the parameters, in order, of each part `clip_grad_norms` clips apart (empty: one part).
    """
    if kind == "flat_adam":
        return FlatAdam(params, lr=lr, eps=1e-5, parts=parts)
    implementation = {"adam": "single", "adam_foreach": "foreach", "adam_fused": "fused"}[kind]
    return LibraryAdam(params, lr=lr, eps=1e-5, implementation=implementation, parts=parts)
