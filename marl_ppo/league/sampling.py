"""Who the learner plays in each episode: its side, and a snapshot of the pool drawn by a named rule.

`uniform` draws every snapshot of the pool alike. `pfsp` (prioritised fictitious self-play, as
AlphaStar's league) weighs snapshot i by `f(x_i)` of the learner's recent score `x_i` against it (a
win 1, a draw 1/2, a loss 0): `hard` `f(x) = (1 - x)^p`, most often the snapshots that beat the
learner; `variance` `f(x) = x (1 - x)`, those of its level. The score is a discounted average: each
game against a snapshot multiplies its earlier games' weight by `decay`, so it follows the learner as
the learner improves; a snapshot not yet played scores 1/2. Where every weight is 0 (the learner beats
the whole pool), the draw is uniform. With `self_play` > 0 that share of episodes is played against
the current policy instead (`CURRENT`).

The sampler holds the learner's win table; a rollout draws from a `DrawPlan`, the pool and its
weights as they were when the rollout started. Each env copy draws with a NumPy generator of its own
(`copy_generator`, seeded from the run's seed and the copy's index), so a copy's opponents do not
depend on which process acts it, nor on how the copies are split among rollout workers. The games of
a rollout update the table in the order one process steps them (by step, then copy). The scores
and the copies' generators are saved in the checkpoint, so a resumed run draws the same opponents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

CURRENT = -1
"""The opponent id of the current policy (self-play: every side learns in that episode)."""


def copy_generator(seed: int, copy: int) -> np.random.Generator:
    """The generator env copy `copy` draws its learner sides and opponents with, in a run with `seed`
    (a stream apart from the run's own generators: drawing opponents leaves training's numbers alone)."""
    return np.random.default_rng([seed, 0x1EA6, copy])


@dataclass(frozen=True)
class DrawPlan:
    """What a rollout's draws pick from: the eligible snapshots and their probabilities, fixed when the
    rollout starts, and the share of self-play."""

    snapshots: tuple[int, ...]
    probabilities: tuple[float, ...]
    self_play: float

    def draw(self, rng: np.random.Generator, sides: int) -> tuple[int, int]:
        """One episode's learner side (of `sides`) and opponent (a snapshot id, or CURRENT), with `rng`."""
        side = int(rng.integers(sides))
        if self.self_play > 0.0 and rng.random() < self.self_play:
            return side, CURRENT
        return side, self.snapshots[int(rng.choice(len(self.snapshots), p=np.array(self.probabilities)))]


def latest_snapshots(snapshots: Sequence[int], pool_size: int) -> list[int]:
    """The snapshots opponents are drawn from: the latest `pool_size` (every one for 0)."""
    return list(snapshots[-pool_size:] if pool_size else snapshots)


class OpponentSampler:
    """The learner's score against each snapshot, and the plans its opponents are drawn by."""

    def __init__(
        self,
        rule: str,
        *,
        pool_size: int = 0,
        self_play: float = 0.0,
        pfsp: str = "hard",
        power: float = 2.0,
        decay: float = 0.99,
    ) -> None:
        if rule not in ("uniform", "pfsp"):
            raise ValueError(f"league.opponents '{rule}' draws no snapshots; use uniform or pfsp")
        if pfsp not in ("hard", "variance"):
            raise ValueError(f"league.pfsp '{pfsp}' is not a weighting; use hard or variance")
        self.rule, self.pool_size, self.self_play = rule, pool_size, self_play
        self.pfsp, self.power, self.decay = pfsp, power, decay
        self.games: dict[int, float] = {}
        """Per snapshot id, the discounted count of games the learner played against it."""
        self.points: dict[int, float] = {}
        """Per snapshot id, the discounted sum of the learner's scores against it."""

    def score(self, snapshot: int) -> float:
        """The learner's recent score against `snapshot` (1/2 before any game)."""
        games = self.games.get(snapshot, 0.0)
        return self.points[snapshot] / games if games > 0 else 0.5

    def eligible(self, snapshots: Sequence[int]) -> list[int]:
        """The snapshots opponents are drawn from (`latest_snapshots`)."""
        return latest_snapshots(snapshots, self.pool_size)

    def weights(self, snapshots: Sequence[int]) -> np.ndarray:
        """The probabilities of drawing each of `snapshots` (the eligible ones) as the opponent."""
        if not snapshots:
            raise ValueError("the league's pool is empty: a snapshot is taken before the first update")
        if self.rule == "uniform":
            raw = np.ones(len(snapshots))
        else:
            x = np.array([self.score(s) for s in snapshots])
            raw = (1.0 - x) ** self.power if self.pfsp == "hard" else x * (1.0 - x)
            if raw.sum() <= 0.0:
                raw = np.ones(len(snapshots))
        return raw / raw.sum()

    def plan(self, snapshots: Sequence[int]) -> DrawPlan:
        """The draws' plan over the pool `snapshots` with the scores as they are now."""
        eligible = self.eligible(snapshots)
        probabilities = tuple(float(p) for p in self.weights(eligible))
        return DrawPlan(tuple(int(s) for s in eligible), probabilities, self.self_play)

    def record(self, snapshot: int, score: float) -> None:
        """The learner scored `score` (1 a win, 1/2 a draw, 0 a loss) in a game against `snapshot`."""
        self.games[snapshot] = self.decay * self.games.get(snapshot, 0.0) + 1.0
        self.points[snapshot] = self.decay * self.points.get(snapshot, 0.0) + score

    def state_dict(self) -> dict[str, Any]:
        """The scores, as plain Python values."""
        return {
            "games": dict(self.games),
            "points": dict(self.points),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` (a checkpoint written before the copies drew apart also holds the one
        generator they shared, "rng", which nothing draws from now)."""
        self.games = {int(k): float(v) for k, v in state["games"].items()}
        self.points = {int(k): float(v) for k, v in state["points"].items()}
