"""`marl-ppo crossplay`: how well trained policies play with partners they were not trained with.

Every run's policy (rows) plays with every other run's (columns) and with the extra partners named
by `--partner` (columns only: `random`, a checkpoint, a scripted policy). The cell (i, j) is the mean
team return of episodes in which the column's policy sits on one seat and the row's on every other,
averaged over which seat the column takes (each seat in turn, the same episodes each): each seating
equals `marl-ppo eval ROW_RUN --partner SEAT=COLUMN_RUN --seed S --episodes N`. The diagonal is each
run's self-play: all seats its own, which equals `marl-ppo eval RUN --seed S --episodes N` (sampled
actions, or modes with `--deterministic`). Every cell is played from the same seed: the
same env resets, so the cells differ only by who plays.

The self-play/cross-play gap is the mean of the diagonal minus the mean of the off-diagonal cells
between runs, with a 95% bootstrap interval (episodes resampled within each cell), and where both
are positive their ratio. Given per-partner
bounds (`--bounds FILE`: partner name -> [low, high], for example its return with a random partner
and with a best response), each cell is also normalised by its column's bounds:
(return - low) / (high - low).

Writes `crossplay.json` (every cell's episode returns: what `marl-ppo compare` reads, as the
algorithms self-play and cross-play of each run), `crossplay.csv`, `crossplay.md` and
`crossplay.png`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.eval.evaluate import eval_config, eval_seed, mean_ci95, zero_sum
from marl_ppo.eval.loading import load_policy, resolve_checkpoint
from marl_ppo.eval.partners import play_seating
from marl_ppo.eval.players import Player, partner_player, player_name, policy_player
from marl_ppo.faults import UserError
from marl_ppo.league.ladder import plot_heatmap
from marl_ppo.plan.settle import plan_eval

CROSSPLAY_JSON = "crossplay.json"
SELF_PLAY, CROSS_PLAY = "self-play", "cross-play"
"""The two algorithms `compare` reads from a cross-play: each run with itself, and with the other runs."""


class CrossPlayError(UserError, ValueError):
    """Bad input to `marl-ppo crossplay`: runs of different envs or agents, a bad bounds file."""


@dataclass(frozen=True)
class CrossPlayResult:
    """The played matrix: per (row run, column partner), every episode's team return."""

    env_id: str
    agents: tuple[str, ...]
    rows: tuple[str, ...]
    """The runs' names (their directories' names), in the order given."""
    columns: tuple[str, ...]
    """The runs' names, then the extra partners'."""
    returns: dict[tuple[int, int], np.ndarray]
    """(row, column) -> the cell's episode team returns, seat by seat in order (the column on seat 0 first)."""
    seed: int
    episodes: int
    deterministic: bool
    run_dirs: tuple[str, ...]
    bounds: dict[str, tuple[float, float]] = field(default_factory=dict)

    def means(self) -> np.ndarray:
        """`(rows, columns)`: each cell's mean team return."""
        table = np.full((len(self.rows), len(self.columns)), np.nan)
        for (i, j), values in self.returns.items():
            table[i, j] = values.mean()
        return table

    def normalised(self) -> np.ndarray | None:
        """`(rows, columns)`: each cell's mean by its column's bounds; None without bounds (NaN where a
        column has none)."""
        if not self.bounds:
            return None
        table = self.means()
        for j, column in enumerate(self.columns):
            low, high = self.bounds.get(column, (np.nan, np.nan))
            table[:, j] = (table[:, j] - low) / (high - low)
        return table

    def gap(self, *, reps: int = 2000, seed: int = 0) -> dict[str, Any]:
        """Self-play (diagonal) and cross-play (off-diagonal run pairs) mean returns, their difference and
        ratio, with 95% bootstrap intervals of the difference (episodes resampled within each cell)."""
        runs = len(self.rows)
        diagonal = [self.returns[i, i] for i in range(runs)]
        off = [self.returns[i, j] for i in range(runs) for j in range(runs) if i != j]
        self_play = float(np.mean([cell.mean() for cell in diagonal]))
        if not off:
            return {"self_play": self_play, "cross_play": None, "gap": None, "gap_ci95": None, "ratio": None}
        cross = float(np.mean([cell.mean() for cell in off]))
        rng = np.random.default_rng(seed)

        def resampled(cells: list[np.ndarray]) -> np.ndarray:
            """`(reps,)`: the mean over cells of each cell's resampled mean."""
            return np.mean(
                [cell[rng.integers(0, len(cell), (reps, len(cell)))].mean(axis=1) for cell in cells], axis=0
            )

        gaps = resampled(diagonal) - resampled(off)
        low, high = np.percentile(gaps, [2.5, 97.5])
        return {
            "self_play": self_play,
            "cross_play": cross,
            "gap": self_play - cross,
            "gap_ci95": [float(low), float(high)],
            "ratio": cross / self_play if self_play > 0 and cross >= 0 else None,  # of positive returns only
        }

    def to_dict(self) -> dict[str, Any]:
        """`crossplay.json`: the setting, every cell's episodes, the means and the gap."""
        normalised = self.normalised()
        return {
            "env": self.env_id,
            "agents": list(self.agents),
            "rows": list(self.rows),
            "columns": list(self.columns),
            "run_dirs": list(self.run_dirs),
            "seed": self.seed,
            "episodes_per_seat": self.episodes,
            "deterministic": self.deterministic,
            "bounds": {name: list(b) for name, b in self.bounds.items()},
            "cells": [
                {"row": self.rows[i], "column": self.columns[j], "team_return": values.tolist()}
                for (i, j), values in sorted(self.returns.items())
            ],
            "mean": _nan_to_none(self.means()),
            "normalised": None if normalised is None else _nan_to_none(normalised),
            "gap": self.gap(),
        }


