"""A never-ending task cut by a time limit: every step pays 1, nothing ever terminates.

With discount gamma the true value of every state is 1 / (1 - gamma); a learner that treats the
time-limit truncation as termination instead learns the finite-horizon value. Used to test the
truncation bootstrap.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class NeverEndingEnv(ParallelEnv):
    """`num_agents` agents, one constant observation, reward 1 per step, truncated after `max_steps`.

    `end_by="termination"` turns the limit into a true terminal state (a finite-horizon task), the
    contrast case for tests.
    """

    metadata = {"name": "never_ending_v0", "render_modes": []}

    def __init__(self, num_agents: int = 1, max_steps: int = 5, end_by: str = "truncation") -> None:
        if end_by not in ("truncation", "termination"):
            raise ValueError(f"end_by must be 'truncation' or 'termination', got {end_by!r}")
        self.end_by = end_by
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.agents: list[str] = []
        self.max_steps = max_steps
        self._t = 0

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def _obs(self) -> dict[str, np.ndarray]:
        return {a: np.array([1.0, 0.5], np.float32) for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        self._t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        over = self._t >= self.max_steps
        rewards = {a: 1.0 for a in self.agents}
        terminations = {a: over and self.end_by == "termination" for a in self.agents}
        truncations = {a: over and self.end_by == "truncation" for a in self.agents}
        observations = self._obs()
        infos = {a: {} for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> NeverEndingEnv:
    """Factory for the registry."""
    return NeverEndingEnv(**kwargs)
