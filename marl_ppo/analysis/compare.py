"""`marl-ppo compare`: algorithms over tasks and seeds, scored by the cooperative-MARL evaluation protocol.

From the normalised scores (`analysis/scores.py`): the median, IQM, mean and optimality gap of each
algorithm's absolute metrics over runs and tasks, and the probability that one algorithm improves on
another, each with a 95% stratified-bootstrap confidence interval (rliable, runs resampled within
each task); performance profiles and sample-efficiency curves (IQM at each evaluation) as PNGs; a
Markdown summary; the scores in marl-eval's JSON layout and as CSV.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from marl_ppo.analysis.runlogs import ReportError, display_names, find_run_dirs, read_run
from marl_ppo.analysis.scores import (
    ScoreTable,
    crossplay_scores,
    marl_eval_json,
    score_table,
    unseparated_keys,
    write_scores_csv,
)
from marl_ppo.analysis.stats import global_numpy_seed, interval_estimates, rliable


def is_crossplay(path: Path) -> bool:
    """Whether `path` is a cross-play's results (`crossplay.json`, or a directory holding one)."""
    return path.name == "crossplay.json" or (path / "crossplay.json").is_file()


AGGREGATES = ("median", "iqm", "mean", "optimality_gap")


def aggregate_scores(scores: np.ndarray) -> np.ndarray:
    """`(runs, tasks)` normalised scores -> [median, IQM, mean, optimality gap] (rliable's definitions)."""
    metrics = rliable()[1]
    return np.array(
        [
            metrics.aggregate_median(scores),
            metrics.aggregate_iqm(scores),
            metrics.aggregate_mean(scores),
            metrics.aggregate_optimality_gap(scores, gamma=1),
        ]
    )


def probability_of_improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y): per task, the chance a run of X scores above a run of Y (ties count half), averaged over tasks."""
    return np.array([rliable()[1].probability_of_improvement(x, y)])


@dataclass(frozen=True)
class Interval:
    """A point estimate and its 95% confidence interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


@dataclass(frozen=True)
class Comparison:
    """What `compare` computed: aggregates per algorithm, P(X > Y) per pair, and the files it wrote."""

    table: ScoreTable
    aggregates: dict[str, dict[str, Interval]]
    improvement: dict[tuple[str, str], Interval]
    files: list[Path]
    warning: str | None = None
    """With `--by`: the other config keys the algorithms differ in (see `unseparated_keys`)."""


def aggregates_of(table: ScoreTable, *, reps: int, seed: int) -> dict[str, dict[str, Interval]]:
    """Per algorithm, each of AGGREGATES over its `(runs, tasks)` absolute metrics, with its 95% CI."""
    points, intervals = interval_estimates(table.final_scores(), aggregate_scores, reps=reps, seed=seed)
    return {
        algorithm: {
            name: Interval(
                float(points[algorithm][i]),
                float(intervals[algorithm][0, i]),
                float(intervals[algorithm][1, i]),
            )
            for i, name in enumerate(AGGREGATES)
        }
        for algorithm in table.algorithms
    }


def improvements_of(table: ScoreTable, *, reps: int, seed: int) -> dict[tuple[str, str], Interval]:
    """P(X > Y) with its 95% CI for each pair of algorithms (X listed before Y)."""
    scores = table.final_scores()
    pairs = list(combinations(table.algorithms, 2))
    found = {}
    for x, y in pairs:
        points, intervals = interval_estimates(
            {"pair": (scores[x], scores[y])}, probability_of_improvement, reps=reps, seed=seed
        )
        found[(x, y)] = Interval(
            float(points["pair"][0]), float(intervals["pair"][0, 0]), float(intervals["pair"][1, 0])
        )
    return found


def plot_profiles(table: ScoreTable, path: Path, *, reps: int, seed: int) -> None:
    """Performance profiles: the fraction of runs (over tasks) whose normalised score exceeds tau, with 95% bands."""
    from matplotlib.figure import Figure

    library = rliable()[0]
    taus = np.linspace(0.0, 1.0, 51)
    with global_numpy_seed(seed):  # rliable's profile bootstrap draws from NumPy's global generator
        profiles, bands = library.create_performance_profile(table.final_scores(), taus, reps=reps)
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    for algorithm in table.algorithms:
        (line,) = axes.plot(taus, profiles[algorithm], label=algorithm)
        axes.fill_between(
            taus, bands[algorithm][0], bands[algorithm][1], color=line.get_color(), alpha=0.2, linewidth=0
        )
    axes.set_xlabel(r"normalised score $\tau$")
    axes.set_ylabel(r"fraction of runs with score > $\tau$")
    axes.set_title("performance profiles (absolute metric)", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=120)


