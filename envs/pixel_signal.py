"""Two agents each see a small uint8 image with a bright square in one of four quadrants and name it.

One step per episode: each agent is paid 1 for naming its own square's quadrant (0 top-left, 1
top-right, 2 bottom-left, 3 bottom-right), so the optimum team return is 2 and a random policy
scores 0.5. Only pixels carry the answer: the test of an image encoder. The global state is both
images stacked on the channel axis, channels first `(2, H, W)`, so the critic reads a CHW image.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class PixelSignalEnv(ParallelEnv):
    """Two agents, one move each, pixel observations `(size, size, 1)` HWC and a CHW state."""

    metadata = {"name": "pixel_signal_v0", "render_modes": []}

    def __init__(self, size: int = 12) -> None:
        if size < 4 or size % 2:
            raise ValueError(f"size must be an even number of pixels >= 4, got {size}")
        self.size = size
        self.possible_agents = ["seer_0", "seer_1"]
        self.agents: list[str] = []
        self.state_space = spaces.Box(0, 255, (2, size, size), np.uint8)
        self._rng = np.random.default_rng()
        self._quadrants = np.zeros(2, np.int64)

    optimum = 2.0
    """Best team return: both agents name their quadrant."""

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0, 255, (self.size, self.size, 1), np.uint8)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(4)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._quadrants = self._rng.integers(0, 4, 2)
        return self._observations(), {a: {} for a in self.agents}

    def _image(self, quadrant: int) -> np.ndarray:
        half = self.size // 2
        image = np.full((self.size, self.size, 1), 20, np.uint8)
        row, col = divmod(int(quadrant), 2)
        image[row * half : (row + 1) * half, col * half : (col + 1) * half] = 230
        return image

    def _observations(self) -> dict[str, np.ndarray]:
        return {a: self._image(q) for a, q in zip(self.possible_agents, self._quadrants, strict=True)}

    def state(self) -> np.ndarray:
        return np.stack([self._image(q)[..., 0] for q in self._quadrants])

    def step(self, actions):
        rewards = {
            a: float(int(actions[a]) == int(q))
            for a, q in zip(self.possible_agents, self._quadrants, strict=True)
        }
        observations = self._observations()
        terminations = {a: True for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> PixelSignalEnv:
    """Factory for the registry."""
    return PixelSignalEnv(**kwargs)
