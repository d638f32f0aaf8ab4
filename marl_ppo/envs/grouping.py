"""A team's layout from one env copy: agents grouped by identical spaces, masks found, inputs sized."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.faults import one_line


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
