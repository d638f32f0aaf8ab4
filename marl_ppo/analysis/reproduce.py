"""`marl-ppo reproduce`: train an experiment's seeds through the sweep runner, check the band it promises.

The experiment file's `expected: {steps: N, seeds: K, team_return: [low, high]}` says what its
result is: the interquartile mean over seeds 0..K-1 of the final team return (each run's mean over
its last `log.return_window` training episodes, as `summary.json` and `report` give it) after N env
steps lies in [low, high]. `eval: {TAG: [low, high]}` bands the last periodic evaluation's value of
`eval/TAG` the same way: a game's win rate against random opponents, where the team return is 0. Runs go to `<out>/<experiment>/seed<k>` as sweep runs do, so finished
runs of the same config are reused and runs of another config are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from marl_ppo.analysis.report import Estimate, iqm_estimates
from marl_ppo.analysis.runlogs import last_values
from marl_ppo.analysis.stats import rliable
from marl_ppo.analysis.sweep import SweepError, SweepOutcome, default_jobs, plan_sweep, run_sweep
from marl_ppo.config import load_config
from marl_ppo.run.code_record import code_label
from marl_ppo.run.rundir import read_summary


@dataclass(frozen=True)
class Check:
    """One promised figure: its name, band, each seed's value and their IQM with its 95% CI."""

    metric: str
    """`team_return` (training episodes), or `eval/TAG` for a band on the last evaluation."""
    band: tuple[float, float]
    values: tuple[float, ...]
    """Each seed's value, seed 0 first."""
    estimate: Estimate

    @property
    def inside(self) -> bool:
        """Whether the IQM over seeds lies in the band (bounds included)."""
        return self.band[0] <= self.estimate.iqm <= self.band[1]


@dataclass(frozen=True)
class Reproduction:
    """The measured figures beside the bands the experiment file promises."""

    name: str
    steps: int
    checks: tuple[Check, ...]
    """The team return's band first (where the file has one), then the evaluation's, in file order."""

    @property
    def inside(self) -> bool:
        """Whether every figure lies in its band."""
        return all(check.inside for check in self.checks)

    def lines(self) -> list[str]:
        """One line per figure: the IQM with its 95% CI, the band, and the verdict."""
        out = []
        for check in self.checks:
            e, (low, high) = check.estimate, check.band
            ci = f" [95% CI {e.low:.2f}, {e.high:.2f}]" if e.seeds > 1 else ""
            what = "team return" if check.metric == "team_return" else check.metric
            out.append(
                f"reproduce {self.name}: {what} IQM {e.iqm:.2f}{ci} over {e.seeds} seed(s) at "
                f"{self.steps:,} env steps; expected [{low:.2f}, {high:.2f}]: "
                + ("inside" if check.inside else "OUTSIDE")
            )
        return out


def _finished_summary(run_dir: Path) -> dict[str, Any]:
    """The summary of a run the sweep reported finished."""
    summary = read_summary(run_dir)
    if summary is None:
        raise SweepError(f"run '{run_dir}' ended without its summary.json; remove it and reproduce again")
    return summary


def reproduce(
    experiment: Path,
    *,
    seeds: int | None = None,
    jobs: int | None = None,
    out: Path = Path("runs/reproduce"),
    echo: Callable[[str], None] = print,
) -> tuple[Reproduction | None, SweepOutcome]:
    """Train the seeds the experiment's `expected:` block names (or `seeds`), then measure them against it.

    Returns no Reproduction when a run failed (the outcome names it and its log).
    """
    config = load_config(experiment)
    expected = config.expected
    if expected is None:
        raise SweepError(
            f"experiment file '{experiment}' has no expected: block; add one, e.g. "
            "expected: {steps: 1_000_000, seeds: 3, team_return: [-36, -29]}"
        )
    if expected.eval and not config.eval.every:  # train ignores expected:, so only reproduce checks it
        raise SweepError(
            f"experiment file '{experiment}': expected.eval bands the last periodic evaluation, but "
            "eval.every is not set; set eval.every (env steps between evaluations) or drop expected.eval"
        )
    if expected.league and config.league.opponents is None:
        raise SweepError(
            f"experiment file '{experiment}': expected.league bands what a league run logs, but "
            "league.opponents is not set; set it (latest keeps self-play as it is) or drop expected.league"
        )
    rliable()  # a missing extra fails before hours of training
    runs, config = plan_sweep(
        experiment, {"total_steps": [str(expected.steps)]}, seeds or expected.seeds, out
    )
    jobs = jobs if jobs is not None else min(default_jobs(config), len(runs))
    echo(
        f"reproduce {experiment.stem}: {len(runs)} seed(s) of {expected.steps:,} env steps, {jobs} at a time, in {out / experiment.stem}"
    )
    outcome = run_sweep(experiment, runs, jobs, echo)
    if outcome.failed:
        return None, outcome
    figures: dict[str, tuple[tuple[float, float], tuple[float, ...]]] = {}
    if expected.team_return is not None:
        returns = tuple(float(_finished_summary(run.run_dir)["team_return_mean"]) for run in runs)
        figures["team_return"] = (expected.team_return, returns)
    for section, bands, example in (
        (
            "eval",
            expected.eval,
            "the periodic evaluation writes (see the run's TensorBoard), e.g. vs_random/win_rate",
        ),
        ("league", expected.league, "the league writes at each snapshot, e.g. pool_nash_conv"),
    ):
        if not bands:
            continue
        per_run = [last_values(run.run_dir, [f"{section}/{tag}" for tag in bands]) for run in runs]
        for tag, band in bands.items():
            values = [logged[f"{section}/{tag}"] for logged in per_run]
            missing = [run.name for run, value in zip(runs, values, strict=True) if value is None]
            if missing:
                raise SweepError(
                    f"expected.{section} names '{section}/{tag}', which {', '.join(missing)} never logged; "
                    f"name a tag {example}"
                )
            figures[f"{section}/{tag}"] = (band, tuple(float(v) for v in values if v is not None))
    codes = [code_label(run.run_dir) for run in runs]
    if len(set(codes)) > 1:  # finished runs of older code were reused beside new ones
        echo(
            "warning: the seeds were trained by different code ("
            + ", ".join(f"{run.name} {code}" for run, code in zip(runs, codes, strict=True))
            + "); `marl-ppo report` keeps them apart, and a new --out trains every seed with today's"
        )
    estimates = iqm_estimates({metric: values for metric, (_, values) in figures.items()}, reps=2000, seed=0)
    checks = tuple(
        Check(metric, band, values, estimates[metric]) for metric, (band, values) in figures.items()
    )
    return Reproduction(experiment.stem, expected.steps, checks), outcome
