"""PettingZoo ParallelEnv adapter: per-agent dicts in, per-group arrays out.

The adapter writes into arrays it is handed (rows of the vector env's preallocated storage),
so no per-step dict-of-dicts is rebuilt beyond what the PettingZoo API itself forces.
Conventions (../DESIGN.md): agent order is `possible_agents`; absent agents keep their slot with
`alive = False` and zero observations; terminated and truncated stay separate; `final_obs` and
`final_state` hold what the step returned, before any reset, for the truncation bootstrap.
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from pettingzoo.utils.conversions import aec_to_parallel_wrapper

from marl_ppo.envs.contract import REJOIN_KEY, ContractChecks, EnvContractError, box_mismatch, describe
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.faults import one_line


def without_check_wrappers(env: Any) -> Any:
    """`env` without PettingZoo's order and action-bounds assertion wrappers around its AEC core, and
    stepped without the observations the parallel wrapper computes only to discard.

    Catalog envs are usually `aec_to_parallel(OrderEnforcingWrapper(AssertOutOfBoundsWrapper(raw)))`.
    Those two wrappers only assert (reset before step, Discrete actions in range) and forward every
    attribute access through Python `__getattr__`, which costs about a third of simple_spread's step
    time. The adapter already guarantees both, so it steps the same core without them. Wrappers that
    change behaviour (e.g. clipping) and any other env are kept as is.

    The parallel wrapper's `step` also calls `last()` before each agent's move, which computes that
    agent's observation and throws it away (3 of simple_spread's 6 observations per step, one per
    piston in pistonball). `LeanCycleParallel` steps the cycle without it. Both changes leave every
    trajectory identical, provided `observe()` only reads the env, as PettingZoo's API describes it
    (tested for every catalog env that steps through the wrapper).
    """
    from pettingzoo.utils.env import AECEnv
    from pettingzoo.utils.wrappers import AssertOutOfBoundsWrapper, OrderEnforcingWrapper

    if type(env) is not aec_to_parallel_wrapper:
        return env
    core = env.aec_env
    while isinstance(core, (OrderEnforcingWrapper, AssertOutOfBoundsWrapper)):
        core = core.env
    env.aec_env = core  # in place: whatever else the factory set on the env object stays
    # a core with its own last() keeps the wrapper's step
    if getattr(type(core), "last", None) is AECEnv.last:
        env.__class__ = LeanCycleParallel
    return env


class LeanCycleParallel(aec_to_parallel_wrapper):
    """PettingZoo's AEC-to-parallel wrapper whose `step` skips the discarded `last()` observations.

    Otherwise the same cycle, step for step: each live agent moves in turn, rewards are summed
    over the cycle's moves, the observations are read after the cycle, and agents that ended are
    then stepped out with `None`.
    """

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        aec = self.aec_env
        rewards: dict[str, float] = defaultdict(int)
        for agent in aec.agents:
            if agent != aec.agent_selection:
                raise AssertionError(
                    f"expected agent {agent} got agent {aec.agent_selection}; the parallel wrapper "
                    "expects agents to step in a cycle and to end only at the end of one"
                )
            aec.step(actions[agent])
            for other in aec.agents:
                rewards[other] += aec.rewards[other]
        terminations = dict(aec.terminations)
        truncations = dict(aec.truncations)
        infos = dict(aec.infos)
        observations = {agent: aec.observe(agent) for agent in aec.agents}
        while aec.agents and (aec.terminations[aec.agent_selection] or aec.truncations[aec.agent_selection]):
            aec.step(None)
        self.agents = aec.agents
        return observations, rewards, terminations, truncations, infos


@dataclass
class TeamArrays:
    """Per-group arrays for one env (shapes `(A_g, ...)`) or E envs (`(E, A_g, ...)`), plus the state."""

    obs: list[np.ndarray]
    alive: list[np.ndarray]
    action_mask: list[np.ndarray]
    """Allowed actions for the next step, `(..., A_g, mask_dim)`; all True where the env gives no mask."""
    reward: list[np.ndarray]
    terminated: list[np.ndarray]
    truncated: list[np.ndarray]
    final_obs: list[np.ndarray]
    state: np.ndarray
    final_state: np.ndarray

    @classmethod
    def allocate(cls, spec: TeamSpec, lead: tuple[int, ...] = ()) -> TeamArrays:
        """Zero arrays (masks all True) for `spec` with leading dims `lead`."""

        def per_group(tail: Callable[[GroupSpec], tuple[int, ...]], dtype: Any) -> list[np.ndarray]:
            return [np.zeros(lead + (g.num_agents,) + tail(g), dtype=dtype) for g in spec.groups]

        return cls(
            obs=per_group(lambda g: (g.obs_dim,), np.float32),
            alive=per_group(lambda g: (), bool),
            action_mask=[np.ones(lead + (g.num_agents, g.mask_dim), bool) for g in spec.groups],
            reward=per_group(lambda g: (), np.float32),
            terminated=per_group(lambda g: (), bool),
            truncated=per_group(lambda g: (), bool),
            final_obs=per_group(lambda g: (g.obs_dim,), np.float32),
            state=np.zeros(lead + (spec.state_dim,), np.float32),
            final_state=np.zeros(lead + (spec.state_dim,), np.float32),
        )

    def row(self, index: int | slice) -> TeamArrays:
        """Views of env `index`, or of a slice of envs (for arrays allocated with one leading env dim)."""
        views: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            views[field.name] = [a[index] for a in value] if isinstance(value, list) else value[index]
        return TeamArrays(**views)


def has_mask_in_obs(space: gym.Space) -> bool:
    """True for PettingZoo's masked observations: a Dict with `observation` and `action_mask` keys."""
    return isinstance(space, gym.spaces.Dict) and {"observation", "action_mask"} <= set(space.spaces)


