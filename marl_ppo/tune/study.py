"""The search: an Optuna study in a SQLite file, its trials trained as K seed runs each, scored and pruned.

One tuner process drives the study through Optuna's ask-and-tell interface: it asks the sampler
(TPE, seeded by the study's seed mixed with the trial's number, so a trial's draw depends on the study's
history alone, not on how often the tuner was restarted) for a trial, starts the trial's seed runs
through a launcher (processes here, or Ray tasks), reports each evaluation's intermediate score to the
pruner as every seed reaches it, and tells the study the trial's score when its seeds finish. Trials
run side by side as far as `jobs` training processes allow.

Everything the study knows is in `study.db`, written by Optuna as each fact arrives. A tuner that is
stopped, or killed with SIGKILL, leaves its unfinished trials in the RUNNING state with their seed
runs' checkpoints; started again, it takes those trials up where their runs stopped, so no finished
trial is run again or lost and the study ends with exactly the trials asked for.
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from marl_ppo.analysis.runlogs import with_defaults
from marl_ppo.analysis.sweep import SweepRun
from marl_ppo.config import ConfigError, config_to_dict, load_config
from marl_ppo.run.rundir import is_finished
from marl_ppo.tune.launch import Handle, Launcher
from marl_ppo.tune.score import common_evaluations, evaluation_means, trial_interval, trial_score
from marl_ppo.tune.space import Choices, SearchSpace, TuneError, overrides_of

STUDY_FILE = "study.db"
TRIALS_DIR = "trials"
PRUNERS = ("median", "halving", "none")
TRIAL_OVERRIDES = ("eval.absolute=0",)
"""Set on every trial's runs: the absolute metric's extra episodes score nothing in a search."""
POLL_S = 0.2
"""How often the tuner looks at its runs' processes and evaluation files."""


@dataclass(frozen=True)
class TuneSetup:
    """What a study searches and how: the experiment, the space, the seeds per trial, the budget."""

    experiment: Path
    space: SearchSpace
    directory: Path
    """The tuning directory: the study file, the trials' runs, the outputs."""
    trials: int
    seeds: int
    jobs: int
    fixed: tuple[str, ...] = ()
    """`key=value` overrides every trial shares."""
    score: str = "curve"
    pruner: str = "median"
    sampler_seed: int = 0


def import_optuna() -> Any:
    """Optuna, quiet below warnings, or a TuneError naming the extra to install."""
    try:
        import optuna
    except ImportError:
        raise TuneError("marl-ppo tune needs optuna; install it with: pip install 'marl-ppo[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def make_pruner(name: str) -> Any:
    """The pruner a name stands for: Optuna's median rule (once two trials completed, after a trial's
    second evaluation), successive halving, or none."""
    pruners = import_optuna().pruners
    if name == "median":
        return pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1)
    if name == "halving":
        return pruners.SuccessiveHalvingPruner()
    if name == "none":
        return pruners.NopPruner()
    raise TuneError(f"--pruner {name} is not one of {', '.join(PRUNERS)}")


def storage_url(directory: Path) -> str:
    """The study's SQLite URL (what optuna-dashboard opens)."""
    return f"sqlite:///{(directory / STUDY_FILE).absolute()}"


def _search_record(setup: TuneSetup) -> dict[str, str]:
    config = load_config(setup.experiment, setup.fixed)
    return {
        "config": json.dumps(config_to_dict(config), sort_keys=True),
        "space": json.dumps(setup.space.as_dict(), sort_keys=True),
        "seeds": str(setup.seeds),
        "score": setup.score,
    }


def _differing(recorded: Mapping[str, str], wanted: Mapping[str, str]) -> list[str]:
    """The parts of the search record in which the recorded search differs from the wanted one, its
    config read by this version of marl_ppo: a key added since (at its default) or moved is no
    difference."""
    differ = [key for key in wanted if key != "config" and recorded.get(key) != wanted[key]]
    config = recorded.get("config", "")
    if config != wanted["config"]:
        try:
            same = json.dumps(with_defaults(json.loads(config)), sort_keys=True) == wanted["config"]
        except ValueError:
            same = False
        if not same:
            differ.insert(0, "config")
    return differ


