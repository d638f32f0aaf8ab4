"""`marl-ppo play`: a person's typed moves reach the env, illegal input is refused in one line, and the
record holds every step and each game's returns; Ctrl-C keeps what was played."""

import io
import json

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marl_ppo.checkpoint import load_checkpoint, save_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.eval.human import BoardView, IllegalInput, board_text, parse_action, seat_of
from marl_ppo.eval.play import play_checkpoint, table_env
from marl_ppo.run.loop import train
from tests.helpers import ROOT

pytest.importorskip("pygame")  # PettingZoo's tic-tac-toe draws with pygame

TINY = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=16",
    "total_steps=32",
    "rollout.vector=sync",
    "log.progress=false",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
    "model.hidden_sizes=[16]",
    "eval.every=0",
    "eval.vs_random=null",
]


@pytest.fixture(scope="module")
def tictactoe_run(tmp_path_factory):
    """A tiny tic-tac-toe run (1 update), and beside its final.pt `lowest.pt`: the same policy with its
    last layer set so that it always takes the lowest-numbered allowed square (its mode)."""
    run_dir = tmp_path_factory.mktemp("play") / "run"
    train(load_config(ROOT / "experiments/classic/tictactoe_v3.yaml", TINY), run_dir)
    payload = load_checkpoint(run_dir / "checkpoints" / "final.pt")
    weight, bias = "actors.0.net.layers.1.weight", "actors.0.net.layers.1.bias"
    payload["model"][weight] = torch.zeros_like(payload["model"][weight])
    payload["model"][bias] = -10.0 * torch.arange(9, dtype=torch.float32).reshape(1, 9)
    save_checkpoint(run_dir / "checkpoints" / "lowest.pt", payload)
    return run_dir


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _replay(actions):
    """Each agent's return when PettingZoo's own tic-tac-toe is played with `actions` in turn."""
    from pettingzoo.classic import tictactoe_v3

    env = tictactoe_v3.env()
    env.reset(seed=0)
    returns = dict.fromkeys(env.possible_agents, 0.0)
    moves = iter(actions)
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        returns[agent] += reward
        env.step(None if terminated or truncated else next(moves))
    assert next(moves, None) is None, "every action was played"
    return returns


