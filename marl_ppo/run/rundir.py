"""A new run's directory: its default name, and the checks made before anything is written to it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from marl_ppo.config import ConfigError


def default_run_dir(experiment: str | Path | None) -> Path:
    """`runs/<experiment file's stem>-<YYYYmmdd-HHMMSS>`, or `runs/default-<time>` without a file."""
    name = Path(experiment).stem if experiment else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_new_run_dir(run_dir: Path) -> None:
    """Raise ConfigError unless `run_dir` is absent or empty and can be created and written."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"run directory '{run_dir}' already exists and is not empty; pick a new --run-dir")
    existing = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"run directory '{run_dir}' cannot be created: '{existing}' is a file; pick another --run-dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"run directory '{run_dir}' is not writable (no write permission on '{existing}'); pick another --run-dir"
        )
