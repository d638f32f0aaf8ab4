"""The `league` section: the learning side plays frozen snapshots of its own policy from a pool."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveInt


@dataclass(frozen=True, config=STRICT)
class LeagueConfig:
    """Opponent pools for competitive games: who the learning side plays, snapshots and ratings."""

    opponents: Literal["latest", "uniform", "pfsp"] | None = None
    """Who the learning side plays. null: no league (every side learns at once against the others'
    current policy). `latest`: the same self-play, with the pool's snapshots taken and rated.
    `uniform`: in each episode of each env copy one side is the learner and every other side plays a
    snapshot drawn uniformly from the pool; only the learner's moves train. `pfsp`: prioritised
    fictitious self-play, the snapshot drawn with weight `f(x)` of the learner's recent score `x`
    against it (`league.pfsp`)."""
    sides: Literal["seats", "teams"] = "seats"
    """The sides of the game: `seats`, every agent is a side (classic games); `teams`, agents form
    teams by their names without the trailing number, or as `eval.teams` names them (MPE's adversaries
    and good agents, MAgent2's red and blue). A symmetric game's shared policy plays its own snapshots
    on the other side."""
    snapshot_every: PositiveInt = 10
    """Updates between two snapshots of the policy into the pool (the first is taken before the first
    update). Snapshots are files in the run directory's `league/pool/`."""
    pool_size: Annotated[int, Field(ge=0)] = 0
    """Opponents are drawn from the latest this many snapshots; 0: from every snapshot."""
    self_play: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0
    """With `uniform` or `pfsp`, the share of episodes played against the current policy instead of a
    snapshot (both sides learn in them)."""
    pfsp: Literal["hard", "variance"] = "hard"
    """PFSP's weighting of a snapshot by the learner's score `x` against it (a win 1, a draw 1/2):
    `hard` `(1 - x)^pfsp_power`, most often the snapshots that beat the learner; `variance`
    `x (1 - x)`, the snapshots of the learner's level."""
    pfsp_power: Annotated[float, Field(gt=0.0)] = 2.0
    """The exponent of `pfsp: hard`."""
    score_decay: Annotated[float, Field(gt=0.0, le=1.0)] = 0.99
    """Each game against a snapshot discounts the learner's earlier games against it by this factor,
    so its score follows the learner as it improves (1: every game weighs the same). A snapshot not
    yet played has score 1/2."""
    rating_episodes: Annotated[int, Field(ge=0)] = 4
    """Each new snapshot plays this many episodes on each side against the previous snapshot, the
    random policy and `rating_opponents` snapshots drawn from the pool; the ratings (openskill) of every
    snapshot are updated and logged under `league/`. 0: no ratings during training (`marl-ppo rate`
    rates a run's pool afterwards)."""
    rating_score: Literal["returns", "roles"] = "returns"
    """How a rating game places the players. `returns`: the side with the higher return wins (games whose
    sides are alike: the classic games, equal armies). `roles`: a duplicate match, for sides that are not
    alike (simple_tag's adversaries and runner): both players play each side from the same starts,
    and the one with the higher return on that side places first."""
    rating_opponents: Annotated[int, Field(ge=0)] = 2
    """Snapshots drawn from the pool, besides the previous one and random, that each new snapshot plays
    for its rating."""
