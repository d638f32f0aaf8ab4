"""A team where one agent leaves early: `leaver` terminates after `leave_at` steps, the rest go on.

Observations are exact and checkable: each agent sees `[agent index, step count]`. Each live agent
earns reward `1 + its index` per step (the leaver's index is 1). The episode ends by truncation at
`max_steps`. Used to test alive masks, per-agent termination and that a gone agent gets no loss.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class EarlyLeaverEnv(ParallelEnv):
    """Three agents; `agent_1` terminates at step `leave_at`; truncation at `max_steps`."""

    metadata = {"name": "early_leaver_v0", "render_modes": []}

    def __init__(self, leave_at: int = 3, max_steps: int = 6) -> None:
        self.possible_agents = ["agent_0", "agent_1", "agent_2"]
        self.agents: list[str] = []
        self.leave_at = leave_at
        self.max_steps = max_steps
        self._t = 0
        self.received_actions: list[dict[str, int]] = []

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 100.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def _obs(self, agents: list[str]) -> dict[str, np.ndarray]:
        return {a: np.array([self.possible_agents.index(a), self._t], np.float32) for a in agents}

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        self._t = 0
        return self._obs(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        self.received_actions.append(dict(actions))
        self._t += 1
        acting = list(self.agents)
        rewards = {a: 1.0 + self.possible_agents.index(a) for a in acting}
        over = self._t >= self.max_steps
        terminations = {a: a == "agent_1" and self._t >= self.leave_at for a in acting}
        truncations = {a: over and not terminations[a] for a in acting}
        observations = self._obs(acting)
        infos = {a: {} for a in acting}
        self.agents = [a for a in acting if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> EarlyLeaverEnv:
    """Factory for the registry."""
    return EarlyLeaverEnv(**kwargs)
