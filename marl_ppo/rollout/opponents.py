"""Opponents in rollouts: who plays the agents the learner does not, per env copy (a league's snapshots,
`marl_ppo.league`), acting in this process or in rollout workers.

In this process the collector's `Opponents` draw from the learner's own league. In a rollout worker
(`rollout.slice`) the worker builds its slice's `Opponents` from the learner's `OpponentsSetup`
(pickled to it: this layer never imports the league), and each rollout command carries an
`OpponentsRollout`: the plan the copies draw by, fixed when the rollout starts, and where each pool
snapshot's weights are (a file in the run directory for local workers, an object in Ray's object store
for Ray actors). The worker reports the games its copies finished; the learner feeds them to its win
table in the order one process steps them (`merge_games`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import Finished


class OpponentGame(NamedTuple):
    """An episode the learner played against a snapshot in one env copy, as the win table records it."""

    step: int
    """The rollout step (0-based) its episode ended at."""
    copy: int
    """The run's index of the env copy."""
    opponent: int
    """The snapshot's id."""
    score: float
    """The learner's score: 1 a win, 1/2 a draw, 0 a loss."""


def merge_games(games: Sequence[OpponentGame]) -> list[OpponentGame]:
    """`games` of one rollout in the order one process over every copy steps them: by step, then copy."""
    return sorted(games, key=lambda game: (game.step, game.copy))


class Opponents(Protocol):
    """Who plays the agents the learner does not, per env copy (a league's snapshots)."""

    def begin_rollout(self) -> None:
        """Before a rollout's first step: fix what its draws pick from (the pool and its weights now)."""
        ...

    def act(
        self,
        obs: Mapping[str, torch.Tensor],
        masks: Mapping[str, torch.Tensor],
        alive: Mapping[str, torch.Tensor],
        actions: dict[str, torch.Tensor],
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """For the step's arrays on the device, the learner's sampled `actions` with the opponents' in
        place on their agents, and per group `(E, A_g)` whether each agent's step trains the learner."""
        ...

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """After the env step: the opponents carry their state on."""
        ...

    def episodes_ended(self, ended: Sequence[Finished]) -> None:
        """The episodes that ended at the last step: score them, draw the copies' next opponents."""
        ...


class WorkerOpponents(Opponents, Protocol):
    """A rollout worker's `Opponents`: drawn by the plan each rollout command brings, their games
    reported to the learner, their state saved with the worker's."""

    games: list[OpponentGame]
    """The games finished in the rollout under way (cleared as it begins)."""

    def use_plan(self, plan: Any) -> None:
        """The plan the next rollout draws by (from the learner's `SlicedOpponents.plan`)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Each copy's side, opponent and generator, the carries of the snapshots in use."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        ...


class OpponentsSetup(Protocol):
    """What a rollout worker builds its opponents from (picklable; sent once, and again to a worker
    that rejoins)."""

    def build(
        self,
        spec: TeamSpec,
        copies: range,
        models: Callable[[int], TeamModel],
        device: torch.device,
    ) -> WorkerOpponents:
        """The opponents of env copies `copies` (the run's indices), snapshot `i` acting as `models(i)`."""
        ...


class SlicedOpponents(Protocol):
    """The learner's side of opponents that act in rollout workers (a league: its draws and win table)."""

    def setup(self) -> OpponentsSetup:
        """What each worker builds its opponents from."""
        ...

    def plan(self) -> Any:
        """The plan a rollout starting now draws by (picklable)."""
        ...

    def snapshots(self) -> list[int]:
        """The ids of every snapshot a worker may need (the whole pool: a copy may still play one that
        has left the draws' window)."""
        ...

    def snapshot_file(self, snapshot: int) -> Path:
        """Where snapshot `snapshot`'s policy file is (local workers read it there)."""
        ...

    def record(self, games: Sequence[OpponentGame]) -> None:
        """The games of a rollout handed to the learner, in `merge_games` order."""
        ...


@dataclass(frozen=True)
class OpponentsRollout:
    """What a rollout command carries for the opponents: the plan, and per snapshot id where its
    weights are (a file path, or a Ray object reference)."""

    plan: Any
    sources: Mapping[int, Any]


class SnapshotModels:
    """A worker's networks of the pool's snapshots, loaded from their sources when first played; at
    most `cache` stay loaded."""

    def __init__(
        self,
        make_model: Callable[[], TeamModel],
        fetch: Callable[[Any], Mapping[str, torch.Tensor]],
        cache: int = 32,
    ) -> None:
        """`fetch` reads a snapshot's weights from its source (a file, an object in Ray's store)."""
        self.make_model, self.fetch, self.cache = make_model, fetch, cache
        self.sources: dict[int, Any] = {}
        self._models: OrderedDict[int, TeamModel] = OrderedDict()

    def offer(self, sources: Mapping[int, Any]) -> None:
        """Where each snapshot's weights are now (a retaken snapshot's source replaces its network)."""
        for snapshot, source in sources.items():
            if self.sources.get(snapshot) != source:
                self._models.pop(snapshot, None)
            self.sources[snapshot] = source

    def model(self, snapshot: int) -> TeamModel:
        """The networks of `snapshot`, in eval mode."""
        if snapshot in self._models:
            self._models.move_to_end(snapshot)
            return self._models[snapshot]
        if snapshot not in self.sources:
            raise KeyError(f"snapshot u{snapshot} of the league's pool reached no rollout worker")
        with torch.random.fork_rng(devices=[]):  # a fresh network's initial draws leave sampling alone
            model = self.make_model()
        model.load_state_dict(self.fetch(self.sources[snapshot]))
        model.eval()
        self._models[snapshot] = model
        while len(self._models) > self.cache:
            self._models.popitem(last=False)
        return model


def read_snapshot_file(path: str | Path) -> Mapping[str, torch.Tensor]:
    """A snapshot's weights from its policy file (local rollout workers share the learner's disk)."""
    weights: Mapping[str, torch.Tensor] = load_checkpoint(Path(path))["model"]
    return weights
