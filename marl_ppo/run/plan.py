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
from marl_ppo.run.host import convolutional, learner_threads, settled_epochs


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
    build_threads: int
    """torch threads while the networks are built and initialised: `threads` without the rule for CNN
    encoders (1 unless set or batched), since the orthogonal init of a CNN's weights varies with the
    thread count: a CNN model starts from the same weights on any number of cores."""

    @property
    def convolutional(self) -> bool:
        """Whether the networks have a CNN encoder (an image input and `model.encoder` other than `mlp`)."""
        return self.spec is not None and convolutional(self.config, self.spec)


def plan_run(config: ExperimentConfig) -> RunPlan:
    """`config` settled for a run on this machine. Builds at most one env copy, the probe (none for a
    batched simulator): its layout is the plan's `spec`, and `vector: auto` times its steps."""
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
        build_threads=learner_threads(config),
    )
