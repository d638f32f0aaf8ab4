"""A memory task: each agent sees a cue at the first step only and must name it at the last.

Two agents; at reset each draws its own cue out of `num_cues` and sees it one-hot in its first
observation. The observations of the steps after are zero, except a last feature set at the final
step (`length`), where each agent is paid 1 if its action names its cue; other steps' actions are
ignored and pay 0, and the episode terminates after the final step. A policy without memory can only
guess: team return `2 / num_cues` (0.5 with the default 4 cues); remembering gives 2.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class CueRecallEnv(ParallelEnv):
    """Two agents, a cue at the first step, its name asked at step `length`; episodes terminate then."""

    metadata = {"name": "cue_recall_v0", "render_modes": []}

    def __init__(self, num_cues: int = 4, length: int = 5) -> None:
        if num_cues < 2:
            raise ValueError(f"num_cues must be at least 2, got {num_cues}")
        if length < 2:
            raise ValueError(f"length must be at least 2 (a cue step and an answer step), got {length}")
        self.num_cues, self.length = num_cues, length
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self._rng = np.random.default_rng()
        self._cues: dict[str, int] = {}
        self._t = 0

    @property
    def optimum(self) -> float:
        """Team return of a policy that remembers: both agents name their cue."""
        return 2.0

    @property
    def chance(self) -> float:
        """Expected team return of a policy without memory."""
        return 2.0 / self.num_cues

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self.num_cues + 1,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(self.num_cues)

    def _observe(self) -> dict[str, np.ndarray]:
        observations = {}
        for agent in self.agents:
            obs = np.zeros(self.num_cues + 1, np.float32)
            if self._t == 0:
                obs[self._cues[agent]] = 1.0
            obs[-1] = float(self._t == self.length - 1)  # answer now
            observations[agent] = obs
        return observations

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self._t = 0
        self._cues = {agent: int(self._rng.integers(self.num_cues)) for agent in self.agents}
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions):
        last = self._t == self.length - 1
        rewards = {a: float(last and int(actions[a]) == self._cues[a]) for a in self.agents}
        self._t += 1
        terminations = {a: last for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        observations = (
            self._observe() if not last else {a: np.zeros(self.num_cues + 1, np.float32) for a in self.agents}
        )
        if last:
            self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> CueRecallEnv:
    """Factory for the registry."""
    return CueRecallEnv(**kwargs)
