"""Agent-stacked MLPs: one weight set per agent along an agent axis, evaluated as one batched computation.

Inputs are `(..., A, in)`. With `shared=False` each of the A agents has its own weights
(`(A, out, in)` tensors, one `baddbmm` per layer, no Python loop over agents). With `shared=True`
one weight set serves all A agents and a one-hot agent id is appended to the input.

The first layer is computed in a cheaper, mathematically identical form:
- the input LayerNorm's affine is folded into the first layer's weights,
  `W (n * g + beta) + b = (W * g) n + (W beta + b)`, so the normalized input `n` needs no gradient
  (no input-gradient matmul, no LayerNorm backward);
- the one-hot agent id is never concatenated: its columns of `W` are added as a per-agent bias;
- a network built with `common_input=True` reads one input shared by all agents (a critic's global
  state), `(..., in) -> (..., A, out)`, and computes the first layer once per row instead of once per
  agent.

`AgentMLP.forward` is the one path, with or without gradients; acting reads the same weights once per
rollout instead (`models.acting.ActingMLP`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from marl_ppo.config import ConfigError

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


def stacked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """`(..., A, in) -> (..., A, out)` with `(copies, out, in)` weights and `(copies, out)` biases:
    one map broadcast over the agents (`copies == 1`) or one per agent (`copies == A`)."""
    if weight.shape[0] == 1:
        return F.linear(x, weight.squeeze(0), bias.squeeze(0))  # a view of the weights: cheap backward
    lead, (agents, in_dim) = x.shape[:-2], x.shape[-2:]
    flat = x.reshape(-1, agents, in_dim).transpose(0, 1)  # (A, B, in)
    out = torch.baddbmm(bias.unsqueeze(1), flat, weight.transpose(1, 2))  # (A, B, out)
    return out.transpose(0, 1).reshape(*lead, agents, -1)


class StackedLinear(nn.Module):
    """`copies` independent linear maps; `copies == 1` is one map broadcast over the agent axis."""

    def __init__(self, copies: int, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.copies = copies
        self.weight = nn.Parameter(torch.empty(copies, out_dim, in_dim))
        self.bias = nn.Parameter(torch.zeros(copies, out_dim))
        bound = 1.0 / math.sqrt(in_dim)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def reset_orthogonal(self, gain: float) -> None:
        """Orthogonal weights with `gain` for every copy, zero bias."""
        with torch.no_grad():
            for weight in self.weight:
                nn.init.orthogonal_(weight, gain)
            self.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, in) -> (..., A, out)`."""
        return stacked_linear(x, self.weight, self.bias)