def open_study(setup: TuneSetup) -> Any:
    """The study in the tuning directory, created or reopened; one of another search is refused."""
    optuna = import_optuna()
    setup.directory.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        study_name="tune",
        storage=storage_url(setup.directory),
        direction="maximize",
        pruner=make_pruner(setup.pruner),
        load_if_exists=True,
    )
    wanted = _search_record(setup)
    recorded = study.user_attrs.get("search")
    if recorded is None:
        study.set_user_attr("search", wanted)
    elif recorded != wanted and (differing := _differing(recorded, wanted)):
        names = {
            "config": "experiment config",
            "space": "search space",
            "seeds": "--seeds",
            "score": "--score",
        }
        differ = [names[key] for key in differing]
        raise TuneError(
            f"tuning directory '{setup.directory}' holds a study of another search ({', '.join(differ)} "
            "differ); pass another --out, or remove the directory to start over"
        )
    return study


@contextmanager
def _only_tuner(directory: Path) -> Iterator[None]:
    """Hold the tuning directory's lock (the kernel lets go of it when the tuner dies)."""
    with open(directory / "tune.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TuneError(
                f"another marl-ppo tune is running on '{directory}'; wait for it or pass another --out"
            ) from None
        yield


@dataclass
class _Trial:
    """A trial being trained: its seed runs, started or waiting, and the evaluations reported."""

    trial: Any
    runs: list[SweepRun]
    waiting: list[SweepRun]
    handles: dict[str, Handle] = field(default_factory=dict)
    reported: int = 0

    def running(self) -> int:
        return sum(1 for handle in self.handles.values() if handle.poll() is None)

    def stop(self) -> None:
        for handle in self.handles.values():
            handle.stop()


def finished_trials(study: Any) -> list[Any]:
    """The study's trials that are done: complete, pruned or failed."""
    states = import_optuna().trial.TrialState
    return study.get_trials(deepcopy=False, states=(states.COMPLETE, states.PRUNED, states.FAIL))


def run_study(setup: TuneSetup, launcher: Launcher, echo: Callable[[str], None] = print) -> Any:
    """Run the study until it has `setup.trials` finished trials; the study."""
    if setup.jobs < 1:
        raise TuneError(f"--jobs {setup.jobs} must be at least 1")
    optuna = import_optuna()
    study = open_study(setup)
    with _only_tuner(setup.directory):
        active = [
            _take_up(study, setup, frozen)
            for frozen in study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
        ]
        for item in active:
            echo(
                f"trial {item.trial.number}: taken up where it stopped ({item.reported} evaluation(s) reported)"
            )
        try:
            while active or len(finished_trials(study)) < setup.trials:
                slots = setup.jobs - sum(item.running() for item in active)
                for item in active:
                    while item.waiting and slots > 0:
                        run = item.waiting.pop(0)
                        item.handles[run.name] = launcher.start(run)
                        slots -= 1
                asked = len(finished_trials(study)) + len(active)
                if slots > 0 and not any(item.waiting for item in active) and asked < setup.trials:
                    new = _ask(study, setup, echo)
                    if new is not None:
                        active.append(new)
                    continue
                active = [item for item in active if not _advance(study, setup, item, echo)]
                time.sleep(POLL_S)
        finally:
            for item in active:  # stopped: the trials stay RUNNING and are taken up next time
                item.stop()
    return study


def _distributions(space: SearchSpace) -> dict[str, Any]:
    dist = import_optuna().distributions
    found: dict[str, Any] = {}
    for key, dim in space.dimensions.items():
        if isinstance(dim, Choices):
            found[key] = dist.CategoricalDistribution(_labels(dim))
        elif dim.integer:
            found[key] = dist.IntDistribution(
                int(dim.low), int(dim.high), log=dim.log, step=int(dim.step or 1)
            )
        else:
            found[key] = dist.FloatDistribution(dim.low, dim.high, log=dim.log, step=dim.step)
    return found


def _labels(dim: Choices) -> tuple[Any, ...]:
    """Choices as Optuna stores them: scalars as they are, a list or mapping as its YAML text."""
    from marl_ppo.config.keys import yaml_value

    return tuple(
        v if v is None or isinstance(v, bool | int | float | str) else yaml_value(v) for v in dim.values
    )


def trial_overrides(space: SearchSpace, params: dict[str, Any]) -> list[str]:
    """A trial's parameters as overrides, in the space's order (a list choice written back as YAML)."""
    plain = {}
    for key, dim in space.dimensions.items():
        value = params[key]
        if isinstance(dim, Choices) and value not in dim.values:
            value = dim.values[_labels(dim).index(value)]
        plain[key] = value
    return overrides_of(plain)