def test_typed_moves_reach_the_env_illegal_input_is_refused_and_the_win_is_recorded(tictactoe_run, tmp_path):
    # the policy (player_2) takes the lowest free square: X at 4, O at 0, X at 1, O at 2, X at 7 wins
    # the middle row (squares 1, 4, 7); before each accepted move, refused input of every kind
    typed = ["abc", "9", "4", "4", "0", "1", "7"]
    out = io.StringIO()
    played = play_checkpoint(
        tictactoe_run / "checkpoints" / "lowest.pt",
        human="player_1",
        deterministic=True,
        window=False,
        reader=io.StringIO("".join(f"{line}\n" for line in typed)),
        writer=out,
    )
    text = out.getvalue()
    assert text.count("your action> ") == len(typed)  # one prompt per line read
    after = [line.split("your action> ")[-1] for line in text.splitlines() if "your action> " in line]
    refusals = [line for line in after if " is not " in line or " out of range" in line]
    assert refusals == [
        "'abc' is not an action: type one of 0, 1, 2, 3, 4, 5, 6, 7, 8 (q ends the session)",
        "9 is out of range: actions are 0 to 8; allowed now 0, 1, 2, 3, 4, 5, 6, 7, 8",
        "4 is not allowed now: type one of 1, 2, 3, 5, 6, 7, 8",
        "0 is not allowed now: type one of 1, 2, 3, 5, 6, 7, 8",
    ]
    assert "game 1 over after 5 steps: player_1 (you) +1, player_2 -1" in text
    assert played.returns == [{"player_1": 1.0, "player_2": -1.0}] and played.ended is None
    # the board the person saw before the last move: X at 4 and 1, O at 0 and 2, drawn as the env draws it
    assert "O 3 6\nX X 7\nO 5 8\n(X yours" in text

    assert played.record.parent == tictactoe_run / "play" and played.record.suffix == ".jsonl"
    lines = _lines(played.record)
    assert [line["type"] for line in lines] == ["session"] + ["step"] * 5 + ["game"]
    assert lines[0]["human"] == "player_1" and lines[0]["checkpoint"].endswith("lowest.pt")
    steps = lines[1:6]
    movers = ["player_1", "player_2"] * 3
    actions = [step["agents"][mover]["action"] for step, mover in zip(steps, movers, strict=False)]
    assert actions == [4, 0, 1, 2, 7]
    assert [step["human_moved"] for step in steps] == [True, False, True, False, True]
    assert [step["step"] for step in steps] == [0, 1, 2, 3, 4] and {s["game"] for s in steps} == {0}
    # the observation each move was made from: player_1's plane 0 (its Xs) before its last move holds 4 and 1
    last = np.array(steps[4]["agents"]["player_1"]["obs"]).reshape(3, 3, 2)
    assert last[:, :, 0].reshape(-1).nonzero()[0].tolist() == [1, 4]
    assert last[:, :, 1].reshape(-1).nonzero()[0].tolist() == [0, 2]
    assert steps[4]["agents"]["player_1"]["allowed"] == [0, 0, 0, 1, 0, 1, 1, 1, 1]
    assert [step["agents"]["player_1"]["reward"] for step in steps] == [0, 0, 0, 0, 1]
    assert lines[6] == {
        "type": "game",
        "game": 0,
        "returns": {"player_1": 1.0, "player_2": -1.0},
        "length": 5,
    }
    assert _replay(actions) == lines[6]["returns"]  # PettingZoo's own game, replayed, agrees


def test_games_against_the_trained_policy_are_recorded_step_by_step(tictactoe_run, tmp_path):
    """Three games as player_2 against the sampled policy; the person types 0..8 over and over, so each
    move is the first allowed square after the last one typed."""
    record = tmp_path / "games.jsonl"
    typed = "".join(f"{n}\n" for n in range(9)) * 12
    played = play_checkpoint(
        tictactoe_run,
        human="player_2",
        games=3,
        record=record,
        seed=3,
        window=False,
        reader=io.StringIO(typed),
        writer=io.StringIO(),
    )
    assert played.record == record and len(played.returns) == 3
    lines = _lines(record)
    ends = [line for line in lines if line["type"] == "game"]
    assert [end["game"] for end in ends] == [0, 1, 2]
    for end, returns in zip(ends, played.returns, strict=True):
        assert end["returns"] == returns and sum(returns.values()) == 0  # zero-sum
        steps = [line for line in lines if line["type"] == "step" and line["game"] == end["game"]]
        assert len(steps) == end["length"] and 5 <= end["length"] <= 9
        movers = [next(a for a, entry in s["agents"].items() if entry["action"] is not None) for s in steps]
        assert movers == (["player_1", "player_2"] * 5)[: len(steps)]  # X first, then turns
        assert [s["human_moved"] for s in steps] == [m == "player_2" for m in movers]
        for step, mover in zip(steps, movers, strict=True):
            entry = step["agents"][mover]
            assert entry["allowed"][entry["action"]] == 1  # every move allowed when made
        for agent in ("player_1", "player_2"):
            assert sum(s["agents"][agent]["reward"] for s in steps) == end["returns"][agent]
        assert _replay([s["agents"][m]["action"] for s, m in zip(steps, movers, strict=True)]) == returns
    again = play_checkpoint(
        tictactoe_run,
        human="player_2",
        games=3,
        record=tmp_path / "again.jsonl",
        seed=3,
        window=False,
        reader=io.StringIO(typed),
        writer=io.StringIO(),
    )
    assert again.returns == played.returns  # the same seed and input play the same games


