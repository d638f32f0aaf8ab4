"""From a settled config (a run's plan, `run.plan`) to the rollout source and the team's networks."""

from __future__ import annotations

import functools

import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import build_vector_env, is_batched, make_adapter, team_spec
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.ray_workers import RayRolloutWorkers
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.rollout.workers import RolloutWorkers


def build_collector(
    config: ExperimentConfig, device: torch.device, spec: TeamSpec | None = None
) -> tuple[RolloutSource, TeamModel]:
    """The rollout collector and the team's networks: acting here, or in rollout workers (`rollout.vector: workers`,
    or Ray actors: `ray`). `config` is settled (a `RunPlan`'s); `spec` is the plan's team layout (None
    reads it from one probe copy built here)."""
    if config.rollout.vector == "auto":
        raise ValueError(
            "build_collector needs a settled config (rollout.vector=auto); build it from plan_run(config)"
        )
    if is_batched(config) or config.rollout.vector not in ("workers", "ray"):
        venv = build_vector_env(config, device, spec=spec)
        model = TeamModel(venv.spec, config).to(device)
        return Collector(venv, model, device), model
    if spec is None:
        spec = team_spec(config)
    model = TeamModel(spec, config).to(device)
    if config.rollout.vector == "ray":
        return RayRolloutWorkers(config, model, spec), model
    workers = RolloutWorkers(
        functools.partial(make_adapter, config, spec),
        functools.partial(TeamModel, spec, config),
        model,
        spec=spec,
        num_envs=config.rollout.num_envs,
        steps=config.rollout.rollout_steps,
        num_workers=min(config.rollout.num_workers, config.rollout.num_envs),
        policy_lag=config.rollout.policy_lag,
        timeout_s=config.rollout.worker_timeout_s,
    )
    return workers, model
