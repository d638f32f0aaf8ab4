"""Agent-stacked MLPs: one weight set per agent along an agent axis, evaluated as one batched computation.

Inputs are `(..., A, in)`. With `shared=False` each of the A agents has its own weights
(`(A, out, in)` tensors, one `baddbmm` per layer, no Python loop over agents). With `shared=True`
one weight set serves all A agents and a one-hot agent id is appended to the input.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

_ACTIVATIONS = {"tanh": torch.tanh, "relu": torch.relu}


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
        if self.copies == 1:
            return F.linear(x, self.weight[0], self.bias[0])
        lead = x.shape[:-2]
        agents, in_dim = x.shape[-2:]
        flat = x.reshape(-1, agents, in_dim).transpose(0, 1)  # (A, B, in)
        out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight.transpose(1, 2))  # (A, B, out)
        return out.transpose(0, 1).reshape(*lead, agents, -1)


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
    ) -> None:
        super().__init__()
        self.num_agents = num_agents
        self.add_agent_id = shared and num_agents > 1
        copies = 1 if shared else num_agents
        width = in_dim + (num_agents if self.add_agent_id else 0)
        use_norm = input_layer_norm and in_dim > 1  # LayerNorm of a single feature is always 0
        self.norm_weight = nn.Parameter(torch.ones(copies, in_dim)) if use_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(copies, in_dim)) if use_norm else None
        sizes = [width, *hidden_sizes, out_dim]
        self.layers = nn.ModuleList(
            StackedLinear(copies, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        )
        self.activation = _ACTIVATIONS[activation]
        if orthogonal_init:
            for layer in self.layers[:-1]:
                layer.reset_orthogonal(math.sqrt(2.0))
            self.layers[-1].reset_orthogonal(head_gain)
        if self.add_agent_id:
            self.register_buffer("agent_ids", torch.eye(num_agents), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`(..., A, in) -> (..., A, out)`."""
        if self.norm_weight is not None:
            x = F.layer_norm(x, x.shape[-1:]) * self.norm_weight + self.norm_bias
        if self.add_agent_id:
            x = torch.cat([x, self.agent_ids.expand(*x.shape[:-1], self.num_agents)], dim=-1)
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)