def plot_sample_efficiency(table: ScoreTable, path: Path, *, reps: int, seed: int) -> None:
    """IQM over runs and tasks of the normalised evaluation return at each evaluation, with 95% bands."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    metrics = rliable()[1]
    steps, scores = table.curve_scores()

    def iqm_per_step(curves: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(curves[..., k]) for k in range(curves.shape[-1])])

    points, intervals = interval_estimates(scores, iqm_per_step, reps=reps, seed=seed)
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    for algorithm in table.algorithms:
        (line,) = axes.plot(steps, points[algorithm], label=algorithm, marker="o", markersize=3)
        axes.fill_between(
            steps,
            intervals[algorithm][0],
            intervals[algorithm][1],
            color=line.get_color(),
            alpha=0.2,
            linewidth=0,
        )
    shared = all(table.evaluation_steps(task) == list(steps) for task in table.tasks)
    axes.set_xlabel(
        "env steps" if shared else f"env steps of {table.tasks[0]} (the tasks' evaluations in order)"
    )
    axes.xaxis.set_major_formatter(EngFormatter())
    axes.set_ylabel("IQM normalised team return")
    axes.set_title("sample efficiency (periodic evaluations)", fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=120)


def markdown_summary(comparison: Comparison, *, reps: int) -> str:
    """The comparison as Markdown: how it was scored, the aggregates, P(X > Y), per-task returns, figures."""
    table = comparison.table
    seeds = len(table.of(table.tasks[0], table.algorithms[0]))
    lines = [
        "# Comparison",
        "",
        f"{len(table.algorithms)} algorithm(s) x {len(table.tasks)} task(s) x {seeds} seed(s). Each run's score is its "
        "absolute metric (the best evaluated policy replayed with 10x the evaluation episodes; runs without one use "
        "their last evaluation; a cross-play's runs, their episodes with themselves and with the other runs), "
        "min-max normalised per task over every algorithm, run, step and episode. "
        f"Intervals are 95% stratified-bootstrap confidence intervals (rliable, {reps} resamples).",
        "",
        *([f"**Warning**: {comparison.warning}.", ""] if comparison.warning else []),
        "| algorithm | median | IQM | mean | optimality gap (lower is better) |",
        "|---|" + "---|" * len(AGGREGATES),
    ]
    lines += [
        f"| {a} | " + " | ".join(str(comparison.aggregates[a][m]) for m in AGGREGATES) + " |"
        for a in table.algorithms
    ]
    if comparison.improvement:
        lines += ["", "Probability of improvement, P(X > Y):", "", "| X | Y | P(X > Y) |", "|---|---|---|"]
        lines += [f"| {x} | {y} | {p} |" for (x, y), p in comparison.improvement.items()]
    lines += [
        "",
        "Raw team return of the absolute metric (mean over seeds) and the task's normalisation bounds:",
        "",
    ]
    lines += [
        "| task | " + " | ".join(table.algorithms) + " | min | max |",
        "|---|" + "---|" * (len(table.algorithms) + 2),
    ]
    for task in table.tasks:
        means = [np.mean([np.mean(r.absolute) for r in table.of(task, a)]) for a in table.algorithms]
        low, high = table.bounds[task]
        lines.append(f"| {task} | " + " | ".join(f"{m:.2f}" for m in means) + f" | {low:.2f} | {high:.2f} |")
    lines += [
        "",
        "![performance profiles](performance_profiles.png)",
        "",
        "![sample efficiency](sample_efficiency.png)",
    ]
    missing = [r for r in table.runs if not r.has_absolute]
    if missing:
        lines += ["", "Runs without an absolute metric (their last evaluation is used):", ""]
        lines += [f"- {r.run_dir}" for r in missing]
    return "\n".join(lines) + "\n"


def write_comparison(
    paths: Iterable[Path | str],
    out: Path | str,
    *,
    by: Sequence[str] | None = None,
    names: Sequence[str] | None = None,
    reps: int = 5000,
    seed: int = 0,
) -> Comparison:
    """Read the runs under `paths` and write `compare.md`, the two figures, `marl_eval.json` and `scores.csv` into `out`.
    `names`: `NAME=LABEL` display names of algorithms (`MAPPO=ppo.critic=state`)."""
    if reps < 1:
        raise ReportError(f"--reps {reps} must be at least 1")
    rliable()
    given = [Path(path) for path in paths]
    crossplays = [path for path in given if is_crossplay(path)]
    others = [path for path in given if path not in crossplays]
    runs = [read_run(run_dir) for run_dir in find_run_dirs(others)] if others else []
    extra = [scores for path in crossplays for scores in crossplay_scores(path)]
    table = score_table(runs, by, display_names(names), extra)
    warning = unseparated_keys(runs, by) if by else None
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    aggregates = aggregates_of(table, reps=reps, seed=seed)
    improvement = improvements_of(table, reps=min(reps, 2000), seed=seed)
    files = [
        out / name
        for name in (
            "compare.md",
            "performance_profiles.png",
            "sample_efficiency.png",
            "marl_eval.json",
            "scores.csv",
        )
    ]
    plot_profiles(table, files[1], reps=min(reps, 2000), seed=seed)
    plot_sample_efficiency(table, files[2], reps=min(reps, 2000), seed=seed)
    files[3].write_text(json.dumps(marl_eval_json(table), indent=1) + "\n")
    write_scores_csv(table, files[4])
    comparison = Comparison(table, aggregates, improvement, files, warning)
    files[0].write_text(markdown_summary(comparison, reps=reps))
    return comparison
