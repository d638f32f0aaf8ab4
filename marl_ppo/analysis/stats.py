"""Statistics across seeds through rliable: the IQM and stratified-bootstrap confidence intervals."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping
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


@contextlib.contextmanager
def global_numpy_seed(seed: int) -> Iterator[None]:
    """NumPy's global generator seeded with `seed` inside the block and put back as it was after it.

    rliable's bootstraps draw from the global generator (`np.random.choice`) whatever `random_state`
    they are given, so an interval is reproducible from its seed only inside this block.
    """
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


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
    The intervals depend on `seed` alone, not on NumPy's global generator, which is left as it was.
    """
    library, _ = rliable()
    with global_numpy_seed(seed), warnings.catch_warnings():  # arch warns of the random_state rliable passes
        warnings.filterwarnings("ignore", message="random_state is deprecated", category=FutureWarning)
        estimates: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = library.get_interval_estimates(
            scores, statistic, reps=reps, random_state=np.random.RandomState(seed)
        )
    return estimates
