"""Recurrent layers over agent-stacked inputs, unrolled over sequences with resets at episode starts.

`StackedRecurrent` is a GRU or LSTM cell with one weight set per agent along an agent axis (or one
shared set), computing torch's own cell equations (`nn.GRUCell`, `nn.LSTMCell`; gate order r, z, n
and i, f, g, o). torch has no cell batched over per-agent weights (`torch.func.vmap` of its cells
falls back to a loop), so the two products per step are `stacked_linear`'s batched ones, and the
input product is taken once for the whole sequence, outside the time loop.

`forward` steps a sequence `(L, B, A, in)` from a state `(B, A, S)`: at each step the state is set to
zero where `is_first` (an episode starts there), and it advances only where the agent acts
(`acted`); elsewhere it is carried unchanged, so a turn-based player's state moves only on its own
moves and an agent that appears mid-episode starts from zero. Acting is `forward` with `L = 1`, so
collection and training compute the same thing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from marl_ppo.models.layers import stacked_linear

_TORCH_CELLS = {"gru": nn.GRUCell, "lstm": nn.LSTMCell}

RECURRENT_GATES = {"gru": 3, "lstm": 4}


@dataclass(frozen=True)
class MemoryLayout:
    """One group's recurrent state sizes: what a rollout buffer stores per step."""

    actor_size: int
    """Numbers in one agent's actor state (0: feed-forward actor)."""
    critic_rows: int
    """Rows of the critic's state per env copy: the group's agents, or 1 for a team critic."""
    critic_size: int
    """Numbers in one row's critic state (0: feed-forward critic)."""


class Stateless(nn.Module):
    """The core of a feed-forward network: its carry is empty and passes through unchanged, so
    feed-forward and recurrent networks are called the same way."""

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, is_first: torch.Tensor, acted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`x` unchanged and the carry `state` `(B, A, 0)` unchanged."""
        return x, state

    @property
    def state_size(self) -> int:
        """Numbers in one agent's carry: none."""
        return 0


