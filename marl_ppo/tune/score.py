"""A trial's score: the IQM over its seeds of each seed's periodic evaluations, with a bootstrap CI.

Each seed's run writes `evaluations.jsonl`, one line per periodic evaluation with that evaluation's
mean team return. A seed's score under the `curve` rule is the mean of its evaluations so far (the
area under its learning curve: learning early counts, and one lucky evaluation counts little);
under the `final` rule it is its latest evaluation. The trial's score is the interquartile mean of
its seeds' scores (rliable's IQM: the mean of the middle 50%, so with fewer than four seeds the mean
of all), and its 95% interval is the stratified bootstrap over seeds. The intermediate score after
evaluation k, which the pruner reads, is the same IQM over the seeds' first k + 1 evaluations.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from marl_ppo.analysis.compare import Interval
from marl_ppo.analysis.stats import interval_estimates, iqm
from marl_ppo.run.protocol import read_evaluations

SCORE_RULES = ("curve", "final")
"""How a seed's evaluations make its score: their mean (`curve`) or the latest one (`final`)."""
BOOTSTRAP_REPS = 2000
"""Bootstrap resamples of a trial's interval."""


def evaluation_means(run_dir: Path) -> list[float]:
    """The mean team return of each periodic evaluation a run has written, in order."""
    return [float(entry["team_return_mean"]) for entry in read_evaluations(run_dir)]


def seed_score(means: Sequence[float], rule: str) -> float:
    """One seed's score from its evaluations' mean team returns under `rule` (see SCORE_RULES)."""
    if not means:
        raise ValueError("a seed's score needs at least one evaluation")
    if rule == "curve":
        return float(np.mean(means))
    if rule == "final":
        return float(means[-1])
    raise ValueError(f"score rule {rule!r} is not one of {', '.join(SCORE_RULES)}")


def trial_score(seeds: Sequence[Sequence[float]], rule: str, upto: int | None = None) -> float:
    """IQM over seeds of each seed's score from its evaluations (its first `upto + 1` only, when given)."""
    cut = None if upto is None else upto + 1
    scores = np.array([[seed_score(means[:cut], rule)] for means in seeds])
    return float(iqm(scores)[0])


def trial_interval(seeds: Sequence[Sequence[float]], rule: str, *, seed: int = 0) -> Interval:
    """The trial's score and its 95% stratified-bootstrap interval over seeds."""
    scores = np.array([[seed_score(means, rule)] for means in seeds])
    points, intervals = interval_estimates({"trial": scores}, iqm, reps=BOOTSTRAP_REPS, seed=seed)
    return Interval(
        float(points["trial"][0]), float(intervals["trial"][0, 0]), float(intervals["trial"][1, 0])
    )


def common_evaluations(seeds: Sequence[Sequence[float]]) -> int:
    """How many evaluations every seed has written (the intermediate scores that can be reported)."""
    return min((len(means) for means in seeds), default=0)
