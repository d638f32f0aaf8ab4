"""Runs of several algorithms over several tasks and seeds, as the evaluation protocol scores them.

A task is the env id a run trained on (its family is marl-eval's environment, the rest its task);
an algorithm is what sets runs of one task apart other than their seed: the config keys that vary
among a task's runs (or the keys `--by` names), read the same way on every task. Each run
contributes its periodic evaluations' episode returns (`evaluations.jsonl`, or the mean
`eval/team_return` of older runs) and its absolute metric (`absolute_metric.json`; without one, its
last evaluation stands in). Scores are min-max normalised per task over every algorithm, run, step
and episode, as marl-eval does.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from marl_ppo.analysis.runlogs import (
    CHECK_KEYS,
    EXECUTION_KEYS,
    ReportError,
    RunLog,
    experiment_name,
    flatten_config,
    renamed,
    without_keys,
)
from marl_ppo.run.protocol import read_absolute_metric, read_evaluations

TASK_KEYS = (
    "env.",
    "total_steps",
    "eval.",
)
"""Config keys that belong to the task (its env and budget), not to the algorithm."""


@dataclass(frozen=True)
class RunScores:
    """One run's evaluation returns: per evaluation, its env step and episodes' team returns."""

    task: str
    algorithm: str
    seed: int
    run_dir: Path
    steps: tuple[int, ...]
    returns: tuple[tuple[float, ...], ...]
    absolute: tuple[float, ...]
    """The absolute metric's episodes (the last evaluation's where the run has none)."""
    has_absolute: bool

    @property
    def env(self) -> str:
        """marl-eval's environment: the family of the env id (`mpe2` of `mpe2/simple_spread_v3`)."""
        return self.task.split("/")[0] if "/" in self.task else self.task

    @property
    def task_name(self) -> str:
        """marl-eval's task: the env id without its family."""
        return self.task.split("/", 1)[1] if "/" in self.task else self.task


def run_scores(run: RunLog, task: str, algorithm: str) -> RunScores:
    """A run's evaluations read from its directory; a ReportError when it was never evaluated."""
    entries = read_evaluations(run.run_dir)
    if entries:
        steps = tuple(int(e["step"]) for e in entries)
        returns = tuple(tuple(float(x) for x in e["team_return"]) for e in entries)
    elif run.has("eval/team_return"):  # an older run: the mean of each evaluation only
        points, values = run.series["eval/team_return"]
        steps, returns = tuple(int(s) for s in points), tuple((float(v),) for v in values)
    else:
        raise ReportError(
            f"run '{run.run_dir}' has no evaluations; compare needs runs trained with eval.every (e.g. eval.every=20000)"
        )
    absolute = read_absolute_metric(run.run_dir)
    return RunScores(
        task=task,
        algorithm=algorithm,
        seed=int(run.config.get("seed", 0)),
        run_dir=run.run_dir,
        steps=steps,
        returns=returns,
        absolute=tuple(absolute["per_episode"]["team_return"]) if absolute else returns[-1],
        has_absolute=absolute is not None,
    )


def crossplay_scores(path: Path) -> list[RunScores]:
    """A cross-play's results (`marl-ppo crossplay`) as runs of two algorithms on its env: each run's
    episodes with itself (`self-play`) and with the other runs (`cross-play`), one evaluation each."""
    from marl_ppo.league.crossplay import read_crossplay, self_and_cross

    data = read_crossplay(path)
    seeds = {row: rank for rank, row in enumerate(data["rows"])}
    dirs = dict(zip(data["rows"], data["run_dirs"], strict=True))
    return [
        RunScores(
            task=str(data["env"]),
            algorithm=algorithm,
            seed=seeds[row],
            run_dir=Path(dirs[row]),
            steps=(0,),
            returns=(tuple(returns),),
            absolute=tuple(returns),
            has_absolute=True,
        )
        for row, algorithm, returns in self_and_cross(data)
    ]


def _algorithm_keys(runs: Sequence[RunLog]) -> list[str]:
    """Config keys (not of the task, seed or execution) whose values differ among one task's runs."""
    by_task: dict[str, list[dict[str, str]]] = {}
    for run in runs:
        kept = without_keys(run.config, (*EXECUTION_KEYS, *CHECK_KEYS))
        flat = {k: v for k, v in flatten_config(kept).items() if not k.startswith(TASK_KEYS)}
        by_task.setdefault(experiment_name(run.config), []).append(flat)
    varying: set[str] = set()
    for flats in by_task.values():
        keys = {key for flat in flats for key in flat}
        varying |= {key for key in keys if len({flat.get(key) for flat in flats}) > 1}
    return sorted(varying)


