"""Rating policies by play: the hook training calls after each pool snapshot, and `marl-ppo rate`.

`marl-ppo rate RUN_DIR [RUN_DIR ...]` rates each run's pool snapshots (`league/pool/`), its final
policy, the uniform random policy, any checkpoint named with `--policy` and any player named with
`--player` (a scripted one such as `scripted/connect_four`, `module:callable`, another run), all on
one env: a round-robin in which every pair of players meets with each of them on each side for `episodes`
games, the ratings updated game by game in the order played (`league.ladder` writes the results).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.vector.base import VectorEnv
from marl_ppo.eval.evaluate import EvalError, eval_config
from marl_ppo.eval.from_checkpoint import load_policy
from marl_ppo.eval.loading import resolve_checkpoint
from marl_ppo.eval.players import RANDOM, Player, partner_player, player_name, policy_player, random_player
from marl_ppo.eval.versus import sides_of
from marl_ppo.faults import UserError
from marl_ppo.league.ladder import LadderFiles, write_ladder
from marl_ppo.league.match import Game, play_duplicate, play_pair
from marl_ppo.league.pool import pool_files, snapshot_name
from marl_ppo.league.ratings import Ratings
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_eval

T = TypeVar("T")


class RateError(UserError, ValueError):
    """Bad input to `marl-ppo rate`: runs of different envs, a run without a policy, one side."""


def rate_new(
    venv: VectorEnv,
    device: torch.device,
    *,
    new: tuple[str, TeamModel],
    opponents: Sequence[tuple[str, TeamModel | None]],
    ratings: Ratings,
    episodes: int,
    seed: int,
    mode: str,
    teams: Mapping[str, Sequence[str]] | None = None,
    deterministic: bool = False,
    score: str = "returns",
) -> list[Game]:
    """Play the new policy against each opponent (None: the random policy) with each on each side for
    `episodes` games (a duplicate match with `score: roles`), update `ratings` with the games in order,
    and return them."""
    sides = sides_of(venv.spec, mode, teams)
    name, model = new
    player = policy_player(name, model, deterministic=deterministic)
    games: list[Game] = []
    for opponent_name, opponent_model in opponents:
        opponent = (
            random_player(opponent_name)
            if opponent_model is None
            else policy_player(opponent_name, opponent_model, deterministic=deterministic)
        )
        match = play_duplicate if score == "roles" else play_pair
        games += match(venv, device, player, opponent, sides=sides, episodes_per_side=episodes, seed=seed)
    ratings.add(name)
    ratings.update_all(games)
    return games


@dataclass(frozen=True)
class PolicyFile:
    """A player of `marl-ppo rate`: a checkpoint holding a policy payload, and its name on the ladder."""

    name: str
    path: Path


def evenly(items: Sequence[T], keep: int | None) -> list[T]:
    """At most `keep` of `items`, evenly spaced, the first and last among them."""
    if keep is None or len(items) <= keep:
        return list(items)
    picks = sorted({int(i) for i in np.linspace(0, len(items) - 1, keep).round()})
    return [items[i] for i in picks]


def run_players(run_dir: Path, max_players: int | None) -> list[PolicyFile]:
    """A run's pool snapshots in update order (at most `max_players`, evenly), then its final policy."""
    if not run_dir.is_dir():
        raise RateError(f"rate: '{run_dir}' is not a run directory; pass the directories of trained runs")
    snapshots = pool_files(run_dir)  # the pool's own reader: ids (updates) to files, oldest first
    names = {path: f"{run_dir.name}/{snapshot_name(update)}" for update, path in snapshots.items()}
    players = [PolicyFile(names[p], p) for p in evenly(list(snapshots.values()), max_players)]
    for final in ("final", "latest"):
        path = run_dir / "checkpoints" / f"{final}.pt"
        if path.is_file():
            players.append(PolicyFile(f"{run_dir.name}/{final}", path))
            break
    if not players:
        raise RateError(
            f"rate: run directory '{run_dir}' has no policy (no league/pool/snapshot_u*.pt, "
            "checkpoints/final.pt or checkpoints/latest.pt); pass runs that have trained"
        )
    return players


def file_player(path: Path) -> PolicyFile:
    """A `--policy` checkpoint, named by its run and file (`RUN/best`) or by its file alone."""
    if not path.is_file():
        raise RateError(
            f"rate: --policy '{path}' is not a file; pass a checkpoint such as RUN_DIR/checkpoints/best.pt"
        )
    name = f"{path.parent.parent.name}/{path.stem}" if path.parent.name == "checkpoints" else path.stem
    return PolicyFile(name, path)


def named_player(text: str) -> PolicyFile | str:
    """A `--player`: a run directory or checkpoint as a policy file (its env is checked with the runs'),
    else the text itself for `partner_player` to read once the env is built (`random`, `scripted/NAME`,
    `module:callable`)."""
    path = Path(text)
    if path.is_dir() or (path.is_file() and path.suffix != ".py"):
        try:
            checkpoint, _ = resolve_checkpoint(path)
        except UserError as err:
            raise RateError(f"rate: --player '{text}': {err}") from None
        return PolicyFile(player_name(path), checkpoint)
    if text == RANDOM:
        raise RateError(
            "rate: --player random is rated already (the random policy always plays); leave it out"
        )
    return text