def _runs(setup: TuneSetup, number: int, overrides: list[str]) -> list[SweepRun]:
    trial_dir = setup.directory / TRIALS_DIR / f"{number:04d}"
    shared = (*setup.fixed, *overrides, *TRIAL_OVERRIDES)
    return [
        SweepRun(f"{number:04d}/seed{seed}", (*shared, f"seed={seed}"), trial_dir / f"seed{seed}")
        for seed in range(setup.seeds)
    ]


def trial_seed(sampler_seed: int, number: int) -> int:
    """The sampler's seed for trial `number`: the two mixed by NumPy's SeedSequence (consecutive small
    seeds of one Mersenne Twister start alike, so `sampler_seed + number` would draw alike trials)."""
    return int(np.random.SeedSequence([sampler_seed, number]).generate_state(1)[0])


def _ask(study: Any, setup: TuneSetup, echo: Callable[[str], None]) -> _Trial | None:
    """A new trial with its runs; None when its draw breaks a rule of the config (it is told failed)."""
    optuna = import_optuna()
    number = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=trial_seed(setup.sampler_seed, number))
    trial = study.ask(_distributions(setup.space))
    overrides = trial_overrides(setup.space, trial.params)
    trial.set_user_attr("overrides", overrides)
    try:
        load_config(setup.experiment, [*setup.fixed, *overrides])
    except ConfigError as err:
        trial.set_user_attr("error", str(err))
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        echo(f"trial {trial.number} failed before training: {err}")
        return None
    runs = _runs(setup, trial.number, overrides)
    return _Trial(trial, runs, list(runs))


def _take_up(study: Any, setup: TuneSetup, frozen: Any) -> _Trial:
    """A trial a stopped tuner left running: its finished runs kept, the others resumed."""
    optuna = import_optuna()
    trial = optuna.trial.Trial(study, frozen._trial_id)
    runs = _runs(setup, frozen.number, trial_overrides(setup.space, frozen.params))
    waiting = [run for run in runs if not is_finished(run.run_dir)]
    return _Trial(trial, runs, waiting, reported=len(frozen.intermediate_values))


def _advance(study: Any, setup: TuneSetup, item: _Trial, echo: Callable[[str], None]) -> bool:
    """Report the trial's new evaluations, prune or finish it; True when it is done."""
    states = import_optuna().trial.TrialState
    number = item.trial.number
    shown = " ".join(
        item.trial.user_attrs.get("overrides") or trial_overrides(setup.space, item.trial.params)
    )
    failed = [
        (name, code) for name, handle in item.handles.items() if (code := handle.poll()) not in (None, 0)
    ]
    if failed:
        item.stop()
        name, code = failed[0]
        log = next(run.log_file for run in item.runs if run.name == name)
        item.trial.set_user_attr("error", f"run {name} exited with status {code}; log {log}")
        study.tell(item.trial, state=states.FAIL)
        echo(f"trial {number} FAILED: run {name} exited with status {code}; log {log}")
        return True
    finished = all(is_finished(run.run_dir) for run in item.runs)  # before the evaluations: a run
    means = [evaluation_means(run.run_dir) for run in item.runs]  # writes its summary after its last
    available = common_evaluations(means)
    while item.reported < available:
        value = trial_score(means, setup.score, upto=item.reported)
        item.trial.report(value, item.reported)
        item.reported += 1
        if item.trial.should_prune():
            item.stop()
            study.tell(item.trial, state=states.PRUNED)
            echo(
                f"trial {number} pruned after evaluation {item.reported}: score {value:.4g} "
                f"({setup.pruner} rule); {shown}"
            )
            return True
    if not finished:
        return False
    if available == 0:
        item.trial.set_user_attr("error", "its runs wrote no evaluations")
        study.tell(item.trial, state=states.FAIL)
        echo(f"trial {number} FAILED: its runs wrote no evaluations (is eval.every set?)")
        return True
    interval = trial_interval(means, setup.score)
    item.trial.set_user_attr("ci95", [interval.low, interval.high])
    study.tell(item.trial, interval.value)
    echo(f"trial {number}: score {interval} (IQM of {setup.seeds} seeds, {setup.score}); {shown}")
    return True
