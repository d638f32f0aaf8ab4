"""From a run's plan (`marl_ppo.plan`) to the rollout source and the team's networks."""

from __future__ import annotations

import functools

from marl_ppo.envs.factory import build_vector_env, make_adapter
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.rollout.ray_workers import RayRolloutWorkers
from marl_ppo.rollout.shaping import reward_shaping
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.rollout.workers import RolloutWorkers


def build_collector(plan: RunPlan) -> tuple[RolloutSource, TeamModel]:
    """The rollout source and the team's networks: acting here (per step, or in compiled rollouts of a
    JaxMARL env where the plan settled `rollout.compiled` true), or in rollout workers
    (`rollout.vector: workers`, or Ray actors: `ray`)."""
    config, device, layout = plan.config, plan.device, plan.layout
    if not isinstance(layout, TeamSpec) or config.rollout.vector not in ("workers", "ray"):
        venv = build_vector_env(config, layout, device)
        model = TeamModel(venv.spec, config).to(device)
        source: CompiledSource | Collector
        if config.rollout.compiled is True:
            assert isinstance(venv, JaxVectorEnv)  # as the plan found it
            steps = config.rollout.rollout_steps
            source = CompiledSource(venv, model, device, steps=steps, seed=config.seed)
        else:
            source = Collector(venv, model, device)
        source.shaping = reward_shaping(config)  # the plan refused it for an env without a shaped reward
        return source, model
    model = TeamModel(layout, config).to(device)
    if config.rollout.vector == "ray":
        return RayRolloutWorkers(config, model, layout), model
    workers = RolloutWorkers(
        functools.partial(make_adapter, config, layout),
        functools.partial(TeamModel, layout, config),
        model,
        spec=layout,
        num_envs=config.rollout.copies,
        steps=config.rollout.rollout_steps,
        num_workers=min(config.rollout.num_workers, config.rollout.copies),
        policy_lag=config.rollout.policy_lag,
        timeout_s=config.rollout.worker_timeout_s,
    )
    return workers, model
