"""Checkpoints: plain dicts of tensors and primitives, written atomically, loadable with weights_only=True.

A run directory's `checkpoints/` holds `update_<N>.pt` every `log.checkpoint_every` updates (the
last `log.keep_last` of them are kept), `latest.pt` (the newest, replaced atomically) and
`final.pt` at the end of the run.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from marl_ppo.config import migrate_stored
from marl_ppo.faults import CheckpointWriteError, NonFiniteError, UserError

FORMAT = "marl_ppo.checkpoint.v2"
"""The layout of every checkpoint this marl_ppo writes and the only one it reads. A change to what a
checkpoint holds (its keys, the run's config keys, the classes of the pickled env copies) takes a new
version; a checkpoint of another version is refused with one line, never read field by field. A config
key that moved into a section (`MOVED_KEYS`) is the exception: its config is migrated as it is read."""
_FAMILY = FORMAT.rpartition(".")[0] + "."
_PERIODIC = re.compile(r"update_(\d+)\.pt")


class CheckpointError(UserError, ValueError):
    """A checkpoint file that cannot be read; the message names the file and what to do."""


def save_checkpoint(path: Path, payload: dict[str, Any], copies: Sequence[Path] = ()) -> None:
    """Write `payload` to `path` (and to each of `copies`) via a temporary file and rename: never half-written.

    Refuses (NonFiniteError) a payload holding NaN or inf, and turns a failed write (a full disk)
    into a one-line CheckpointWriteError; either way the previous files are kept.
    """
    bad = _first_nonfinite(payload)
    if bad is not None:
        raise NonFiniteError(
            f"refusing to write checkpoint '{path}': '{bad}' holds NaN or inf values; "
            "the previous checkpoint is kept"
        )
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    for target in (path, *copies):
        write_atomic(target, buffer.getbuffer())


def write_atomic(path: Path, data: bytes | memoryview) -> None:
    """Write `data` to a temporary file next to `path`, fsync it and rename it onto `path`."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; checkpoints are ordinary shareable files
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        reason = err.strerror or str(err) or type(err).__name__
        raise CheckpointWriteError(
            f"could not write checkpoint '{path}' ({reason}); the previous checkpoint is kept, "
            "free space or fix permissions and resume from it"
        ) from err
    except BaseException:
        _remove(tmp)
        raise
    if os.name == "posix":  # make the rename itself survive a power cut
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


def _remove(tmp: str | None) -> None:
    if tmp is not None:
        Path(tmp).unlink(missing_ok=True)


def _first_nonfinite(value: Any, name: str = "") -> str | None:
    """Dotted name of the first floating tensor in `value` with a NaN or inf entry, else None."""
    if isinstance(value, torch.Tensor):
        finite = not value.is_floating_point() or bool(torch.isfinite(value).all())
        return None if finite else name or "<payload>"
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = _first_nonfinite(item, f"{name}.{key}" if name else str(key))
        if found is not None:
            return found
    return None


def load_checkpoint(path: Path | str) -> dict[str, Any]:
    """Read a checkpoint of this version's FORMAT with `weights_only=True` (no code runs from the file),
    its config's moved keys at their new place."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint '{path}' does not exist; pass a file under a run's checkpoints/")
    if path.suffix in (".yaml", ".yml"):
        raise CheckpointError(
            f"'{path}' is an experiment file, not a checkpoint; evaluate a run with `marl-ppo eval RUN_DIR`, "
            f"or the uniform random policy on this experiment with `marl-ppo eval --random {path}`"
        )
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"checkpoint '{path}' is unreadable ({type(err).__name__}); it is truncated or not a marl_ppo checkpoint"
        ) from None
    found = payload.get("format") if isinstance(payload, dict) else None
    if not isinstance(found, str) or not found.startswith(_FAMILY):
        raise CheckpointError(f"checkpoint '{path}' is not a marl_ppo checkpoint (no '{FORMAT}' format tag)")
    if found != FORMAT:
        raise CheckpointError(
            f"checkpoint '{path}' has format '{found}' but this marl_ppo reads only '{FORMAT}'; "
            "train the run again, or use the marl_ppo version that wrote it"
        )
    if isinstance(payload.get("config"), dict):
        payload["config"] = migrate_stored(payload["config"])
    return payload


def periodic_path(directory: Path, update: int) -> Path:
    """`directory/update_<N>.pt`, zero-padded so that names sort by update."""
    return directory / f"update_{update:08d}.pt"


def prune_checkpoints(directory: Path, keep_last: int | None) -> list[Path]:
    """Delete all but the newest `keep_last` `update_<N>.pt` files (None keeps all) and stale temporary files."""
    periodic = sorted(
        (int(match.group(1)), path)
        for path in directory.glob("update_*.pt")
        if (match := _PERIODIC.fullmatch(path.name))
    )
    doomed = [path for _, path in periodic[:-keep_last]] if keep_last is not None else []
    doomed += list(directory.glob(".*.tmp"))  # left by a process killed mid-write
    for path in doomed:
        path.unlink(missing_ok=True)
    return doomed