def _nan_to_none(table: np.ndarray) -> list[list[float | None]]:
    return [[None if not np.isfinite(v) else float(v) for v in row] for row in table]


def crossplay_runs(
    run_dirs: Sequence[Path | str],
    *,
    partners: Sequence[str] = (),
    episodes: int = 10,
    seed: int | None = None,
    deterministic: bool = False,
    bounds: Path | str | None = None,
) -> CrossPlayResult:
    """Play the cross-play matrix of `run_dirs` (rows and columns) and `partners` (columns)."""
    if episodes < 1:
        raise CrossPlayError(f"crossplay: --episodes {episodes} must be at least 1")
    if not run_dirs:
        raise CrossPlayError("crossplay: name at least one run directory")
    names = _unique([player_name(Path(run)) for run in run_dirs])
    payloads = [load_checkpoint(resolve_checkpoint(run)[0]) for run in run_dirs]
    _same_env(names, payloads)
    config = build_config(payloads[0]["config"])
    plan = plan_eval(config)
    seed = eval_seed(config) if seed is None else seed
    venv = build_vector_env(eval_config(plan.config, episodes), plan.layout, plan.device)
    try:
        spec = venv.spec
        for name, payload in zip(names, payloads, strict=True):
            if list(payload["agents"]) != list(spec.agents):
                raise CrossPlayError(
                    f"crossplay: run {name} has agents {list(payload['agents'])}, not {list(spec.agents)}; "
                    "cross-play runs of one env"
                )
        players: list[Player] = [
            policy_player(
                name,
                load_policy(payload, spec, build_config(payload["config"]), plan.device),
                deterministic=deterministic,
            )
            for name, payload in zip(names, payloads, strict=True)
        ]
        extra = [partner_player(text, spec, plan.device, deterministic=deterministic) for text in partners]
        columns = _unique(names + [player.name for player in extra])
        players += [
            Player(name, player.build) for name, player in zip(columns[len(names) :], extra, strict=True)
        ]
        seats = {agent: (agent,) for agent in spec.agents}

        def team_returns(seated: Sequence[Player], seating: tuple[int, ...]) -> np.ndarray:
            """Episodes of `seated[seating[k]]` on seat k: only the seated players act (and draw samples),
            the row's first, as `eval --partner` orders them."""
            result = play_seating(
                venv,
                plan.device,
                seated,
                seats,
                seating,
                episodes=episodes,
                seed=seed,
                deterministic=deterministic,
            )
            if zero_sum(result.team_returns, result.agent_returns):
                raise CrossPlayError(
                    f"crossplay: env '{config.env.id}' is zero-sum (the team return is 0 in every episode), "
                    "so cross-play's team returns say nothing; rate competitive policies with marl-ppo rate"
                )
            return result.team_returns

        cells: dict[tuple[int, int], np.ndarray] = {}
        for i in range(len(names)):
            for j in range(len(columns)):
                if i == j:
                    cells[i, j] = team_returns([players[i]], (0,) * len(seats))
                    continue
                cells[i, j] = np.concatenate(
                    [
                        team_returns(
                            [players[i], players[j]], tuple(int(seat == k) for seat in range(len(seats)))
                        )
                        for k in range(len(seats))
                    ]
                )
    finally:
        venv.close()
    return CrossPlayResult(
        env_id=config.env.id,
        agents=tuple(spec.agents),
        rows=tuple(names),
        columns=tuple(columns),
        returns=cells,
        seed=seed,
        episodes=episodes,
        deterministic=deterministic,
        run_dirs=tuple(str(Path(run)) for run in run_dirs),
        bounds=read_bounds(bounds, columns) if bounds is not None else {},
    )


