"""Skill ratings of named players from played games, with openskill's Plackett-Luce model.

Each player's skill is a normal belief, mean `mu` and deviation `sigma` (25 and 25/3 before its first
game); its `ordinal`, `mu - 3 sigma`, is the conservative estimate a ladder is sorted by. A game
updates the beliefs of the players in it from their places (`Game.player_ranks`: tied players drew),
in the order the games are given. A game with a single distinct player (a policy against itself)
says nothing of skill and is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from marl_ppo.faults import UserError
from marl_ppo.league.match import Game

MODEL = "openskill.PlackettLuce"
"""The rating model, named in the state so that a state of another model is refused."""


class RatingsError(UserError, ValueError):
    """A ratings state that does not fit, or a rating library that is missing."""


def _model() -> Any:
    """openskill's Plackett-Luce model with its defaults (mu 25, sigma 25/3, beta 25/6, tau 25/300)."""
    try:
        from openskill.models import PlackettLuce
    except ImportError:
        raise RatingsError(
            "ratings need openskill; install it with: pip install 'marl-ppo[league]'"
        ) from None
    return PlackettLuce()


@dataclass(frozen=True)
class Rating:
    """One player's row of the ladder."""

    player: str
    mu: float
    sigma: float
    games: int

    @property
    def ordinal(self) -> float:
        """The conservative skill estimate, `mu - 3 sigma`."""
        return self.mu - 3.0 * self.sigma


class Ratings:
    """The ratings of named players, updated game by game; new players start at the model's prior."""

    def __init__(self) -> None:
        self._model = _model()
        self._beliefs: dict[str, tuple[float, float]] = {}
        self._games: dict[str, int] = {}

    def add(self, player: str) -> None:
        """Put a player on the ladder at the prior, before its first game (no-op for a known player)."""
        if player not in self._beliefs:
            prior = self._model.rating()
            self._beliefs[player] = (float(prior.mu), float(prior.sigma))
            self._games[player] = 0

    def update(self, game: Game) -> None:
        """Update the beliefs of the game's players from their places (equal places: a draw)."""
        ranks = game.player_ranks()
        if len(ranks) < 2:
            return
        for player in ranks:
            self.add(player)
        names = list(ranks)
        teams = [[self._model.rating(*self._beliefs[name], name=name)] for name in names]
        rated = self._model.rate(teams, ranks=[float(ranks[name]) for name in names])
        for name, (rating,) in zip(names, rated, strict=True):
            self._beliefs[name] = (float(rating.mu), float(rating.sigma))
            self._games[name] += 1

    def update_all(self, games: Iterable[Game]) -> None:
        """`update` with each game, in order."""
        for game in games:
            self.update(game)

    def __getitem__(self, player: str) -> Rating:
        mu, sigma = self._beliefs[player]
        return Rating(player, mu, sigma, self._games[player])

    def __contains__(self, player: object) -> bool:
        return player in self._beliefs

    def table(self) -> list[Rating]:
        """Every player, the highest ordinal first (ties by name)."""
        return sorted((self[name] for name in self._beliefs), key=lambda r: (-r.ordinal, r.player))

    def scalars(self, prefix: str = "league/rating") -> dict[str, float]:
        """Each player's ordinal and mu as tracker scalars, `{prefix}/{player}/ordinal` and `/mu`."""
        scalars = {}
        for rating in self.table():
            scalars[f"{prefix}/{rating.player}/ordinal"] = rating.ordinal
            scalars[f"{prefix}/{rating.player}/mu"] = rating.mu
        return scalars

    def state_dict(self) -> dict[str, Any]:
        """Plain Python values (for a checkpoint): the model's name and each player's mu, sigma and games."""
        return {
            "model": MODEL,
            "players": {
                name: {"mu": mu, "sigma": sigma, "games": self._games[name]}
                for name, (mu, sigma) in self._beliefs.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict()` exactly, replacing every rating held."""
        if state.get("model") != MODEL:
            raise RatingsError(
                f"ratings state of model {state.get('model')!r} cannot be loaded into {MODEL} ratings"
            )
        players = state["players"]
        self._beliefs = {name: (float(p["mu"]), float(p["sigma"])) for name, p in players.items()}
        self._games = {name: int(p["games"]) for name, p in players.items()}