class AgentMLP(nn.Module):
    """MLP over `(..., A, in)` with per-agent (stacked) or shared weights; returns `(..., A, out)`."""

    def __init__(
        self,
        *,
        num_agents: int,
        in_dim: int,
        out_dim: int,
        hidden_sizes: Sequence[int],
        activation: str,
        input_layer_norm: bool,
        shared: bool,
        orthogonal_init: bool,
        head_gain: float,
        precision: Precision = "fp32",
        common_input: bool = False,
        activate_output: bool = False,
    ) -> None:
        super().__init__()
        self.common_input = common_input
        """The input is one row every agent sees, `(..., in)`, rather than one per agent."""
        self.activate_output = activate_output
        """The output layer is a hidden layer (a recurrent network's trunk): activated like the others."""
        self.precision = settled_precision(precision)
        """`fp32` or `bf16` (the layers' products and activations in bfloat16, see `arithmetic`), as a
        run's plan settles `model.precision` (`resolve_precision`)."""
        self.num_agents = num_agents
        self.in_dim = in_dim
        self.add_agent_id = shared and num_agents > 1
        copies = 1 if shared else num_agents
        width = in_dim + (num_agents if self.add_agent_id else 0)
        use_norm = input_layer_norm and in_dim > 1  # LayerNorm of a single feature is always 0
        self.norm_weight = nn.Parameter(torch.ones(copies, in_dim)) if use_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(copies, in_dim)) if use_norm else None
        sizes = [width, *hidden_sizes, out_dim]
        linears = [StackedLinear(copies, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        self.layers = nn.ModuleList(linears)
        self.linears = tuple(linears)
        """The same layers, typed (plain references; the ModuleList registers them)."""
        self.activation: Callable[[torch.Tensor], torch.Tensor] = _ACTIVATIONS[activation]
        if orthogonal_init:
            for layer in linears[:-1]:
                layer.reset_orthogonal(math.sqrt(2.0))
            linears[-1].reset_orthogonal(head_gain)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, in) -> (..., A, out)`; with `common_input`, `(..., in) -> (..., A, out)`: every
        agent's output for one input they all see, as if it were expanded to `(..., A, in)`."""
        first = self.first_layer()  # in float32: outside the arithmetic's autocast
        x = self.normalized(x)
        with arithmetic(self.precision, x.device):
            h = first_layer_output(x, *first, common_input=self.common_input, agents=self.num_agents)
            # the tuple, not `self.layers[1:]`: slicing a ModuleList builds a new module per call
            for layer in self.linears[1:]:
                h = layer(self.activation(h))
            return self.output(h)

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """The input as the first layer reads it: LayerNorm without its affine (which lives in the first
        layer's weights), or `x` unchanged. Row by row, so a minibatch's rows equal the whole batch's."""
        return F.layer_norm(x, x.shape[-1:]) if self.norm_weight is not None else x

    def first_layer(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The first layer's effective `(copies, out, in)` weights and `(copies, out)` biases, and the
        `(A, out)` per-agent bias standing in for the one-hot agent id (None without ids)."""
        first, in_dim = self.linears[0], self.in_dim
        weight: torch.Tensor = first.weight[..., :in_dim]
        bias: torch.Tensor = first.bias
        if self.norm_weight is not None and self.norm_bias is not None:
            bias = bias + (weight @ self.norm_bias.unsqueeze(-1)).squeeze(-1)
            weight = weight * self.norm_weight.unsqueeze(1)
        # contiguous: a transposed (A, out) bias made each broadcast add slow and gave its output an
        # agent-innermost layout, which the next layer then copied back and the tanh passes crossed
        agent_bias = first.weight[0, :, in_dim:].T.contiguous() if self.add_agent_id else None
        return weight, bias, agent_bias

    def output(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's output in float32, activated where it is a hidden layer."""
        h = h.float()
        return self.activation(h) if self.activate_output else h


def as_is(t: torch.Tensor) -> torch.Tensor:
    """`t` itself: the first layer's sums as they come (`first_layer_output`)."""
    return t


def first_layer_output(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    agent_bias: torch.Tensor | None,
    *,
    common_input: bool,
    agents: int,
    grid: Callable[[torch.Tensor], torch.Tensor] = as_is,
) -> torch.Tensor:
    """The first layer's pre-activation `(..., A, out)` from the normalized input and
    `AgentMLP.first_layer()`'s weights: per agent `(..., A, in)`, or with `common_input` one row
    `(..., in)` every agent sees, its product taken once per row. `grid`: what each sum passes
    through (acting's bfloat16 rounding, `models.acting`; none in training)."""
    if not common_input:
        h = grid(stacked_linear(x, weight, bias))
        return h if agent_bias is None else grid(h + agent_bias.to(h.dtype))
    if weight.shape[0] == 1:
        h = grid(F.linear(x, weight.squeeze(0), bias.squeeze(0))).unsqueeze(-2)
        if agent_bias is not None:
            return grid(h + agent_bias.to(h.dtype))
        return h.expand(*h.shape[:-2], agents, h.shape[-1])
    out_dim = weight.shape[1]
    h = grid(F.linear(x, weight.reshape(agents * out_dim, -1), bias.reshape(-1)))
    per_agent: torch.Tensor = h.unflatten(-1, (agents, out_dim))
    return per_agent


def arithmetic(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """The context a network's layers run in under `model.precision`. With `bf16`, torch's autocast:
    matrix products and convolutions take bfloat16 copies of their float32 weights and return
    bfloat16, so the activations between them are bfloat16 too. Weights, gradients (autocast casts
    them back) and optimizer state stay float32; the network casts its output to float32."""
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


Precision = Literal["fp32", "bf16"]
"""`model.precision` settled for a device: what the networks are built with."""


def settled_precision(precision: str) -> Precision:
    """`precision` when it is settled (`fp32` or `bf16`); a clear error for `auto`, which a run's plan
    resolves for its device (`marl_ppo.plan`) before any network is built."""
    if precision == "fp32":
        return "fp32"
    if precision == "bf16":
        return "bf16"
    raise ValueError(
        f"model.precision={precision} reached a network unsettled; build the networks from a run's plan "
        "(marl_ppo.plan.plan_run or plan_eval), which resolves it for the device, or set fp32 or bf16"
    )


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` is `bf16` where `device` computes bfloat16 products natively (a GPU with bfloat16
    tensor cores, a CPU with AVX512-BF16 or AMX), else `fp32`; `fp32` and `bf16` stay as they are."""
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


@functools.cache
def native_bf16(device: torch.device) -> bool:
    """Whether `device` has bfloat16 matrix instructions (emulated bfloat16 is slower than float32)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch's own CPU probes
        return any(getattr(torch.cpu, name, lambda: False)() for name in checks)
    return False


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available; `cuda` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "host.device=cuda but no CUDA device is available; use host.device=cpu or host.device=auto"
        )
    return torch.device(name)
