"""Where a trial's seed runs train: as processes on this machine, or as Ray tasks on a cluster.

Both start the `marl-ppo train` process a sweep starts for a run (`analysis/sweep.launch_words`: a
fresh run, or `--resume` from its last checkpoint), so a study started again continues the runs of
its unfinished trials. On this machine each training process is tied to the tuner: if the tuner is
killed, even with SIGKILL, its trainings are killed with it and later resume from their checkpoints
(never two processes on one run directory). On Ray each run is the sweep's task (`ray_sweep.train_run`)
with its retries: a lost node loses its running trainings, which Ray runs again from their checkpoints.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from marl_ppo.analysis.sweep import SweepRun, die_with_parent, launch_words

Command = Callable[[SweepRun], tuple[list[str], str]]
"""A run -> the words of its process and the mode its log file opens in (`w`, or `a` when resuming)."""


class Handle(Protocol):
    """One started run."""

    def poll(self) -> int | None:
        """None while it runs; its exit status after (non-zero: it failed or was stopped)."""
        ...

    def stop(self) -> None:
        """Stop it (a training checkpoints first) and wait until it has."""
        ...


class Launcher(Protocol):
    """Starts runs; `close` lets go of what it holds (a Ray connection)."""

    def start(self, run: SweepRun) -> Handle:
        """Start the run (its directory's parent is created)."""
        ...

    def close(self) -> None:
        """Release the launcher's resources."""
        ...


class _ProcessHandle:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait()


class ProcessLauncher:
    """Each run a process on this machine, its output in the run's log file beside its directory."""

    def __init__(self, experiment: Path, command: Command | None = None) -> None:
        self.command: Command = command or (lambda run: launch_words(experiment, run))

    def start(self, run: SweepRun) -> Handle:
        run.run_dir.parent.mkdir(parents=True, exist_ok=True)
        words, mode = self.command(run)
        with open(run.log_file, mode) as log:
            process = subprocess.Popen(words, stdout=log, stderr=log, preexec_fn=die_with_parent)
        return _ProcessHandle(process)

    def close(self) -> None:
        return None


class _RayHandle:
    def __init__(self, ray: Any, ref: Any) -> None:
        self.ray, self.ref = ray, ref

    def poll(self) -> int | None:
        ready, _ = self.ray.wait([self.ref], timeout=0)
        if not ready:
            return None
        try:
            status, _node = self.ray.get(self.ref)
        except self.ray.exceptions.RayError:  # cancelled, or its retries used up
            return -1
        return int(status)

    def stop(self) -> None:
        self.ray.cancel(self.ref)
        self.ray.wait([self.ref], timeout=120.0)


class RayLauncher:
    """Each run a Ray task on the cluster at `address`, with the CPUs its config keeps busy reserved;
    the experiment file and the tuning directory must be on storage every node shares."""

    def __init__(self, experiment: Path, cores: int, address: str) -> None:
        from marl_ppo.analysis.ray_sweep import TASK_RETRIES, train_run
        from marl_ppo.rollout.ray_workers import connect_ray, import_ray

        self.ray = import_ray()
        self.experiment = experiment.absolute()
        self._disconnect = connect_ray(address)
        self._task = self.ray.remote(train_run).options(num_cpus=cores, max_retries=TASK_RETRIES)

    def slots(self, cores: int) -> int:
        """Runs of `cores` CPUs each that the cluster holds at once."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)) // cores)

    def start(self, run: SweepRun) -> Handle:
        run.run_dir.parent.mkdir(parents=True, exist_ok=True)
        absolute = SweepRun(run.name, run.overrides, run.run_dir.absolute())
        return _RayHandle(self.ray, self._task.remote(self.experiment, absolute))

    def close(self) -> None:
        if self._disconnect:
            self.ray.shutdown()
