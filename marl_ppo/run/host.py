"""The host a run executes on: learner threads and resident-memory probes."""

from __future__ import annotations

import dataclasses
import os
import resource

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import is_batched, team_spec, usable_cores
from marl_ppo.envs.spec import TeamSpec


def learner_threads(config: ExperimentConfig, *, convolutional: bool = False) -> int:
    """Torch threads of the learner: `torch_threads`, or for `auto` every core with a batched simulator
    (large tensors, nothing else running) or a CNN encoder (`convolutional`: convolutions over many
    frames per minibatch; a synchronous run's env workers wait while it learns), and 1 otherwise.

    Other networks here are small: a second thread buys nothing on their matrices, and where env
    workers or other processes keep the cores busy, threads that wait for each other slow a small
    run down several times over.
    """
    if config.torch_threads != "auto":
        return config.torch_threads
    return usable_cores() if is_batched(config) or convolutional else 1


def convolutional(config: ExperimentConfig, spec: TeamSpec | None = None) -> bool:
    """Whether the configured model will have a CNN encoder: an image among the env's observations or
    state (`spec`, else read from one env copy built here) and `model.encoder` other than `mlp`."""
    if config.model.encoder == "mlp" or is_batched(config):
        return False
    return (spec or team_spec(config)).has_image


def settled_epochs(config: ExperimentConfig, spec: TeamSpec | None = None) -> ExperimentConfig:
    """`config` with `auto` PPO epochs settled as its run settles them (4 with a CNN encoder, else 10;
    `spec` as for `convolutional`): what a run records, and what a sweep compares a finished run with."""
    if "auto" not in (config.ppo.train_pi_iters, config.ppo.train_vf_iters):
        return config
    return dataclasses.replace(config, ppo=config.ppo.settled(convolutional=convolutional(config, spec)))


def run_cores(config: ExperimentConfig) -> int:
    """Cores one training process keeps busy: its env or rollout worker processes while it collects
    or its learner threads while it learns, whichever are more (`vector: ray`: 1, its workers reserve
    their own as Ray actors). With `torch_threads: auto` one env copy is built to see whether the
    model will have a CNN encoder."""
    if config.vector == "ray":
        return 1
    workers = (
        config.num_workers if config.vector in ("subprocess", "workers", "auto") else 0
    )  # auto may pick workers
    images = config.torch_threads == "auto" and convolutional(config)
    return max(workers, learner_threads(config, convolutional=images))


def rss_mb(pid: int | str = "self") -> float:
    """Current resident memory of a process (this one by default), in MiB; nan where /proc is missing."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB (Linux reports ru_maxrss in KiB)."""
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self_kib / 1024


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its child processes that have ended
    (rollout and env workers, once closed). Unlike wall time, it barely moves when other work
    shares the machine."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
