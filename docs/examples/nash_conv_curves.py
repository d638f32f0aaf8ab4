"""NashConv over training of groups of runs: a table of the last values and a PNG of the curves.

Each group is a label and run directories (the seeds of one configuration); it reads each run's
`eval/nash_conv` (the policy at each periodic evaluation) and `league/pool_nash_conv` (the average of
the pool's snapshots, logged at each snapshot) and draws each group's mean over seeds with its range.

    python docs/examples/nash_conv_curves.py OUT.png "naive=runs/kuhn_naive_s*" "league=runs/kuhn_league_s*"
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import numpy as np

from marl_ppo.analysis.runlogs import scalar_series

TAGS = ("eval/nash_conv", "league/pool_nash_conv")


_READ: dict[Path, dict[str, tuple[np.ndarray, np.ndarray]]] = {}


def _series(run: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Both tags of a run, its event files read once (a long run's are hundreds of MB)."""
    if run not in _READ:
        _READ[run] = scalar_series(run, TAGS)
    return _READ[run]


def curves(run_dirs: list[Path], tag: str) -> tuple[np.ndarray, np.ndarray]:
    """The steps every run logged `tag` at, and the values `(runs, steps)` there."""
    series = [_series(run).get(tag) for run in run_dirs]
    series = [s for s in series if s is not None and len(s[0])]
    if not series:
        return np.zeros(0), np.zeros((0, 0))
    steps = sorted(set.intersection(*(set(s[0].tolist()) for s in series)))
    values = np.array(
        [[dict(zip(s[0].tolist(), s[1].tolist(), strict=True))[t] for t in steps] for s in series]
    )
    return np.array(steps), values


def main(out: str, groups: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn: dict[str, list[tuple[str, np.ndarray, np.ndarray]]] = {tag: [] for tag in TAGS}
    for group in groups:
        label, pattern = group.split("=", 1)
        runs = [Path(p) for p in sorted(glob.glob(pattern))]
        for tag in TAGS:
            steps, values = curves(runs, tag)
            if not len(steps):
                continue
            drawn[tag].append((label, steps, values))
            last = values[:, -1]
            print(
                f"{label:>10} {tag:<24} at {int(steps[-1]):>8} steps: mean {last.mean():.3f} "
                f"(seeds {', '.join(f'{v:.3f}' for v in last)})"
            )
    tags = [tag for tag in TAGS if drawn[tag]] or list(TAGS[:1])  # a panel only for what was logged
    figure, axes = plt.subplots(1, len(tags), figsize=(5.5 * len(tags), 4), sharey=True, squeeze=False)
    axes = axes[0]
    for axis, tag in zip(axes, tags, strict=True):
        for label, steps, values in drawn[tag]:
            axis.plot(steps, values.mean(axis=0), label=f"{label} ({len(values)} seeds)")
            axis.fill_between(steps, values.min(axis=0), values.max(axis=0), alpha=0.2)
        axis.set_title(tag)
        axis.set_xlabel("env steps")
        axis.set_yscale("log")
        axis.grid(alpha=0.3)
        axis.legend()
    axes[0].set_ylabel("NashConv")
    figure.tight_layout()
    figure.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
