"""From a config to the rollout source and the team's networks."""

from __future__ import annotations

import functools

import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import build_vector_env, is_batched, make_adapter, resolve_vector, team_spec
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.memory import make_memory
from marl_ppo.rollout.ray_workers import RayRolloutWorkers
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.rollout.workers import RolloutWorkers


def build_collector(config: ExperimentConfig, device: torch.device) -> tuple[RolloutSource, TeamModel]:
    """The rollout collector and the team's networks: acting here, or in rollout workers (`vector: workers`, or Ray actors: `ray`)."""
    config = resolve_vector(config)
    if config.vector == "ray" and not is_batched(config):
        spec = team_spec(config)
        model = TeamModel(spec, config).to(device)
        return RayRolloutWorkers(config, model, spec), model
    if config.vector == "workers" and not is_batched(config):
        spec = team_spec(config)
        model = TeamModel(spec, config).to(device)
        workers = RolloutWorkers(
            functools.partial(make_adapter, config, spec),
            functools.partial(TeamModel, spec, config),
            model,
            spec=spec,
            num_envs=config.num_envs,
            steps=config.rollout_steps,
            num_workers=min(config.num_workers, config.num_envs),
            policy_lag=config.policy_lag,
            timeout_s=config.worker_timeout_s,
        )
        return workers, model
    venv = build_vector_env(config, device)
    model = TeamModel(venv.spec, config).to(device)
    return Collector(venv, model, device, make_memory(model, config.num_envs, device)), model
