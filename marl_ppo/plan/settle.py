"""The run settled once: every `auto` of a config resolved on this machine (and the env copies it
leaves to the env), and the env's layout read from one probe env copy, in a frozen record that the builders, the trainer, evaluation and the memory
check take.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal, cast

import torch

from marl_ppo.config import ConfigError, ExperimentConfig, SettledPPO
from marl_ppo.envs.factory import (
    batched_layout,
    make_team_env,
    probe_layout,
    probe_step_seconds,
    resolve_vector,
    team_spec,
)
from marl_ppo.envs.jax.catalog import reports_shaped_reward
from marl_ppo.envs.registry import anchored
from marl_ppo.envs.spec import BatchedLayout, EnvLayout, TeamSpec
from marl_ppo.models.layers import resolve_device, resolve_precision
from marl_ppo.plan.compiled import settle_compiled, settle_learner
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.host import convolutional, learner_threads, update_threads


@dataclass(frozen=True)
class RunPlan:
    """What a run (or an evaluation) is built from, settled once before its first step (`plan_run`,
    `plan_eval`)."""

    config: ExperimentConfig
    """The config the run trains, and records in config.yaml and its checkpoints: `rollout.vector: auto`
    settled (with `policy_lag` 0 unless rollout workers act, and `num_workers`), `model.precision: auto`
    and `auto` PPO epochs settled. `host.device` and `host.torch_threads` stay as written: they say where this
    process runs, not what it learns, and a resumed run settles them again (`device`, `threads`)."""
    layout: EnvLayout
    """The env's layout: the team (groups, spaces, state) read from the probe copy, or `BatchedLayout`
    for a batched simulator (VMAS, JaxMARL), whose one env object reports its team when built."""
    device: torch.device
    """Where the networks live (`device: auto` settled)."""
    threads: int
    """torch threads of the learner (`host.torch_threads: auto` settled, `plan.host.learner_threads`)."""
    update_threads: int
    """torch threads while the learner updates (`plan.host.update_threads`): `threads`, or every core
    for a CNN or batched-simulator learner that nothing runs beside during its update."""
    ppo: SettledPPO
    """The config's PPO settings with their epochs settled (`config.ppo`, typed): what the trainer takes."""
    build_threads: int
    """torch threads while the networks are built and initialised: `threads` without the rule for CNN
    encoders (1 unless set or batched), since the orthogonal init of a CNN's weights varies with the
    thread count: a CNN model starts from the same weights on any number of cores."""
    rollout_path: str | None = None
    """How a JaxMARL env's rollouts run, for the start line: `compiled (lax.scan over T steps)` or
    `per-step (the reason)` (`plan.compiled`); None for other envs, and for an evaluation's plan."""
    learner_path: str | None = None
    """How the updates run where `fast.learner: jax`, for the start line (`plan.compiled.settle_learner`);
    None for torch's learner, and for an evaluation's plan."""

    @property
    def batched(self) -> bool:
        """Whether the env is a batched simulator: one object holds every copy, built in this process."""
        return isinstance(self.layout, BatchedLayout)

    @property
    def convolutional(self) -> bool:
        """Whether the networks have a CNN encoder (an image input and `model.encoder` other than `mlp`)."""
        return convolutional(self.config, self.layout)

    def describe(self) -> str:
        """What the run builds, in one line: algorithm, env, team, env copies and where they run, threads."""
        config = self.config
        algorithm = "IPPO" if config.ppo.critic == "obs" else "MAPPO"
        if config.ppo.actor_update == "sequential":
            algorithm = "HAPPO"
        if not isinstance(self.layout, TeamSpec):
            team, where = "", f"in one batched simulator on {self.device}"
        else:
            groups = len(self.layout.groups)
            team = f" ({self.layout.num_agents} agents in {groups} group{'s' * (groups > 1)})"
            where = {
                "sync": "in this process",
                "subprocess": f"in {config.rollout.num_workers} env worker processes",
                "workers": f"in {config.rollout.num_workers} rollout worker processes",
                "ray": f"in {config.rollout.num_workers} Ray workers",
            }[config.rollout.vector]
        encoder = ", a CNN encoder" if self.convolutional else ""
        threads = f"{self.threads} torch thread{'s' * (self.threads > 1)}"
        if self.update_threads != self.threads:
            threads += f" ({self.update_threads} while updating)"
        league = config.league
        if league.opponents == "latest":
            encoder += f"; self-play with a snapshot every {league.snapshot_every} updates"
        elif league.opponents is not None:
            encoder += (
                f"; a league: {league.opponents} over snapshots taken every {league.snapshot_every} updates"
                + (f", {league.self_play:.0%} self-play" if league.self_play else "")
            )
        rollout = "" if self.rollout_path is None else f"; rollout: {self.rollout_path}"
        if self.learner_path is not None:
            rollout += f"; learner: {self.learner_path}"
        return (
            f"{algorithm} on {config.env.id}{team}: {config.rollout.copies} env copies {where}, {threads}"
            f"{encoder}{rollout}"
        )


