"""`marl-ppo report`: returns per configuration across seeds, as a Markdown table and learning curves.

Per run: the final training return, the final and the best evaluation return. Across a
configuration's seeds, each seed counted once (a run of the same configuration and seed as another,
e.g. a sweep repeated into another directory, is listed as a duplicate and not counted): the interquartile mean (IQM) with a 95% stratified-bootstrap confidence
interval, computed with rliable. Curves: the mean over seeds with a 95% bootstrap band over env
steps, one PNG per experiment, one line per configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marl_ppo.analysis.runlogs import (
    Configuration,
    ReportError,
    RunLog,
    display_names,
    file_stem,
    find_run_dirs,
    group_configurations,
    last_step,
    read_run,
    renamed,
)
from marl_ppo.analysis.stats import interval_estimates, iqm, rliable

METRICS = {
    "final_return": (
        "final return",
        "the mean team return of the run's last `log.return_window` training episodes (`rollout/team_return`)",
    ),
    "final_eval": ("final eval return", "the team return of the run's last evaluation (`eval/team_return`)"),
    "max_eval": ("max eval return", "the best team return over the run's evaluations (`eval/team_return`)"),
}


@dataclass(frozen=True)
class Estimate:
    """IQM over seeds with the bounds of its 95% confidence interval."""

    iqm: float
    low: float
    high: float
    seeds: int


@dataclass(frozen=True)
class ReportRow:
    """One configuration's line of the table: per metric, the estimate (None when no run logged it)."""

    configuration: Configuration
    env_steps: int
    estimates: dict[str, Estimate | None]


@dataclass(frozen=True)
class ReportFiles:
    """What `write_report` wrote."""

    markdown: Path
    figures: list[Path]
    rows: list[ReportRow]


def run_metrics(run: RunLog) -> dict[str, float]:
    """The run's final training return and, when it was evaluated, its final and best eval return."""
    metrics = {}
    if run.has("rollout/team_return"):
        window = int((run.config.get("log") or {}).get("return_window", 100))
        metrics["final_return"] = run.last_episodes_mean("rollout/team_return", window)
    if run.has("eval/team_return"):
        values = run.series["eval/team_return"][1]
        metrics["final_eval"], metrics["max_eval"] = float(values[-1]), float(values.max())
    return metrics


def iqm_estimates(scores: dict[str, Sequence[float]], *, reps: int, seed: int) -> dict[str, Estimate]:
    """Per key, the IQM of the per-seed scores and its 95% stratified-bootstrap CI (rliable)."""
    matrices = {name: np.asarray(values, dtype=np.float64).reshape(-1, 1) for name, values in scores.items()}
    points, intervals = interval_estimates(matrices, iqm, reps=reps, seed=seed)
    return {
        name: Estimate(
            float(points[name][0]),
            float(intervals[name][0, 0]),
            float(intervals[name][1, 0]),
            len(scores[name]),
        )
        for name in scores
    }


def summarize(configurations: Sequence[Configuration], *, reps: int, seed: int) -> list[ReportRow]:
    """One row per configuration: the IQM and CI across its seeds of each metric its runs logged."""
    per_run = [[run_metrics(run) for run in config.runs] for config in configurations]
    estimates: list[dict[str, Estimate | None]] = [dict.fromkeys(METRICS) for _ in configurations]
    for metric in METRICS:
        scores = {str(i): [m[metric] for m in runs if metric in m] for i, runs in enumerate(per_run)}
        found = iqm_estimates({k: v for k, v in scores.items() if v}, reps=reps, seed=seed)
        for key, estimate in found.items():
            estimates[int(key)][metric] = estimate
    return [
        ReportRow(config, min(last_step(run) for run in config.runs), estimate)
        for config, estimate in zip(configurations, estimates, strict=True)
    ]


def _cell(estimate: Estimate | None) -> str:
    if estimate is None:
        return "–"
    if estimate.seeds < 2:
        return f"{estimate.iqm:.2f} (one seed)"
    return f"{estimate.iqm:.2f} [{estimate.low:.2f}, {estimate.high:.2f}]"


