"""From a config to env copies: one adapted copy, its team layout, and the vector env of E copies.

`resolve_vector` also settles `rollout.vector: auto` (in this process or in rollout workers) from the cores
available and a short timing probe of one env step. A run settles both once (`marl_ppo.plan`), on
one probe copy, and hands the layout to the builders here: nothing here builds a probe behind the
caller's back (`probe_layout` is the one explicit way to read a layout without a plan).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.config import ConfigError, ExperimentConfig
from marl_ppo.envs.adapters.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.adapters.check_wrappers import without_check_wrappers
from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.frames import FrameOptions, with_frame_options
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import EnvError, env_spec, make_env, registered_id
from marl_ppo.envs.spec import BatchedLayout, EnvLayout, GroupSpec, TeamArrays, TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.envs.vector.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector.sync import SyncVectorEnv
from marl_ppo.envs.vmas.adapter import VmasVectorEnv
from marl_ppo.fast.screen_copy import one_screen_copy

MAMUJOCO_MODULE = "gymnasium_robotics.envs.multiagent_mujoco"
"""Gymnasium-Robotics' multi-agent MuJoCo package, whose envs `fast.mamujoco_gather` steps."""


def batched_layout(config: ExperimentConfig) -> BatchedLayout | None:
    """The layout of the configured env id where it is a batched simulator (its registration says so;
    nothing is built), else None: its layout is read from a copy (`team_spec`)."""
    name = registered_id(config.env.id)
    if name is None or not env_spec(name).batched:
        return None
    return BatchedLayout(own_threads=env_spec(name).own_threads)


def probe_layout(config: ExperimentConfig) -> EnvLayout:
    """The configured env's layout without a run's plan: one probe copy built, read and closed here
    (none for a batched simulator). For tools and tests; a run reads it once, in its plan."""
    batched = batched_layout(config)
    if batched is not None:
        return batched
    probe = make_team_env(config)
    try:
        return team_spec(config, probe)
    finally:
        probe.close()


def probe_spec(config: ExperimentConfig) -> TeamSpec:
    """`probe_layout` of an env that is not a batched simulator; a clear error for one that is."""
    layout = probe_layout(config)
    if not isinstance(layout, TeamSpec):
        raise EnvError(f"env '{config.env.id}' is a batched simulator: its layout is read once it is built")
    return layout


def make_team_env(config: ExperimentConfig) -> Any:
    """Build one env copy and check it is a PettingZoo env (parallel or AEC)."""
    env = make_env(config.env.id, **config.env.kwargs)
    if isinstance(env, gym.Env):  # a Gymnasium env: single-agent, or a team with Tuple spaces
        env = GymnasiumTeamEnv(env)
    if not hasattr(env, "possible_agents"):
        raise EnvError(
            f"env '{config.env.id}' returned {type(env).__name__}, not a PettingZoo env; return a ParallelEnv "
            "or AEC env (wrap a Gymnasium env in marl_ppo.envs.GymnasiumTeamEnv)"
        )
    return env


def make_adapter(config: ExperimentConfig, spec: TeamSpec) -> ParallelEnvAdapter:
    """One env copy behind the adapter its kind needs (turn by turn for AEC envs)."""
    return adapt(config, spec, make_team_env(config))


def adapt(config: ExperimentConfig, spec: TeamSpec, env: Any) -> ParallelEnvAdapter:
    """`env`, a copy from `make_team_env`, behind the adapter its kind needs (turn by turn for AEC envs)."""
    if is_aec(env):
        return TurnBasedAdapter(env, spec)
    if config.env.skip_check_wrappers:
        env = without_check_wrappers(env)
    if config.fast.screen_copy:
        env = one_screen_copy(env)
    if config.fast.mamujoco_gather and type(env).__module__.startswith(MAMUJOCO_MODULE):
        from marl_ppo.fast.mamujoco_gather import gathered_mamujoco  # imports Gymnasium-Robotics

        env = gathered_mamujoco(env)
    return ParallelEnvAdapter(with_frame_options(env, FrameOptions.of(config.env)), spec)


def build_vector_env(
    config: ExperimentConfig, layout: EnvLayout, device: torch.device | None = None
) -> VectorEnv:
    """E copies of the configured env: one batched simulator, or copies in this process or in workers
    (`rollout.vector: subprocess`; every other mode steps them here). `layout`: the env's, as a plan holds it."""
    if isinstance(layout, BatchedLayout):
        device = device or torch.device("cpu")
        taken = sorted({"num_envs", "device", "seed"} & config.env.kwargs.keys())
        if taken:
            raise EnvError(
                f"env '{config.env.id}' is batched: the run sets its {', '.join(taken)} "
                f"(num_envs, device, seed keys of the config); drop env.kwargs.{taken[0]}"
            )
        make = functools.partial(
            make_env, config.env.id, num_envs=config.rollout.copies, device=str(device), **config.env.kwargs
        )
        env = make(seed=config.seed)
        if isinstance(env, VectorEnv):  # a batched factory that builds its own vector env (JAX)
            return env
        return VmasVectorEnv(env, config.env.id, make_spare=make)
    spec = layout
    make_copy = functools.partial(make_adapter, config, spec)
    if config.rollout.vector == "subprocess":
        return SubprocessVectorEnv(
            make_copy,
            config.rollout.copies,
            config.rollout.num_workers,
            timeout_s=config.rollout.worker_timeout_s,
            spec=spec,
        )
    return SyncVectorEnv(make_copy, config.rollout.copies)


