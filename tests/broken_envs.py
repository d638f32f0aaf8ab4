"""Small PettingZoo envs that break the parallel contract on purpose, for the bad-input tests.

`BrokenEnv(fault=..., at=k)` behaves (two agents, 4-step episodes ending by truncation) until the
k-th step of its copy (counted over episodes), then commits its fault on every later step. Reset
faults strike on the second reset (the first auto-reset), so the run has trained before.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv, ParallelEnv

from marl_ppo.envs import registry
from marl_ppo.envs.adapters.contract import REJOIN_KEY

BROKEN = "tests/broken_v0"
# 2 copies x 5 steps per update; the broken env strikes at its copy's 7th step, during update 2
TINY_RUN = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=5",
    "total_steps=40",
    "log.progress=false",
    "log.checkpoint_every=1",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
    "model.hidden_sizes=[8]",
]

FAULTS = (
    "none",
    "obs_nan",
    "obs_inf",
    "obs_shape",
    "obs_dtype",
    "obs_missing",
    "reward_nan",
    "reward_missing",
    "reward_text",
    "unknown_agent",
    "unknown_obs_agent",
    "rejoin",
    "silent_leave",
    "silent_pause",
    "step_raises",
    "step_old_api",
    "state_nan",
    "reset_no_agents",
    "reset_raises",
    "first_reset_raises",
    "reset_obs_nan",
    "huge_reward",
    "unshared_reward",
    "hang",
)


class BrokenEnv(ParallelEnv):
    """Two agents on Box(0, 10, (2,)) observations and Discrete(2) actions; `fault` strikes from step `at`."""

    metadata: dict[str, Any] = {"name": "broken_v0"}

    def __init__(self, fault: str = "none", at: int = 7, max_steps: int = 4, rejoin: bool = False):
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        self.fault, self.at, self.max_steps = fault, at, max_steps
        if rejoin:
            self.metadata = {**self.metadata, REJOIN_KEY: True}
        self.possible_agents = ["agent_0", "agent_1"]
        self.agents: list[str] = []
        self._t = self._total = self._resets = 0
        if fault == "state_nan":
            self.state_space = spaces.Box(-1.0, 1.0, (3,), np.float32)

    @functools.cache  # noqa: B019 - PettingZoo requires the same space object on every call
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 10.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def state(self) -> np.ndarray:
        value = np.nan if self._broken() else 0.5
        return np.full(3, value, np.float32)

    def _broken(self) -> bool:
        return self._total >= self.at

    def _obs(self, agent: str) -> np.ndarray:
        return np.array([self.possible_agents.index(agent), self._t], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None):
        self._resets += 1
        self._t = 0
        strike = self._resets >= 2
        if (self.fault == "reset_raises" and strike) or self.fault == "first_reset_raises":
            raise RuntimeError("simulator lost its license server")
        self.agents = [] if self.fault == "reset_no_agents" and strike else list(self.possible_agents)
        observations = {a: self._obs(a) for a in self.agents}
        if self.fault == "reset_obs_nan" and strike:
            observations["agent_0"] = np.array([np.nan, 0.0], np.float32)
        return observations, {a: {} for a in self.agents}

    def step(self, actions):
        self._t += 1
        self._total += 1
        acting = list(self.agents)
        over = self._t >= self.max_steps
        observations = {a: self._obs(a) for a in acting}
        rewards = {a: 1.0 for a in acting}
        terminations = {a: False for a in acting}
        truncations = {a: over for a in acting}
        infos: dict[str, dict[str, Any]] = {a: {} for a in acting}
        self.agents = [] if over else acting
        if self._broken():
            result = self._strike(observations, rewards, terminations, truncations, infos)
            if result is not None:
                return result
        return observations, rewards, terminations, truncations, infos

    def _strike(self, observations, rewards, terminations, truncations, infos):
        fault = self.fault
        if fault in ("obs_nan", "obs_inf"):
            observations["agent_1"] = np.array([1.0, np.nan if fault == "obs_nan" else np.inf], np.float32)
        elif fault == "obs_shape":
            observations["agent_1"] = np.zeros(3, np.float32)
        elif fault == "obs_dtype":
            observations["agent_1"] = np.array(["left", "right"])
        elif fault == "obs_missing" and self.agents:
            del observations["agent_1"]
        elif fault == "reward_nan":
            rewards["agent_1"] = float("nan")
        elif fault == "reward_missing":
            del rewards["agent_1"]
        elif fault == "reward_text":
            rewards["agent_1"] = "high"
        elif fault == "unknown_agent" and self.agents:
            self.agents.append("ghost")
        elif fault == "unknown_obs_agent":
            observations["ghost"] = np.zeros(2, np.float32)
        elif fault == "rejoin" and self.agents:
            if self._total == self.at:  # agent_1 terminates now and comes back next step
                terminations["agent_1"] = True
                self.agents.remove("agent_1")
            elif "agent_1" not in self.agents:
                self.agents.append("agent_1")
                observations["agent_1"] = self._obs("agent_1")
        elif fault == "silent_leave" and "agent_1" in self.agents:  # gone with neither flag
            self.agents.remove("agent_1")
        elif fault == "silent_pause" and self.agents:  # gone with neither flag, back at the next step
            if self._total == self.at:
                self.agents.remove("agent_1")
            elif "agent_1" not in self.agents:
                self.agents.append("agent_1")
                observations["agent_1"] = self._obs("agent_1")
        elif fault == "step_raises":
            raise ZeroDivisionError("division by zero in the physics step")
        elif fault == "step_old_api":
            return observations, rewards, truncations, infos
        elif fault == "huge_reward":
            rewards = {a: 3e38 for a in rewards}
        elif fault == "unshared_reward":
            rewards["agent_1"] = 0.5
        elif fault == "hang":
            time.sleep(3600)
        return observations, rewards, terminations, truncations, infos


class SilentLeaverAEC(AECEnv):
    """Two players alternate moves on Box(0, 10, (2,)) observations; at move `at` the waiting
    `player_1` is removed from `agents` with neither flag. Episodes end by truncation at `max_moves`."""

    metadata = {"name": "silent_leaver_aec_v0"}

    def __init__(self, at: int = 3, max_moves: int = 8):
        self.at, self.max_moves = at, max_moves
        self.possible_agents = ["player_0", "player_1"]
        self.agents: list[str] = []

    @functools.cache  # noqa: B019
    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 10.0, (2,), np.float32)

    @functools.cache  # noqa: B019
    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.possible_agents.index(agent), self._moves], np.float32)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos: dict[str, dict[str, Any]] = {a: {} for a in self.agents}
        self._moves = 0
        self.agent_selection = self.agents[0]

    def step(self, action) -> None:
        mover = self.agent_selection
        if self.terminations[mover] or self.truncations[mover]:
            self._was_dead_step(action)
            return
        self._moves += 1
        self.rewards = {a: 1.0 for a in self.agents}
        if self._moves >= self.max_moves:
            self.truncations = {a: True for a in self.agents}
        if self._moves == self.at and "player_1" in self.agents and mover != "player_1":
            self.agents.remove("player_1")
            for table in (
                self.rewards,
                self._cumulative_rewards,
                self.terminations,
                self.truncations,
                self.infos,
            ):
                del table["player_1"]
        self.agent_selection = self.agents[(self.agents.index(mover) + 1) % len(self.agents)]


def make(**kwargs) -> BrokenEnv:
    """Factory for `env.id=tests/broken_envs.py:make`."""
    return BrokenEnv(**kwargs)


def make_raising(**kwargs) -> BrokenEnv:
    """A factory that fails before building anything."""
    raise ConnectionError("could not reach the simulator at port 5555")


def register_for_test(monkeypatch) -> None:
    """Register the test ids for one test only (the catalog tests must not see them)."""
    specs = [
        registry.EnvSpec(BROKEN, BrokenEnv),
        registry.EnvSpec("tests/factory_raises_v0", make_raising),
        registry.EnvSpec("tests/needs_extra_v0", "no_such_sim.envs:make", extra="nosim"),
    ]
    for spec in specs:
        monkeypatch.setitem(registry._REGISTRY, spec.id, spec)