def _unique(files: Sequence[PolicyFile]) -> list[PolicyFile]:
    """The files, each once, with a name no other has (a repeated name gets `#2`, `#3`, ...)."""
    seen_paths: set[Path] = set()
    names: dict[str, int] = {RANDOM: 1}
    unique = []
    for file in files:
        if file.path.resolve() in seen_paths:
            continue
        seen_paths.add(file.path.resolve())
        count = names.get(file.name, 0) + 1
        names[file.name] = count
        unique.append(PolicyFile(file.name if count == 1 else f"{file.name}#{count}", file.path))
    return unique


@dataclass(frozen=True)
class RateOutput:
    """What `rate_runs` played, rated and wrote."""

    ratings: Ratings
    games: list[Game]
    players: list[str]
    files: LadderFiles


def rate_runs(
    run_dirs: Sequence[Path],
    *,
    policies: Sequence[Path] = (),
    players: Sequence[str] = (),
    episodes: int = 10,
    max_players: int | None = None,
    seed: int = 0,
    out: Path | None = None,
    deterministic: bool = False,
    sides: str | None = None,
    score: str = "returns",
) -> RateOutput:
    """`marl-ppo rate`: a round-robin of the runs' policies, the random policy, `policies` (checkpoints)
    and `players` (any form `partner_player` reads), rated and written to `out` (default: the first
    run's `rating/`). `sides`: `seats` or `teams` (`sides_of`); default the first run's `eval.vs_random`."""
    if episodes < 1:
        raise RateError(f"rate: --episodes {episodes} must be at least 1")
    if max_players is not None and max_players < 2:
        raise RateError(f"rate: --max-players {max_players} must be at least 2 (the first and last snapshot)")
    if not run_dirs:
        raise RateError("rate: name at least one run directory")
    named = [named_player(text) for text in players]
    files = _unique(
        [f for run in run_dirs for f in run_players(Path(run), max_players)]
        + [file_player(Path(p)) for p in policies]
        + [player for player in named if isinstance(player, PolicyFile)]
    )
    scripted = list(dict.fromkeys(text for text in named if isinstance(text, str)))
    payloads = {file.name: load_checkpoint(file.path) for file in files}
    first = _same_env(payloads)
    config = build_config(payloads[first]["config"])
    plan = plan_eval(config)
    mode = sides or config.eval.vs_random
    if mode is None:
        raise RateError(
            f"rate: the sides of env '{config.env.id}' are not set (its run's eval.vs_random is null); pass "
            "--sides seats (every agent a side) or --sides teams for a competitive env"
        )
    venv = build_vector_env(eval_config(plan.config, 4 * episodes), plan.layout, plan.device)
    try:
        seated = _sides(venv.spec, mode, config.eval.teams)
        seated_players: list[Player] = [random_player()] + [
            policy_player(name, _model(payload, venv.spec, plan.device), deterministic=deterministic)
            for name, payload in payloads.items()
        ]
        seated_players += [_scripted(text, venv.spec, plan.device) for text in scripted]
        ratings = Ratings()
        for player in seated_players:
            ratings.add(player.name)
        games: list[Game] = []
        if score not in ("returns", "roles"):
            raise RateError(f"rate: --score '{score}' is not a way to place players; use returns or roles")
        match = play_duplicate if score == "roles" else play_pair
        for first_player, second_player in combinations(seated_players, 2):
            games += match(
                venv,
                plan.device,
                first_player,
                second_player,
                sides=seated,
                episodes_per_side=episodes,
                seed=seed,
            )
    finally:
        venv.close()
    ratings.update_all(games)
    names = [player.name for player in seated_players]
    out_dir = Path(out) if out is not None else Path(run_dirs[0]) / "rating"
    written = write_ladder(out_dir, ratings, games, names, by_return=mode == "teams")
    return RateOutput(ratings, games, names, written)


def _same_env(payloads: Mapping[str, dict[str, Any]]) -> str:
    """The first player's name, after checking that every player was trained on the same env id."""
    envs = {name: payload["config"]["env"]["id"] for name, payload in payloads.items()}
    first = next(iter(envs))
    for name, env_id in envs.items():
        if env_id != envs[first]:
            raise RateError(
                f"rate: runs {first.split('/')[0]} and {name.split('/')[0]} are of env {envs[first]} and "
                f"env {env_id}; rate runs of one env"
            )
    return first


def _sides(
    spec: TeamSpec, mode: str, teams: Mapping[str, Sequence[str]] | None
) -> dict[str, tuple[str, ...]]:
    """The sides of the env (the run's `eval.vs_random` mode, seats by default): two or more, or a one-line error."""
    if mode not in ("seats", "teams"):
        raise RateError(f"rate: --sides '{mode}' is not a way to split agents into sides; use seats or teams")
    try:
        return sides_of(spec, mode, teams)
    except EvalError as err:
        if "two or more sides" in str(err):
            raise RateError(
                f"rate: env '{spec.env_id}' has one side ({mode}: agents {list(spec.agents)}); ratings need "
                "a game of two or more sides"
            ) from None
        raise


def _scripted(text: str, spec: TeamSpec, device: torch.device) -> Player:
    """A `--player` that is not a run: `partner_player`'s, its errors as `rate`'s one line."""
    try:
        return partner_player(text, spec, device)
    except EvalError as err:
        message = str(err).removeprefix(f"partner '{text}': ")
        raise RateError(f"rate: --player '{text}': {message}") from None


def _model(payload: dict[str, Any], spec: TeamSpec, device: torch.device) -> TeamModel:
    """A player's policy from its payload, with the network its own config describes."""
    return load_policy(payload, spec, build_config(payload["config"]), device)
