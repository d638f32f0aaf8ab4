"""Who the learner plays in each episode: its side, and a snapshot of the pool drawn by a named rule.

`uniform` draws every snapshot of the pool alike. `pfsp` (prioritised fictitious self-play, as
AlphaStar's league) weighs snapshot i by `f(x_i)` of the learner's recent score `x_i` against it (a
win 1, a draw 1/2, a loss 0): `hard` `f(x) = (1 - x)^p`, most often the snapshots that beat the
learner; `variance` `f(x) = x (1 - x)`, those of its level. The score is a discounted average: each
game against a snapshot multiplies its earlier games' weight by `decay`, so it follows the learner as
the learner improves; a snapshot not yet played scores 1/2. Where every weight is 0 (the learner beats
the whole pool), the draw is uniform. With `self_play` > 0 that share of episodes is played against
the current policy instead (`CURRENT`).

The sampler's random numbers are its own (a NumPy generator seeded from the run's seed), saved with
its scores in the checkpoint, so a resumed run draws the same opponents.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

CURRENT = -1
"""The opponent id of the current policy (self-play: every side learns in that episode)."""


def latest_snapshots(snapshots: Sequence[int], pool_size: int) -> list[int]:
    """The snapshots opponents are drawn from: the latest `pool_size` (every one for 0)."""
    return list(snapshots[-pool_size:] if pool_size else snapshots)


class OpponentSampler:
    """Draws each episode's learner side and opponent; keeps the learner's score against each snapshot."""

    def __init__(
        self,
        rule: str,
        *,
        seed: int,
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
        # a stream apart from the run's own generators: drawing opponents leaves training's numbers alone
        self.rng = np.random.default_rng([seed, 0x1EA6])
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

    def draw(self, snapshots: Sequence[int], sides: int) -> tuple[int, int]:
        """One episode's learner side (of `sides`) and opponent: a snapshot id, or CURRENT."""
        side = int(self.rng.integers(sides))
        if self.self_play > 0.0 and self.rng.random() < self.self_play:
            return side, CURRENT
        eligible = self.eligible(snapshots)
        return side, eligible[int(self.rng.choice(len(eligible), p=self.weights(eligible)))]

    def record(self, snapshot: int, score: float) -> None:
        """The learner scored `score` (1 a win, 1/2 a draw, 0 a loss) in a game against `snapshot`."""
        self.games[snapshot] = self.decay * self.games.get(snapshot, 0.0) + 1.0
        self.points[snapshot] = self.decay * self.points.get(snapshot, 0.0) + score

    def state_dict(self) -> dict[str, Any]:
        """The generator's state and the scores, as plain Python values."""
        return {
            "rng": self.rng.bit_generator.state,
            "games": dict(self.games),
            "points": dict(self.points),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.rng.bit_generator.state = dict(state["rng"])
        self.games = {int(k): float(v) for k, v in state["games"].items()}
        self.points = {int(k): float(v) for k, v in state["points"].items()}
