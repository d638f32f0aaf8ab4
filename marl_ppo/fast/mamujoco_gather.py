"""Multi-agent MuJoCo's step with the agents' observations and the joint action as index arrays."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
from gymnasium_robotics.envs.multiagent_mujoco.mujoco_multi import MultiAgentMujocoEnv
from gymnasium_robotics.envs.multiagent_mujoco.obsk import build_obs

SOURCES = ("qpos", "qvel", "qfrc_actuator", "cvel", "cinert", "cfrc_ext")
"""The MuJoCo data arrays an agent's observation may gather from, in the order they are concatenated."""


def gathered_mamujoco(env: Any) -> Any:
    """`env` stepped by `GatheredMaMuJoCo` where it is Gymnasium-Robotics' MultiAgentMujocoEnv whose
    agents' observations are plain selections of MuJoCo's data arrays and whose agents together set
    every joint once; any other env (one agent, a computed observation item) is returned as it is.

    The library builds each agent's observation at every step by walking its joint graph (a Python
    call and a list extend per joint and category), its joint action element by element, and its
    state by building the MuJoCo env's observation again after the step returned it. The first two
    are fixed selections, found here once from stand-in data records (`_observation_plan`), so a
    step takes the same numbers by one index (and a clip where the library clips) per agent, and
    `state()` copies the observation the step returned. Resets keep the library's own path.
    """
    if type(env) is not MultiAgentMujocoEnv or env.agent_obsk is None:
        return env
    actions = _action_plan(env)
    plan = _observation_plan(env)
    if actions is None or plan is None:
        return env
    env.__class__ = GatheredMaMuJoCo  # in place: every attribute the factory and the library set stays
    env._gathered_actions, env._gathered_plan = actions, plan
    env._gathered_joints = env.single_agent_env.action_space.shape[0]
    env._gathered_keeps_state = _unchanged_observations(env.single_agent_env)
    return env


class GatheredMaMuJoCo(MultiAgentMujocoEnv):
    """MultiAgentMujocoEnv whose `step` maps the actions and reads the observations by index arrays
    (`gathered_mamujoco`); the same numbers, rewards and flags as the library's step."""

    _gathered_actions: list[tuple[str, np.ndarray, np.ndarray]]
    _gathered_plan: ObservationPlan
    _gathered_joints: int
    _gathered_keeps_state: bool
    """The MuJoCo env's step returns its observation unchanged (only Gymnasium's own wrappers)."""
    _gathered_state: np.ndarray | None = None

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self._gathered_state = None
        return super().reset(seed=seed, options=options)

    def state(self) -> np.ndarray:
        if self._gathered_state is None:
            return super().state()
        return self._gathered_state.copy()

    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict, dict, dict, dict]:
        joint = np.empty(self._gathered_joints)
        for agent, local, target in self._gathered_actions:
            joint[target] = np.asarray(actions[agent])[local]
        robot, reward, terminated, truncated, info = self.single_agent_env.step(joint)
        if self._gathered_keeps_state:
            self._gathered_state = robot  # the MuJoCo env's observation, which is what `state()` gives
        data = self.single_agent_env.unwrapped.data
        plan = self._gathered_plan
        values = np.concatenate([getattr(data, name).ravel() for name in plan.sources])
        agents = self.possible_agents
        observations = dict(zip(agents, plan.observe(values), strict=True))
        rewards = dict.fromkeys(agents, reward)
        terminations = dict.fromkeys(agents, terminated)
        truncations = dict.fromkeys(agents, truncated)
        infos = dict.fromkeys(agents, info)
        if terminated or truncated:
            self.agents: list[str] = []
        return observations, rewards, terminations, truncations, infos


PLAIN_WRAPPERS = ("TimeLimit", "OrderEnforcing", "PassiveEnvChecker")
"""The wrappers `gymnasium.make` puts around a MuJoCo env, none of which changes an observation."""


def _unchanged_observations(env: Any) -> bool:
    """Whether every wrapper around the MuJoCo env is one of `gymnasium.make`'s own."""
    while hasattr(env, "env"):
        if type(env).__name__ not in PLAIN_WRAPPERS or not type(env).__module__.startswith("gymnasium."):
            return False
        env = env.env
    return True


def _action_plan(env: MultiAgentMujocoEnv) -> list[tuple[str, np.ndarray, np.ndarray]] | None:
    """Per agent, which entries of its action go to which joints; None unless every joint is set
    exactly once (the library asserts that at each step)."""
    joints = env.single_agent_env.action_space.shape[0]
    plan, seen = [], []
    for agent, partition in zip(env.possible_agents, env.agent_action_partitions, strict=True):
        local, target = [], []
        for position, node in enumerate(partition):
            ids = np.atleast_1d(np.asarray(node.act_ids, dtype=np.int64))
            local.extend([position] * len(ids))
            target.extend(ids.tolist())
        plan.append((agent, np.array(local, dtype=np.int64), np.array(target, dtype=np.int64)))
        seen.extend(target)
    if sorted(seen) != list(range(joints)):
        return None
    return plan


