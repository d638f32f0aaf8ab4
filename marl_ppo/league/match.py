"""Matches between named policies: who played which side of each game, and how each side placed.

A player is a name and a way to act for every agent of E env copies (a trained policy, the uniform
random policy, a scripted one). A match seats one player on each side of each game (`sides_of`:
every agent a side, or teams) and plays its games over the env copies (`play_seated`); the record of
a game names each side's player and return, and ranks the sides by return (1 the best; tied sides
share a rank: a draw).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.players import Player
from marl_ppo.eval.seated import play_seated


@dataclass(frozen=True)
class Game:
    """One played game: each side's player and return, in the order of the env's sides."""

    players: dict[str, str]
    """Side -> the name of the player on it."""
    returns: dict[str, float]
    """Side -> its return (the sum over its agents)."""

    def side_ranks(self) -> dict[str, int]:
        """Side -> 1 + the number of sides with a higher return (tied sides share a rank)."""
        return {
            s: 1 + sum(other > mine for other in self.returns.values()) for s, mine in self.returns.items()
        }

    def player_ranks(self) -> dict[str, int]:
        """Player -> the best rank among the sides it played (a player on several sides places by its best)."""
        ranks: dict[str, int] = {}
        for side, rank in self.side_ranks().items():
            name = self.players[side]
            ranks[name] = min(rank, ranks.get(name, rank))
        return ranks

    def to_dict(self) -> dict[str, Any]:
        """One line of games.jsonl: players, returns and ranks by side."""
        return {"players": self.players, "returns": self.returns, "ranks": self.side_ranks()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Game:
        """The game `to_dict` wrote."""
        return cls(dict(data["players"]), {side: float(r) for side, r in data["returns"].items()})


def play_games(
    venv: VectorEnv,
    device: torch.device,
    players: Sequence[Player],
    schedule: Sequence[Sequence[int]],
    *,
    sides: Mapping[str, Sequence[str]],
    seed: int,
) -> list[Game]:
    """Play `schedule` (per game, the index in `players` of each side's player); the games in its order.

    Each player's `Acting` is built once for the match and keeps its carries per env copy; seeded as
    `play_seated` is, so the same call gives the same games."""
    spec = venv.spec
    actings = [player.build(spec, venv.num_envs, device) for player in players]
    ended = sorted(play_seated(venv, actings, sides, schedule, device, seed=seed), key=lambda game: game[0])
    columns = [[spec.agents.index(agent) for agent in agents] for agents in sides.values()]
    games = []
    for index, episode in ended:
        agent_returns = episode.agent_returns
        games.append(
            Game(
                {side: players[p].name for side, p in zip(sides, schedule[index], strict=True)},
                {side: float(agent_returns[c].sum()) for side, c in zip(sides, columns, strict=True)},
            )
        )
    return games


def pair_schedule(num_sides: int, episodes_per_side: int) -> list[tuple[int, ...]]:
    """Player 0 on each side in turn with player 1 on every other, then player 1 on each side with player 0
    on every other: `episodes_per_side` games each."""
    return [
        tuple(alone if side == seat else 1 - alone for side in range(num_sides))
        for alone in (0, 1)
        for seat in range(num_sides)
        for _ in range(episodes_per_side)
    ]


def play_pair(
    venv: VectorEnv,
    device: torch.device,
    first: Player,
    second: Player,
    *,
    sides: Mapping[str, Sequence[str]],
    episodes_per_side: int,
    seed: int,
) -> list[Game]:
    """A match of two players, each on each side for `episodes_per_side` games (`pair_schedule`)."""
    schedule = pair_schedule(len(sides), episodes_per_side)
    return play_games(venv, device, [first, second], schedule, sides=sides, seed=seed)


def play_duplicate(
    venv: VectorEnv,
    device: torch.device,
    first: Player,
    second: Player,
    *,
    sides: Mapping[str, Sequence[str]],
    episodes_per_side: int,
    seed: int,
) -> list[Game]:
    """A duplicate match: scores by role, for games whose sides are not alike (simple_tag's adversaries
    and runner, MAgent2's red and blue when their armies differ).

    For each side, the first player plays it against the second on every other side, and then the
    second plays it against the first, on the same seed (the same env resets, game by game). Each
    pair of games becomes one comparison of the two players on that side: the higher return on the
    same side, from the same starts, places first (equal returns: a draw). A comparison is recorded as
    a game of two sides named `SIDE@1` (the first player's game) and `SIDE@2`."""
    compared = []
    for side in sides:
        alone = [tuple(0 if other == side else 1 for other in sides)] * episodes_per_side
        swapped = [tuple(1 - p for p in seating) for seating in alone]
        mine = play_games(venv, device, [first, second], alone, sides=sides, seed=seed)
        theirs = play_games(venv, device, [first, second], swapped, sides=sides, seed=seed)
        compared += duplicate_games(mine, theirs, side)
    return compared


def duplicate_games(first: Sequence[Game], second: Sequence[Game], side: str) -> list[Game]:
    """Game k of `first` against game k of `second` on `side`: one game of two sides `SIDE@1` and
    `SIDE@2`, each the player on `side` in that game with its return there."""
    if len(first) != len(second):
        raise ValueError(f"a duplicate match pairs games one to one, got {len(first)} and {len(second)}")
    return [
        Game(
            {f"{side}@1": a.players[side], f"{side}@2": b.players[side]},
            {f"{side}@1": a.returns[side], f"{side}@2": b.returns[side]},
        )
        for a, b in zip(first, second, strict=True)
    ]