class StackedRecurrent(nn.Module):
    """A GRU or LSTM cell per agent (`copies == A`) or shared (`copies == 1`) over `(..., A, in)`.

    The state is `(..., A, S)`: `h` for a GRU (`S = hidden`), `h` and `c` side by side for an LSTM
    (`S = 2 * hidden`); the output is `h`.
    """

    def __init__(
        self,
        kind: str,
        *,
        copies: int,
        in_dim: int,
        hidden: int,
        orthogonal_init: bool,
        library_cell: bool = False,
    ) -> None:
        super().__init__()
        if kind not in RECURRENT_GATES:
            raise ValueError(f"recurrent kind must be one of {sorted(RECURRENT_GATES)}, got {kind!r}")
        self.kind, self.hidden = kind, hidden
        self.library_cell = library_cell
        """Step with torch's own `nn.GRUCell` / `nn.LSTMCell` on these weights, called once per agent
        (per-agent weights) or once for all (shared), instead of the stacked products
        (`fast.recurrent_cell: false`); the same numbers up to float rounding."""
        self._torch_cell = (_TORCH_CELLS[kind](in_dim, hidden),)  # a tuple: not a submodule, no weights saved
        width = RECURRENT_GATES[kind] * hidden
        self.weight_ih = nn.Parameter(torch.empty(copies, width, in_dim))
        self.weight_hh = nn.Parameter(torch.empty(copies, width, hidden))
        self.bias_ih = nn.Parameter(torch.empty(copies, width))
        self.bias_hh = nn.Parameter(torch.empty(copies, width))
        bound = 1.0 / math.sqrt(hidden)  # torch's cell initialization
        for parameter in self.parameters():
            nn.init.uniform_(parameter, -bound, bound)
        if orthogonal_init:  # MAPPO's recurrent layer: orthogonal weights, zero biases
            with torch.no_grad():
                for weights in (self.weight_ih, self.weight_hh):
                    for weight in weights:
                        nn.init.orthogonal_(weight)
                self.bias_ih.zero_()
                self.bias_hh.zero_()

    @property
    def state_size(self) -> int:
        """Numbers in one agent's state."""
        return self.hidden * (2 if self.kind == "lstm" else 1)

    def cell(self, projected: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """One step: `projected` is the input's product `W_ih x + b_ih` `(..., A, gates*hidden)`."""
        hidden = self.hidden
        h = state[..., :hidden]
        recurrent = stacked_linear(h, self.weight_hh, self.bias_hh)
        if self.kind == "gru":
            in_r, in_z, in_n = projected.chunk(3, -1)
            h_r, h_z, h_n = recurrent.chunk(3, -1)
            reset = torch.sigmoid(in_r + h_r)
            update = torch.sigmoid(in_z + h_z)
            candidate = torch.tanh(in_n + reset * h_n)
            return (1.0 - update) * candidate + update * h
        gate_i, gate_f, gate_g, gate_o = (projected + recurrent).chunk(4, -1)
        c = torch.sigmoid(gate_f) * state[..., hidden:] + torch.sigmoid(gate_i) * torch.tanh(gate_g)
        return torch.cat([torch.sigmoid(gate_o) * torch.tanh(c), c], dim=-1)

    def forward(
        self, x: torch.Tensor, state: torch.Tensor, is_first: torch.Tensor, acted: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs `(L, B, A, hidden)` and the state after the last step `(B, A, S)`.

        `x` `(L, B, A, in)`; `state` `(B, A, S)`, the state carried into the first step; `is_first`
        and `acted` `(L, B, A)` bools. The output at a step is the cell's on the reset state, also
        where the agent does not act (no loss reads it there).
        """
        step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
        if self.library_cell:
            step = self._torch_step
            inputs = x
        else:
            step = self.cell
            inputs = stacked_linear(x, self.weight_ih, self.bias_ih)  # every step's input product at once
        # which steps reset or hold any state, read once (one sync) rather than masking every step
        resets = is_first.flatten(1).any(1).tolist()
        holds = (~acted).flatten(1).any(1).tolist()
        outputs = []
        # one view per step from unbind, whose backward stacks the steps' gradients once; indexing
        # `inputs[t]` would add each step's gradient into a zero tensor of the whole sequence's size,
        # a backward that grows with the square of the sequence's length
        for t, step_input in enumerate(inputs.unbind(0)):
            if resets[t]:
                state = torch.where(is_first[t].unsqueeze(-1), 0.0, state)
            stepped = step(step_input, state)
            outputs.append(stepped[..., : self.hidden])
            state = torch.where(acted[t].unsqueeze(-1), stepped, state) if holds[t] else stepped
        return torch.stack(outputs), state

    def _torch_step(self, x: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """One step of torch's cell on `(..., A, in)`: once with shared weights, else once per agent."""
        (cell,) = self._torch_cell
        copies = self.weight_ih.shape[0]
        if copies == 1:
            return self._torch_cell_on(cell, 0, x, state)
        agents = [self._torch_cell_on(cell, a, x[..., a, :], state[..., a, :]) for a in range(copies)]
        return torch.stack(agents, dim=-2)

    def _torch_cell_on(
        self, cell: nn.Module, copy: int, x: torch.Tensor, state: torch.Tensor
    ) -> torch.Tensor:
        """torch's cell with weight set `copy` on inputs `(..., in)` and states `(..., S)`."""
        lead = x.shape[:-1]
        weights = {
            name: getattr(self, name)[copy] for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        }
        flat_x, flat_state = x.reshape(-1, x.shape[-1]), state.reshape(-1, state.shape[-1])
        stepped: torch.Tensor
        if self.kind == "gru":
            stepped = torch.func.functional_call(cell, weights, (flat_x, flat_state))
        else:
            h, c = torch.func.functional_call(
                cell, weights, (flat_x, (flat_state[:, : self.hidden], flat_state[:, self.hidden :]))
            )
            stepped = torch.cat([h, c], dim=-1)
        return stepped.reshape(*lead, -1)
