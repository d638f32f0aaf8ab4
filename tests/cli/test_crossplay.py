"""Partners in evaluation and `marl-ppo crossplay` on tiny real runs: a scripted partner sees its own
seat's observations and its moves reach the env; the cross-play diagonal is each run's self-play
evaluation on the same seeds; an off-diagonal cell is the partner evaluation of its seatings; the gap,
bounds and `compare` read the matrix; bad input gets one line."""

import json

import numpy as np
import pytest
import torch

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.eval.partners import parse_partners, partner_sides
from marl_ppo.league.crossplay import CrossPlayError, CrossPlayResult, crossplay_runs
from marl_ppo.run.loop import train
from tests.helpers import ROOT

SEED, EPISODES = 7, 4


def _train(run_dir, experiment, *overrides):
    base = ["rollout.num_envs=2", "rollout.rollout_steps=16", "total_steps=64", "log.progress=false"]
    base += ["eval.every=null", "ppo.num_minibatches=2", "model.hidden_sizes=[16]"]
    train(load_config(ROOT / experiment, [*base, *overrides]), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three tiny simple_spread runs (seeds 0, 1, 2) and a tiny tic-tac-toe run."""
    root = tmp_path_factory.mktemp("crossplay")
    spread = [
        _train(
            root / f"spread_s{seed}",
            "experiments/mpe/simple_spread.yaml",
            f"seed={seed}",
            "rollout.rollout_steps=25",
            "total_steps=50",
        )
        for seed in range(3)
    ]
    return spread, _train(root / "ttt", "experiments/classic/tictactoe_v3.yaml")


class Recorder:
    """A scripted tic-tac-toe player: the lowest free square of PREFERENCE; it records every observation
    and mask it is given, and the squares it chose, per episode."""

    PREFERENCE = (4, 0, 8, 2, 6, 1, 3, 5, 7)
    episodes: list[list[tuple[np.ndarray, np.ndarray, int]]] = []

    def __init__(self):
        self.reset()

    def reset(self):
        self.moves: list[tuple[np.ndarray, np.ndarray, int]] = []
        Recorder.episodes.append(self.moves)

    def __call__(self, observation, mask, agent):
        assert agent == "player_2"
        choice = next(square for square in self.PREFERENCE if mask[square])
        self.moves.append((observation.copy(), mask.copy(), choice))
        return choice


def test_a_scripted_partner_sees_its_own_seat_and_its_moves_reach_the_env(runs, tmp_path):
    Recorder.episodes = []
    output = evaluate_checkpoint(
        runs[1],
        episodes=3,
        seed=SEED,
        out=tmp_path,
        partners={"player_2": "tests.cli.test_crossplay:Recorder"},
    )
    played = [moves for moves in Recorder.episodes if moves]
    assert len(played) >= 3
    for moves in played:
        chosen: list[int] = []
        for observation, mask, choice in moves:
            board = observation.reshape(9, 2)  # channel 0: the observer's own marks, 1: the opponent's
            assert sorted(np.flatnonzero(board[:, 0])) == sorted(chosen)  # its own earlier moves, placed
            occupied = board.any(axis=1)
            np.testing.assert_array_equal(mask, ~occupied)  # its mask: exactly the free squares
            assert board[:, 1].sum() in (len(chosen), len(chosen) + 1)  # the policy moved in between
            chosen.append(choice)
    summary = json.loads(output.eval_json.read_text())
    assert summary["partners"] == {
        "player_2": {"partner": "tests.cli.test_crossplay:Recorder", "agents": ["player_2"]}
    }
    returns = np.array(summary["per_episode"]["agent_returns"])
    assert returns.shape == (3, 2) and set(returns.sum(axis=1)) == {0.0}


def test_the_diagonal_is_each_runs_self_play_evaluation_on_the_same_seeds(runs, tmp_path):
    spread = runs[0]
    result = crossplay_runs(spread, episodes=EPISODES, seed=SEED)
    assert result.rows == result.columns == ("spread_s0", "spread_s1", "spread_s2")
    for i, run in enumerate(spread):
        alone = evaluate_checkpoint(run, episodes=EPISODES, seed=SEED, out=tmp_path / str(i))
        np.testing.assert_array_equal(result.returns[i, i], alone.result.team_returns)
    # cell (0, 1): run 1 on agent_0, then agent_1, then agent_2, run 0 elsewhere, each the eval with a partner
    for seat in range(3):
        with_partner = evaluate_checkpoint(
            spread[0],
            episodes=EPISODES,
            seed=SEED,
            out=tmp_path / f"p{seat}",
            partners={f"agent_{seat}": str(spread[1])},
        )
        chunk = result.returns[0, 1][seat * EPISODES : (seat + 1) * EPISODES]
        np.testing.assert_array_equal(chunk, with_partner.result.team_returns)
    assert result.returns[0, 1].shape == (3 * EPISODES,)
    assert not np.array_equal(result.returns[0, 1], result.returns[1, 0])  # three seats: not symmetric


def test_gap_and_bounds_by_hand():
    cells = {
        (0, 0): np.array([4.0, 6.0]),
        (1, 1): np.array([8.0, 8.0]),
        (0, 1): np.array([1.0, 3.0]),
        (1, 0): np.array([2.0, 2.0]),
        (0, 2): np.array([0.0, 0.0]),
        (1, 2): np.array([1.0, 1.0]),
    }
    result = CrossPlayResult(
        env_id="toy",
        agents=("a", "b"),
        rows=("r0", "r1"),
        columns=("r0", "r1", "random"),
        returns=cells,
        seed=0,
        episodes=1,
        deterministic=False,
        run_dirs=("r0", "r1"),
        bounds={"r1": (0.0, 10.0), "random": (-1.0, 1.0)},
    )
    gap = result.gap()
    assert gap["self_play"] == pytest.approx((5 + 8) / 2)
    assert gap["cross_play"] == pytest.approx((2 + 2) / 2)  # the random column is not a run
    assert gap["gap"] == pytest.approx(4.5) and gap["ratio"] == pytest.approx(2 / 6.5)
    low, high = gap["gap_ci95"]
    assert 3.0 <= low <= 4.5 <= high <= 6.0
    normalised = result.normalised()
    assert normalised is not None
    np.testing.assert_allclose(normalised[:, 1], [2 / 10, 8 / 10])
    np.testing.assert_allclose(normalised[:, 2], [(0 + 1) / 2, (1 + 1) / 2])
    assert np.isnan(normalised[:, 0]).all()  # no bounds for r0


def test_crossplay_command_writes_its_files_and_compare_reads_them(runs, tmp_path, capsys):
    spread = runs[0]
    bounds = tmp_path / "bounds.yaml"
    bounds.write_text("random: [-200, -20]\n")
    out = tmp_path / "xp"
    args = ["crossplay", *map(str, spread), "--partner", "random", "--episodes", "2", "--seed", "3"]
    assert main([*args, "--bounds", str(bounds), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| policy \\ partner | spread_s0 | spread_s1 | spread_s2 | random |" in printed
    data = json.loads((out / "crossplay.json").read_text())
    assert data["columns"][-1] == "random" and data["episodes_per_seat"] == 2
    random_cell = next(c for c in data["cells"] if c["row"] == "spread_s2" and c["column"] == "random")
    assert len(random_cell["team_return"]) == 3 * 2
    assert data["normalised"][2][3] == pytest.approx((np.mean(random_cell["team_return"]) + 200) / 180)
    assert (out / "crossplay.png").stat().st_size > 0
    assert len((out / "crossplay.csv").read_text().splitlines()) == 1 + 3 * 4
    assert main(["compare", str(out), "--out", str(tmp_path / "cmp"), "--reps", "50"]) == 0
    compared = json.loads((tmp_path / "cmp" / "marl_eval.json").read_text())
    task = compared["mpe2"]["simple_spread_v3"]
    assert set(task) == {"self-play", "cross-play"}
    own = next(c for c in data["cells"] if c["row"] == "spread_s0" and c["column"] == "spread_s0")
    assert task["self-play"]["run_0"]["absolute_metrics"]["return"] == own["team_return"]


def test_bad_input_gets_one_line(runs, tmp_path):
    spread, game = runs
    with pytest.raises(CrossPlayError, match="are of env mpe2/simple_spread_v3 and env classic/tictactoe_v3"):
        crossplay_runs([spread[0], game], episodes=1)
    with pytest.raises(CrossPlayError, match="zero-sum"):
        crossplay_runs([game, game], episodes=1)
    bounds = tmp_path / "b.yaml"
    bounds.write_text("spread_s0: [3, 1]\n")
    with pytest.raises(CrossPlayError, match=r"give \[low, high\] with low < high"):
        crossplay_runs(spread[:1], episodes=1, bounds=bounds)
    bounds.write_text("nobody: [0, 1]\n")
    with pytest.raises(CrossPlayError, match="'nobody', which is not one of the partners"):
        crossplay_runs(spread[:1], episodes=1, bounds=bounds)
    with pytest.raises(EvalError, match="must be SEAT=PARTNER"):
        parse_partners(["agent_0"])
    with pytest.raises(EvalError, match="names seat 'agent_0' twice"):
        parse_partners(["agent_0=random", "agent_0=random"])
    with pytest.raises(EvalError, match="not an agent of env"):
        evaluate_checkpoint(spread[0], episodes=1, out=tmp_path, partners={"agent_9": "random"})
    with pytest.raises(EvalError, match="leave it at least one seat"):
        evaluate_checkpoint(spread[0], episodes=1, out=tmp_path, partners={"agent": "random"})
    with pytest.raises(EvalError, match="is not a run directory, a checkpoint file"):
        evaluate_checkpoint(spread[0], episodes=1, out=tmp_path, partners={"agent_1": "nowhere"})
    with pytest.raises(EvalError, match="defines no callable 'missing'"):
        evaluate_checkpoint(spread[0], episodes=1, out=tmp_path, partners={"agent_1": "json:missing"})
    with pytest.raises(EvalError, match="which is not allowed now"):
        evaluate_checkpoint(
            game, episodes=1, out=tmp_path, partners={"player_2": "tests.cli.test_crossplay:taken"}
        )


def taken(observation, mask, agent):
    """A scripted player that always takes square 0, taken or not."""
    return 0


def test_partner_sides_put_every_agent_on_one_side(runs):
    from marl_ppo.envs.factory import build_vector_env
    from marl_ppo.eval.evaluate import eval_config
    from marl_ppo.plan.settle import plan_eval

    plan = plan_eval(load_config(ROOT / "experiments/mpe/simple_spread.yaml", ["rollout.num_envs=1"]))
    venv = build_vector_env(eval_config(plan.config, 1), plan.layout, torch.device("cpu"))
    try:
        sides = partner_sides(venv.spec, ["agent_2"])
    finally:
        venv.close()
    assert sides == {"policy": ("agent_0", "agent_1"), "agent_2": ("agent_2",)}


def test_periodic_evaluation_with_partners_logs_what_eval_partner_measures(tmp_path):
    run = _train(
        tmp_path / "run",
        "experiments/mpe/simple_spread.yaml",
        "rollout.rollout_steps=25",
        "total_steps=100",
        "eval.every=50",
        "eval.episodes=3",
        "eval.absolute=0",
        "eval.partners={agent_2: random}",
    )
    from tests.helpers import scalars

    logged = scalars(run)["eval/partners/team_return"]
    assert [step for step, _ in logged] == [50, 100]
    config = load_config(run / "config.yaml")
    again = evaluate_checkpoint(
        run / "checkpoints" / "final.pt",
        episodes=3,
        deterministic=True,
        seed=config.seed + 1_000_000,
        out=tmp_path / "again",
        partners={"agent_2": "random"},
    )
    assert logged[-1][1] == pytest.approx(float(again.result.team_returns.mean()), rel=1e-6)
    with pytest.raises(EvalError, match="partner seat 'agent_7' is not an agent"):
        _train(
            tmp_path / "bad",
            "experiments/mpe/simple_spread.yaml",
            "rollout.rollout_steps=25",
            "total_steps=50",
            "eval.every=50",
            "eval.partners={agent_7: random}",
        )
