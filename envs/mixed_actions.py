"""Two agents with different action spaces: `mover` acts in a Box, `signaller` in a MultiDiscrete.

Each episode lasts `max_steps` steps; with `signaller_leaves_at=k` the signaller terminates after
step k and the mover plays on alone (a heterogeneous team with an agent that leaves early). The mover is paid for keeping its action near the target in
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

    def __init__(self, max_steps: int = 10, signaller_leaves_at: int | None = None) -> None:
        self.signaller_leaves_at = signaller_leaves_at
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

    def _observe(self, agents: list[str]) -> dict[str, np.ndarray]:
        signal = np.concatenate([self._digits, [self._t / self.max_steps, 1.0]]).astype(np.float32)
        return {a: self._target.copy() if a == "mover" else signal for a in agents}

    def _draw(self) -> None:
        self._target = self._rng.uniform(-1, 1, 2).astype(np.float32)
        self._digits = self._rng.integers(0, 3, 2)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._draw()
        return self._observe(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        acting = list(self.agents)
        rewards = {"mover": -float(np.abs(np.asarray(actions["mover"]) - self._target).sum())}
        if "signaller" in acting:
            rewards["signaller"] = float((np.asarray(actions["signaller"]) == self._digits).sum())
        over = self._t >= self.max_steps
        leaves = self.signaller_leaves_at is not None and self._t >= self.signaller_leaves_at
        terminations = {a: a == "signaller" and leaves for a in acting}
        truncations = {a: over and not terminations[a] for a in acting}
        self._draw()
        observations = self._observe(acting)
        infos = {a: {} for a in acting}
        self.agents = [a for a in acting if not (terminations[a] or truncations[a])]
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> MixedActionsEnv:
    """Factory for the registry."""
    return MixedActionsEnv(**kwargs)
