"""A Gymnasium env presented as a PettingZoo ParallelEnv team, so the framework trains it unchanged.

Two kinds of Gymnasium env are understood, told apart by their spaces (isinstance checks only):

- **single-agent**: any other env, e.g. `gymnasium.make("CartPole-v1")`; a one-agent team
  `agent_0` whose observation and action spaces are the env's own.
- **multi-agent gymnasium** (the lbforaging / rware convention): `observation_space` and
  `action_space` are both `gymnasium.spaces.Tuple` of the same length N >= 1; agents
  `agent_0 .. agent_{N-1}` get the tuples' elements as spaces. `step` sends the env the tuple of
  actions in agent order. Rewards may be N floats or one float (given to every agent);
  `terminated` / `truncated` may be one bool (for the whole team) or N bools (per agent). An agent
  done on its own leaves `agents` and is not asked for actions again; the env keeps receiving a
  placeholder action for it (Discrete: its first action, MultiDiscrete: `start`, Box: zeros
  clipped into the box) so the tuple stays complete.

The spaces are those of the outermost wrapper (the unwrapped env's own objects when the wrapper
chain changes nothing). Observations are passed on as the env gives them, except that an
observation of a Box space that is not an array of the box's dtype (a list, a float64 array) is
converted to one, so it lies inside its space. Each agent's info is a shallow copy of the env's
info dict. No `state()` / `state_space` is offered: the framework then builds the global state by
concatenating the agents' observations.

Time limits. lbforaging and rware end their step limit with `terminated=True, truncated=False`,
which would make a learner treat a time-out as a terminal state (no bootstrap). The wrapper
therefore counts steps since `reset` against a time limit: `time_limit` when given, else the
smallest of the env's known limits that exist, `env.unwrapped._max_episode_steps` (lbforaging),
`env.unwrapped.max_steps` (rware) and `env.spec.max_episode_steps` (Gymnasium's TimeLimit). The
rule:

- before the limit, flags are reported as the env gives them, so a true early end (lbforaging
  when all food is collected, CartPole's pole falling) stays a termination;
- at the limit step, every agent still live is reported `truncated=True, terminated=False` and the
  episode ends, whatever the env said: a termination the env reports exactly at the limit step is
  taken to be its time-out. (A genuine termination that happens to coincide with the limit step
  is therefore reported as a truncation too; an env cannot tell the two apart there.)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo import ParallelEnv


def detect_time_limit(env: gym.Env) -> int | None:
    """The env's step limit from its known attributes and Gymnasium spec (the smallest found), or None."""
    unwrapped = env.unwrapped
    spec = getattr(env, "spec", None)
    candidates = (
        getattr(unwrapped, "_max_episode_steps", None),
        getattr(unwrapped, "max_steps", None),
        getattr(spec, "max_episode_steps", None),
    )
    limits = [
        int(value)
        for value in candidates
        if isinstance(value, int | np.integer) and not isinstance(value, bool) and value > 0
    ]
    return min(limits) if limits else None


def placeholder_action(space: gym.Space) -> Any:
    """A fixed valid action of `space` (first action, `start`, or zeros clipped into a Box)."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.array(space.start, dtype=space.dtype, copy=True)
    if isinstance(space, gym.spaces.MultiBinary):
        return np.zeros(space.shape, dtype=space.dtype)
    if isinstance(space, gym.spaces.Box):
        return np.clip(np.zeros(space.shape), space.low, space.high).astype(space.dtype)
    if isinstance(space, gym.spaces.Tuple):
        return tuple(placeholder_action(s) for s in space.spaces)
    if isinstance(space, gym.spaces.Dict):
        return {key: placeholder_action(s) for key, s in space.spaces.items()}
    fixed = copy.deepcopy(space)
    fixed.seed(0)
    return fixed.sample()


def _outer_space(env: gym.Env, name: str) -> gym.Space:
    """The wrapper chain's space, as the unwrapped env's own object when the chain leaves it equal."""
    outer: gym.Space = getattr(env, name)
    inner: gym.Space | None = getattr(env.unwrapped, name, None)
    if inner is not None and (inner is outer or inner == outer):
        return inner
    return outer


def _conform(space: gym.Space, observation: Any) -> Any:
    """A Box observation as an array of the box's dtype; anything else unchanged."""
    if isinstance(space, gym.spaces.Box) and not (
        isinstance(observation, np.ndarray) and observation.dtype == space.dtype
    ):
        return np.asarray(observation, dtype=space.dtype)
    return observation


