"""The trainer's optimizers, torch's Adam on the code path `fast.optimizer` names, an Adam of one
agent's rows of agent-stacked parameters (HAPPO's per-agent steps), and gradient-norm clipping."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.optim.adam import adam

ADAM_EPS = 1e-5

IMPLEMENTATION_SETTINGS = ("foreach", "fused", "capturable", "differentiable")
"""Adam options that choose torch's code path, not the arithmetic: a loaded state dict keeps ours."""

_TORCH_ADAM_OPTIONS: dict[str, dict[str, Any]] = {
    "adam": {"foreach": False},
    "adam_foreach": {"foreach": True},
    "adam_fused": {"fused": True},
}
"""`fast.optimizer` -> the options of torch's Adam that pick its code path."""


def make_optimizer(params: Iterable[nn.Parameter], *, lr: float, kind: str) -> torch.optim.Optimizer:
    """torch's Adam (eps 1e-5) over `params` on the code path `kind` names: `adam` (single-tensor),
    `adam_foreach` or `adam_fused`."""
    optimizer = torch.optim.Adam(params, lr=lr, eps=ADAM_EPS, **_torch_adam_options(kind))
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    return optimizer


def make_agent_optimizer(
    params: Iterable[nn.Parameter], *, agent: int, agents: int, lr: float, kind: str
) -> AgentAdam:
    """Adam (eps 1e-5) over agent `agent`'s rows of `params`, each stacking `agents` agents' weights
    (`AgentAdam`), on the code path `kind` names."""
    optimizer = AgentAdam(
        params, agent=agent, agents=agents, lr=lr, eps=ADAM_EPS, **_torch_adam_options(kind)
    )
    optimizer.register_load_state_dict_pre_hook(_keep_implementation)
    return optimizer


def _torch_adam_options(kind: str) -> dict[str, Any]:
    if kind not in _TORCH_ADAM_OPTIONS:
        raise ValueError(f"unknown optimizer '{kind}'; expected one of {', '.join(_TORCH_ADAM_OPTIONS)}")
    return _TORCH_ADAM_OPTIONS[kind]


class AgentAdam(torch.optim.Adam):
    """`torch.optim.Adam` over one agent's rows of agent-stacked parameters, with moments and a step
    count of its own: one agent's optimizer, beside the other agents' over the same tensors.

    Each parameter stacks `agents` agents' weights along its first axis, agent-major (`(agents * n,
    ...)`); agent `agent`'s are rows `[agent * n, (agent + 1) * n)` (`rows`). The param groups hold the
    whole stacked parameters, so zeroing and clipping work on their gradients as on any optimizer's (in
    a HAPPO turn only the learning agent's rows have a non-zero gradient: the clip bounds its own); the
    state holds `(n, ...)` moments, and a step writes the agent's rows and nothing else: torch's
    functional Adam on the rows' views, on the code path the options name (single-tensor, foreach or
    fused). A parameter without a gradient is not stepped, as in torch's Adam.
    """

    def __init__(
        self,
        params: Iterable[nn.Parameter],
        *,
        agent: int,
        agents: int,
        lr: float,
        eps: float,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        params = list(params)
        if not 0 <= agent < agents:
            raise ValueError(f"agent {agent} is not one of {agents} stacked agents")
        for p in params:
            if p.dim() == 0 or p.shape[0] % agents:
                raise ValueError(f"parameter of shape {tuple(p.shape)} does not stack {agents} agents")
        super().__init__(params, lr=lr, eps=eps, foreach=foreach, fused=fused)
        self.agent = agent
        self.agents = agents

    def rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """The agent's rows of a stacked tensor (a view)."""
        count = tensor.shape[0] // self.agents
        return tensor.narrow(0, self.agent * count, count)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """One Adam step of the agent's rows of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            stepped = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p, group) for p in stepped]
            beta1, beta2 = group["betas"]
            adam(
                [self.rows(p) for p in stepped],
                [self.rows(p.grad) for p in stepped],
                [state["exp_avg"] for state in states],
                [state["exp_avg_sq"] for state in states],
                [],
                [state["step"] for state in states],
                foreach=group["foreach"],
                fused=group["fused"],
                amsgrad=False,
                beta1=beta1,
                beta2=beta2,
                lr=group["lr"],
                weight_decay=0.0,
                eps=group["eps"],
                maximize=False,
            )
        return loss

    def _state(self, p: torch.Tensor, group: dict[str, Any]) -> dict[str, Any]:
        """The parameter's state, made as torch's Adam makes it (zero moments, a float32 count on the
        CPU, on the parameter's device when fused) the first time it steps."""
        state: dict[str, Any] = self.state[p]
        if not state:
            rows = self.rows(p)
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if group["fused"] else "cpu")
            state["exp_avg"] = torch.zeros_like(rows, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(rows, memory_format=torch.preserve_format)
        return state


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
    (global clipping). Each part is clipped by `nn.utils.clip_grad_norm_` (foreach).
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    norms = []
    for start, stop in part_bounds(parts, len(params)):
        part = params[start:stop]
        if max_norm is None:
            norms.append(nn.utils.get_total_norm([p.grad for p in part if p.grad is not None], foreach=True))
        else:
            norms.append(nn.utils.clip_grad_norm_(part, max_norm, foreach=True))
    return torch.stack(norms)


def part_bounds(parts: Sequence[int], count: int) -> list[tuple[int, int]]:
    """`[start, stop)` indices into `count` parameters of parts of `parts` parameters each (empty: one part)."""
    sizes = list(parts) or [count]
    if sum(sizes) != count or min(sizes) < 1:
        raise ValueError(f"optimizer parts {sizes} must be positive and add up to the {count} parameters")
    ends = list(itertools.accumulate(sizes))
    return list(zip([0, *ends[:-1]], ends, strict=True))


def group_parts(optimizer: torch.optim.Optimizer, networks: Iterable[nn.Module]) -> list[int]:
    """The parts `grad_clip: per_group` clips apart, as `clip_grad_norms` takes them: the lengths of the
    runs of the optimizer's parameters (in its order) that one group's network holds.

    A group whose network holds none of them has no part (a HAPPO agent's optimizer holds one group's);
    a parameter of no network, or a group's parameters apart in the optimizer's order, is refused.
    """
    owner = {id(p): k for k, network in enumerate(networks) for p in network.parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if any(id(p) not in owner for p in params):
        raise ValueError(
            "grad_clip per_group: the optimizer holds a parameter of none of the groups' networks"
        )
    runs = [(group, len(list(run))) for group, run in itertools.groupby(owner[id(p)] for p in params)]
    if len({group for group, _ in runs}) != len(runs):
        raise ValueError("grad_clip per_group: the optimizer's parameters are not ordered group by group")
    return [size for _, size in runs]
