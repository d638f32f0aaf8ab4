"""`marl-ppo sweep`: a grid of `key=v1,v2` overrides x seeds, each run a `marl-ppo train` process.

Run directories are `<out>/<experiment>/<key=value,...>/seed<k>` (only keys with several values name
a directory), each with its console output beside it in `seed<k>.log`. Every configuration is
validated before the first process starts. A run whose directory already holds a finished run
(`summary.json`) is skipped only when that run's resolved config (its `config.yaml`) is the one the
sweep would start; a finished run of another config stops the sweep before any process starts,
with one line naming the keys that differ, so a re-run after a failure reuses exactly its own runs
and a changed setting never passes off another config's results as its own. An unfinished run of
the same config (a sweep stopped by Ctrl-C, a lost machine) continues from its last checkpoint
(`train --resume`), or starts over when it stopped before its first one: the same sweep started
again finishes what the stopped one left.
"""

from __future__ import annotations

import ctypes
import itertools
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from marl_ppo.analysis.runlogs import CHECK_KEYS, flatten_config, with_defaults
from marl_ppo.config import ConfigError, ExperimentConfig, config_to_dict, load_config
from marl_ppo.envs.factory import probe_layout, usable_cores
from marl_ppo.faults import UserError
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.host import run_cores, settled_epochs
from marl_ppo.plan.settle import anchored_config
from marl_ppo.run.rundir import is_finished, read_summary


class SweepError(UserError, ValueError):
    """A user-facing sweep problem; its message is one line naming the value and the fix."""


@dataclass(frozen=True)
class SweepRun:
    """One training process of the sweep."""

    name: str
    """`<key=value,...>/seed<k>`, the run directory relative to the sweep directory."""
    overrides: tuple[str, ...]
    run_dir: Path

    @property
    def log_file(self) -> Path:
        """The run's console output, beside its run directory."""
        return self.run_dir.with_name(self.run_dir.name + ".log")


