"""A shaped reward added to what the policy learns from (`env.shaped_reward`), its weight annealed.

Some envs report, beside their own reward, a denser one that pays steps towards it (JaxMARL's
Overcooked: an onion put in a pot, a dish or a soup picked up). The rollout sources store
`reward + weight * shaped` in the buffer, the weight read once at each rollout's start from the env
steps taken before it, and keep the env's own reward for the episodes' returns, so curves,
evaluations and `report` stay comparable with runs that learn without it. The weight depends on the
step counter alone, which checkpoints keep: a resumed run learns from the weights the uninterrupted
one did.
"""

from __future__ import annotations

import dataclasses

from marl_ppo.config import ExperimentConfig

WEIGHT_TAG = "rollout/shaped_reward_weight"
"""The tag each update logs the rollout's weight under."""


@dataclasses.dataclass(frozen=True)
class RewardShaping:
    """`weight` at env step 0, falling linearly to 0 at `steps` env steps (None: constant)."""

    weight: float
    steps: int | None = None

    def weight_at(self, env_steps: int) -> float:
        """The weight of a rollout that starts after `env_steps` env steps."""
        if self.steps is None:
            return self.weight
        return self.weight * max(0.0, 1.0 - env_steps / self.steps)


def reward_shaping(config: ExperimentConfig) -> RewardShaping | None:
    """The run's shaping, or None where `env.shaped_reward` is 0."""
    if config.env.shaped_reward == 0:
        return None
    return RewardShaping(config.env.shaped_reward, config.env.shaped_reward_steps)