def _value(flat: dict[str, str], key: str) -> str:
    value = json.loads(flat[key]) if key in flat else None
    if isinstance(value, list):
        return "[" + " ".join(str(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) or value is None else str(value)


def algorithm_labels(runs: Sequence[RunLog], by: Sequence[str] | None = None) -> list[str]:
    """Each run's algorithm: `key=value` of the keys that set a task's runs apart (or of `by`), joined
    by spaces (no commas: marl-eval refuses them); `default` where nothing differs."""
    keys = list(by) if by else _algorithm_keys(runs)
    labels = []
    for run in runs:
        flat = flatten_config(run.config)
        unknown = [key for key in keys if key not in flat]
        if by and unknown:
            from marl_ppo.config import MOVED_KEYS

            moved = f" (moved to {MOVED_KEYS[unknown[0]]})" if unknown[0] in MOVED_KEYS else ""
            raise ReportError(
                f"--by {','.join(by)}: run '{run.run_dir}' has no config key {unknown[0]}{moved}"
            )
        labels.append(" ".join(f"{key}={_value(flat, key)}" for key in keys) or "default")
    return labels


def unseparated_keys(runs: Sequence[RunLog], by: Sequence[str]) -> str | None:
    """With `--by`, a one-line warning naming the other config keys (not of the task, seed or
    execution) whose values differ among a task's runs, with each algorithm's values: a difference
    the comparison credits to `by`. None when the runs differ in `by` only."""
    others = [key for key in _algorithm_keys(runs) if key not in by]
    if not others:
        return None
    labels = algorithm_labels(runs, by)
    described = []
    for key in others:
        values: dict[str, list[str]] = {}
        for run, label in zip(runs, labels, strict=True):
            flat = flatten_config(run.config)
            shown = _value(flat, key) if key in flat else "unset"
            if shown not in values.setdefault(label, []):
                values[label].append(shown)
        described.append(f"{key} (" + "; ".join(f"{','.join(vs)} for {a}" for a, vs in values.items()) + ")")
    wanted = ",".join([*by, *others])
    return (
        f"--by {','.join(by)}: the runs also differ in {', '.join(described)}, which this comparison "
        f"credits to {','.join(by)}; compare runs that differ only there, or name every difference with --by {wanted}"
    )


@dataclass(frozen=True)
class ScoreTable:
    """Every run's scores, by task and algorithm, with each task's normalisation bounds."""

    runs: tuple[RunScores, ...]
    tasks: tuple[str, ...]
    algorithms: tuple[str, ...]
    bounds: dict[str, tuple[float, float]]
    """Per task, the lowest and highest episode return of any algorithm, run and step."""

    def of(self, task: str, algorithm: str) -> list[RunScores]:
        """The runs of `algorithm` on `task`, by seed."""
        return sorted(
            (r for r in self.runs if r.task == task and r.algorithm == algorithm), key=lambda r: r.seed
        )

    def normalised(self, task: str, values: np.ndarray) -> np.ndarray:
        """(x - min) / (max - min + 1e-6) with the task's bounds (marl-eval's normalisation)."""
        low, high = self.bounds[task]
        result: np.ndarray = (values - low) / (high - low + 1e-6)
        return result

    def final_scores(self) -> dict[str, np.ndarray]:
        """Per algorithm, `(runs, tasks)`: each run's normalised absolute metric (its mean over episodes)."""
        return {
            algorithm: np.stack(
                [
                    [
                        float(self.normalised(task, np.asarray(r.absolute)).mean())
                        for r in self.of(task, algorithm)
                    ]
                    for task in self.tasks
                ],
                axis=1,
            )
            for algorithm in self.algorithms
        }

    def evaluation_steps(self, task: str) -> list[int]:
        """The env steps of `task` at which every run of it was evaluated, as many on every task
        (marl-eval reads the same number of evaluations everywhere): the first ones."""
        length = min(len(self.common_steps(t)) for t in self.tasks)
        return self.common_steps(task)[:length]

    def curve_scores(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(env steps, per algorithm `(runs, tasks, evaluations)`): normalised mean returns at each of
        the `evaluation_steps` (the first task's steps on the x axis)."""
        scores = {}
        for algorithm in self.algorithms:
            per_task = []
            for task in self.tasks:
                steps = self.evaluation_steps(task)
                rows = []
                for r in self.of(task, algorithm):
                    means = {s: float(np.mean(v)) for s, v in zip(r.steps, r.returns, strict=True)}
                    rows.append(self.normalised(task, np.array([means[s] for s in steps])))
                per_task.append(np.stack(rows))
            scores[algorithm] = np.stack(per_task, axis=1)
        return np.array(self.evaluation_steps(self.tasks[0]), dtype=np.int64), scores

    def common_steps(self, task: str) -> list[int]:
        """The env steps at which every run of `task` was evaluated."""
        sets = [set(r.steps) for r in self.runs if r.task == task]
        return sorted(set.intersection(*sets))


def score_table(
    runs: Sequence[RunLog],
    by: Sequence[str] | None = None,
    names: dict[str, str] | None = None,
    extra: Sequence[RunScores] = (),
) -> ScoreTable:
    """The runs' scores (and `extra` ones, a cross-play's), checked to be a full table: every algorithm
    on every task, the same seed count. `names` gives algorithms display names ({label: name},
    `runlogs.display_names`)."""
    labels = algorithm_labels(runs, by) if runs else []
    labels = [renamed(label, names or {}, labels) for label in labels]
    scores = tuple(
        run_scores(run, experiment_name(run.config), label) for run, label in zip(runs, labels, strict=True)
    ) + tuple(
        RunScores(**{**vars(r), "algorithm": (names or {}).get(r.algorithm, r.algorithm)}) for r in extra
    )
    tasks = tuple(dict.fromkeys(s.task for s in scores))
    algorithms = tuple(dict.fromkeys(s.algorithm for s in scores))
    counts = {
        (t, a): sum(1 for s in scores if s.task == t and s.algorithm == a) for t in tasks for a in algorithms
    }
    if len(set(counts.values())) != 1 or 0 in counts.values():
        shown = "; ".join(f"{a} on {t}: {n}" for (t, a), n in counts.items())
        raise ReportError(
            f"compare needs every algorithm on every task with the same number of seeds, got {shown}; "
            "add the missing runs, or pass --by KEY to say what sets the algorithms apart"
        )
    bounds = {}
    for task in tasks:
        values = np.concatenate(
            [
                np.concatenate([np.ravel(v) for v in (*s.returns, s.absolute)])
                for s in scores
                if s.task == task
            ]
        )
        bounds[task] = (float(values.min()), float(values.max()))
    return ScoreTable(scores, tasks, algorithms, bounds)


def marl_eval_json(table: ScoreTable) -> dict[str, Any]:
    """marl-eval's layout: env -> task -> algorithm -> run -> `step_<k>` {step_count, return: [episodes]},
    and `absolute_metrics` {return: [episodes]}, at the `evaluation_steps` of each task.

    Runs are keyed `run_<rank>` by seed order (as the score matrices' rows): marl-eval reads every
    algorithm and task by the first one's run keys, which seed values would break wherever
    algorithms ran different seeds (scores.csv keeps the seeds)."""
    data: dict[str, Any] = {}
    for task in table.tasks:
        steps = table.evaluation_steps(task)
        for algorithm in table.algorithms:
            for rank, r in enumerate(table.of(task, algorithm)):
                by_step = dict(zip(r.steps, r.returns, strict=True))
                record: dict[str, Any] = {
                    f"step_{k}": {"step_count": step, "return": list(by_step[step])}
                    for k, step in enumerate(steps)
                }
                record["absolute_metrics"] = {"return": list(r.absolute)}
                runs = data.setdefault(r.env, {}).setdefault(r.task_name, {}).setdefault(algorithm, {})
                runs[f"run_{rank}"] = record
    return data


CSV_HEADER = ("env", "task", "algorithm", "seed", "step", "episodes", "return_mean", "normalised_return_mean")


def write_scores_csv(table: ScoreTable, path: Path) -> None:
    """One row per run and evaluation (`step` is the env step, or `absolute` for the absolute metric)."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_HEADER)
        for r in table.runs:
            points = [*zip(r.steps, r.returns, strict=True), ("absolute", r.absolute)]
            for step, values in points:
                mean = float(np.mean(values))
                normalised = float(table.normalised(r.task, np.asarray(values)).mean())
                writer.writerow(
                    (r.env, r.task_name, r.algorithm, r.seed, step, len(values), mean, normalised)
                )
