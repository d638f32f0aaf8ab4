"""`marl-ppo sweep --ray ADDRESS`: each (grid point, seed) of a sweep as a Ray task, on any node of a cluster.

A task runs the same `marl-ppo train` process a local sweep runs, on the node Ray picks, with the
CPUs its config keeps busy reserved for it, and writes the same run directory and log file beside
it; so the paths (the experiment file, `--out`) must be the same shared storage on every node. The
task decides what to run when it starts: nothing for a finished run, `train --resume` for a run
with a checkpoint, a fresh `train` otherwise (a run stopped before its first checkpoint starts
over). So a sweep started again finishes what an interrupted one left, and a task that Ray retries
after its node died resumes from the run's last checkpoint. Ctrl-C or SIGTERM stops the running
tasks' trainings the way Ctrl-C stops a training: after a checkpoint.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from marl_ppo.analysis.sweep import (
    SweepError,
    SweepOutcome,
    SweepRun,
    _result_line,
    die_with_parent,
    launch_words,
)
from marl_ppo.config import ExperimentConfig
from marl_ppo.plan.host import run_cores
from marl_ppo.rollout.ray_workers import connect_ray, import_ray
from marl_ppo.run.rundir import is_finished

TASK_RETRIES = 3
"""Times Ray runs a run's task again after its node or process died (each time resuming the run)."""
_STOP_WAIT_S = 120.0
"""How long a stopped sweep waits for its running trainings to write their checkpoints."""


def run_finished(run: SweepRun) -> bool:
    """Whether the run is done: the rule of the local sweep, a summary.json in its directory."""
    return is_finished(run.run_dir)


def train_run(experiment: Path, run: SweepRun) -> tuple[int, str]:
    """A Ray task: finish one run of the sweep (resume it, or start it, as a local sweep does); its
    exit status and node. A cancelled task stops its training with SIGTERM, which checkpoints it."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    if is_finished(run.run_dir):
        return 0, node
    words, mode = launch_words(experiment, run)
    with open(run.log_file, mode) as log:
        # tied to this task's worker process: a node lost with its workers takes its trainings with it,
        # so the task Ray runs again elsewhere is the run's only writer
        process = subprocess.Popen(words, stdout=log, stderr=log, preexec_fn=die_with_parent)
        try:
            while process.poll() is None:  # not a blocking wait: Ray's cancel arrives between bytecodes
                time.sleep(0.2)
            return process.returncode, node
        except BaseException:  # cancelled (KeyboardInterrupt) or the worker is exiting
            process.terminate()
            process.wait()
            raise


def run_sweep_on_ray(
    experiment: Path,
    runs: Sequence[SweepRun],
    config: ExperimentConfig,
    address: str,
    jobs: int | None = None,
    echo: Callable[[str], None] = print,
) -> SweepOutcome:
    """Run the sweep's unfinished runs as Ray tasks (at most `jobs` at once, else as the cluster's
    CPUs allow), echoing one line as each ends."""
    if jobs is not None and jobs < 1:
        raise SweepError(f"--jobs {jobs} must be at least 1")
    ray = import_ray()
    outcome = SweepOutcome()
    pending = []
    for run in runs:
        if run_finished(run):
            outcome.skipped.append(run.name)
        else:
            pending.append(run)
    disconnect = connect_ray(address)
    task = ray.remote(train_run).options(num_cpus=run_cores(config), max_retries=TASK_RETRIES)
    total = len(pending)
    running: dict[Any, SweepRun] = {}  # Ray's object reference -> its run
    previous = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
    try:
        while pending or running:
            while pending and (jobs is None or len(running) < jobs):
                run = pending.pop(0)
                run.run_dir.parent.mkdir(parents=True, exist_ok=True)
                running[task.remote(experiment.absolute(), _absolute(run))] = run
            ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in ready:
                _finish(ray, ref, running.pop(ref), outcome, total, echo)
    finally:
        _stop(ray, running)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if disconnect:
            ray.shutdown()
    return outcome


def _finish(
    ray: Any, ref: Any, run: SweepRun, outcome: SweepOutcome, total: int, echo: Callable[[str], None]
) -> None:
    done = len(outcome.finished) + len(outcome.failed) + 1
    try:
        status, node = ray.get(ref)
    except ray.exceptions.RayError as err:  # the task itself failed (its retries used up)
        status, node = -1, f"lost: {type(err).__name__}"
    if status == 0:
        outcome.finished.append(run.name)
        echo(f"[{done}/{total}] done {run.name} on node {node[:8]}: {_result_line(run)}")
    else:
        outcome.failed.append((run, status))
        echo(f"[{done}/{total}] FAILED {run.name} on node {node[:8]} (exit {status}); log {run.log_file}")


def _stop(ray: Any, running: dict[Any, SweepRun]) -> None:
    """Cancel the running tasks (their trainings checkpoint and stop) and wait for them to end."""
    if not running:
        return
    for ref in running:
        ray.cancel(ref)
    ray.wait(list(running), num_returns=len(running), timeout=_STOP_WAIT_S)


def _absolute(run: SweepRun) -> SweepRun:
    return SweepRun(run.name, run.overrides, run.run_dir.absolute())


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
