"""From a run's plan (`marl_ppo.plan`) to the rollout source and the team's networks."""

from __future__ import annotations

import dataclasses
import functools

import torch

from marl_ppo.config import ConfigError
from marl_ppo.envs.factory import build_vector_env, make_adapter
from marl_ppo.envs.jax.vector import JaxVectorEnv
from marl_ppo.envs.spec import BatchedLayout, TeamSpec
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.compiled import CompiledSource
from marl_ppo.rollout.jax_policy import unsupported_reason
from marl_ppo.rollout.ray_workers import RayRolloutWorkers
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.rollout.workers import RolloutWorkers


def settle_rollout(plan: RunPlan) -> RunPlan:
    """`plan` with `rollout.compiled` settled to true or false, and for a JaxMARL env the start line's
    word on its rollouts (`RunPlan.rollout_path`). Compiled where the env is a JaxMARL vector env, no
    league snapshots act beside the learner and the model has a JAX forward (`unsupported_reason`,
    read from the networks built on the meta device for a probe of the env); `true` where the
    run cannot be compiled is a ConfigError with the reason."""
    config = plan.config
    wanted = config.rollout.compiled
    if wanted is not True and wanted is not False:
        wanted = "auto"
    jax_env = isinstance(plan.layout, BatchedLayout) and plan.layout.own_threads
    reason = _per_step_reason(plan) if jax_env else f"env '{config.env.id}' is not a JaxMARL env"
    if reason is not None and wanted is True:
        raise ConfigError(f"rollout.compiled=true: {reason}; set rollout.compiled: auto or false")
    compiled = reason is None
    path = (
        f"compiled (lax.scan over {config.rollout.rollout_steps} steps)"
        if compiled
        else f"per-step ({reason})"
    )
    rollout = dataclasses.replace(config.rollout, compiled=compiled)
    return dataclasses.replace(
        plan, config=dataclasses.replace(config, rollout=rollout), rollout_path=path if jax_env else None
    )


def _per_step_reason(plan: RunPlan) -> str | None:
    """Why a JaxMARL env's rollouts step per step (one line), or None where they can be compiled."""
    config = plan.config
    if config.rollout.compiled is False:
        return "rollout.compiled=false"
    if config.league.opponents not in (None, "latest"):
        return f"league.opponents={config.league.opponents} acts snapshots beside the learner at every step"
    probe = build_vector_env(config, plan.layout)  # built, not reset: nothing is compiled or stepped
    try:
        if not isinstance(probe, JaxVectorEnv):
            return f"env '{config.env.id}' is not a JaxMARL vector env"
        with torch.device("meta"):  # the networks' structure only: no weights initialised
            model = TeamModel(probe.spec, config)
    finally:
        probe.close()
    return unsupported_reason(model)


def build_collector(plan: RunPlan) -> tuple[RolloutSource, TeamModel]:
    """The rollout source and the team's networks: acting here (per step, or in compiled rollouts for
    a JaxMARL env, `settle_rollout`), or in rollout workers (`rollout.vector: workers`, or Ray actors: `ray`)."""
    if plan.config.rollout.compiled == "auto":
        plan = settle_rollout(plan)
    config, device, layout = plan.config, plan.device, plan.layout
    if not isinstance(layout, TeamSpec) or config.rollout.vector not in ("workers", "ray"):
        venv = build_vector_env(config, layout, device)
        model = TeamModel(venv.spec, config).to(device)
        if config.rollout.compiled is True:
            assert isinstance(venv, JaxVectorEnv)  # as settle_rollout found
            steps = config.rollout.rollout_steps
            return CompiledSource(venv, model, device, steps=steps, seed=config.seed), model
        return Collector(venv, model, device), model
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
