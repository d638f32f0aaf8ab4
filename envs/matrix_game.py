"""A one-step cooperative matrix game with a known optimum.

Two agents pick a row and a column of `payoff` at once; both are paid the entry, and the episode
ends (terminates). With the default payoff the optimum is (0, 0) with 10 per agent, team return 20;
the other diagonal entries (5, 2) are weaker equilibria a learner can settle in.
"""

from __future__ import annotations

import functools

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

DEFAULT_PAYOFF = ((10.0, 0.0, 0.0), (0.0, 5.0, 0.0), (0.0, 0.0, 2.0))


class MatrixGameEnv(ParallelEnv):
    """Two players, one simultaneous move, shared payoff; observations are a constant."""

    metadata = {"name": "matrix_game_v0", "render_modes": []}

    def __init__(self, payoff: tuple[tuple[float, ...], ...] | list = DEFAULT_PAYOFF) -> None:
        self.payoff = np.asarray(payoff, dtype=np.float32)
        if self.payoff.ndim != 2:
            raise ValueError(f"payoff must be a matrix, got shape {self.payoff.shape}")
        self.possible_agents = ["row", "column"]
        self.agents: list[str] = []

    @property
    def optimum(self) -> float:
        """Best team return: both agents paid the largest entry."""
        return 2.0 * float(self.payoff.max())

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (1,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(self.payoff.shape[0 if agent == "row" else 1])

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        return {a: np.ones(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        value = float(self.payoff[int(actions["row"]), int(actions["column"])])
        observations = {a: np.ones(1, np.float32) for a in self.agents}
        rewards = {a: value for a in self.agents}
        terminations = {a: True for a in self.agents}
        truncations = {a: False for a in self.agents}
        infos = {a: {} for a in self.agents}
        self.agents = []
        return observations, rewards, terminations, truncations, infos


def parallel_env(**kwargs) -> MatrixGameEnv:
    """Factory for the registry."""
    return MatrixGameEnv(**kwargs)
