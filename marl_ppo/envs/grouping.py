"""A team's layout from one env copy: agents grouped by identical spaces, masks found, inputs sized."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import gymnasium as gym

from marl_ppo.config import ConfigError
from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.layout import (
    InputLayout,
    auto_pool,
    feature_space,
    has_mask_in_obs,
    is_image,
    layout_of,
    pool_image,
)
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.faults import one_line

__all__ = [
    "agent_stem",
    "agents_named",
    "build_team_spec",
    "feature_space",
    "group_members",
    "has_mask_in_obs",
    "is_image",
    "pool_image",
]


def agent_stem(agent: str) -> str:
    """An agent's name without its trailing number (`adversary_0` -> `adversary`, `redmelee_3` ->
    `redmelee`): the side or kind its name puts it on."""
    return re.sub(r"[_\-]?\d+$", "", agent) or agent


def agents_named(names: Sequence[str], agents: Sequence[str]) -> tuple[tuple[str, ...], list[str]]:
    """The agents that `names` name, each name an agent or a stem (`agent_stem`: its agents in agent
    order), in the order named; and the names that match no agent."""
    named: list[str] = []
    unknown: list[str] = []
    for name in names:
        matches = [name] if name in agents else [a for a in agents if agent_stem(a) == name]
        named += matches
        if not matches:
            unknown.append(name)
    return tuple(named), unknown


def _side(agent: str) -> str | None:
    """The side a numbered agent's name puts it on (its stem: `redmelee_3` -> `redmelee`); None for a
    name without a number (`row`, `column`), which says nothing about sides."""
    stem = agent_stem(agent)
    return stem if stem != agent else None


def _group_name(agents: Sequence[str], taken: set[str]) -> str:
    stem = agent_stem(agents[0])
    name, k = stem, 1
    while name in taken:
        name, k = f"{stem}{k}", k + 1
    return name


def _same_spaces(env: Any, first: str, other: str) -> bool:
    same: bool = env.observation_space(first) == env.observation_space(other)
    return same and env.action_space(first) == env.action_space(other)


def group_members(
    env: Any, agents: tuple[str, ...], groups: Mapping[str, Sequence[str]] | None
) -> list[tuple[str, tuple[str, ...]]]:
    """(name, agents) per group: as configured (each member an agent or a stem, `agents_named`), else
    agents with identical spaces whose numbered names have the same stem (`redmelee_0` and
    `bluemelee_0` are two sides whatever their spaces; `row` and `column` carry no number), in agent order."""
    if groups:
        named: list[tuple[str, tuple[str, ...]]] = []
        unknown: list[str] = []
        for name, names in groups.items():
            members, missed = agents_named(names, agents)
            named.append((name, members))
            unknown += missed
        listed = [a for _, members in named for a in members]
        missing = sorted(set(agents) - set(listed))
        if unknown or missing or len(listed) != len(set(listed)):
            raise EnvContractError(
                f"env.groups must list each of {list(agents)} exactly once (unknown: {unknown}, missing: {missing})"
            )
        return named
    buckets: list[list[str]] = []
    for agent in agents:
        bucket = next(
            (b for b in buckets if _side(b[0]) == _side(agent) and _same_spaces(env, b[0], agent)),
            None,
        )
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
    image_pool: int | Literal["auto"] = 1,
    state: str = "auto",
    encoder: str = "mlp",
    sized_obs: bool = False,
) -> TeamSpec:
    """Group the env's agents (by identical spaces, or by the `groups` mapping), find masks, size the state.

    `image_pool` is a factor or `auto` (see `layout.auto_pool`); `encoder` (`model.encoder`) other
    than `mlp` lays out images as frames for a CNN (see `envs/layout.py`). `sized_obs`: the
    observations were resized to the user's size (`env.resize`), so `auto` pools only the state.
    """
    agents = tuple(env.possible_agents)
    if not agents:
        raise EnvContractError(f"env '{env_id}': possible_agents is empty; the env must declare its agents")
    info_masks = _info_mask_agents(env, env_id)
    declared = getattr(env, "state_space", None)
    if state == "env" and not isinstance(declared, gym.spaces.Space):
        raise EnvContractError(
            f"env.state=env but env '{env_id}' declares no state_space; use env.state=auto"
        )
    state_space = declared if state != "concat" and isinstance(declared, gym.spaces.Space) else None
    if image_pool == "auto":
        observed = () if sized_obs else (env.observation_space(a) for a in agents)
        image_pool = auto_pool(observed, state_space)
        obs_pool = 1 if sized_obs else image_pool
    else:
        obs_pool = image_pool
    frames = encoder != "mlp"
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
        layout = _layout(obs_space, obs_pool, frames)
        specs.append(GroupSpec(name, members, obs_space, act_space, layout.size, mask_source, layout))
    if state_space is not None:
        state_layout = _layout(state_space, image_pool, frames)
    else:
        state_layout = InputLayout(())
        for agent in agents:
            state_layout = state_layout.then(_layout(env.observation_space(agent), obs_pool, frames))
    if encoder == "cnn" and not (
        state_layout.has_image or any(g.obs_layout is not None and g.obs_layout.has_image for g in specs)
    ):
        raise ConfigError(
            f"model.encoder=cnn but no observation or state of env '{env_id}' is an image (a Box of rank 3); "
            "use model.encoder=auto or mlp"
        )
    from_env = state_space is not None
    return TeamSpec(env_id, agents, tuple(specs), state_layout.size, from_env, image_pool, state_layout)


def _layout(space: gym.Space, image_pool: int, frames: bool) -> InputLayout:
    try:
        return layout_of(space, pool=image_pool, frames=frames)
    except ValueError as err:
        raise ConfigError(str(err)) from None
