"""The run settled once: every `auto` of a config resolved on this machine, and the team layout read
from one probe env copy, in a frozen record that the builders, the trainer and the memory check take.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Literal, cast

import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import is_batched, make_team_env, probe_step_seconds, resolve_vector, team_spec
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.models.layers import resolve_device, resolve_precision
from marl_ppo.registry import anchored
from marl_ppo.run.host import convolutional, learner_threads, settled_epochs, update_threads


@dataclass(frozen=True)
class RunPlan:
    """What a run is built from, settled once before its first step (`plan_run`)."""

    config: ExperimentConfig
    """The config the run trains, and records in config.yaml and its checkpoints: `vector: auto` settled
    (with `policy_lag` 0 unless rollout workers act, and `num_workers`), `model.precision: auto` and
    `auto` PPO epochs settled. `device` and `torch_threads` stay as written: they say where this
    process runs, not what it learns, and a resumed run settles them again (`device`, `threads`)."""
    spec: TeamSpec | None
    """The team layout (groups, spaces, state) read from the probe copy; None for a batched simulator
    (VMAS), whose one env object reports its layout when built."""
    device: torch.device
    """Where the networks live (`device: auto` settled)."""
    threads: int
    """torch threads of the learner (`torch_threads: auto` settled, `run.host.learner_threads`)."""
    update_threads: int
    """torch threads while the learner updates (`run.host.update_threads`): `threads`, or every core
    for a CNN or batched-simulator learner that nothing runs beside during its update."""
    build_threads: int
    """torch threads while the networks are built and initialised: `threads` without the rule for CNN
    encoders (1 unless set or batched), since the orthogonal init of a CNN's weights varies with the
    thread count: a CNN model starts from the same weights on any number of cores."""

    @property
    def convolutional(self) -> bool:
        """Whether the networks have a CNN encoder (an image input and `model.encoder` other than `mlp`)."""
        return self.spec is not None and convolutional(self.config, self.spec)

    def describe(self) -> str:
        """What the run builds, in one line: algorithm, env, team, env copies and where they run, threads."""
        config = self.config
        algorithm = "IPPO" if config.critic == "obs" else "MAPPO"
        if config.ppo.actor_update == "sequential":
            algorithm = "HAPPO"
        if self.spec is None:
            team, where = "", f"in one batched simulator on {self.device}"
        else:
            groups = len(self.spec.groups)
            team = f" ({self.spec.num_agents} agents in {groups} group{'s' * (groups > 1)})"
            where = {
                "sync": "in this process",
                "subprocess": f"in {config.num_workers} env worker processes",
                "workers": f"in {config.num_workers} rollout worker processes",
                "ray": f"in {config.num_workers} Ray workers",
            }[config.vector]
        encoder = ", a CNN encoder" if self.convolutional else ""
        threads = f"{self.threads} torch thread{'s' * (self.threads > 1)}"
        if self.update_threads != self.threads:
            threads += f" ({self.update_threads} while updating)"
        return (
            f"{algorithm} on {config.env.id}{team}: {config.num_envs} env copies {where}, {threads}{encoder}"
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
    batched simulator): its layout is the plan's `spec`, and `vector: auto` times its steps."""
    config = anchored_config(config)
    device = resolve_device(config.device)
    precision = cast(Literal["fp32", "bf16"], resolve_precision(config.model.precision, device))
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, precision=precision))
    spec = None
    if is_batched(config):
        config = resolve_vector(config)  # batched simulators run as one object: no probe
    else:
        probe = make_team_env(config)
        try:
            spec = team_spec(config, probe)
            timing = functools.partial(probe_step_seconds, config, env=probe, spec=spec)
            config = resolve_vector(config, step_seconds=timing)
        finally:
            probe.close()
    config = settled_epochs(config, spec)
    cnn = spec is not None and convolutional(config, spec)
    return RunPlan(
        config=config,
        spec=spec,
        device=device,
        threads=learner_threads(config, convolutional=cnn),
        update_threads=update_threads(config, convolutional=cnn),
        build_threads=learner_threads(config),
    )
