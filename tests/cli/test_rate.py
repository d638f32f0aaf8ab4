"""`marl-ppo rate` on tiny real runs: the ladder, cross-play and games it writes, their numbers
against openskill and each other, reproducibility, and its one-line errors."""

import csv
import json

import pytest
import torch
from openskill.models import PlackettLuce

from marl_ppo.checkpoint import load_checkpoint, save_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.league.rate import evenly
from marl_ppo.run.loop import train
from tests.helpers import ROOT

POLICY_KEYS = ("format", "config", "agents", "groups", "updates", "env_steps", "model")
"""The policy payload a pool snapshot holds (as checkpoints/best.pt does)."""


def _train(run_dir, experiment, *overrides):
    base = ["rollout.num_envs=2", "rollout.rollout_steps=16", "total_steps=64", "log.progress=false"]
    base += ["eval.every=null", "ppo.num_minibatches=2", "model.hidden_sizes=[16]"]
    train(load_config(ROOT / experiment, [*base, *overrides]), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny tic-tac-toe run with a pool of three snapshots (its final weights, perturbed), and tiny RPS
    and simple_spread runs."""
    root = tmp_path_factory.mktemp("rate")
    game = _train(root / "ttt", "experiments/classic/tictactoe_v3.yaml")
    final = load_checkpoint(game / "checkpoints" / "final.pt")
    for update in (1, 2, 3):
        torch.manual_seed(update)
        model = {
            k: v + 0.5 * torch.randn_like(v) if v.is_floating_point() else v
            for k, v in final["model"].items()
        }
        payload = {**{k: final[k] for k in POLICY_KEYS}, "model": model, "updates": update}
        save_checkpoint(game / "league" / "pool" / f"snapshot_u{update:07d}.pt", payload)
    rps = _train(
        root / "rps", "experiments/classic/rps_v2.yaml", "rollout.rollout_steps=15", "total_steps=60"
    )
    spread = _train(
        root / "spread", "experiments/mpe/simple_spread.yaml", "rollout.rollout_steps=25", "total_steps=50"
    )
    return game, rps, spread


def _rows(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_rate_writes_the_ladder_crossplay_and_games_of_a_round_robin(runs, tmp_path, capsys):
    game = runs[0]
    args = ["rate", str(game), "--episodes", "2", "--max-players", "2", "--seed", "5"]
    assert main([*args, "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "| rank | player | mu | sigma | ordinal | games |" in out
    assert "4 players, 48 games: wrote" in out  # random, u1, u3 (first and last), final; 6 pairs x 2 x 2 x 2
    games = [json.loads(line) for line in (tmp_path / "a" / "games.jsonl").read_text().splitlines()]
    assert len(games) == 48
    assert {p for g in games for p in g["players"].values()} == {"random", "ttt/u1", "ttt/u3", "ttt/final"}
    # the ratings are openskill's, game by game in the order of games.jsonl
    model = PlackettLuce()
    beliefs: dict = {}
    for g in games:
        names = list(g["players"].values())
        teams = [[beliefs.get(name, model.rating(name=name))] for name in names]
        ranks = [g["ranks"][side] for side in g["players"]]
        for name, (rating,) in zip(names, model.rate(teams, ranks=ranks), strict=True):
            beliefs[name] = rating
    ladder = _rows(tmp_path / "a" / "ratings.csv")
    assert [row["rank"] for row in ladder] == ["1", "2", "3", "4"]
    for row in ladder:
        assert float(row["mu"]) == round(beliefs[row["player"]].mu, 3) and row["games"] == "24"
        assert float(row["ordinal"]) == round(beliefs[row["player"]].ordinal(), 3)
    ordinals = [float(row["ordinal"]) for row in ladder]
    assert ordinals == sorted(ordinals, reverse=True)
    # cross-play: each pair met in 8 games, and a pair's two scores add up to 1
    cells = {(r["row"], r["column"]): r for r in _rows(tmp_path / "a" / "crossplay.csv")}
    assert len(cells) == 12 and all(r["games"] == "8" for r in cells.values())
    for (row, column), cell in cells.items():
        assert float(cell["score"]) + float(cells[column, row]["score"]) == pytest.approx(1.0)
        assert int(cell["wins"]) == int(cells[column, row]["losses"])
    assert (tmp_path / "a" / "crossplay.png").stat().st_size > 0
    assert "| 1 |" in (tmp_path / "a" / "ratings.md").read_text()
    assert main([*args, "--out", str(tmp_path / "b")]) == 0  # the same seed, the same games
    assert (tmp_path / "b" / "games.jsonl").read_text() == (tmp_path / "a" / "games.jsonl").read_text()


def test_rate_takes_policy_files_and_writes_into_the_first_run_by_default(runs, tmp_path, capsys):
    game = runs[0]
    best = game / "league" / "pool" / "snapshot_u0000002.pt"
    args = ["rate", str(game), "--policy", str(best), "--episodes", "1", "--max-players", "2"]
    assert main(args) == 0
    assert "5 players, 40 games" in capsys.readouterr().out
    players = {row["player"] for row in _rows(game / "rating" / "ratings.csv")}
    assert players == {"random", "ttt/u1", "ttt/u3", "ttt/final", "snapshot_u0000002"}


def lowest_free(observation, mask, agent):
    """A scripted tic-tac-toe player: the free square of the lowest number."""
    return int(mask.nonzero()[0][0])


def highest_free(observation, mask, agent):
    """A scripted tic-tac-toe player: the free square of the highest number."""
    return int(mask.nonzero()[0][-1])


def test_rate_plays_scripted_players_and_other_runs_beside_the_runs(runs, tmp_path, capsys):
    game = runs[0]
    snapshot = game / "league" / "pool" / "snapshot_u0000002.pt"
    players = ["tests.cli.test_rate:lowest_free", "tests.cli.test_rate:highest_free", str(snapshot)]
    args = ["rate", str(game), "--episodes", "2", "--max-players", "2", "--out", str(tmp_path)]
    assert main([*args, *(f"--player={p}" for p in players)]) == 0
    # random, u1, u3, final, snapshot_u0000002 and the two scripted: 21 pairs x 2 sides x 2 x 2
    assert "7 players, 168 games: wrote" in capsys.readouterr().out
    rated = {row["player"]: row for row in _rows(tmp_path / "ratings.csv")}
    assert set(rated) == {
        "random",
        "ttt/u1",
        "ttt/u3",
        "ttt/final",
        "snapshot_u0000002",
        "tests.cli.test_rate:lowest_free",
        "tests.cli.test_rate:highest_free",
    }
    assert all(row["games"] == "48" for row in rated.values())
    # the two scripted players against each other: whoever moves first (player_1) takes a line in five
    # moves (0, 1, 2 or 8, 7, 6) before the other completes one; so each wins the 4 games it opens
    games = [json.loads(line) for line in (tmp_path / "games.jsonl").read_text().splitlines()]
    scripted = {"tests.cli.test_rate:lowest_free", "tests.cli.test_rate:highest_free"}
    between = [g for g in games if set(g["players"].values()) == scripted]
    assert len(between) == 8
    for g in between:
        assert g["ranks"] == {"player_1": 1, "player_2": 2} and g["returns"] == {
            "player_1": 1.0,
            "player_2": -1.0,
        }
    cells = {(r["row"], r["column"]): r for r in _rows(tmp_path / "crossplay.csv")}
    cell = cells["tests.cli.test_rate:lowest_free", "tests.cli.test_rate:highest_free"]
    assert (cell["games"], cell["wins"], cell["losses"], float(cell["score"])) == ("8", "4", "4", 0.5)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (
            "two_envs",
            "rate: runs ttt and rps are of env classic/tictactoe_v3 and env classic/rps_v2; rate runs of one env",
        ),
        ("no_policy", "has no policy"),
        ("not_a_dir", "is not a run directory"),
        ("one_side", "rate: env 'classic/rps_v2' has one side (teams: agents ['player_0', 'player_1'])"),
        (
            "sides_unset",
            "rate: the sides of env 'mpe2/simple_spread_v3' are not set (its run's eval.vs_random is null)",
        ),
        ("one_team", "rate: env 'mpe2/simple_spread_v3' has one side (teams: agents"),
        ("max_players", "rate: --max-players 1 must be at least 2"),
        (
            "unknown_scripted",
            "rate: --player 'scripted/nope': no scripted player 'nope'; the project ships scripted/connect_four, "
            "scripted/hanabi, scripted/smax",
        ),
        ("player_random", "rate: --player random is rated already"),
        ("player_other_env", "rate: runs ttt and rps are of env classic/tictactoe_v3 and env classic/rps_v2"),
        (
            "player_no_callable",
            "rate: --player 'tests.cli.test_rate:nothing': 'tests.cli.test_rate' defines no",
        ),
    ],
)
def test_bad_rate_input_is_one_line_and_exit_status_2(runs, tmp_path, capsys, case, message):
    game, rps, spread = runs
    (tmp_path / "empty").mkdir()
    args = {
        "two_envs": [str(game), str(rps)],
        "no_policy": [str(tmp_path / "empty")],
        "not_a_dir": [str(tmp_path / "missing")],
        "one_side": [str(rps), "--sides", "teams"],
        "sides_unset": [str(spread)],
        "one_team": [str(spread), "--sides", "teams"],
        "max_players": [str(game), "--max-players", "1"],
        "unknown_scripted": [str(game), "--player", "scripted/nope"],
        "player_random": [str(game), "--player", "random"],
        "player_other_env": [str(game), "--player", str(rps)],
        "player_no_callable": [str(game), "--player", "tests.cli.test_rate:nothing"],
    }[case]
    assert main(["rate", *args, "--episodes", "1", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_max_players_keeps_the_first_and_last_snapshot_and_spaces_the_rest_evenly():
    pool = [f"u{k}" for k in range(10)]
    assert evenly(pool, 4) == ["u0", "u3", "u6", "u9"] and evenly(pool, 2) == ["u0", "u9"]
    assert evenly(pool, 10) == pool and evenly(pool, None) == pool and evenly(pool[:3], 5) == pool[:3]


def test_rate_by_roles_plays_duplicate_games_on_each_side(tmp_path, capsys):
    tag = _train(
        tmp_path / "tag",
        "experiments/mpe/simple_tag.yaml",
        "rollout.rollout_steps=25",
        "total_steps=50",
        "rollout.vector=sync",
    )
    out = tmp_path / "rating"
    args = ["rate", str(tag), "--sides", "teams", "--score", "roles", "--episodes", "2", "--out", str(out)]
    assert main(args) == 0
    games = [json.loads(line) for line in (out / "games.jsonl").read_text().splitlines()]
    assert len(games) == 2 * 2  # random and the final policy: each side twice
    assert [sorted(g["players"]) for g in games] == [["adversary@1", "adversary@2"]] * 2 + [
        ["agent@1", "agent@2"]
    ] * 2
    assert {name for g in games for name in g["players"].values()} == {"random", "tag/final"}
    with pytest.raises(SystemExit):
        main([*args[:-2], "--score", "wins"])
    assert "invalid choice: 'wins'" in capsys.readouterr().err
