"""Two agents with different action spaces: `mover` acts in a Box, `signaller` in a MultiDiscrete.

Each episode lasts `max_steps` steps. The mover is paid for keeping its action near the target in
its observation; the signaller for repeating the observed pair of digits. Small and exact, for
tests of heterogeneous teams and of the Box and MultiDiscrete heads.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class MixedActionsEnv(ParallelEnv):
    """A Box-action agent and a MultiDiscrete-action agent in one team."""

    metadata = {"name": "mixed_actions_v0", "render_modes": []}

    def __init__(self, max_steps: int = 10) -> None:
        self.possible_agents = ["mover", "signaller"]
        self.agents: list[str] = []
        self.max_steps = max_steps
        self._t = 0
        self._rng = np.random.default_rng()
        self._target = np.zeros(2, np.float32)
        self._digits = np.zeros(2, np.int64)

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1.0, 3.0, (2,) if agent == "mover" else (4,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Space:
        if agent == "mover":
            return spaces.Box(-1.0, 1.0, (2,), np.float32)
        return spaces.MultiDiscrete([3, 3])

    def _observe(self) -> dict[str, np.ndarray]:
        signal = np.concatenate([self._digits, [self._t / self.max_steps, 1.0]]).astype(np.float32)
        return {"mover": self._target.copy(), "signaller": signal}

    def _draw(self) -> None:
        self._target = self._rng.uniform(-1, 1, 2).astype(np.float32)
        self._digits = self._rng.integers(0, 3, 2)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._draw()
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        rewards = {
            "mover": -float(np.abs(np.asarray(actions["mover"]) - self._target).sum()),
            "signaller": float((np.asarray(actions["signaller"]) == self._digits).sum()),
        }
        over = self._t >= self.max_steps
        self._draw()
        observations = self._observe()
        flags = {a: over for a in self.agents}
        infos = {a: {} for a in self.agents}
        terminations = {a: False for a in self.agents}
        if over:
            self.agents = []
        return observations, rewards, terminations, flags, infos


def parallel_env(**kwargs) -> MixedActionsEnv:
    """Factory for the registry."""
    return MixedActionsEnv(**kwargs)