@dataclass
class SweepOutcome:
    """Names of the runs that finished, failed (with exit status) or were skipped as already finished."""

    finished: list[str] = field(default_factory=list)
    failed: list[tuple[SweepRun, int]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def split_values(text: str) -> list[str]:
    """Split `v1,v2` on the commas outside brackets, braces and quotes (`[64,64],[32]` is two values)."""
    values: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append("".join(current))
            current = []
            continue
        current.append(char)
    values.append("".join(current))
    return [value.strip() for value in values]


def parse_grid(items: Sequence[str]) -> dict[str, list[str]]:
    """`key=v1,v2` arguments -> {key: [v1, v2]} in the given order."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SweepError(f"grid argument '{item}' is not key=v1,v2; write e.g. ppo.pi_lr=3e-4,1e-3")
        if key == "seed":
            raise SweepError("seed cannot be a grid key; use --seeds N (runs seeds 0..N-1)")
        if key in grid:
            raise SweepError(f"grid key '{key}' is given twice; list all its values once: {key}=v1,v2")
        values = split_values(raw)
        if "" in values:
            raise SweepError(f"grid argument '{item}' has an empty value; separate values with single commas")
        grid[key] = values
    return grid


def _dir_name(assignments: Sequence[tuple[str, str]]) -> str:
    text = ",".join(f"{key}={value}" for key, value in assignments)
    return re.sub(r"[^A-Za-z0-9._=,+-]", "_", text)


def plan_sweep(
    experiment: Path, grid: dict[str, list[str]], seeds: int, out: Path
) -> tuple[list[SweepRun], ExperimentConfig]:
    """Every (grid point, seed) run with its validated overrides and run directory; the first config."""
    if seeds < 1:
        raise SweepError(f"--seeds {seeds} must be at least 1")
    sweep_dir = out / experiment.stem
    varying = [key for key, values in grid.items() if len(values) > 1]
    runs, first = [], None
    for point in itertools.product(*grid.values()):
        assignments = list(zip(grid, point, strict=True))
        overrides = tuple(f"{key}={value}" for key, value in assignments)
        config_dir = sweep_dir / _dir_name([(k, v) for k, v in assignments if k in varying])
        for seed in range(seeds):
            try:
                config = load_config(experiment, [*overrides, f"seed={seed}"])
            except ConfigError as err:
                raise ConfigError(f"{err} (in sweep point {', '.join(overrides)})") from None
            first = first or config
            run_dir = config_dir / f"seed{seed}" if varying else sweep_dir / f"seed{seed}"
            name = run_dir.relative_to(sweep_dir).as_posix()
            run = SweepRun(name, (*overrides, f"seed={seed}"), run_dir)
            _check_reusable(run, config)
            runs.append(run)
    assert first is not None
    return runs, first


AUTO_KEYS = ("rollout.vector", "rollout.compiled", "model.precision", "host.torch_threads")
"""Keys whose `auto` a run settles when it starts; a finished run's recorded choice matches `auto`
(how it ran, not what it trained; `auto` epochs, which change training, are settled instead)."""


def config_differences(planned: ExperimentConfig, recorded: dict[str, Any]) -> list[str]:
    """The dotted keys in which a finished run's config.yaml differs from the config the sweep would start."""
    wanted = flatten_config(config_to_dict(settle_copies(anchored_config(planned))))  # as the run records it
    found = flatten_config(with_defaults(recorded))
    settled = {key for key in AUTO_KEYS if wanted.get(key) == '"auto"' and key in found}
    if (
        "rollout.vector" in settled
        and found["rollout.vector"] != '"workers"'
        and found.get("rollout.policy_lag") == "0"
    ):
        settled.add("rollout.policy_lag")  # auto that picked sync runs, and records, policy_lag 0
    return [
        key
        for key in sorted(set(wanted) | set(found))
        if wanted.get(key) != found.get(key) and key not in settled and not _ignored(key)
    ]


def _ignored(key: str) -> bool:
    """Keys a finished run may differ in and still be reused: the sweep sets `log.progress` itself, and
    `expected` (the band `reproduce` checks) changes nothing that is trained."""
    return key == "log.progress" or key.split(".")[0] in CHECK_KEYS


def _check_reusable(run: SweepRun, config: ExperimentConfig) -> None:
    """Refuse a run directory that holds a run, finished or not, of another config (an unfinished run
    of this config is continued by `launch_words`)."""
    if not run.run_dir.exists() or not any(run.run_dir.iterdir()):
        return
    saved = run.run_dir / "config.yaml"
    finished = is_finished(run.run_dir)
    if not finished and not saved.exists():
        return  # stopped before it wrote its config: the run starts afresh there
    try:
        recorded = yaml.safe_load(saved.read_text())
    except (OSError, yaml.YAMLError):
        recorded = None
    if not isinstance(recorded, dict):
        raise SweepError(
            f"run directory '{run.run_dir}' holds a run without a readable config.yaml, so it "
            "cannot be told apart from another config; remove it or pass another --out"
        )
    config = settle_copies(config)  # the copies and epochs settled as the run settled them
    if "auto" in (config.ppo.train_pi_iters, config.ppo.train_vf_iters):
        config = settled_epochs(config, probe_layout(config))
    differences = config_differences(config, recorded)
    if differences:
        wanted, found = flatten_config(config_to_dict(config)), flatten_config(with_defaults(recorded))
        shown = [
            f"{key} {found.get(key, 'unset')} there, {wanted.get(key, 'unset')} here" for key in differences
        ]
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        raise SweepError(
            f"run directory '{run.run_dir}' holds {'a finished' if finished else 'an unfinished'} run of another "
            f"config ({'; '.join(shown[:3])}{more}); "
            "pass another --out, or remove the run to train it again"
        )


def default_jobs(config: ExperimentConfig) -> int:
    """Runs at once: the cores available divided by the cores one run keeps busy."""
    return max(1, usable_cores() // run_cores(config))


def _command(experiment: Path, run: SweepRun) -> list[str]:
    return [
        sys.executable,
        "-m",
        "marl_ppo",
        "train",
        str(experiment),
        *run.overrides,
        "log.progress=false",
        "--run-dir",
        str(run.run_dir),
    ]


_PR_SET_PDEATHSIG = 1
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None
"""libc's prctl, looked up before any fork: the forked child only calls it (no lookup, no lock)."""


def die_with_parent() -> None:
    """`preexec_fn` of a training process (Linux): the kernel sends it SIGKILL when the process that
    started it dies, so a training never outlives the tuner or Ray task that owns its run directory
    (a second process resuming that run would write into it at the same time)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def launch_words(experiment: Path, run: SweepRun) -> tuple[list[str], str]:
    """The command that finishes an unfinished run, and the mode its log file opens in: `train
    --resume` for a run with a checkpoint (its log goes on), a fresh `train` otherwise (a directory a
    run left before its first checkpoint is cleared first)."""
    if (run.run_dir / "checkpoints" / "latest.pt").exists():
        resume = [sys.executable, "-m", "marl_ppo", "train", "--resume", str(run.run_dir)]
        return [*resume, "log.progress=false"], "a"
    if run.run_dir.exists():
        shutil.rmtree(run.run_dir)
    return _command(experiment, run), "w"


def _result_line(run: SweepRun) -> str:
    summary = read_summary(run.run_dir)
    if summary is None:  # exit 0 without a summary: it did not train to its end
        return "exited 0 without its summary.json"
    return f"team return {summary['team_return_mean']:.2f}, {summary['wall_s'] / 60:.1f} min"


def run_sweep(
    experiment: Path, runs: Sequence[SweepRun], jobs: int, echo: Callable[[str], None] = print
) -> SweepOutcome:
    """Run the training processes, at most `jobs` at once, echoing one line as each ends."""
    if jobs < 1:
        raise SweepError(f"--jobs {jobs} must be at least 1")
    outcome = SweepOutcome()
    pending = []
    for run in runs:
        if is_finished(run.run_dir):
            outcome.skipped.append(run.name)
        else:
            pending.append(run)
    total = len(pending)
    running: dict[SweepRun, subprocess.Popen[bytes]] = {}
    try:
        while pending or running:
            while pending and len(running) < jobs:
                run = pending.pop(0)
                run.run_dir.parent.mkdir(parents=True, exist_ok=True)
                words, mode = launch_words(experiment, run)
                with open(run.log_file, mode) as log:
                    running[run] = subprocess.Popen(words, stdout=log, stderr=log)
            time.sleep(0.1)
            for run, process in list(running.items()):
                if process.poll() is None:
                    continue
                del running[run]
                done = len(outcome.finished) + len(outcome.failed) + 1
                if process.returncode == 0:
                    outcome.finished.append(run.name)
                    echo(f"[{done}/{total}] done {run.name}: {_result_line(run)}")
                else:
                    outcome.failed.append((run, process.returncode))
                    echo(
                        f"[{done}/{total}] FAILED {run.name} (exit {process.returncode}); log {run.log_file}"
                    )
    finally:
        for process in running.values():  # interrupted: stop the runs this sweep started
            process.terminate()
        for process in running.values():
            process.wait()
    return outcome


def summary_line(name: str, outcome: SweepOutcome) -> str:
    """One line: counts of finished, skipped and failed runs, naming each failure and its log file."""
    line = (
        f"sweep {name}: {len(outcome.finished)} finished, {len(outcome.skipped)} skipped "
        f"(already finished), {len(outcome.failed)} failed"
    )
    if outcome.failed:
        line += ": " + "; ".join(f"{run.name} (log {run.log_file})" for run, _ in outcome.failed)
    return line