def anchored_config(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with a user's env file named by its absolute path (`registry.anchored`): what a run
    records, so that resume and eval find the file from any directory."""
    env_id = anchored(config.env.id)
    return (
        config
        if env_id == config.env.id
        else dataclasses.replace(config, env=dataclasses.replace(config.env, id=env_id))
    )


def plan_run(config: ExperimentConfig) -> RunPlan:
    """`config` settled for a run on this machine. Builds at most one env copy, the probe (none for a
    batched simulator but a JaxMARL env's, built and not reset, for `rollout.compiled`): its layout is
    the plan's, and `rollout.vector: auto` times its steps."""
    config = _with_precision(settle_copies(anchored_config(config)))
    _check_shaping(config)
    batched = batched_layout(config)
    if batched is not None:  # one object holds every copy: no probe copy (a JaxMARL env's is built
        # for `rollout.compiled`, not reset: nothing is compiled or stepped)
        config = resolve_vector(config, batched=True, step_seconds=_untimed)
        config, rollout_path = settle_compiled(config, batched)
        learner_path = settle_learner(config, rollout_path)
        plan = _settled(config, batched)
        return dataclasses.replace(plan, rollout_path=rollout_path, learner_path=learner_path)
    probe = make_team_env(config)
    try:
        spec = team_spec(config, probe)
        timing = functools.partial(probe_step_seconds, config, probe, spec)
        config = resolve_vector(config, batched=False, step_seconds=timing)
    finally:
        probe.close()
    config, _ = settle_compiled(config, spec)  # false: not a JaxMARL env
    settle_learner(config, None)  # fast.learner=jax is refused here
    return _settled(config, spec)


def _check_shaping(config: ExperimentConfig) -> None:
    """Refuse `env.shaped_reward` for an env that reports no shaped reward, and an anneal of no shaped reward."""
    if config.env.shaped_reward and not reports_shaped_reward(config.env.id):
        raise ConfigError(
            f"env.shaped_reward={config.env.shaped_reward}: env '{config.env.id}' reports no shaped reward "
            "(JaxMARL's Overcooked layouts do); set env.shaped_reward: 0"
        )
    if config.env.shaped_reward_steps is not None and not config.env.shaped_reward:
        raise ConfigError(
            f"env.shaped_reward_steps={config.env.shaped_reward_steps} anneals a shaped reward that is off "
            "(env.shaped_reward: 0); set env.shaped_reward to its starting weight, or env.shaped_reward_steps: null"
        )


def plan_eval(config: ExperimentConfig) -> RunPlan:
    """`config` (a checkpoint's, with any overrides) settled to evaluate in this process: env copies
    stepped here (`rollout.vector: sync`), its layout read from one probe copy (none for a batched simulator)."""
    config = _with_precision(settle_copies(config))
    config = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, vector="sync", policy_lag=0)
    )
    return _settled(config, probe_layout(config))


def _with_precision(config: ExperimentConfig) -> ExperimentConfig:
    """`config` with `model.precision: auto` settled for its device."""
    precision = resolve_precision(config.model.precision, resolve_device(config.host.device))
    model = dataclasses.replace(config.model, precision=cast(Literal["fp32", "bf16"], precision))
    return dataclasses.replace(config, model=model)


def _untimed() -> float:
    raise AssertionError("a batched simulator's vector mode needs no step timing")


def _settled(config: ExperimentConfig, layout: EnvLayout) -> RunPlan:
    ppo = config.ppo.settled(convolutional=convolutional(config, layout))
    config = dataclasses.replace(config, ppo=ppo)
    cnn = convolutional(config, layout)
    return RunPlan(
        config=config,
        layout=layout,
        ppo=ppo,
        device=resolve_device(config.host.device),
        threads=learner_threads(config, layout, convolutional=cnn),
        update_threads=update_threads(config, layout, convolutional=cnn),
        build_threads=learner_threads(config, layout),
    )