class _InterruptedAfter:
    """An input stream whose `readline` gives `lines`, then raises KeyboardInterrupt (Ctrl-C)."""

    def __init__(self, lines):
        self.lines = list(lines)

    def readline(self):
        if not self.lines:
            raise KeyboardInterrupt
        return self.lines.pop(0)


def test_ctrl_c_mid_game_keeps_the_steps_played(tictactoe_run, tmp_path):
    out = io.StringIO()
    played = play_checkpoint(
        tictactoe_run / "checkpoints" / "lowest.pt",
        human="player_1",
        games=2,
        record=tmp_path / "cut.jsonl",
        deterministic=True,
        window=False,
        reader=_InterruptedAfter(["4\n"]),
        writer=out,
    )
    assert played.ended == "interrupted" and played.returns == []
    lines = _lines(tmp_path / "cut.jsonl")
    assert [line["type"] for line in lines] == ["session", "step", "step", "ended"]
    assert lines[1]["agents"]["player_1"]["action"] == 4 and lines[2]["agents"]["player_2"]["action"] == 0
    assert lines[3] == {"type": "ended", "game": 0, "reason": "interrupted"}
    assert (
        f"session ended (interrupted): 0 game(s) finished; record: {tmp_path / 'cut.jsonl'}" in out.getvalue()
    )


def test_the_command_plays_and_refuses_bad_input_in_one_line(tictactoe_run, tmp_path, monkeypatch, capsys):
    lowest = str(tictactoe_run / "checkpoints" / "lowest.pt")
    record = tmp_path / "cli.jsonl"
    monkeypatch.setattr("sys.stdin", io.StringIO("4\n1\n7\n"))
    args = ["play", lowest, "--human", "player_1", "--deterministic", "--no-window", "--record", str(record)]
    assert main(args) == 0
    assert "player_1 (you) +1, player_2 -1" in capsys.readouterr().out
    assert _lines(record)[-1]["returns"] == {"player_1": 1.0, "player_2": -1.0}

    assert main(args) == 2  # never overwrites a record
    assert capsys.readouterr().err.strip().endswith("exists; name a new file (a record is never overwritten)")
    assert main(["play", lowest, "--human", "player_3", "--no-window"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --human 'player_3' is not an agent of env 'classic/tictactoe_v3'; pick one of player_1, player_2\n"
    )
    assert main(["play", lowest, "--human", "player_1", "--games", "0"]) == 2
    assert "--games 0 must be at least 1" in capsys.readouterr().err

    monkeypatch.setattr("sys.stdin", _InterruptedAfter([]))
    assert (
        main(["play", lowest, "--human", "player_1", "--no-window", "--record", str(tmp_path / "c.jsonl")])
        == 130
    )
    assert "session ended (interrupted)" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("q\n"))
    assert (
        main(["play", lowest, "--human", "player_1", "--no-window", "--record", str(tmp_path / "q.jsonl")])
        == 0
    )
    assert _lines(tmp_path / "q.jsonl")[-1] == {"type": "ended", "game": 0, "reason": "quit"}


def test_a_seat_whose_actions_cannot_be_typed_is_refused():
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    group = GroupSpec("walker", ("walker_0",), box, box, 2)
    spec = TeamSpec("sisl/multiwalker_v9", ("walker_0",), (group,), 2, False)
    with pytest.raises(
        EvalError,
        match=r"^--human walker_0: its actions \(Box\(-1.0, 1.0, \(2,\), float32\)\) are continuous",
    ):
        seat_of(spec, "walker_0")
    several = gym.spaces.MultiDiscrete([3, 2])
    spec = TeamSpec("grid", ("mover",), (GroupSpec("mover", ("mover",), box, several, 2, "info"),), 2, False)
    seat = seat_of(spec, "mover")  # one number per part
    assert seat.sizes == (3, 2)
    parts = seat.parts(np.array([1, 0, 1, 0, 1]))
    assert [p.tolist() for p in parts] == [[True, False, True], [False, True]]
    assert [p.tolist() for p in seat.parts(np.zeros(0))] == [[True] * 3, [True] * 2]


