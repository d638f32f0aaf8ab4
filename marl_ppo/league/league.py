"""A run's league (`league:`): the pool of snapshots, the opponents they play in the collector, and
the state a checkpoint keeps of them.

With `league.opponents: latest` the run trains as plain self-play (the collector is not touched) and
the league only takes and rates snapshots; with `uniform` or `pfsp` the collector's `Opponents` are
the league's seats (`league.seats`): in this process, or in each rollout worker over its slice of the
env copies (`rollout.vector: workers` or `ray`). Either way the learner keeps the win table: each
rollout draws by the plan it makes as the rollout starts, and the rollout's games come back to it.
The first snapshot is the policy before any update.

Ratings (`league.rating_episodes` > 0): each new snapshot plays the previous one, the random policy
and `league.rating_opponents` snapshots drawn from the rest of the pool, on every side, on env copies
of their own (`league.match`, seeded apart from training and leaving its random numbers alone); the
openskill ratings of every player are updated from those games (`league.ratings`), logged under
`league/rating/` and written as `league/ratings.md` in the run directory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from marl_ppo.checkpoint import write_atomic
from marl_ppo.config import ConfigError, ExperimentConfig
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.eval.exploitability import nash_conv_on, pool_nash_conv
from marl_ppo.eval.players import RANDOM
from marl_ppo.eval.versus import sides_of
from marl_ppo.league.ladder import ladder_markdown
from marl_ppo.league.pool import POOL_DIR, Pool, snapshot_name, snapshot_path
from marl_ppo.league.rate import rate_new
from marl_ppo.league.ratings import Ratings
from marl_ppo.league.sampling import DrawPlan, OpponentSampler, latest_snapshots
from marl_ppo.league.seats import LeagueSeats, WorkerSeats
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.opponents import OpponentGame
from marl_ppo.rollout.slice import SlicedSource
from marl_ppo.rollout.source import RolloutSource


def league_sides(config: ExperimentConfig, spec: TeamSpec) -> dict[str, tuple[str, ...]]:
    """The league's sides of the env's agents (`league.sides`), refused in one line where there are
    fewer than two."""
    try:
        return sides_of(spec, config.league.sides, config.eval.teams)
    except EvalError as err:
        message = str(err).replace("eval.vs_random:", "league.sides:")
        raise ConfigError(f"{message}; a league needs a game of two or more sides") from None


class League:
    """The pool, the sampler and (with `uniform` or `pfsp`) the seats the collector's opponents are."""

    def __init__(
        self,
        config: ExperimentConfig,
        spec: TeamSpec,
        run_dir: Path,
        make_model: Callable[[], TeamModel],
        device: torch.device,
        rating_venv: Callable[[], VectorEnv] | None = None,
    ) -> None:
        """`rating_venv` builds the env copies the rating games play on (with `league.rating_episodes`)."""
        league = config.league
        if league.opponents is None:
            raise ValueError("League needs league.opponents")
        self.spec = spec
        self.config, self.every, self.run_dir, self.device = config, league.snapshot_every, run_dir, device
        self.sides = league_sides(config, spec)
        self.pool = Pool(run_dir, make_model, device)
        self.ratings: Ratings | None = None
        self._rating_venv = rating_venv
        self._venv: VectorEnv | None = None
        if league.rating_episodes and rating_venv is not None:
            self.ratings = Ratings()
            self.ratings.add(RANDOM)
        # which pool members a new snapshot plays for its rating: a stream of its own
        self.rating_rng = np.random.default_rng([config.seed, 0x4A7E])
        self.nash_conv = nash_conv_on(config)
        """Whether each snapshot logs the NashConv of the pool's average policy (a game OpenSpiel solves)."""
        self.seats: LeagueSeats | None = None
        self.sampler: OpponentSampler | None = None
        if league.opponents != "latest":
            self.sampler = OpponentSampler(
                league.opponents,
                pool_size=league.pool_size,
                self_play=league.self_play,
                pfsp=league.pfsp,
                power=league.pfsp_power,
                decay=league.score_decay,
            )

    def attach(self, collector: RolloutSource) -> None:
        """Make the league's seats the collector's opponents (`uniform`, `pfsp`): in this process, or in
        each rollout worker."""
        if self.sampler is None:
            return
        if isinstance(collector, SlicedSource):
            collector.attach_opponents(self)
            return
        if not isinstance(collector, Collector):
            raise ConfigError(
                f"league.opponents: {self.config.league.opponents} plays its snapshots through a collector "
                f"of env copies or rollout workers, which {type(collector).__name__} is not"
            )
        self.seats = LeagueSeats(
            self.spec,
            self.sides,
            range(self.config.rollout.copies),
            seed=self.config.seed,
            models=self.pool.model,
            plans=self.plan,
            record=self._record_one,
            device=self.device,
        )
        collector.opponents = self.seats

    # the learner's side of seats in rollout workers (`rollout.opponents.SlicedOpponents`)

    def setup(self) -> WorkerSeats:
        """What each rollout worker builds its seats from."""
        return WorkerSeats(self.sides, self.config.seed)

    def plan(self) -> DrawPlan:
        """The plan a rollout starting now draws by: the pool and the win table as they are now."""
        assert self.sampler is not None
        return self.sampler.plan(self.pool.snapshots)

    def snapshots(self) -> list[int]:
        """Every snapshot of the pool (a copy may still play one that has left the draws' window)."""
        return list(self.pool.snapshots)

    def snapshot_file(self, snapshot: int) -> Path:
        """The policy file of `snapshot`."""
        return snapshot_path(self.run_dir, snapshot)

    def record(self, games: Sequence[OpponentGame]) -> None:
        """A rollout's games, in the order one process steps them, into the win table."""
        for game in games:
            self._record_one(game)

    def _record_one(self, game: OpponentGame) -> None:
        assert self.sampler is not None
        self.sampler.record(game.opponent, game.score)

    def begin(self, saved: Mapping[str, Any] | None, payload: Callable[[], dict[str, Any]]) -> None:
        """A new run's first snapshot (the policy before any update) and first draws, or the league of
        the checkpoint `saved`."""
        if saved is None:
            self.pool.add(0, payload())
            self._rate(0)
            return
        if "league" not in saved:
            raise ConfigError(
                "--resume: the checkpoint has no league (the run was trained without league.opponents); "
                "resume it without a league, or train a new run"
            )
        self.load_state_dict(saved["league"])

    def after_update(self, updates: int, payload: Callable[[], dict[str, Any]]) -> dict[str, float]:
        """Take a snapshot every `league.snapshot_every` updates; the league's scalars to log."""
        scalars: dict[str, float] = {}
        if updates % self.every == 0:
            self.pool.add(updates, payload())
            scalars.update(self._rate(updates))
            scalars.update(self._pool_nash_conv())
        scalars["league/pool_size"] = float(len(self.pool.snapshots))
        if self.sampler is not None:
            eligible = self.sampler.eligible(self.pool.snapshots)
            scores = np.array([self.sampler.score(s) for s in eligible])
            weights = self.sampler.weights(eligible)
            scalars["league/score_vs_pool"] = float(scores.mean())
            scalars["league/score_vs_drawn"] = float((weights * scores).sum())  # expected score of a draw
        return scalars

    def _rate(self, updates: int) -> dict[str, float]:
        """Rate the snapshot of `updates` against the previous one, random and drawn pool members; the
        ratings' scalars."""
        if self.ratings is None or self._rating_venv is None:
            return {}
        if self._venv is None:
            self._venv = self._rating_venv()
        league, pool = self.config.league, self.pool
        earlier = [s for s in pool.snapshots if s != updates]
        chosen = earlier[-1:]
        rest = earlier[:-1]
        if rest and league.rating_opponents:
            picks = self.rating_rng.choice(
                len(rest), size=min(league.rating_opponents, len(rest)), replace=False
            )
            chosen += [rest[int(i)] for i in sorted(picks)]
        opponents: list[tuple[str, TeamModel | None]] = [(RANDOM, None)]
        opponents += [(snapshot_name(s), pool.model(s)) for s in chosen]
        rate_new(
            self._venv,
            self.device,
            new=(snapshot_name(updates), pool.model(updates)),
            opponents=opponents,
            ratings=self.ratings,
            episodes=league.rating_episodes,
            seed=self.config.seed + 7919 * (updates + 1),
            mode=league.sides,
            teams=self.config.eval.teams,
            score=league.rating_score,
        )
        path = self.run_dir / POOL_DIR.parent / "ratings.md"
        write_atomic(path, ladder_markdown(self.ratings).encode())
        new, best = self.ratings[snapshot_name(updates)], self.ratings.table()[0]
        return {
            "league/rating/latest_ordinal": new.ordinal,
            "league/rating/latest_mu": new.mu,
            "league/rating/random_ordinal": self.ratings[RANDOM].ordinal,
            "league/rating/best_ordinal": best.ordinal,
        }

    def _pool_nash_conv(self) -> dict[str, float]:
        """`league/pool_nash_conv`: NashConv of the average of the pool's snapshots (those opponents are
        drawn from), each weighted alike, mixed by reach: what fictitious play converges in."""
        if not self.nash_conv:
            return {}
        snapshots = latest_snapshots(self.pool.snapshots, self.config.league.pool_size)
        models = [self.pool.model(s) for s in snapshots]
        value = pool_nash_conv(models, [1.0] * len(models), self.config.env.id, self.config.env.kwargs)
        return {"league/pool_nash_conv": value}

    def close(self) -> None:
        """Close the rating games' env copies."""
        if self._venv is not None:
            self._venv.close()
            self._venv = None

    def state_dict(self) -> dict[str, Any]:
        """The pool's snapshot ids, the win table, and the seats acting in this process (carries
        included; rollout workers save their seats with their own state)."""
        state: dict[str, Any] = {"pool": self.pool.state_dict()}
        if self.ratings is not None:
            state["ratings"] = self.ratings.state_dict()
            state["rating_rng"] = self.rating_rng.bit_generator.state
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
        if self.seats is not None:
            state["seats"] = self.seats.state_dict()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.pool.load_state_dict(state["pool"])
        if self.ratings is not None and "ratings" in state:
            self.ratings.load_state_dict(state["ratings"])
            self.rating_rng.bit_generator.state = dict(state["rating_rng"])
        if self.sampler is not None:
            if "sampler" not in state:
                raise ConfigError(
                    "--resume: the checkpoint's league drew no snapshots (league.opponents: latest), so "
                    "it cannot go on with uniform or pfsp; resume with league.opponents=latest"
                )
            self.sampler.load_state_dict(state["sampler"])
        if self.seats is not None:
            self.seats.load_state_dict(state["seats"])
