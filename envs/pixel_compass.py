"""Dict observations: an image and a vector, both needed, and an action mask.

Each of two agents observes `{"observation": {"image": ..., "flip": ...}, "action_mask": ...}`: a
uint8 image `(8, 8, 1)` with a dot in its left or right half, and a float one-hot `flip` that says
whether to answer the dot's side (left 0, right 1) or the other one. Action 2 exists but is always
masked. One step per episode, 1 per agent for the right side: optimum team return 2, random 1 (the
two allowed actions at random). Neither key alone beats chance.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

SIZE = 8


class PixelCompassEnv(ParallelEnv):
    """Two agents, one move each; Dict observations of an image beside a vector, masked actions."""

    metadata = {"name": "pixel_compass_v0", "render_modes": []}

    def __init__(self) -> None:
        self.possible_agents = ["scout_0", "scout_1"]
        self.agents: list[str] = []
        self._rng = np.random.default_rng()
        self._sides = np.zeros(2, np.int64)
        self._flips = np.zeros(2, np.int64)

    optimum = 2.0
    """Best team return: both agents answer right."""

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Dict:
        features = spaces.Dict(
            {
                "image": spaces.Box(0, 255, (SIZE, SIZE, 1), np.uint8),
                "flip": spaces.Box(0.0, 1.0, (2,), np.float32),
            }
        )
        return spaces.Dict({"observation": features, "action_mask": spaces.Box(0, 1, (3,), np.int8)})

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._sides = self._rng.integers(0, 2, 2)
        self._flips = self._rng.integers(0, 2, 2)
        return self._observations(), {a: {} for a in self.agents}

    def _observations(self) -> dict[str, dict]:
        observations = {}
        for agent, side, flip in zip(self.possible_agents, self._sides, self._flips, strict=True):
            image = np.zeros((SIZE, SIZE, 1), np.uint8)
            col = 1 if side == 0 else SIZE - 3
            image[3:5, col : col + 2] = 255
            features = {"image": image, "flip": np.eye(2, dtype=np.float32)[flip]}
            observations[agent] = {"observation": features, "action_mask": np.array([1, 1, 0], np.int8)}
        return observations

    def step(self, actions):
        rewards = {}
        for agent, side, flip in zip(self.possible_agents, self._sides, self._flips, strict=True):
            rewards[agent] = float(int(actions[agent]) == int(side ^ flip))
        observations = self._observations()
        terminations = {a: True for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> PixelCompassEnv:
    """Factory for the registry."""
    return PixelCompassEnv(**kwargs)
