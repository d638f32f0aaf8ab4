"""Acting's view of a team's networks: their MLPs' weights read once for a rollout or an evaluation.

Acting runs many small forwards without gradients between two changes of the weights. An
`ActingView` is built for them once, after the weights last changed, and every acting caller (the
collector, in one process or in rollout workers, evaluation, the scores against a random opponent,
video) steps the policy through one, so all of them compute the same numbers:

- each MLP's first layer is folded (`AgentMLP.first_layer`) once and the later layers' weights are
  kept as their products read them (`ActingMLP`); in float32 the outputs equal the MLP's own
  forward, bit for bit, since the same operations make the same weights;
- under `bf16` on a GPU the weights are the bfloat16 copies autocast makes at every product. On a
  CPU they are float32 tensors of bfloat16 values, and every product's input and output and every
  activation is rounded to bfloat16's grid (`bf16_grid`): autocast's bfloat16 numbers up to the
  order of a product's sums, in float32 products, which CPUs without matrix units (and those with
  them, on acting's few rows) run faster than bfloat16 ones.

The rest of each network (CNN encoders, recurrent core, head, distribution) is the network's own
code (`GroupActor.forward_with`, `GroupCritic.forward_with`), reading its parameters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.nn.functional as F

from marl_ppo.models.distributions import ActionDistribution
from marl_ppo.models.layers import (
    AgentMLP,
    arithmetic,
    as_is,
    first_layer_output,
    stacked_linear,
)
from marl_ppo.models.team import GroupNetworks, TeamModel


def bf16_grid(t: torch.Tensor) -> torch.Tensor:
    """`t` rounded to the nearest bfloat16 value, kept in float32."""
    return t.bfloat16().float()


class ActingMLP:
    """An AgentMLP's forward without gradients, on its weights as they are when this is built."""

    def __init__(self, mlp: AgentMLP) -> None:
        self.mlp = mlp
        grid: Callable[[torch.Tensor], torch.Tensor] = as_is
        with torch.no_grad():
            weight, bias, agent_bias = mlp.first_layer()
            rest = tuple(_linear_form(layer.weight, layer.bias) for layer in mlp.linears[1:])
            if mlp.precision == "bf16":
                grid = bf16_grid if weight.device.type == "cpu" else as_is
                cast = bf16_grid if grid is bf16_grid else torch.Tensor.bfloat16
                weight, bias = cast(weight), cast(bias)
                agent_bias = None if agent_bias is None else cast(agent_bias)
                rest = tuple((cast(w), cast(b)) for w, b in rest)
        self.first = (weight, bias, agent_bias)
        """`AgentMLP.first_layer()`, as the products read it."""
        self.rest = rest
        """The later layers' `(weight, bias)`, as the products read them (`_linear_form`)."""
        self.grid = grid
        """What each product's input and output pass through: `as_is`, or `bf16_grid` (bf16 on a CPU)."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`AgentMLP.forward` of `x` (see the module for the numbers under bf16)."""
        mlp, grid = self.mlp, self.grid
        x = grid(mlp.normalized(x))
        with arithmetic(mlp.precision, x.device) if grid is as_is else contextlib.nullcontext():
            h = first_layer_output(
                x, *self.first, common_input=mlp.common_input, agents=mlp.num_agents, grid=grid
            )
            for weight, bias in self.rest:
                h = grid(mlp.activation(h))
                h = grid(F.linear(h, weight, bias) if weight.dim() == 2 else stacked_linear(h, weight, bias))
            return mlp.output(h)


def _linear_form(weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stacked layer's weights as `stacked_linear` hands them to its product: one map's `(out, in)`
    and `(out,)` views (copies == 1), else the `(copies, out, in)` and `(copies, out)` tensors."""
    return (weight.squeeze(0), bias.squeeze(0)) if weight.shape[0] == 1 else (weight, bias)


class _Group:
    """One group's networks and their MLPs' acting forms."""

    def __init__(self, networks: GroupNetworks) -> None:
        self.networks = networks
        self.actor = ActingMLP(networks.actor.net)
        self.critic = ActingMLP(networks.critic.net)


class ActingView:
    """A team's actors and critics as acting calls them, their MLPs' weights read once (see the
    module): build one per rollout or evaluation, after the weights last changed, and call it
    without gradients."""

    def __init__(self, model: TeamModel) -> None:
        self._groups = {name: _Group(model.group(name)) for name in model.group_names()}

    def actor(
        self,
        name: str,
        obs: torch.Tensor,
        action_mask: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[ActionDistribution, torch.Tensor]:
        """Group `name`'s `GroupActor.forward`, on the acting MLP."""
        group = self._groups[name]
        return group.networks.actor.forward_with(group.actor, obs, action_mask, carry, is_first, acted)

    def critic(
        self,
        name: str,
        state: torch.Tensor,
        obs: torch.Tensor,
        carry: torch.Tensor,
        is_first: torch.Tensor,
        acted: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Group `name`'s `GroupCritic.forward` (values in the critic's units), on the acting MLP."""
        group = self._groups[name]
        return group.networks.critic.forward_with(group.critic, state, obs, carry, is_first, acted)

    def denormalize(self, name: str, raw: torch.Tensor) -> torch.Tensor:
        """Group `name`'s critic values in return units."""
        return self._groups[name].networks.value_norm.denormalize(raw)