def feature_space(space: gym.Space) -> gym.Space:
    """The part of an observation space the networks see (a masked Dict's `observation`)."""
    return space["observation"] if has_mask_in_obs(space) else space


def is_image(space: gym.Space) -> bool:
    """A Box shaped (height, width, channels), the layout PettingZoo's pixel observations use."""
    return isinstance(space, gym.spaces.Box) and len(space.shape) == 3


def pool_image(image: np.ndarray, factor: int) -> np.ndarray:
    """Average-pool an (H, W, C) image over factor x factor blocks (edges cropped); uint8 scaled to [0, 1]."""
    height, width, channels = image.shape
    h, w = height // factor, width // factor
    blocks = np.asarray(image[: h * factor, : w * factor], dtype=np.float32).reshape(
        h, factor, w, factor, channels
    )
    pooled = blocks.mean(axis=(1, 3))
    return pooled / 255.0 if image.dtype == np.uint8 else pooled


def _flat_dim(space: gym.Space, image_pool: int = 1) -> int:
    space = feature_space(space)
    if is_image(space) and image_pool > 1:
        height, width, channels = space.shape
        return (height // image_pool) * (width // image_pool) * channels
    if isinstance(space, gym.spaces.Box):
        return int(np.prod(space.shape))
    return int(gym.spaces.flatdim(space))


def _group_name(agents: Sequence[str], taken: set[str]) -> str:
    stem = re.sub(r"[_\-]?\d+$", "", agents[0]) or "group"
    name, k = stem, 1
    while name in taken:
        name, k = f"{stem}{k}", k + 1
    return name


def _same_spaces(env: Any, first: str, other: str) -> bool:
    return env.observation_space(first) == env.observation_space(other) and env.action_space(
        first
    ) == env.action_space(other)


def group_members(
    env: Any, agents: tuple[str, ...], groups: Mapping[str, Sequence[str]] | None
) -> list[tuple[str, tuple[str, ...]]]:
    """(name, agents) per group: as configured, else agents with identical spaces in agent order."""
    if groups:
        named = [(name, tuple(members)) for name, members in groups.items()]
        listed = [a for _, members in named for a in members]
        missing = sorted(set(agents) - set(listed))
        unknown = sorted(set(listed) - set(agents))
        if unknown or missing or len(listed) != len(set(listed)):
            raise EnvContractError(
                f"env.groups must list each of {list(agents)} exactly once (unknown: {unknown}, missing: {missing})"
            )
        return named
    buckets: list[list[str]] = []
    for agent in agents:
        bucket = next((b for b in buckets if _same_spaces(env, b[0], agent)), None)
        if bucket is None:
            buckets.append([agent])
        else:
            bucket.append(agent)
    taken: set[str] = set()
    named = []
    for bucket in buckets:
        name = _group_name(bucket, taken)
        taken.add(name)
        named.append((name, tuple(bucket)))
    return named


def _info_mask_agents(env: Any, env_id: str) -> set[str]:
    """Agents whose reset infos carry an `action_mask` (the probe env is reset once to look)."""
    try:
        result = env.reset(seed=0)
    except Exception as err:
        raise EnvContractError(
            f"env '{env_id}': reset(seed=0) raised {type(err).__name__}: {one_line(err)} (--debug shows the env's traceback)"
        ) from err
    infos = result[1] if isinstance(result, tuple) else getattr(env, "infos", {})  # AEC reset returns None
    return {
        agent for agent, info in (infos or {}).items() if isinstance(info, dict) and "action_mask" in info
    }


def build_team_spec(
    env: Any,
    env_id: str,
    groups: Mapping[str, Sequence[str]] | None = None,
    *,
    image_pool: int = 1,
    state: str = "auto",
) -> TeamSpec:
    """Group the env's agents (by identical spaces, or by the `groups` mapping), find masks, size the state."""
    agents = tuple(env.possible_agents)
    if not agents:
        raise EnvContractError(f"env '{env_id}': possible_agents is empty; the env must declare its agents")
    info_masks = _info_mask_agents(env, env_id)
    specs = []
    for name, members in group_members(env, agents, groups):
        obs_space, act_space = env.observation_space(members[0]), env.action_space(members[0])
        for agent in members[1:]:
            if not _same_spaces(env, members[0], agent):
                raise EnvContractError(
                    f"env.groups: agent '{agent}' has different spaces from '{members[0]}' in group '{name}'"
                )
        if not isinstance(act_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete | gym.spaces.Box):
            raise EnvContractError(
                f"env '{env_id}': agent '{members[0]}' has action space {act_space}; "
                "supported are Discrete, MultiDiscrete and Box"
            )
        if has_mask_in_obs(obs_space):
            mask_source = "obs"
        elif info_masks & set(members):
            mask_source = "info"
        else:
            mask_source = None
        obs_dim = _flat_dim(obs_space, image_pool)
        specs.append(GroupSpec(name, members, obs_space, act_space, obs_dim, mask_source))
    state_space = getattr(env, "state_space", None)
    if state == "env" and not isinstance(state_space, gym.spaces.Space):
        raise EnvContractError(
            f"env.state=env but env '{env_id}' declares no state_space; use env.state=auto"
        )
    if state != "concat" and isinstance(state_space, gym.spaces.Space):
        state_dim, from_env = _flat_dim(state_space, image_pool), True
    else:
        state_dim, from_env = sum(_flat_dim(env.observation_space(a), image_pool) for a in agents), False
    return TeamSpec(env_id, agents, tuple(specs), state_dim, from_env, image_pool)


class ParallelEnvAdapter(ContractChecks):
    """Steps one PettingZoo ParallelEnv, reading actions from and writing results into group arrays."""

    def __init__(self, env: Any, spec: TeamSpec) -> None:
        self.env = env
        self.spec = spec
        self._slots = {agent: spec.group_of(agent) for agent in spec.agents}
        self.step_count = 0
        """Steps of the current episode (0 after reset); named in contract errors."""
        self.ended_at = 0
        self.copy_index = 0
        """Which env copy this adapter steps (the vector env sets it); named in contract errors."""
        self._rejoin = bool((getattr(env, "metadata", None) or {}).get(REJOIN_KEY, False))
        self._done_at: dict[str, int] = {}

    def reset(self, seed: int | None, out: TeamArrays) -> None:
        """Reset the env and write the first observations, alive flags, masks and state into `out`."""
        self.ended_at, self.step_count = self.step_count, 0
        self._done_at.clear()
        result = self._call("reset", self.env.reset, seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise self._error(None, f"reset returned {describe(result)}; expected (observations, infos)")
        observations, infos = result
        if not self.env.agents:
            raise self._error(None, "reset returned no agents; at least one must be live")
        for g in range(len(self.spec.groups)):
            out.obs[g].fill(0.0)
            out.alive[g].fill(False)
            out.action_mask[g].fill(True)
        for agent in self.env.agents:
            g, i = self._slot(agent)
            if agent not in observations:
                raise self._error(agent, "reset gave no observation for this live agent")
            out.obs[g][i] = self._flatten(agent, observations[agent])
            out.alive[g][i] = True
            self._write_mask(agent, observations[agent], infos, out.action_mask[g][i])
        self._write_state(out.state, out.obs)

    def step(self, actions: Sequence[np.ndarray], out: TeamArrays) -> bool:
        """Send the live agents' actions; write rewards, flags, next obs and masks. True when the episode is over."""
        action_dict = {}
        for agent in self.env.agents:
            g, i = self._slot(agent)
            action_dict[agent] = self._to_env_action(g, actions[g][i])
        self.step_count += 1
        result = self._call("step", self.env.step, action_dict)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise self._error(
                None,
                f"step returned {describe(result)}; expected (observations, rewards, terminations, "
                "truncations, infos)",
            )
        observations, rewards, terminations, truncations, infos = result
        self._clear_step(out)
        for agent in action_dict:
            g, i = self._slots[agent]
            self._write_reward(agent, rewards, out.reward[g], i)
            out.terminated[g][i] = bool(terminations.get(agent, False))
            out.truncated[g][i] = bool(truncations.get(agent, False)) and not out.terminated[g][i]
            if not self._rejoin and (out.terminated[g][i] or out.truncated[g][i]):
                self._done_at.setdefault(agent, self.step_count)
        for agent, observation in observations.items():  # includes agents that join this step
            g, i = self._slot(agent)
            out.final_obs[g][i] = self._flatten(agent, observation)
        live = set(self.env.agents)
        if self._done_at:
            self._check_no_rejoin(live)
        for g, group in enumerate(self.spec.groups):
            for i, agent in enumerate(group.agents):
                still = agent in live and not (out.terminated[g][i] or out.truncated[g][i])
                if still and agent not in observations:
                    raise self._error(agent, "step gave no observation for this live agent")
                out.alive[g][i] = still
                out.obs[g][i] = out.final_obs[g][i] if still else 0.0
                if still and group.mask_source is not None:
                    self._write_mask(agent, observations.get(agent), infos, out.action_mask[g][i])
        self._write_state(out.final_state, out.final_obs)
        if self.spec.state_from_env:
            out.state[...] = out.final_state
        else:
            self._write_state(out.state, out.obs)
        return not any(out.alive[g].any() for g in range(len(self.spec.groups)))

    def _clear_step(self, out: TeamArrays) -> None:
        """Reset what a step reports (rewards, flags, final obs, masks) before the step writes it."""
        for g in range(len(self.spec.groups)):
            out.reward[g].fill(0.0)
            out.terminated[g].fill(False)
            out.truncated[g].fill(False)
            out.final_obs[g].fill(0.0)
            out.action_mask[g].fill(True)

    def close(self) -> None:
        """Close the underlying env."""
        self.env.close()

    def _slot(self, agent: str) -> tuple[int, int]:
        try:
            return self._slots[agent]
        except (KeyError, TypeError):
            raise self._error(agent, f"agent is not in possible_agents {list(self.spec.agents)}") from None

    def _flatten(self, agent: str, observation: Any) -> np.ndarray:
        g, _ = self._slots[agent]
        space = self.spec.groups[g].observation_space
        try:
            if has_mask_in_obs(space):
                space, observation = space["observation"], observation["observation"]
            if isinstance(space, gym.spaces.Box):
                array = np.asarray(observation)
                problem = box_mismatch(array, space)
                if problem is not None:
                    raise self._error(agent, problem)
                if is_image(space) and self.spec.image_pool > 1:
                    return pool_image(array, self.spec.image_pool).reshape(-1)
                return array.astype(np.float32, copy=False).reshape(-1)
            return np.asarray(gym.spaces.flatten(space, observation), dtype=np.float32)
        except EnvContractError:
            raise
        except Exception:
            raise self._error(agent, f"observation {describe(observation)} does not fit {space}") from None

    def _write_mask(
        self, agent: str, observation: Any, infos: Mapping[str, Any] | None, target: np.ndarray
    ) -> None:
        g, _ = self._slots[agent]
        source = self.spec.groups[g].mask_source
        if source is None:
            return
        raw = (
            observation["action_mask"] if source == "obs" else (infos or {}).get(agent, {}).get("action_mask")
        )
        if raw is None:
            raise self._error(
                agent,
                f"no action_mask in its {'observation' if source == 'obs' else 'infos'}, though it had one at reset",
            )
        parts = raw if isinstance(raw, tuple | list) and len(raw) and np.ndim(raw[0]) == 1 else [raw]
        target[...] = np.concatenate([np.asarray(p).reshape(-1) for p in parts]).astype(bool)

    def _to_env_action(self, g: int, action: np.ndarray) -> Any:
        space = self.spec.groups[g].action_space
        if isinstance(space, gym.spaces.Discrete):
            return int(action) + int(space.start)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return np.asarray(action, dtype=space.dtype).reshape(space.shape) + space.start
        return np.clip(action.reshape(space.shape), space.low, space.high).astype(space.dtype, copy=False)

    def _write_state(self, target: np.ndarray, obs: list[np.ndarray]) -> None:
        if self.spec.state_from_env:
            state = np.asarray(self._call("state", self.env.state))
            if state.ndim == 3 and self.spec.image_pool > 1:
                state = pool_image(state, self.spec.image_pool)
            if state.size != target.size:
                raise self._error(None, f"state() returned {state.size} values; expected {target.size}")
            target[...] = state.reshape(-1)
            return
        position = 0
        for g, group in enumerate(self.spec.groups):
            size = group.num_agents * group.obs_dim
            target[position : position + size] = obs[g].reshape(-1)
            position += size