class GymnasiumTeamEnv(ParallelEnv):
    """A Gymnasium env (single-agent, or multi-agent with Tuple spaces) as a PettingZoo ParallelEnv."""

    def __init__(self, env: gym.Env, *, agent_prefix: str = "agent", time_limit: int | None = None) -> None:
        if not isinstance(env, gym.Env):
            raise TypeError(f"GymnasiumTeamEnv wraps a gymnasium.Env, got {type(env).__name__}")
        if time_limit is not None and (
            isinstance(time_limit, bool) or not isinstance(time_limit, int | np.integer) or time_limit < 1
        ):
            raise ValueError(f"time_limit must be a positive int or None, got {time_limit!r}")
        self.env = env
        obs_space = _outer_space(env, "observation_space")
        act_space = _outer_space(env, "action_space")
        obs_spaces: list[gym.Space] = [obs_space]
        act_spaces: list[gym.Space] = [act_space]
        self.multi_agent = False
        """True for a Tuple-spaces team env, False for a one-agent team."""
        if (
            isinstance(obs_space, gym.spaces.Tuple)
            and isinstance(act_space, gym.spaces.Tuple)
            and len(obs_space.spaces) == len(act_space.spaces) > 0
        ):
            obs_spaces, act_spaces = list(obs_space.spaces), list(act_space.spaces)
            self.multi_agent = True
        self.possible_agents = [f"{agent_prefix}_{i}" for i in range(len(obs_spaces))]
        self.agents: list[str] = []
        self.observation_spaces = dict(zip(self.possible_agents, obs_spaces, strict=True))
        self.action_spaces = dict(zip(self.possible_agents, act_spaces, strict=True))
        self._placeholders = {agent: placeholder_action(s) for agent, s in self.action_spaces.items()}
        self.time_limit = int(time_limit) if time_limit is not None else detect_time_limit(env)
        """Steps after which every live agent is truncated (None: only the env ends episodes)."""
        self.elapsed_steps = 0
        spec = getattr(env, "spec", None)
        name = spec.id if spec is not None and spec.id else type(env.unwrapped).__name__
        self.metadata = {**dict(getattr(env, "metadata", None) or {}), "name": name}
        self.render_mode = getattr(env, "render_mode", None)

    def observation_space(self, agent: str) -> gym.Space:
        """The agent's observation space (the same object on every call)."""
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        """The agent's action space (the same object on every call)."""
        return self.action_spaces[agent]

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Reset the env; every agent is live again."""
        observation, info = self.env.reset(seed=seed, options=options)
        self.elapsed_steps = 0
        self.agents = list(self.possible_agents)
        observations = self._split_observations(observation)
        return (
            {agent: observations[i] for i, agent in enumerate(self.possible_agents)},
            self._infos(info, self.agents),
        )

    def step(
        self, actions: Mapping[str, Any]
    ) -> tuple[dict[str, Any], dict[str, float], dict[str, bool], dict[str, bool], dict[str, dict[str, Any]]]:
        """Step the env with the live agents' actions; results are keyed by the agents that acted."""
        if not self.agents:
            raise RuntimeError("step() called with no live agents; the episode is over, call reset()")
        acting = list(self.agents)
        missing = [agent for agent in acting if agent not in actions]
        if missing:
            raise KeyError(f"no action for live agent(s) {missing} at step {self.elapsed_steps + 1}")
        if self.multi_agent:
            live = set(acting)
            env_action: Any = tuple(
                actions[agent] if agent in live else self._placeholders[agent]
                for agent in self.possible_agents
            )
        else:
            env_action = actions[acting[0]]
        observation, reward, terminated, truncated, info = self.env.step(env_action)
        self.elapsed_steps += 1
        n = len(self.possible_agents)
        observations = self._split_observations(observation)
        rewards = self._per_agent(reward, n, "reward", np.float64)
        terminations = self._per_agent(terminated, n, "terminated", bool)
        truncations = self._per_agent(truncated, n, "truncated", bool)
        at_limit = self.time_limit is not None and self.elapsed_steps >= self.time_limit
        index = {agent: i for i, agent in enumerate(self.possible_agents)}
        out_obs, out_rew, out_term, out_trunc = {}, {}, {}, {}
        for agent in acting:
            i = index[agent]
            out_obs[agent] = observations[i]
            out_rew[agent] = float(rewards[i])
            out_term[agent] = bool(terminations[i]) and not at_limit
            out_trunc[agent] = bool(truncations[i]) or at_limit
        self.agents = [agent for agent in acting if not (out_term[agent] or out_trunc[agent])]
        return out_obs, out_rew, out_term, out_trunc, self._infos(info, acting)

    def render(self) -> Any:
        """Render through the wrapped env."""
        return self.env.render()

    def close(self) -> None:
        """Close the wrapped env."""
        self.env.close()

    def _split_observations(self, observation: Any) -> list[Any]:
        if not self.multi_agent:
            return [_conform(self.observation_spaces[self.possible_agents[0]], observation)]
        parts = list(observation)
        if len(parts) != len(self.possible_agents):
            raise ValueError(
                f"env gave {len(parts)} observations for {len(self.possible_agents)} agents "
                f"at step {self.elapsed_steps}"
            )
        return [
            _conform(self.observation_spaces[agent], part)
            for agent, part in zip(self.possible_agents, parts, strict=True)
        ]

    def _per_agent(self, value: Any, n: int, what: str, dtype: Any) -> np.ndarray:
        """One entry per agent: a scalar is given to every agent, a sequence must have n entries."""
        values = np.asarray(value, dtype=dtype)
        if values.ndim == 0:
            return np.full(n, values, dtype=dtype)
        values = values.reshape(-1)
        if values.size != n:
            raise ValueError(
                f"env gave {what} with {values.size} entries for {n} agents at step {self.elapsed_steps}"
            )
        return values

    @staticmethod
    def _infos(info: Any, agents: list[str]) -> dict[str, dict[str, Any]]:
        shared = info if isinstance(info, Mapping) else {}
        return {agent: dict(shared) for agent in agents}