def _unique(names: Sequence[str]) -> list[str]:
    """The names, a repeated one suffixed `#2`, `#3`, ..."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return unique


def _same_env(names: Sequence[str], payloads: Sequence[dict[str, Any]]) -> None:
    envs = [payload["config"]["env"]["id"] for payload in payloads]
    for name, env_id in zip(names, envs, strict=True):
        if env_id != envs[0]:
            raise CrossPlayError(
                f"crossplay: runs {names[0]} and {name} are of env {envs[0]} and env {env_id}; "
                "cross-play runs of one env"
            )


def read_bounds(path: Path | str, columns: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per-partner return bounds from a YAML or JSON file `{name: [low, high]}`; one line when a name is
    not a column or a pair is not two numbers with low < high."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise CrossPlayError(
            f"crossplay: cannot read --bounds '{path}' ({err}); give a YAML or JSON file"
        ) from None
    if not isinstance(data, dict):
        raise CrossPlayError(f"crossplay: --bounds '{path}' must map partner names to [low, high]")
    bounds: dict[str, tuple[float, float]] = {}
    for name, pair in data.items():
        if str(name) not in columns:
            raise CrossPlayError(
                f"crossplay: --bounds names '{name}', which is not one of the partners {list(columns)}"
            )
        ok = isinstance(pair, list) and len(pair) == 2 and all(isinstance(v, int | float) for v in pair)
        if not ok or not pair[0] < pair[1]:
            raise CrossPlayError(
                f"crossplay: --bounds gives '{name}' {pair!r}; give [low, high] with low < high"
            )
        bounds[str(name)] = (float(pair[0]), float(pair[1]))
    return bounds


@dataclass(frozen=True)
class CrossPlayFiles:
    json: Path
    csv: Path
    markdown: Path
    png: Path


def write_crossplay(result: CrossPlayResult, out: Path | str) -> CrossPlayFiles:
    """Write `crossplay.json`, `.csv`, `.md` and the heat-map `.png` into `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = CrossPlayFiles(*(out / f"crossplay.{ext}" for ext in ("json", "csv", "md", "png")))
    files.json.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    normalised = result.normalised()
    with files.csv.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", "column", "episodes", "mean", "ci95_low", "ci95_high", "normalised"])
        for (i, j), values in sorted(result.returns.items()):
            stats = mean_ci95(values)
            norm = (
                "" if normalised is None or not np.isfinite(normalised[i, j]) else f"{normalised[i, j]:.4f}"
            )
            writer.writerow(
                [result.rows[i], result.columns[j], len(values), f"{stats['mean']:.4f}"]
                + [f"{v:.4f}" for v in stats["ci95"]]
                + [norm]
            )
    files.markdown.write_text(crossplay_markdown(result))
    plot_heatmap(
        files.png,
        result.means(),
        result.rows,
        result.columns,
        label="mean team return",
        title=f"cross-play: {result.env_id}",
        axis_labels=("partner (one seat)", "policy (the other seats)"),
    )
    return files


def crossplay_markdown(result: CrossPlayResult) -> str:
    """The matrix of mean team returns (and normalised scores), and the self-play/cross-play gap."""
    lines = [
        f"# Cross-play on {result.env_id}",
        "",
        f"{result.episodes} episodes per seating from seed {result.seed} "
        f"({'modes' if result.deterministic else 'sampled actions'}); rows: the policy on every seat but "
        "one, columns: the partner on that seat (each seat in turn).",
        "",
    ]
    for title, table in (("Mean team return", result.means()), ("Normalised", result.normalised())):
        if table is None:
            continue
        lines += [f"## {title}", "", "| policy \\ partner | " + " | ".join(result.columns) + " |"]
        lines.append("|---|" + "---:|" * len(result.columns))
        for name, row in zip(result.rows, table, strict=True):
            lines.append(
                f"| {name} | " + " | ".join("" if not np.isfinite(v) else f"{v:.2f}" for v in row) + " |"
            )
        lines.append("")
    gap = result.gap()
    if gap["cross_play"] is not None:
        low, high = gap["gap_ci95"]
        lines += [
            f"Self-play {gap['self_play']:.2f}, cross-play {gap['cross_play']:.2f}: gap {gap['gap']:.2f} "
            f"[95% bootstrap CI {low:.2f}, {high:.2f}]"
            + (f", cross-play/self-play {gap['ratio']:.2f}" if gap["ratio"] is not None else ""),
            "",
        ]
    return "\n".join(lines)


def read_crossplay(path: Path | str) -> dict[str, Any]:
    """A `crossplay.json` (or the directory holding one) as written."""
    path = Path(path)
    path = path / CROSSPLAY_JSON if path.is_dir() else path
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CrossPlayError(f"cannot read cross-play results '{path}' ({err})") from None
    return data


def self_and_cross(data: Mapping[str, Any]) -> list[tuple[str, str, list[float]]]:
    """Per run (row), its self-play episodes and its cross-play episodes with the other runs: (run,
    algorithm, team returns)."""
    runs = set(data["rows"])
    out: list[tuple[str, str, list[float]]] = []
    for row in data["rows"]:
        cells = [c for c in data["cells"] if c["row"] == row]
        own = [x for c in cells if c["column"] == row for x in c["team_return"]]
        others = [x for c in cells if c["column"] != row and c["column"] in runs for x in c["team_return"]]
        out.append((row, SELF_PLAY, own))
        if others:
            out.append((row, CROSS_PLAY, others))
    return out
