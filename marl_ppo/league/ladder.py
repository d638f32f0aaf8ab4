"""What a rating of policies writes: the ladder (ratings.csv, ratings.md), the cross-play matrix
(crossplay.csv, crossplay.png) and every game (games.jsonl).

The cross-play matrix holds, for each ordered pair of players, the games they met in and the row
player's wins, draws and losses against the column player (its best side placed above, level with
or below the column player's), its score (wins plus half the draws, per game: the row and column
scores of a pair add up to 1) and the mean return of the sides it played.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marl_ppo.faults import UserError
from marl_ppo.league.match import Game
from marl_ppo.league.ratings import Ratings


@dataclass(frozen=True)
class CrossPlay:
    """Per ordered pair of players (row, column), `(P, P)` counts and means of the games they met in."""

    players: tuple[str, ...]
    games: np.ndarray
    wins: np.ndarray
    draws: np.ndarray
    losses: np.ndarray
    return_sum: np.ndarray
    """The summed mean return of the row player's sides, over the games counted."""

    def score(self) -> np.ndarray:
        """`(P, P)`: the row player's wins plus half its draws, per game (NaN where they never met)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.wins + 0.5 * self.draws) / self.games

    def mean_return(self) -> np.ndarray:
        """`(P, P)`: the row player's mean side return against the column player (NaN where they never met)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.return_sum / self.games


def crossplay(games: Sequence[Game], players: Sequence[str]) -> CrossPlay:
    """The cross-play counts of `games` between `players` (in that order)."""
    index = {name: i for i, name in enumerate(players)}
    shape = (len(players), len(players))
    counts = {key: np.zeros(shape) for key in ("games", "wins", "draws", "losses", "return_sum")}
    for game in games:
        ranks = game.player_ranks()
        for row, row_rank in ranks.items():
            sides = [side for side, name in game.players.items() if name == row]
            mean_return = float(np.mean([game.returns[side] for side in sides]))
            for column, column_rank in ranks.items():
                if column == row:
                    continue
                i, j = index[row], index[column]
                counts["games"][i, j] += 1
                counts["return_sum"][i, j] += mean_return
                outcome = (
                    "wins" if row_rank < column_rank else "losses" if row_rank > column_rank else "draws"
                )
                counts[outcome][i, j] += 1
    return CrossPlay(tuple(players), **counts)


@dataclass(frozen=True)
class LadderFiles:
    """The files a rating wrote."""

    ratings_csv: Path
    ratings_md: Path
    crossplay_csv: Path
    crossplay_png: Path
    games_jsonl: Path


def ladder_rows(ratings: Ratings) -> list[dict[str, object]]:
    """The ladder: rank, player, mu, sigma, ordinal and games, the highest ordinal first."""
    return [
        {
            "rank": rank,
            "player": r.player,
            "mu": round(r.mu, 3),
            "sigma": round(r.sigma, 3),
            "ordinal": round(r.ordinal, 3),
            "games": r.games,
        }
        for rank, r in enumerate(ratings.table(), start=1)
    ]


def ladder_markdown(ratings: Ratings) -> str:
    """The ladder as a Markdown table."""
    rows = ladder_rows(ratings)
    header = "| rank | player | mu | sigma | ordinal | games |\n|---:|---|---:|---:|---:|---:|\n"
    body = "".join(
        f"| {r['rank']} | {r['player']} | {r['mu']:.2f} | {r['sigma']:.2f} | {r['ordinal']:.2f} | {r['games']} |\n"
        for r in rows
    )
    return header + body


def write_ladder(
    out: Path, ratings: Ratings, games: Sequence[Game], players: Sequence[str], *, by_return: bool
) -> LadderFiles:
    """Write the ladder, the cross-play matrix (heat-map of the score, or of the mean return with
    `by_return`, for games whose sides do not win or lose against each other) and the games."""
    out.mkdir(parents=True, exist_ok=True)
    files = LadderFiles(
        out / "ratings.csv",
        out / "ratings.md",
        out / "crossplay.csv",
        out / "crossplay.png",
        out / "games.jsonl",
    )
    with files.ratings_csv.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["rank", "player", "mu", "sigma", "ordinal", "games"])
        writer.writeheader()
        writer.writerows(ladder_rows(ratings))
    files.ratings_md.write_text(ladder_markdown(ratings))
    matrix = crossplay(games, players)
    _write_crossplay_csv(files.crossplay_csv, matrix)
    _plot_crossplay(files.crossplay_png, matrix, by_return=by_return)
    files.games_jsonl.write_text("".join(json.dumps(game.to_dict()) + "\n" for game in games))
    return files


def _write_crossplay_csv(path: Path, matrix: CrossPlay) -> None:
    score, mean_return = matrix.score(), matrix.mean_return()
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", "column", "games", "wins", "draws", "losses", "score", "mean_return"])
        for i, row in enumerate(matrix.players):
            for j, column in enumerate(matrix.players):
                if matrix.games[i, j]:
                    counts = [int(matrix.games[i, j]), int(matrix.wins[i, j]), int(matrix.draws[i, j])]
                    counts.append(int(matrix.losses[i, j]))
                    writer.writerow([row, column, *counts, f"{score[i, j]:.4f}", f"{mean_return[i, j]:.4f}"])


def _plot_crossplay(path: Path, matrix: CrossPlay, *, by_return: bool) -> None:
    """A heat-map of the row player's score (or mean return) against each column player."""
    values = matrix.mean_return() if by_return else matrix.score()
    label = "mean return of the row player's side" if by_return else "row player's score (win 1, draw 1/2)"
    plot_heatmap(
        path,
        values,
        matrix.players,
        matrix.players,
        label=label,
        title="cross-play",
        limits=None if by_return else (0.0, 1.0),
        cmap="viridis" if by_return else "RdBu",
    )


def plot_heatmap(
    path: Path,
    values: np.ndarray,
    rows: Sequence[str],
    columns: Sequence[str],
    *,
    label: str,
    title: str,
    limits: tuple[float, float] | None = None,
    cmap: str = "viridis",
    axis_labels: tuple[str, str] = ("column player", "row player"),
) -> None:
    """A `(rows, columns)` matrix as a PNG heat-map, each cell's value written in it (NaN cells blank)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError(
            "the cross-play heat-map needs matplotlib; install it with: pip install 'marl-ppo[report]'"
        ) from None
    size = max(4.0, 0.5 * max(len(rows), len(columns)) + 2.0)
    figure, axes = plt.subplots(figsize=(size + 1.5, size))
    vmin, vmax = limits if limits is not None else (None, None)
    image = axes.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax)
    if max(len(rows), len(columns)) <= 16:
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7)
    axes.set_xticks(range(len(columns)), list(columns), rotation=60, ha="right", fontsize=8)
    axes.set_yticks(range(len(rows)), list(rows), fontsize=8)
    axes.set_xlabel(axis_labels[0])
    axes.set_ylabel(axis_labels[1])
    figure.colorbar(image, ax=axes, label=label)
    axes.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