def markdown_report(rows: Sequence[ReportRow], figures: dict[str, Path], *, reps: int) -> str:
    """The report: how numbers are computed, then per experiment a table, its curves and its run dirs."""
    lines = [
        "# Results",
        "",
        "Team return is the sum over agents of an episode's rewards. Per run, "
        + "; ".join(f"**{name}** is {doc}" for name, doc in METRICS.values())
        + ". Each cell is the interquartile mean (IQM: the mean of the middle 50% of seeds; with fewer "
        f"than 4 seeds no seed is trimmed) over the configuration's seeds, with its 95% stratified-bootstrap "
        f"confidence interval (rliable, {reps} resamples). Env steps count one step of one env copy once.",
    ]
    for experiment in dict.fromkeys(row.configuration.experiment for row in rows):
        group = [row for row in rows if row.configuration.experiment == experiment]
        lines += ["", f"## {experiment}", ""]
        lines.append(
            "| configuration | seeds | env steps | " + " | ".join(n for n, _ in METRICS.values()) + " |"
        )
        lines.append("|---|---|---|" + "---|" * len(METRICS))
        for row in group:
            cells = [_cell(row.estimates[m]) for m in METRICS]
            config = row.configuration
            lines.append(
                f"| {config.label} | {len(config.runs)} | {row.env_steps:,} | " + " | ".join(cells) + " |"
            )
        if experiment in figures:
            lines += ["", f"![learning curves of {experiment}]({figures[experiment].name})"]
        lines += ["", "Runs:", ""]
        lines += [
            f"- {row.configuration.label}: " + ", ".join(str(r.run_dir) for r in row.configuration.runs)
            for row in group
        ]
        repeated = [row.configuration for row in group if row.configuration.duplicates]
        if repeated:
            lines += ["", "Not counted: runs of the same configuration and seed as a run above:", ""]
            lines += [
                f"- {config.label}: "
                + ", ".join(f"{r.run_dir} (seed {r.config.get('seed')})" for r in config.duplicates)
                for config in repeated
            ]
    return "\n".join(lines) + "\n"


def write_report(
    paths: Iterable[Path | str],
    out: Path | str,
    *,
    reps: int = 5000,
    seed: int = 0,
    by_code: bool = True,
    names: Sequence[str] | None = None,
) -> ReportFiles:
    """Read the runs under `paths`, write `report.md` and one `curves_<experiment>.png` per experiment into `out`.

    Runs trained by different code (package version and tree, see `code.json`) are different
    configurations unless `by_code=False`. `names`: `NAME=LABEL` display names of configurations.
    """
    from marl_ppo.analysis.curves import plot_experiment

    if reps < 1:
        raise ReportError(f"--reps {reps} must be at least 1")
    rliable()  # a missing extra fails before the (slow) reading of event files
    runs = [read_run(run_dir) for run_dir in find_run_dirs(paths)]
    logged = [run for run in runs if run.series]
    if not logged:
        raise ReportError("none of the runs logged rollout/team_return or eval/team_return yet")
    configurations = group_configurations(logged, by_code=by_code)
    named, labels = display_names(names), [config.label for config in configurations]
    configurations = [
        dataclasses.replace(config, label=renamed(config.label, named, labels)) for config in configurations
    ]
    rows = summarize(configurations, reps=reps, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figures = {}
    for experiment in dict.fromkeys(config.experiment for config in configurations):
        members = [config for config in configurations if config.experiment == experiment]
        path = out / f"curves_{file_stem(experiment)}.png"
        plot_experiment(experiment, members, path, reps=min(reps, 2000), seed=seed)
        figures[experiment] = path
    markdown = out / "report.md"
    markdown.write_text(markdown_report(rows, figures, reps=reps))
    return ReportFiles(markdown, list(figures.values()), rows)