def test_parse_action_takes_numbers_and_names_and_refuses_the_rest():
    allowed = [np.array([True, False, True])]
    names = ["rock", "paper", "scissors"]
    assert parse_action(" 2 \n", allowed, names) == (2,) and parse_action("Rock", allowed, names) == (0,)
    for typed, reason in [("paper", "not allowed now"), ("-1", "out of range"), ("", "is not an action")]:
        with pytest.raises(IllegalInput, match=reason):
            parse_action(typed, allowed, names)
    parts = [np.array([True, False, True]), np.array([False, True])]
    assert parse_action("2 1", parts, None) == (2, 1)
    refusals = {
        "2": "'2' is not an action: type 2 numbers, one per part (q ends the session)",
        "1 1": "part 1: 1 is not allowed now: type one of 0, 2",
        "0 2": "part 2: 2 is out of range: actions are 0 to 1; allowed now 1",
        "0 x": "part 2: 'x' is not an action: type one of 1 (q ends the session)",
    }
    for typed, message in refusals.items():
        with pytest.raises(IllegalInput) as refused:
            parse_action(typed, parts, None)
        assert str(refused.value) == message


def test_a_plain_board_numbers_rows_and_columns():
    planes = np.zeros((2, 3, 2))
    planes[0, 1, 0] = planes[1, 2, 1] = 1
    assert board_text(planes, BoardView(legend="key")) == "   0 1 2\n 0 . X .\n 1 . . O\n(key)"


