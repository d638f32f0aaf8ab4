"""A run's pool of policy snapshots: files in `RUN_DIR/league/pool/`, one per snapshot.

Each snapshot is the policy as it was after some update, written like `checkpoints/best.pt` (the
config, the agents and the networks, no optimizer or env state) as `snapshot_u<updates>.pt`, so
`marl-ppo eval`, `marl-ppo rate` and `load_checkpoint` read it as they read any policy. A snapshot's id
is its update count; its name, in ratings and tables, `u<updates>`. The files are written before the
checkpoint that lists them, and a resumed run lists exactly the snapshots its checkpoint listed (a
snapshot written after that checkpoint is written again, with the same weights, when the resumed run
reaches its update).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from marl_ppo.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from marl_ppo.models.team import TeamModel

POOL_DIR = Path("league") / "pool"
"""Where a run keeps its snapshots, under its run directory."""

_SNAPSHOT = re.compile(r"snapshot_u(\d+)\.pt")


def snapshot_path(run_dir: Path, updates: int) -> Path:
    """The file of the snapshot taken after `updates` updates."""
    return run_dir / POOL_DIR / f"snapshot_u{updates:07d}.pt"


def snapshot_name(updates: int) -> str:
    """A snapshot's name in ratings and tables."""
    return f"u{updates}"


def pool_files(run_dir: Path) -> dict[int, Path]:
    """The snapshot files in `run_dir`'s pool, by id (update count), oldest first."""
    directory = run_dir / POOL_DIR
    if not directory.is_dir():
        return {}
    found = {int(m.group(1)): p for p in directory.iterdir() if (m := _SNAPSHOT.fullmatch(p.name))}
    return dict(sorted(found.items()))


class Pool:
    """The snapshots of a run, oldest first, and their networks, loaded when an opponent needs them."""

    def __init__(
        self, run_dir: Path, make_model: Callable[[], TeamModel], device: torch.device, *, cache: int = 32
    ) -> None:
        """`make_model` builds a fresh network of the run's shape (a snapshot's weights are loaded
        into it); at most `cache` snapshots' networks stay loaded."""
        self.run_dir, self.make_model, self.device, self.cache = run_dir, make_model, device, cache
        self.snapshots: list[int] = []
        """The ids (update counts) of the snapshots, oldest first."""
        self._models: OrderedDict[int, TeamModel] = OrderedDict()

    def add(self, updates: int, payload: Mapping[str, Any]) -> Path:
        """Write the policy `payload` (as `checkpoints/best.pt` holds one) as the snapshot of `updates`."""
        path = snapshot_path(self.run_dir, updates)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(path, dict(payload))
        if updates in self.snapshots:  # a resumed run retaking a snapshot its checkpoint lists
            self._models.pop(updates, None)
        else:
            self.snapshots.append(updates)
        return path

    def model(self, snapshot: int) -> TeamModel:
        """The networks of `snapshot`, in eval mode (loaded from its file on first use)."""
        if snapshot in self._models:
            self._models.move_to_end(snapshot)
            return self._models[snapshot]
        path = snapshot_path(self.run_dir, snapshot)
        try:
            payload = load_checkpoint(path)
        except CheckpointError as err:
            raise CheckpointError(
                f"league pool: {err}; the run's pool in {self.run_dir / POOL_DIR} lost a snapshot its "
                "checkpoint lists, so the league cannot go on from it"
            ) from None
        with torch.random.fork_rng(
            devices=[]
        ):  # a fresh network's initial draws leave the run's numbers alone
            model = self.make_model().to(self.device)
        model.load_state_dict(payload["model"])
        model.eval()
        self._models[snapshot] = model
        while len(self._models) > self.cache:
            self._models.popitem(last=False)
        return model

    def state_dict(self) -> dict[str, Any]:
        """The snapshots' ids (their weights are in their files)."""
        return {"snapshots": list(self.snapshots)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`; every listed snapshot's file must be there."""
        snapshots = [int(s) for s in state["snapshots"]]
        missing = [s for s in snapshots if not snapshot_path(self.run_dir, s).is_file()]
        if missing:
            raise CheckpointError(
                f"league pool: snapshots {[snapshot_name(s) for s in missing]} of the checkpoint are missing "
                f"from {self.run_dir / POOL_DIR}; restore them there, or train the run again"
            )
        self.snapshots = snapshots
        self._models.clear()
