"""Cheap run-time checks of what an env returns: one vectorized test per group array, details only on failure."""

from __future__ import annotations

from collections.abc import Sequence

import gymnasium as gym
import numpy as np

REJOIN_KEY = "agents_can_rejoin"
"""An env whose `metadata[REJOIN_KEY]` is true may bring an agent back after it terminated."""

_NUMERIC_KINDS = "biuf"


def first_nonfinite(arrays: Sequence[np.ndarray]) -> tuple[int, int] | None:
    """(group, agent) of the first NaN or inf in per-group arrays shaped `(A_g, ...)`, else None."""
    for g, array in enumerate(arrays):
        if not np.isfinite(array).all():
            finite_rows = np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
            return g, int(np.argmin(finite_rows))
    return None


def box_mismatch(array: np.ndarray, space: gym.spaces.Box) -> str | None:
    """Why `array` cannot be an observation of `space` (shape or dtype), else None."""
    kind = array.dtype.kind
    if array.shape == space.shape and kind in _NUMERIC_KINDS and (kind != "f" or space.dtype.kind == "f"):
        return None
    return (
        f"observation has shape {array.shape} and dtype {array.dtype}; expected shape {space.shape} "
        f"and dtype {space.dtype} as declared by {space}"
    )


def describe(value: object, limit: int = 60) -> str:
    """A short one-line repr of a value the env returned, for error messages."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
