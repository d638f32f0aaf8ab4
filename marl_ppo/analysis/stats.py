"""Statistics across seeds through rliable: the IQM and stratified-bootstrap confidence intervals."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from marl_ppo.analysis.runlogs import ReportError


def rliable() -> tuple[Any, Any]:
    """rliable's `library` and `metrics` modules, or a ReportError naming the extra to install."""
    try:
        from rliable import library, metrics
    except ImportError:
        raise ReportError(
            "marl-ppo report needs rliable and matplotlib; install them with pip install 'marl-ppo[report]'"
        ) from None
    return library, metrics


def iqm(scores: np.ndarray) -> np.ndarray:
    """Interquartile mean of all the scores (25% trimmed from each end), as a one-element array."""
    return np.array([rliable()[1].aggregate_iqm(scores)])


def interval_estimates(
    scores: Mapping[str, np.ndarray | tuple[np.ndarray, ...]],
    statistic: Callable[..., np.ndarray],
    *,
    reps: int,
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Point estimates and 95% stratified-bootstrap intervals (`(2, ...)`: low, high) of `statistic`.

    Each score array is `(runs, tasks, ...)`; runs are resampled within each task. A tuple of arrays
    (two algorithms' scores) is resampled array by array and passed to `statistic` as its arguments.
    """
    library, _ = rliable()
    with warnings.catch_warnings():  # arch warns about the random_state argument rliable passes it
        warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
        estimates: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = library.get_interval_estimates(
            scores, statistic, reps=reps, random_state=np.random.RandomState(seed)
        )
    return estimates