def _observation_plan(env: MultiAgentMujocoEnv) -> ObservationPlan | None:
    """The data arrays the observations read and, per agent, the positions of its observation in their
    concatenation and the bounds each item is clipped to (Ant's contact forces, Hopper's velocities);
    None when an observation item is anything else.

    Every agent's observation is built by the library from stand-in records of MuJoCo's arrays: one
    whose entries are small distinct markers gives the positions read; ones all +inf and all -inf give
    the bounds. The plan must then give the library's own observation, number for number, from records
    of random values that cross the bounds, and from the env's data as it is now.
    """
    data = env.single_agent_env.unwrapped.data
    sizes = [getattr(data, name).size for name in SOURCES]
    total = sum(sizes)
    unit = 2.0**-24  # markers (i + 1) * unit: exact in float64 and inside every clip the library applies

    def build(values: np.ndarray | float) -> list[np.ndarray]:
        record = _record(data, np.broadcast_to(np.asarray(values, dtype=np.float64), (total,)), sizes)
        return [
            np.asarray(
                build_obs(record, k_dict, env.local_categories, env.mujoco_globals, env.global_categories),
                dtype=np.float64,
            )
            for k_dict in env.k_dicts
        ]

    try:
        read = build((np.arange(total) + 1) * unit)
        upper, lower = build(np.inf), build(-np.inf)
        probes = [np.random.default_rng(seed).normal(0.0, 30.0, total) for seed in range(4)]
        expected = [build(values) for values in probes]
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):  # an item outside SOURCES
        return None
    index = []
    for agent, markers in zip(env.possible_agents, read, strict=True):
        positions = markers / unit - 1
        if markers.shape != env.observation_space(agent).shape or not np.all(
            (positions >= 0) & (positions < total) & (positions == np.round(positions))
        ):
            return None
        index.append(positions.astype(np.int64))
    plan, spans = _compact(index, sizes, lower, upper)
    probes = [np.concatenate([values[span] for span in spans]) for values in probes]
    for values, library in zip(probes, expected, strict=True):
        if not all(
            np.array_equal(ours, theirs) for ours, theirs in zip(plan.observe(values), library, strict=True)
        ):
            return None
    now = np.concatenate([getattr(data, name).ravel() for name in plan.sources])
    library = [env._get_obs_agent(agent_id) for agent_id in range(len(index))]
    if not all(np.array_equal(ours, theirs) for ours, theirs in zip(plan.observe(now), library, strict=True)):
        return None
    return plan


class ObservationPlan:
    """Each agent's observation as `clip(values[index], lower, upper)` of the concatenated `sources`;
    agents whose bounds are all infinite skip the clip."""

    def __init__(
        self,
        sources: tuple[str, ...],
        index: list[np.ndarray],
        lower: list[np.ndarray],
        upper: list[np.ndarray],
    ) -> None:
        self.sources = sources
        self.index = index
        self.bounds = [
            (low, high) if np.isfinite(low).any() or np.isfinite(high).any() else None
            for low, high in zip(lower, upper, strict=True)
        ]

    def observe(self, values: np.ndarray) -> list[np.ndarray]:
        """Every agent's observation from the concatenated source arrays."""
        return [
            values[index] if bounds is None else np.clip(values[index], *bounds)
            for index, bounds in zip(self.index, self.bounds, strict=True)
        ]


def _compact(
    index: list[np.ndarray], sizes: list[int], lower: list[np.ndarray], upper: list[np.ndarray]
) -> tuple[ObservationPlan, list[slice]]:
    """The plan over only the SOURCES some agent reads, positions moved into their concatenation, and
    where those arrays lie in the concatenation of every SOURCES array."""
    starts = np.cumsum([0, *sizes])
    read = set().union(*(np.searchsorted(starts, positions, side="right") - 1 for positions in index))
    used = [i for i in range(len(SOURCES)) if i in read]
    shift = np.zeros(len(SOURCES), dtype=np.int64)
    for i, offset in zip(used, np.cumsum([0, *(sizes[i] for i in used)]), strict=False):
        shift[i] = starts[i] - offset
    moved = [positions - shift[np.searchsorted(starts, positions, side="right") - 1] for positions in index]
    spans = [slice(starts[i], starts[i + 1]) for i in used]
    return ObservationPlan(tuple(SOURCES[i] for i in used), moved, lower, upper), spans


def _record(data: Any, values: np.ndarray, sizes: list[int]) -> types.SimpleNamespace:
    """A stand-in for MuJoCo's data: SOURCES with `data`'s shapes, filled from `values` in order."""
    arrays, start = {}, 0
    for name, size in zip(SOURCES, sizes, strict=True):
        arrays[name] = values[start : start + size].reshape(getattr(data, name).shape)
        start += size
    return types.SimpleNamespace(**arrays)
