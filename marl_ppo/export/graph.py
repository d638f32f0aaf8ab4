"""One group's actor as one step of a deployed policy: named tensors in, actions and the new carry out.

`ActorStep` is the module that `marl-ppo export` hands to torch's ONNX exporter and to TorchScript.
It computes what `GroupActor.forward` computes for a sequence of one step, in float32, without the
branches on data that the training path takes for speed (which steps reset, which hold), so that one
graph serves every batch:

- inputs, per group, with B rows (env copies, or 1 for one controller) and A agents of the group:
  `obs` `(B, A, obs_dim)` (uint8 where the group's observations are frames, else float32), then
  `action_mask` `(B, A, mask_dim)` bool where the group has masks, then for a recurrent actor `carry`
  `(B, A, carry_size)` float32, `episode_start` `(B, A)` bool (the carry is zeroed first where set)
  and `alive` `(B, A)` bool (the carry advances only there), then for a sampling policy `noise`:
  uniform in (0, 1) `(B, A, head_size)` for discrete actions (Gumbel-max sampling), standard normal
  `(B, A, action_dim)` for Box actions;
- outputs: `actions` `(B, A)` int64 (Discrete), `(B, A, k)` int64 (MultiDiscrete) or `(B, A, d)`
  float32 (Box, before the env's clipping to its bounds); `logits` `(B, A, head_size)` (masked
  actions at `MASKED_LOGIT`) or `mean` `(B, A, d)` for Box; and `next_carry` `(B, A, carry_size)` for a
  recurrent actor.

Discrete actions are indices from 0 (an env whose space starts elsewhere adds its start).
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from marl_ppo.envs.spec import GroupSpec
from marl_ppo.models.distributions import MASKED_LOGIT, head_size
from marl_ppo.models.encoders import FeatureEncoder, ReusedFeatures
from marl_ppo.models.layers import stacked_linear
from marl_ppo.models.recurrent import StackedRecurrent
from marl_ppo.models.team import GroupActor


@dataclass(frozen=True)
class StepSignature:
    """The names of a group's exported inputs and outputs, in order (see the module)."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def signature(group: GroupSpec, *, recurrent: bool, sample: bool) -> StepSignature:
    """The inputs and outputs of `group`'s exported actor."""
    inputs = ["obs"]
    if group.mask_dim:
        inputs.append("action_mask")
    if recurrent:
        inputs += ["carry", "episode_start", "alive"]
    if sample:
        inputs.append("noise")
    params = "mean" if isinstance(group.action_space, gym.spaces.Box) else "logits"
    outputs = ["actions", params] + (["next_carry"] if recurrent else [])
    return StepSignature(tuple(inputs), tuple(outputs))


def noise_size(space: gym.Space) -> int:
    """Numbers of noise one agent's sampled action takes: one per logit, or one per Box dimension."""
    return head_size(space)


class ActorStep(nn.Module):
    """One step of `actor` (see the module): `forward(*inputs)` in `signature(...).inputs` order."""

    def __init__(self, actor: GroupActor, group: GroupSpec, *, sample: bool) -> None:
        super().__init__()
        self.actor = actor
        self.space = group.action_space
        self.recurrent = isinstance(actor.core, StackedRecurrent)
        self.signature = signature(group, recurrent=self.recurrent, sample=sample)
        self.sample = sample
        features = actor.features
        self.features: FeatureEncoder | None = (
            features.encoder if isinstance(features, ReusedFeatures) else features
        )

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Actions, the distribution's parameters and (recurrent) the new carry; see the module."""
        named = dict(zip(self.signature.inputs, inputs, strict=True))
        obs = named["obs"]
        features = self.actor.net(obs.float() if self.features is None else self.features(obs))
        carry_out = None
        if self.recurrent:
            features, carry_out = self._recurrent(features, named)
        output = self.actor.head(features)
        params = output
        if "action_mask" in named:
            params = output.masked_fill(~named["action_mask"], MASKED_LOGIT)
        actions = self._actions(params, named.get("noise"))
        return (actions, params) if carry_out is None else (actions, params, carry_out)

    def _recurrent(
        self, features: torch.Tensor, named: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`StackedRecurrent.forward` for one step: reset where an episode starts, step, keep the
        stepped carry where the agent is alive."""
        core = self.actor.core
        assert isinstance(core, StackedRecurrent)
        carry = torch.where(named["episode_start"].unsqueeze(-1), 0.0, named["carry"])
        stepped = core.cell(stacked_linear(features, core.weight_ih, core.bias_ih), carry)
        kept = torch.where(named["alive"].unsqueeze(-1), stepped, carry)
        return stepped[..., : core.hidden], kept

    def _actions(self, params: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        space = self.space
        if isinstance(space, gym.spaces.Box):
            if noise is None:
                return params
            log_std = self.actor.log_std
            assert log_std is not None  # a Box actor has one
            return params + log_std.exp() * noise
        scores = params if noise is None else params - torch.log(-torch.log(noise))
        if isinstance(space, gym.spaces.Discrete):
            return scores.argmax(-1)
        sizes = [int(n) for n in space.nvec.reshape(-1)]
        return torch.stack([part.argmax(-1) for part in scores.split(sizes, dim=-1)], dim=-1)


def example_inputs(step: ActorStep, group: GroupSpec, rows: int = 2) -> tuple[torch.Tensor, ...]:
    """Inputs of the right names, shapes and dtypes for tracing: `rows` rows of `group`'s agents."""
    agents = group.num_agents
    carry_size = step.actor.carry_size
    make = {
        "obs": lambda: torch.zeros(rows, agents, group.obs_dim, dtype=_obs_dtype(group)),
        "action_mask": lambda: torch.ones(rows, agents, group.mask_dim, dtype=torch.bool),
        "carry": lambda: torch.zeros(rows, agents, carry_size),
        "episode_start": lambda: torch.ones(rows, agents, dtype=torch.bool),
        "alive": lambda: torch.ones(rows, agents, dtype=torch.bool),
        "noise": lambda: torch.full((rows, agents, noise_size(group.action_space)), 0.5),
    }
    return tuple(make[name]() for name in step.signature.inputs)


def _obs_dtype(group: GroupSpec) -> torch.dtype:
    return torch.uint8 if group.obs_dtype == np.uint8 else torch.float32
