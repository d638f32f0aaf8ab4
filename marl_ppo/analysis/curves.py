"""Learning curves: each run's returns on a common grid of env steps, mean over seeds with a 95% band."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from marl_ppo.analysis.runlogs import Configuration, ReportError
from marl_ppo.analysis.stats import interval_estimates

CURVE_BINS = 50
"""Training-episode returns are averaged over this many equal spans of env steps."""


def curve_tag(configurations: Sequence[Configuration]) -> str:
    """`eval/team_return` when every run of the experiment was evaluated, else the training episodes'."""
    runs = [run for config in configurations for run in config.runs]
    return "eval/team_return" if all(run.has("eval/team_return") for run in runs) else "rollout/team_return"


def binned_curve(
    steps: np.ndarray, values: np.ndarray, edges: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """Mean of the values in each span `(edges[k], edges[k+1]]`, each value counted `weights` times
    (the episodes behind an update's mean; once without); empty spans interpolated from their neighbours."""
    index = np.searchsorted(edges, steps, side="left") - 1
    inside = (index >= 0) & (index < len(edges) - 1)
    weight = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=np.float64)
    sums = np.bincount(index[inside], weights=values[inside] * weight[inside], minlength=len(edges) - 1)
    counts = np.bincount(index[inside], weights=weight[inside], minlength=len(edges) - 1)
    centers = (edges[:-1] + edges[1:]) / 2
    filled = counts > 0
    curve: np.ndarray = np.interp(centers, centers[filled], sums[filled] / counts[filled])
    return curve


def configuration_curves(config: Configuration, tag: str) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, `(seeds, points)` returns) of a configuration's runs on one grid up to their common end."""
    usable = [run for run in config.runs if run.has(tag)]
    if not usable:
        raise ReportError(f"configuration '{config.label}' has no run with {tag}")
    end = min(int(run.series[tag][0][-1]) for run in usable)
    if tag == "eval/team_return":
        grid = usable[0].series[tag][0].astype(np.float64)
        grid = grid[grid <= end]
        return grid, np.stack([np.interp(grid, *run.series[tag]) for run in usable])
    edges = np.linspace(0.0, end, CURVE_BINS + 1)
    curves = np.stack([binned_curve(*run.series[tag], edges, run.episode_counts(tag)) for run in usable])
    return (edges[:-1] + edges[1:]) / 2, curves


def mean_band(curves: np.ndarray, *, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (rows) at each point, with its 95% bootstrap interval over seeds (rliable)."""
    scores = curves[:, None, :]  # (seeds, 1 task, points)
    points, intervals = interval_estimates(
        {"curve": scores}, lambda x: x.mean(axis=(0, 1)), reps=reps, seed=seed
    )
    return points["curve"], intervals["curve"][0], intervals["curve"][1]


def plot_experiment(
    experiment: str, configurations: Sequence[Configuration], path: Path, *, reps: int, seed: int
) -> None:
    """One PNG: a line (mean over seeds) and a 95% band per configuration, against env steps."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import EngFormatter

    tag = curve_tag(configurations)
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.subplots()
    for config in configurations:
        steps, curves = configuration_curves(config, tag)
        mean, low, high = mean_band(curves, reps=reps, seed=seed)
        (line,) = axes.plot(
            steps,
            mean,
            label=f"{config.label} ({len(curves)} seed{'' if len(curves) == 1 else 's'})",
            marker="o" if tag.startswith("eval/") else None,  # each evaluation is a point; bins are not
            markersize=3,
        )
        axes.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    source = "deterministic evaluation" if tag.startswith("eval/") else "training episodes"
    axes.set_xlabel("env steps")
    axes.xaxis.set_major_formatter(EngFormatter())  # 200k, 1M rather than 200000, 1000000
    axes.set_ylabel(f"team return (sum over agents), {source}")
    axes.set_title(experiment, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=120)
