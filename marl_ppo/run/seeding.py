"""Seeding of every random stream the run uses."""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

LegacyNumpyState = tuple[str, np.ndarray, int, int, float]
"""NumPy's legacy MT19937 state: name, key words, position, has_gauss, cached gaussian."""


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a separate torch generator for minibatch shuffling."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    generator = torch.Generator()
    generator.manual_seed(seed + 1)
    return generator


def rng_state() -> dict[str, Any]:
    """The Python, NumPy and torch (CPU and CUDA) global RNG states as tensors and primitives."""
    version, words, gauss = random.getstate()
    # The global generator is NumPy's legacy MT19937, whose legacy state is this tuple.
    numpy_state = cast(LegacyNumpyState, np.random.get_state(legacy=True))
    name, keys, position, has_gauss, cached = numpy_state
    return {
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the global RNG states that `rng_state` captured."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["words"].tolist()), python["gauss"]))
    numpy = state["numpy"]
    np.random.set_state(
        (
            numpy["name"],
            numpy["keys"].numpy().astype(np.uint32),
            numpy["position"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resume_seed(seed: int, updates: int) -> int:
    """Env reset seed for a resume after `updates` updates when the envs' own state could not be saved."""
    return int(np.random.SeedSequence([seed, updates]).generate_state(1)[0])
