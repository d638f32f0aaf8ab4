"""simple_spread whose observations keep their size at any team size: each agent sees its nearest.

mpe2's simple_spread_v3 (N agents cover N landmarks) shows each agent every landmark's and every
other agent's relative position and communication, so its observation grows with N, and a policy
trained with 3 agents cannot read 4 agents' observations. This env plays the same world, dynamics
and rewards (mpe2's, `local_ratio` included) and shows each agent its own velocity and position and
the relative positions of its `landmarks` nearest landmarks and its `neighbours` nearest other
agents, nearest first: `4 + 2 * (landmarks + neighbours)` numbers whatever N is (14 by default).
Used for warm starts across team sizes (`model.init_from`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class SpreadNearestEnv(ParallelEnv):
    """mpe2's simple_spread_v3 with N agents, each observing its nearest landmarks and agents."""

    metadata = {"name": "spread_nearest_v0", "render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(
        self,
        N: int = 3,  # noqa: N803 - mpe2's name for the team size
        landmarks: int = 3,
        neighbours: int = 2,
        max_cycles: int = 25,
        local_ratio: float = 0.5,
        render_mode: str | None = None,
    ) -> None:
        if landmarks > N or neighbours > N - 1:
            raise ValueError(
                f"N={N} agents have N landmarks and N - 1 neighbours each; got landmarks={landmarks}, "
                f"neighbours={neighbours}"
            )
        from mpe2 import simple_spread_v3

        self._env = simple_spread_v3.parallel_env(
            N=N,
            max_cycles=max_cycles,
            local_ratio=local_ratio,
            continuous_actions=False,
            render_mode=render_mode,
        )
        self.landmarks, self.neighbours = landmarks, neighbours
        self.possible_agents = list(self._env.possible_agents)
        self.agents: list[str] = []
        self.render_mode = render_mode

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        size = 4 + 2 * (self.landmarks + self.neighbours)
        return spaces.Box(-np.inf, np.inf, (size,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Space:
        return self._env.action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        _, infos = self._env.reset(seed=seed, options=options)
        self.agents = list(self._env.agents)
        return self._observe(self.agents), infos

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        acting = list(self.agents)
        _, rewards, terminations, truncations, infos = self._env.step(actions)
        self.agents = list(self._env.agents)
        return self._observe(acting), rewards, terminations, truncations, infos

    def _observe(self, agents: list[str]) -> dict[str, np.ndarray]:
        world = self._env.unwrapped.world
        bodies = {body.name: body for body in world.agents}
        landmarks = np.array([landmark.state.p_pos for landmark in world.landmarks])
        positions = np.array([body.state.p_pos for body in world.agents])
        observations = {}
        for agent in agents:
            body = bodies[agent]
            own = body.state.p_pos
            others = np.array([p for b, p in zip(world.agents, positions, strict=True) if b is not body])
            parts = [body.state.p_vel, own, _nearest(landmarks - own, self.landmarks)]
            parts.append(_nearest(others - own, self.neighbours))
            observations[agent] = np.concatenate([np.ravel(p) for p in parts]).astype(np.float32)
        return observations

    def render(self) -> Any:
        return self._env.render()

    def close(self) -> None:
        self._env.close()


def _nearest(offsets: np.ndarray, count: int) -> np.ndarray:
    """The `count` shortest of the relative positions `offsets` `(n, 2)`, nearest first (stable ties)."""
    order = np.argsort(np.linalg.norm(offsets, axis=1), kind="stable")
    return offsets[order[:count]]


def parallel_env(**kwargs: Any) -> SpreadNearestEnv:
    """Factory for the registry."""
    return SpreadNearestEnv(**kwargs)
