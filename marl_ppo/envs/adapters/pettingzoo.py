"""PettingZoo ParallelEnv adapter: per-agent dicts in, per-group arrays out.

The adapter writes into arrays it is handed (rows of the vector env's preallocated storage),
so no per-step dict-of-dicts is rebuilt beyond what the PettingZoo API itself forces.
Conventions (docs/design.md): agent order is `possible_agents`; absent agents keep their slot with
`alive = False` and zero observations; terminated and truncated stay separate; `final_obs` and
`final_state` hold what the step returned, before any reset, for the truncation bootstrap.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.envs.adapters.contract import (
    REJOIN_KEY,
    ContractChecks,
    EnvContractError,
    box_mismatch,
    describe,
)
from marl_ppo.envs.layout import InputLayout, InputPart, flatten_value, has_mask_in_obs
from marl_ppo.envs.spec import GroupSpec, TeamArrays, TeamSpec


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
        self._left_at: dict[str, int] = {}
        self._to_env = {group.name: action_converter(group.action_space) for group in spec.groups}
        """Per group: one agent's action row -> the env's action (`_to_env_action`)."""
        self._vector_box = {group.name: _vector_box(group) for group in spec.groups}
        """Per group: its observation space where an observation is a plain vector Box (stored as it is,
        flattened), read by `_flatten` without the layout's general path; else None."""

    def reset(self, seed: int | None, out: TeamArrays[np.ndarray]) -> None:
        """Reset the env and write the first observations, alive flags, masks and state into `out`."""
        self.ended_at, self.step_count = self.step_count, 0
        self._done_at.clear()
        self._left_at.clear()
        result = self._call("reset", self.env.reset, seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise self._error(None, f"reset returned {describe(result)}; expected (observations, infos)")
        observations, infos = result
        if not self.env.agents:
            raise self._error(None, "reset returned no agents; at least one must be live")
        for arrays in out.groups.values():
            arrays.obs.fill(0.0)
            arrays.alive.fill(False)
            arrays.action_mask.fill(True)
        for agent in self.env.agents:
            group, i = self._slot(agent)
            if agent not in observations:
                raise self._error(agent, "reset gave no observation for this live agent")
            arrays = out.groups[group.name]
            arrays.obs[i] = self._flatten(agent, observations[agent])
            arrays.alive[i] = True
            self._write_mask(agent, observations[agent], infos, arrays.action_mask[i])
        self._write_state(out.state, out, "obs")

    def step(self, actions: Mapping[str, np.ndarray], out: TeamArrays[np.ndarray]) -> bool:
        """Send the live agents' actions (per group name, `(A_g, ...)`); write rewards, flags, next obs
        and masks. True when the episode is over."""
        action_dict = {}
        to_env = self._to_env
        for agent in self.env.agents:
            group, i = self._slot(agent)
            action_dict[agent] = to_env[group.name](actions[group.name][i])
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
        ended: set[str] = set()  # the agents this step terminated or truncated
        truncated_any = False
        for agent in action_dict:
            group, i = self._slots[agent]
            arrays = out.groups[group.name]
            self._write_reward(agent, rewards, arrays.reward, i)
            terminated = bool(terminations.get(agent, False))
            truncated = bool(truncations.get(agent, False)) and not terminated
            arrays.terminated[i], arrays.truncated[i] = terminated, truncated
            if terminated or truncated:
                ended.add(agent)
                truncated_any = truncated_any or truncated
                if not self._rejoin:
                    self._done_at.setdefault(agent, self.step_count)
        for agent, observation in observations.items():  # includes agents that join this step
            group, i = self._slot(agent)
            out.groups[group.name].final_obs[i] = self._flatten(agent, observation)
        live = set(self.env.agents)
        if self._done_at:
            self._check_no_rejoin(live)
        silent = [a for a in action_dict if a not in live and a not in ended]
        over = True
        for group in self.spec.groups:
            arrays = out.groups[group.name]
            np.copyto(arrays.obs, arrays.final_obs)  # the next observations: zero where not alive
            for i, agent in enumerate(group.agents):
                still = agent in live and agent not in ended
                arrays.alive[i] = still
                if not still:
                    arrays.obs[i] = 0.0
                    continue
                over = False
                if agent not in observations:
                    raise self._error(agent, "step gave no observation for this live agent")
                if group.mask_source is not None:
                    self._write_mask(agent, observations.get(agent), infos, arrays.action_mask[i])
        if silent or self._left_at:
            self._check_leavers(silent, live, over)
        if over and self.spec.state_from_env and not truncated_any:
            # ended by termination: no bootstrap reads the final state, and an env may have freed what
            # state() reads (multiwalker destroys a fallen walker's body), so state() is not called
            out.final_state.fill(0.0)
            out.state.fill(0.0)
            return over
        self._write_state(out.final_state, out, "final_obs")
        if self.spec.state_from_env:
            out.state[...] = out.final_state
        else:
            self._write_state(out.state, out, "obs")
        return over

    def _flagged(self, agent: str, out: TeamArrays[np.ndarray]) -> bool:
        """Whether this step terminated or truncated `agent`."""
        group, i = self._slots[agent]
        arrays = out.groups[group.name]
        return bool(arrays.terminated[i] or arrays.truncated[i])

    def _clear_step(self, out: TeamArrays[np.ndarray]) -> None:
        """Reset what a step reports (rewards, flags, final obs, masks) before the step writes it."""
        for arrays in out.groups.values():
            arrays.reward.fill(0.0)
            arrays.terminated.fill(False)
            arrays.truncated.fill(False)
            arrays.final_obs.fill(0.0)
            arrays.action_mask.fill(True)

    def close(self) -> None:
        """Close the underlying env."""
        self.env.close()

    def _slot(self, agent: str) -> tuple[GroupSpec, int]:
        try:
            return self._slots[agent]
        except (KeyError, TypeError):
            raise self._error(agent, f"agent is not in possible_agents {list(self.spec.agents)}") from None

    def _flatten(self, agent: str, observation: Any) -> np.ndarray:
        group = self._slots[agent][0]
        box = self._vector_box[group.name]
        if box is not None and isinstance(observation, np.ndarray):  # the common case, checked as below
            problem = box_mismatch(observation, box)
            if problem is not None:
                raise self._error(agent, problem)
            return observation.astype(np.float32, copy=False).reshape(-1)
        space = group.observation_space
        try:
            if has_mask_in_obs(space):
                space, observation = space["observation"], observation["observation"]
            if isinstance(space, gym.spaces.Box):
                observation = np.asarray(observation)
                problem = box_mismatch(observation, space)
                if problem is not None:
                    raise self._error(agent, problem)
            return flatten_value(group.obs_layout or _one_vector(group.obs_dim), space, observation)
        except EnvContractError:
            raise
        except Exception:
            raise self._error(agent, f"observation {describe(observation)} does not fit {space}") from None

    def _write_mask(
        self, agent: str, observation: Any, infos: Mapping[str, Any] | None, target: np.ndarray
    ) -> None:
        source = self._slots[agent][0].mask_source
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

    def _to_env_action(self, group: GroupSpec, action: np.ndarray) -> Any:
        """One agent's action row as the env takes it: a Discrete index shifted by the space's start, a
        MultiDiscrete vector likewise, a Box action clipped to the space's bounds in its dtype."""
        return self._to_env[group.name](action)

    def _write_state(self, target: np.ndarray, out: TeamArrays[np.ndarray], obs_field: str) -> None:
        """The env's `state()` into `target`, or the groups' `obs_field` arrays concatenated."""
        if self.spec.state_from_env:
            state = np.asarray(self._call("state", self.env.state))
            layout = self.spec.state_layout
            if layout is not None and state.ndim == 3 and (self.spec.image_pool > 1 or layout.has_image):
                state = flatten_value(layout, self.env.state_space, state)  # pooled, or kept as frames
            if state.size != target.size:
                raise self._error(None, f"state() returned {state.size} values; expected {target.size}")
            target[...] = state.reshape(-1)
            return
        position = 0
        for group in self.spec.groups:
            size = group.num_agents * group.obs_dim
            target[position : position + size] = getattr(out.groups[group.name], obs_field).reshape(-1)
            position += size


def action_converter(space: gym.Space) -> Callable[[np.ndarray], Any]:
    """`_to_env_action` for one action space, its constants read once (a partial: adapters pickle)."""
    if isinstance(space, gym.spaces.Discrete):
        return functools.partial(_discrete_action, int(space.start))
    if isinstance(space, gym.spaces.MultiDiscrete):
        return functools.partial(_multi_discrete_action, space)
    if not isinstance(space, gym.spaces.Box):
        raise TypeError(f"unsupported action space {space!r}; use Discrete, MultiDiscrete or Box")
    return functools.partial(_box_action, space.shape, space.low, space.high, space.dtype)


def _discrete_action(start: int, action: np.ndarray) -> int:
    return int(action) + start


def _multi_discrete_action(space: gym.spaces.MultiDiscrete, action: np.ndarray) -> Any:
    return np.asarray(action, dtype=space.dtype).reshape(space.shape) + space.start


def _box_action(
    shape: tuple[int, ...], low: np.ndarray, high: np.ndarray, dtype: Any, action: np.ndarray
) -> Any:
    # np.clip's arithmetic (the larger of the action and the low bound, then the smaller of that and
    # the high one) without its dispatch, which costs more than the clip on a few numbers
    return np.minimum(np.maximum(action.reshape(shape), low), high).astype(dtype, copy=False)


def _vector_box(group: GroupSpec) -> gym.spaces.Box | None:
    """The group's observation space where `_flatten`'s general path would store an observation as
    the Box's values flattened to float32 (one vector part, no image, no pooling, no mask), else None."""
    space = group.observation_space
    if has_mask_in_obs(space) or not isinstance(space, gym.spaces.Box):
        return None
    layout = group.obs_layout or _one_vector(group.obs_dim)
    if len(layout.parts) != 1:
        return None
    part = layout.parts[0]
    return space if part.key is None and not part.is_image and part.pool == 1 else None


def _one_vector(size: int) -> InputLayout:
    """The layout of a spec built without one (a flat float vector)."""
    return InputLayout((InputPart(0, size),))