def team_spec(config: ExperimentConfig, env: Any) -> TeamSpec:
    """The team layout (groups, spaces, state) of the configured env, read from `env` (a fresh copy
    from `make_team_env`, reset here and left open for its owner to close)."""
    return build_team_spec(
        with_frame_options(env, FrameOptions.of(config.env)),
        config.env.id,
        config.env.groups,
        image_pool=config.env.image_pool,
        state=config.env.state,
        encoder=config.model.encoder,
        sized_obs=config.env.resize is not None,
    )


AUTO_WORKERS_MIN_STEP_S = 50e-6
"""`rollout.vector: auto` runs env copies in rollout workers when one env step costs at least this long."""

AUTO_SLOW_STEP_S = 2e-3
"""An env step this slow (pistonball's is about 30 ms) keeps a worker busy with a single env copy:
`rollout.vector: auto` then gives each copy its own worker, up to `rollout.num_workers` and the cores."""


def resolve_vector(
    config: ExperimentConfig, *, batched: bool, step_seconds: Callable[[], float]
) -> ExperimentConfig:
    """Replace `rollout.vector: auto` by `sync` or `workers`, from the cores available and the env's step cost
    (and set `rollout.policy_lag` to 0 unless the envs run in rollout workers).

    `batched`: the env is a batched simulator (it runs in this process as one object);
    `step_seconds` times one env step where the choice needs it (a run times its probe copy).

    Workers pay for themselves when there are at least two cores, enough env copies to split
    (two per worker) and an env step that costs more than the per-step bookkeeping (50 us); an env
    whose step costs milliseconds gets a worker per copy even with fewer copies. Toy envs and
    single-core machines run in this process. The choice (and `rollout.num_workers`) is recorded in the run's
    config.yaml, so a rerun from that file takes the same path.
    """
    if batched and config.rollout.vector not in ("auto", "sync"):
        raise ConfigError(
            f"rollout.vector={config.rollout.vector} does not apply to '{config.env.id}': a batched simulator "
            "steps every env copy at once in this process; drop rollout.vector or set rollout.vector=sync"
        )
    if config.rollout.vector != "auto":
        acting = config.rollout.vector in ("workers", "ray")  # rollout workers may collect ahead (policy_lag)
        return config if acting else _with_rollout(config, policy_lag=0)
    cores = usable_cores()
    workers = min(config.rollout.num_workers, cores)
    if batched or cores < 2 or config.rollout.copies < 2:
        return _with_rollout(config, vector="sync", policy_lag=0)
    try:
        seconds = step_seconds()
    except EnvContractError:  # the run meets it too, and reports it where it happens, after its updates
        return _with_rollout(config, vector="sync", policy_lag=0)
    if seconds >= AUTO_WORKERS_MIN_STEP_S and config.rollout.copies >= 2 * workers:
        return _with_rollout(config, vector="workers")
    if seconds >= AUTO_SLOW_STEP_S:
        return _with_rollout(config, vector="workers", num_workers=min(workers, config.rollout.copies))
    return _with_rollout(config, vector="sync", policy_lag=0)


def _with_rollout(config: ExperimentConfig, **changes: Any) -> ExperimentConfig:
    """`config` with the `rollout` keys in `changes` replaced."""
    return dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, **changes))


def usable_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def probe_step_seconds(config: ExperimentConfig, env: Any, spec: TeamSpec, budget_s: float = 0.25) -> float:
    """Typical seconds (25th percentile) of one adapter step of `env` with a fixed legal action: a copy
    from `make_team_env` whose layout is `spec`, stepped here and left for its owner to close."""
    adapter = adapt(config, spec, env)
    arrays = TeamArrays.allocate(spec)
    adapter.reset(config.seed, arrays)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline and len(times) < 200:
        actions = {g.name: _first_allowed(g, arrays.groups[g.name].action_mask) for g in spec.groups}
        started = time.perf_counter()
        over = adapter.step(actions, arrays)
        times.append(time.perf_counter() - started)
        if over:
            adapter.reset(None, arrays)
    return float(np.percentile(times, 25))  # robust to a busy machine: preempted steps are outliers


def _first_allowed(group: GroupSpec, mask: np.ndarray) -> np.ndarray:
    """Per agent of the group, the first action its mask allows (the middle of a Box)."""
    space = group.action_space
    if isinstance(space, gym.spaces.Discrete):
        return mask.argmax(-1) if mask.shape[-1] else np.zeros(group.num_agents, dtype=np.int64)
    if isinstance(space, gym.spaces.MultiDiscrete):
        if not mask.shape[-1]:
            return np.zeros((group.num_agents, *group.action_shape), dtype=np.int64)
        bounds = np.cumsum([0, *space.nvec.reshape(-1)])
        return np.stack([mask[:, a:b].argmax(-1) for a, b in zip(bounds[:-1], bounds[1:], strict=True)], -1)
    middle = (np.clip(space.low, -1e6, 1e6) + np.clip(space.high, -1e6, 1e6)) / 2
    return np.broadcast_to(middle.reshape(-1), (group.num_agents, *group.action_shape)).astype(np.float32)
