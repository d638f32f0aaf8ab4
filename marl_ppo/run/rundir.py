"""A run's directory: its default name, the checks made before anything is written to it, and its
`summary.json`, written last, whose presence marks the run finished."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from marl_ppo.config import ConfigError


def default_run_dir(experiment: str | Path | None) -> Path:
    """`runs/<experiment file's stem>-<YYYYmmdd-HHMMSS>`, or `runs/default-<time>` without a file."""
    name = Path(experiment).stem if experiment else "default"
    return Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def check_new_run_dir(run_dir: Path) -> None:
    """Raise ConfigError unless `run_dir` is absent or empty and can be created and written."""
    if run_dir.exists() and (not run_dir.is_dir() or any(run_dir.iterdir())):
        raise ConfigError(f"run directory '{run_dir}' already exists and is not empty; pick a new --run-dir")
    for path in (run_dir.absolute(), *run_dir.absolute().parents):
        if path.is_symlink() and not path.exists():
            raise ConfigError(
                f"run directory '{run_dir}' cannot be created: '{path}' is a link to '{os.readlink(path)}', "
                "which does not exist; create the link's target or pick another --run-dir"
            )
    existing = next(p for p in (run_dir.absolute(), *run_dir.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(
            f"run directory '{run_dir}' cannot be created: '{existing}' is a file; pick another --run-dir"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"run directory '{run_dir}' is not writable (no write permission on '{existing}'); pick another --run-dir"
        )
    try:  # permissions do not tell everything: /proc and /sys refuse new folders even to root
        probe = tempfile.mkdtemp(prefix=".marl_ppo_probe_", dir=existing)
    except OSError as err:
        raise ConfigError(
            f"run directory '{run_dir}' cannot be created in '{existing}' ({err.strerror}); pick another --run-dir"
        ) from None
    os.rmdir(probe)


SUMMARY = "summary.json"
"""A finished run's figures: its `TrainResult` and the resources its process used."""


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    """Write `summary` as the run's summary.json, whole or not at all (a temporary file renamed onto
    it), so a run killed while writing it is never read as finished."""
    tmp = run_dir / f".{SUMMARY}.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    os.replace(tmp, run_dir / SUMMARY)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """The run's summary.json; None while it runs, or after it was stopped or killed."""
    path = run_dir / SUMMARY
    return json.loads(path.read_text()) if path.is_file() else None


def is_finished(run_dir: Path) -> bool:
    """Whether the run trained to its end (it wrote its summary.json)."""
    return (run_dir / SUMMARY).is_file()
