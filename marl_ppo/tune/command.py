"""`marl-ppo tune EXPERIMENT.yaml --space SPACE.yaml --trials N --seeds K`: the search from start to outputs.

Everything the user gave is checked first (the space against the config's rules, the env id, the
extras), then the study runs (or continues, in the same tuning directory), then the outputs are
written: best.yaml, trials.csv, importances.json, tune.md, and with `--fresh-seeds M` the comparison
of the best trial against the starting file on M seeds the search never saw.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from marl_ppo.analysis.sweep import default_jobs
from marl_ppo.config import load_config
from marl_ppo.console import shell_command
from marl_ppo.envs.registry import resolve_factory
from marl_ppo.plan.host import run_cores
from marl_ppo.tune.launch import Launcher, ProcessLauncher, RayLauncher
from marl_ppo.tune.outputs import compare_fresh, write_best, write_tables
from marl_ppo.tune.score import SCORE_RULES
from marl_ppo.tune.space import TuneError, read_space
from marl_ppo.tune.study import PRUNERS, TuneSetup, finished_trials, run_study, storage_url

PRUNER_WORDS = {
    "median": "median rule: once two trials have completed, a trial stops when its score after its second or a later "
    "evaluation is below the median of the complete trials' scores after the same evaluation",
    "halving": "successive halving: at each rung only the best third of the trials that reached it go on",
    "none": "no pruning: every trial trains to its end",
}


@dataclass(frozen=True)
class TuneRequest:
    """The `tune` command's arguments."""

    experiment: Path
    space: Path
    overrides: tuple[str, ...]
    trials: int
    seeds: int
    out: Path
    jobs: int | None = None
    ray: str | None = None
    pruner: str = "median"
    score: str = "curve"
    fresh_seeds: int = 0
    sampler_seed: int = 0


def prepare(request: TuneRequest) -> TuneSetup:
    """The checked setup of a study, or a one-line TuneError/ConfigError before anything runs."""
    if request.trials < 1:
        raise TuneError(f"--trials {request.trials} must be at least 1")
    if request.seeds < 1:
        raise TuneError(f"--seeds {request.seeds} must be at least 1")
    if request.fresh_seeds < 0:
        raise TuneError(f"--fresh-seeds {request.fresh_seeds} must be 0 or more")
    if request.pruner not in PRUNERS:
        raise TuneError(f"--pruner {request.pruner} is not one of {', '.join(PRUNERS)}")
    if request.score not in SCORE_RULES:
        raise TuneError(f"--score {request.score} is not one of {', '.join(SCORE_RULES)}")
    if any(item.partition("=")[0].strip() == "seed" for item in request.overrides):
        raise TuneError("seed cannot be set for a search; --seeds K trains seeds 0..K-1 in every trial")
    config = load_config(request.experiment, request.overrides)
    if not config.eval.every:
        raise TuneError(
            "a trial is scored by its periodic evaluations, and the experiment has none; "
            f"set eval.every (e.g. eval.every={max(config.total_steps // 10, 1)})"
        )
    resolve_factory(config.env.id)  # unknown ids and missing extras fail here, before any trial
    space = read_space(request.space, request.experiment, request.overrides)
    jobs = request.jobs if request.jobs is not None else default_jobs(config)
    return TuneSetup(
        experiment=request.experiment,
        space=space,
        directory=request.out / request.experiment.stem,
        trials=request.trials,
        seeds=request.seeds,
        jobs=jobs,
        fixed=request.overrides,
        score=request.score,
        pruner=request.pruner,
        sampler_seed=request.sampler_seed,
    )


def tune(request: TuneRequest, echo: Callable[[str], None] = print) -> int:
    """Run the `tune` command; its exit status (1 when no trial completed)."""
    setup = prepare(request)
    config = load_config(setup.experiment, setup.fixed)
    launcher: Launcher = ProcessLauncher(setup.experiment)
    if request.ray is not None:
        ray_launcher = RayLauncher(setup.experiment, run_cores(config), request.ray)
        if request.jobs is None:  # as many runs at once as the cluster's CPUs hold
            setup = dataclasses.replace(setup, jobs=ray_launcher.slots(run_cores(config)))
        launcher = ray_launcher
    where = f"{setup.jobs} training run(s) at a time" + (
        f" on the Ray cluster at {request.ray}" if request.ray else ""
    )
    echo(
        f"tune {setup.experiment.stem}: {setup.trials} trials x {setup.seeds} seeds of {len(setup.space.dimensions)} "
        f"key(s), {where}, in {setup.directory}"
    )
    echo(f"pruning: {PRUNER_WORDS[setup.pruner]}")
    previous = signal.signal(signal.SIGTERM, _interrupt) if _main_thread() else None
    try:
        study = run_study(setup, launcher, echo)
    finally:
        launcher.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    for path in write_tables(study, setup):
        echo(f"wrote {path}")
    if not any(
        trial.value is not None and trial.state.name == "COMPLETE" for trial in finished_trials(study)
    ):
        echo("no trial completed; see trials.csv and the trials' logs")
        return 1
    best = write_best(study, setup)
    echo(
        f"best: trial {study.best_trial.number}, score {study.best_value:.4g}; train it with: {shell_command('train', str(best))}"
    )
    if request.fresh_seeds:
        out = compare_fresh(study, setup, request.fresh_seeds, ray_address=request.ray, echo=echo)
        echo(f"best against start on {request.fresh_seeds} fresh seed(s): {out / 'compare.md'}")
    if shutil.which("optuna-dashboard"):
        echo(f"browse the study with: optuna-dashboard {storage_url(setup.directory)}")
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
