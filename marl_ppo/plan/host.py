"""The host a run executes on: learner threads and resident-memory probes."""

from __future__ import annotations

import dataclasses
import os
import resource
import sys
from collections.abc import Mapping

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import probe_layout, usable_cores
from marl_ppo.envs.spec import BatchedLayout, EnvLayout


def learner_threads(config: ExperimentConfig, layout: EnvLayout, *, convolutional: bool = False) -> int:
    """Torch threads of the learner: `host.torch_threads`, or for `auto`, with a batched simulator (large
    tensors) or a CNN encoder (`convolutional`: convolutions over many frames per minibatch), the cores
    that the run's worker processes leave (`worker_processes`, at least 1), and 1 otherwise, a batched
    simulator with threads of its own (JAX) included.

    Other networks here are small: a second thread buys nothing on their matrices. Threads that
    share their cores with busy processes wait for each other: a CNN learner with as many threads as
    cores next to two env workers acted 20 times slower than with one thread.
    """
    if config.host.torch_threads != "auto":
        return config.host.torch_threads
    batched = isinstance(layout, BatchedLayout)
    if _own_threads(layout) or not (batched or convolutional):
        return 1
    return max(1, usable_cores() - worker_processes(config, layout))


def _own_threads(layout: EnvLayout) -> bool:
    return isinstance(layout, BatchedLayout) and layout.own_threads


def update_threads(config: ExperimentConfig, layout: EnvLayout, *, convolutional: bool = False) -> int:
    """Torch threads while the learner updates: `learner_threads`, except that for `auto` a learner
    with large tensors (a CNN encoder or a batched simulator) takes every usable core when nothing
    else runs during the update (`rollout.policy_lag: 0`: env and rollout workers wait for the next rollout).
    Collecting goes back to `learner_threads`: then the workers need their cores.

    An MLP learner keeps its one thread for the update too: a second thread speeds its small products
    up only on an idle machine, and beside other busy processes (a sweep's other runs, the user's own
    work) two threads wait for each other at every product and make the update many times slower."""
    threads = learner_threads(config, layout, convolutional=convolutional)
    if config.host.torch_threads != "auto" or config.rollout.policy_lag > 0 or _own_threads(layout):
        return threads
    if not (isinstance(layout, BatchedLayout) or convolutional):
        return threads
    return max(threads, usable_cores())


def worker_processes(config: ExperimentConfig, layout: EnvLayout) -> int:
    """Processes the run starts on this machine besides itself: env or rollout workers (`rollout.vector:
    subprocess`, `workers`, and `auto`, which may pick workers); none for a batched simulator, in
    this process, or Ray's workers, which reserve their own CPUs."""
    if isinstance(layout, BatchedLayout) or config.rollout.vector not in ("subprocess", "workers", "auto"):
        return 0
    return config.rollout.num_workers


ACTING_DWARFS_ENV = 4.0
"""Acting this many times slower than the env steps it acts on (per update) is worth a line."""


def acting_hint(
    config: ExperimentConfig, layout: EnvLayout, threads: int, act_s: float, env_s: float
) -> str | None:
    """One line when this process's acting (`act_s`, over some updates) dwarfs its env time (`env_s`)
    while it runs several torch threads: threads that share busy cores wait for each other."""
    acting_here = config.rollout.vector in ("sync", "subprocess") or isinstance(layout, BatchedLayout)
    if not acting_here or threads < 2 or act_s < ACTING_DWARFS_ENV * max(env_s, 1e-3):
        return None
    return (
        f"note: acting takes {act_s:.2f} s per update against {env_s:.2f} s of env steps with "
        f"{threads} torch threads; where other work shares the cores, host.torch_threads=1 is often faster"
    )


class ActingWatch:
    """Watches a run's first updates (the very first, which warms up, aside) and prints `acting_hint`'s
    line once, where it has one."""

    def __init__(
        self, config: ExperimentConfig, layout: EnvLayout, threads: int, *, updates: int = 3
    ) -> None:
        self.config, self.layout, self.threads, self.updates = config, layout, threads, updates
        self.seen: list[Mapping[str, float]] = []

    def update_done(self, seconds: Mapping[str, float]) -> None:
        """Take one update's `act_s` and `env_s`; after the watched updates, print the line if any."""
        if len(self.seen) > self.updates:
            return
        self.seen.append(seconds)
        if len(self.seen) == self.updates + 1 and self.config.log.progress:
            watched = self.seen[1:]
            act = sum(s["act_s"] for s in watched) / self.updates
            env = sum(s["env_s"] for s in watched) / self.updates
            line = acting_hint(self.config, self.layout, self.threads, act, env)
            if line is not None:
                print(line, file=sys.stderr, flush=True)


def convolutional(config: ExperimentConfig, layout: EnvLayout) -> bool:
    """Whether the configured model will have a CNN encoder: an image among the env's observations or
    state (`layout`) and `model.encoder` other than `mlp`."""
    if config.model.encoder == "mlp" or isinstance(layout, BatchedLayout):
        return False
    return layout.has_image


def settled_epochs(config: ExperimentConfig, layout: EnvLayout) -> ExperimentConfig:
    """`config` with its PPO epochs settled as its run settles them (`auto`: 4 with a CNN encoder, else
    10): what a run records, and what a sweep compares a finished run with."""
    return dataclasses.replace(config, ppo=config.ppo.settled(convolutional=convolutional(config, layout)))


def run_cores(config: ExperimentConfig, layout: EnvLayout | None = None) -> int:
    """Cores one training process keeps busy: its env or rollout worker processes while it collects
    or its learner threads while it learns (`update_threads`), whichever are more (`rollout.vector: ray`: 1,
    its workers reserve their own as Ray actors). Without `layout`, one env copy is built to read it
    (`probe_layout`)."""
    if config.rollout.vector == "ray":
        return 1
    layout = probe_layout(config) if layout is None else layout
    images = config.host.torch_threads == "auto" and convolutional(config, layout)
    return max(worker_processes(config, layout), update_threads(config, layout, convolutional=images))


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