class Pick(ParallelEnv):
    """Two rounds in which both agents pick 0, 1 or 2 at once and are paid what they picked; rendered as
    text. With `parts`, each picks two numbers (0..2 and 0..1) and is paid 10 x the first + the second."""

    metadata = {"name": "pick_v0", "render_modes": ["ansi"]}

    def __init__(self, render_mode=None, parts=False):
        self.possible_agents = ["left", "right"]
        self.render_mode, self.parts = render_mode, parts

    def observation_space(self, agent):
        return spaces.Box(0.0, 2.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.MultiDiscrete([3, 2]) if self.parts else spaces.Discrete(3)

    def reset(self, seed=None, options=None):
        self.agents, self.round = list(self.possible_agents), 0
        return {a: np.zeros(1, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.round += 1
        obs = {a: np.array([float(self.round)], np.float32) for a in self.agents}
        rewards = {a: float(np.dot(actions[a], [10, 1]) if self.parts else actions[a]) for a in self.agents}
        over = {a: self.round == 2 for a in self.agents}
        if self.round == 2:
            self.agents = []
        return obs, rewards, over, {a: False for a in obs}, {a: {} for a in obs}

    def render(self):
        return f"round {self.round} of 2"


def pick(render_mode=None, parts=False):
    return Pick(render_mode, parts)


def test_a_simultaneous_game_shows_the_envs_text_and_records_both_moves(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [f"env.id={__file__}:pick", "rollout.num_envs=2", "rollout.rollout_steps=4", "total_steps=8"]
    overrides += ["rollout.vector=sync", "log.progress=false", "ppo.num_minibatches=1", "eval.every=0"]
    train(load_config(None, overrides), run_dir)
    out = io.StringIO()
    played = play_checkpoint(
        run_dir,
        human="right",
        window=False,
        reader=io.StringIO("2\n1\n"),
        writer=out,
        record=tmp_path / "p.jsonl",
    )
    text = out.getvalue()
    assert "game 1, your move 1 as right:\nround 0 of 2\nallowed: 0, 1, 2" in text
    assert (
        "game 1, your move 2 as right:\nround 1 of 2\n" in text
        and "round 2 of 2\ngame 1 over after 2 steps" in text
    )
    steps = [line for line in _lines(tmp_path / "p.jsonl") if line["type"] == "step"]
    assert [s["agents"]["right"]["action"] for s in steps] == [2, 1]
    assert [s["agents"]["right"]["reward"] for s in steps] == [2.0, 1.0]
    assert all(s["human_moved"] and s["agents"]["left"]["action"] in (0, 1, 2) for s in steps)
    assert "allowed" not in steps[0]["agents"]["right"]  # an env without masks records none
    left = sum(s["agents"]["left"]["action"] for s in steps)
    assert played.returns == [{"left": float(left), "right": 3.0}]


def test_the_env_draws_its_own_window_where_a_screen_is(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # a window without a screen, for the test
    monkeypatch.setenv("DISPLAY", ":0")
    config = load_config(ROOT / "experiments/classic/tictactoe_v3.yaml", [])
    env, mode = table_env(config, window=True)
    try:
        assert mode == "human" and env.unwrapped.render_mode == "human"
    finally:
        env.close()
    env, mode = table_env(config, window=False)
    env.close()
    assert mode is None
    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    env, mode = table_env(config, window=True)
    env.close()
    assert mode is None


def test_an_openspiel_game_names_the_actions_and_shows_what_the_seat_knows(tmp_path):
    pytest.importorskip("pyspiel")
    overrides = [
        "env.id=classic/kuhn_poker",
        "rollout.num_envs=2",
        "rollout.rollout_steps=8",
        "total_steps=16",
    ]
    overrides += ["rollout.vector=sync", "log.progress=false", "ppo.num_minibatches=1", "eval.every=0"]
    train(load_config(None, overrides), tmp_path / "run")
    out = io.StringIO()
    played = play_checkpoint(
        tmp_path / "run", human="player_0", games=3, window=False, reader=io.StringIO("Bet\n" * 6), writer=out
    )
    text = out.getvalue()
    # Kuhn poker deals player_0 one of three cards (0, 1 or 2, OpenSpiel's information state) and it acts first
    assert text.count("allowed: 0 (Pass), 1 (Bet)") >= 3
    assert "game 1, your move 1 as player_0:\ninformation state: " in text
    first_moves = [line for line in _lines(played.record) if line["type"] == "step" and line["step"] == 0]
    assert [line["agents"]["player_0"]["action"] for line in first_moves] == [
        1,
        1,
        1,
    ]  # "Bet" reached the game
    assert all(sum(returns.values()) == 0 for returns in played.returns) and len(played.returns) == 3
    # betting first, player_0 wins the ante when player_1 folds, else 2 chips more or less at the showdown
    assert {returns["player_0"] for returns in played.returns} <= {1.0, 2.0, -2.0}


def test_a_seat_of_several_parts_types_one_number_per_part(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [f"env.id={__file__}:pick", "env.kwargs={parts: true}", "rollout.num_envs=2"]
    overrides += ["rollout.rollout_steps=4", "total_steps=8", "rollout.vector=sync", "log.progress=false"]
    overrides += ["ppo.num_minibatches=1", "eval.every=0"]
    train(load_config(None, overrides), run_dir)
    out = io.StringIO()
    played = play_checkpoint(
        run_dir, human="left", window=False, reader=io.StringIO("2\n2 1\n0 2\n1 0\n"), writer=out
    )
    text = out.getvalue()
    assert "allowed (type 2 numbers): part 1: 0, 1, 2; part 2: 0, 1" in text
    assert (
        "'2' is not an action: type 2 numbers, one per part" in text and "part 2: 2 is out of range" in text
    )
    steps = [line for line in _lines(played.record) if line["type"] == "step"]
    assert [s["agents"]["left"]["action"] for s in steps] == [[2, 1], [1, 0]]
    assert [s["agents"]["left"]["reward"] for s in steps] == [21.0, 10.0]
    assert played.returns[0]["left"] == 31.0
