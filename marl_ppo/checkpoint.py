"""Checkpoints: plain dicts of tensors and primitives, written atomically, loadable with weights_only=True."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read; the message names the file and what to do."""


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` via a temporary file and rename, so `path` is never half-written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; checkpoints are ordinary shareable files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Read a checkpoint with `weights_only=True` (no code runs from the file)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a file under a run's checkpoints/")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint '{path}' is unreadable ({type(err).__name__}); it is truncated or not a marl_ppo checkpoint"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint '{path}' is not a marl_ppo checkpoint (no '{FORMAT}' format tag)")
    return payload


FORMAT = "marl_ppo.checkpoint.v1"
