"""Evaluation of a trained run: eval.json numbers, rendered episodes, overrides, periodic eval, errors."""

import json

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.envs.registry import make_env
from marl_ppo.eval import evaluate
from marl_ppo.eval.evaluate import EVAL_SEED_OFFSET, EvalError, eval_config, mean_ci95, run_episodes
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.run.loop import train
from tests.helpers import ROOT, assert_same_final_weights, vector_env
from tests.user_env_files import write_env_file, write_humans_only_file

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny MAPPO run on mpe2 simple_spread (2 updates of 2 copies x 25 steps)."""
    overrides = [
        "rollout.num_envs=2",
        "rollout.rollout_steps=25",
        "total_steps=100",
        "rollout.vector=sync",
        "log.progress=false",
        "ppo.train_pi_iters=2",
        "ppo.train_vf_iters=2",
        "ppo.num_minibatches=2",
        "model.hidden_sizes=[16,16]",
    ]
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    train(load_config(SPREAD, overrides), run_dir)
    return run_dir


def test_eval_writes_returns_with_confidence_intervals_and_a_gif(trained_run, tmp_path):
    from PIL import Image, ImageSequence

    output = evaluate_checkpoint(trained_run, episodes=5, deterministic=True, render="gif", out=tmp_path)
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["episodes"] == 5 and report["deterministic"] is True
    assert report["seed"] == EVAL_SEED_OFFSET  # the run's seed 0 + the offset: apart from training seeds
    assert report["trained_env_steps"] == 100 and report["checkpoint"].endswith("final.pt")
    episodes = report["per_episode"]
    assert episodes["length"] == [25] * 5  # every mpe2 episode runs max_cycles=25 steps
    agent_returns = np.array(episodes["agent_returns"])
    assert agent_returns.shape == (5, 3)
    np.testing.assert_allclose(episodes["team_return"], agent_returns.sum(axis=1))  # team = sum over agents
    team = report["team_return"]
    assert team["mean"] == pytest.approx(np.mean(episodes["team_return"]))
    low, high = team["ci95"]
    assert np.isfinite([low, high]).all() and low < team["mean"] < high
    assert set(report["agents"]) == {"agent_0", "agent_1", "agent_2"}
    assert report["agents"]["agent_1"]["mean"] == pytest.approx(agent_returns[:, 1].mean())
    assert report["video"] == "episode.gif" and output.video == tmp_path / "episode.gif"

    gif = Image.open(tmp_path / "episode.gif")
    durations = [frame.info["duration"] for frame in ImageSequence.Iterator(gif)]
    frame_ms = round(1000 / make_env("mpe2/simple_spread_v3").metadata["render_fps"])
    # the reset frame and one per step; Pillow merges identical consecutive frames, keeping their time
    assert sum(durations) == 26 * frame_ms and 0 < gif.n_frames <= 26  # type: ignore[attr-defined]  # a GIF's ImageFile
    assert gif.size == (700, 700)


def test_deterministic_eval_is_repeatable_and_every_copy_plays_its_share(trained_run, tmp_path):
    first = evaluate_checkpoint(trained_run, episodes=5, deterministic=True, out=tmp_path / "a").result
    second = evaluate_checkpoint(trained_run, episodes=5, deterministic=True, out=tmp_path / "b").result
    np.testing.assert_array_equal(first.agent_returns, second.agent_returns)
    assert len(first.team_returns) == 5  # 2 env copies play 3 and 2 episodes
    assert len(set(first.team_returns.tolist())) == 5  # distinct seeds, distinct episodes
    sampled = [
        evaluate_checkpoint(trained_run, episodes=2, seed=7, out=tmp_path / name).result for name in "cd"
    ]
    np.testing.assert_array_equal(sampled[0].team_returns, sampled[1].team_returns)  # seeded sampling


def test_env_kwargs_override_changes_the_evaluated_env(trained_run, tmp_path):
    output = evaluate_checkpoint(
        trained_run, episodes=2, deterministic=True, overrides=["env.kwargs.max_cycles=10"], out=tmp_path
    )
    assert output.result.lengths.tolist() == [10, 10]
    assert json.loads(output.eval_json.read_text())["env"]["kwargs"]["max_cycles"] == 10


def test_eval_cli_writes_eval_json_and_mp4(trained_run, tmp_path, capsys):
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v3 as iio

    code = main(["eval", str(trained_run), "--episodes", "2", "--render", "mp4", "--out", str(tmp_path)])
    assert code == 0
    assert "2 episodes: team return (sum over agents)" in capsys.readouterr().out
    assert iio.imread(tmp_path / "episode.mp4").shape == (26, 700, 700, 3)
    assert json.loads((tmp_path / "eval.json").read_text())["episodes"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["eval", "no/such/run"], "is neither a run directory nor a checkpoint file"),
        (["eval", "{empty}"], "has no checkpoints/final.pt or checkpoints/latest.pt"),
        (["eval", "{run}", "--render", "avi"], "--render 'avi' is not a video format; use one of gif, mp4"),
        (["eval", "{run}", "--episodes", "0"], "--episodes 0 must be at least 1"),
        (["eval", "{run}", "env.kwargs.N=4"], "checkpoint was trained with"),
        (["eval", "{run}", "ppo.pi_lr=-1"], "config key 'ppo.pi_lr'"),
    ],
)
def test_bad_eval_input_is_one_line_and_exit_status_2(trained_run, tmp_path, capsys, args, message):
    (tmp_path / "empty").mkdir()
    filled = [a.format(run=trained_run, empty=tmp_path / "empty") for a in args]
    assert main([*filled, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out" / "eval.json").exists()


def _lbf_id():
    pytest.importorskip("lbforaging")
    return "lbf/foraging_8x8_2p_2f_coop_v3"


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        (
            lambda d: f"{write_env_file(d)}:Rendezvous",  # the README's own example env
            "takes no render_mode, so it cannot be rendered; add a render_mode parameter and return frames",
        ),
        (
            lambda d: "envs/matrix_game_v0",
            "declares render modes [] (metadata['render_modes']), not 'rgb_array'",
        ),
        (lambda d: _lbf_id(), "declares render modes ['human'] (metadata['render_modes']), not 'rgb_array'"),
        (
            lambda d: f"{write_humans_only_file(d)}:HumansOnly",
            "render() raised AssertionError: unsupported render mode: rgb_array; drop --render",
        ),
    ],
    ids=["readme_rendezvous", "no_render_modes", "lbf_human_only", "render_raises"],
)
def test_an_env_that_cannot_render_gets_one_line_and_eval_writes_nothing(tmp_path, capsys, env_id, message):
    env_id = env_id(tmp_path)
    run_dir = tmp_path / "run"
    tiny = [
        "rollout.num_envs=2",
        "rollout.rollout_steps=10",
        "total_steps=20",
        "rollout.vector=sync",
        "log.progress=false",
    ]
    assert (
        main(["train", f"env.id={env_id}", *tiny, "model.hidden_sizes=[8]", "--run-dir", str(run_dir)]) == 0
    )
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--render", "gif"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: env '{env_id}' ") and message in err and err.count("\n") == 1
    assert "env.kwargs" not in err  # the user passed no kwargs: eval added render_mode
    assert not (run_dir / "eval.json").exists() and not (run_dir / "episode.gif").exists()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0  # without --render it evaluates


def _render_fails_after(monkeypatch, frames):
    """mpe2's render raises as an env without OpenGL does, from its `frames + 1`-th call on."""
    from mpe2._mpe_utils.simple_env import SimpleEnv

    calls = []
    render = SimpleEnv.render

    def failing(self):
        calls.append(1)
        if len(calls) > frames:
            raise RuntimeError("cannot create an OpenGL context")
        return render(self)

    monkeypatch.setattr(SimpleEnv, "render", failing)


def test_render_is_checked_before_any_episode_is_played(trained_run, tmp_path, monkeypatch, capsys):
    import marl_ppo.eval.from_checkpoint as from_checkpoint

    _render_fails_after(monkeypatch, frames=0)
    played = []
    monkeypatch.setattr(from_checkpoint, "run_episodes", lambda *a, **k: played.append(1))
    assert main(["eval", str(trained_run), "--episodes", "2", "--render", "gif", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "failed to render" in err and "cannot create an OpenGL context" in err and err.count("\n") == 1
    assert played == [] and not (tmp_path / "eval.json").exists()


def test_a_render_that_fails_after_the_episodes_keeps_their_eval_json(
    trained_run, tmp_path, monkeypatch, capsys
):
    _render_fails_after(monkeypatch, frames=3)  # the check's frame and two of the recording's
    assert main(["eval", str(trained_run), "--episodes", "3", "--render", "gif", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "failed to render" in err and f"the evaluation's numbers are in {tmp_path / 'eval.json'}" in err
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["episodes"] == 3 and report["per_episode"]["length"] == [25] * 3 and report["video"] is None
    assert not (tmp_path / "episode.gif").exists()


def test_periodic_eval_logs_eval_scalars_and_leaves_training_unchanged(tiny_overrides, tmp_path):
    plain = load_config(SPREAD, [*tiny_overrides, "rollout.vector=sync"])
    evaluated = load_config(
        SPREAD, [*tiny_overrides, "rollout.vector=sync", "eval.every=50", "eval.episodes=3"]
    )
    train(plain, tmp_path / "plain")
    train(evaluated, tmp_path / "evaluated")
    assert_same_final_weights(tmp_path / "plain", tmp_path / "evaluated")  # evaluation draws no training RNG

    events = EventAccumulator(str(tmp_path / "evaluated" / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("eval/team_return")] == [50, 100]
    assert [e.value for e in events.Scalars("eval/episode_length")] == [25.0, 25.0]
    team = [e.value for e in events.Scalars("eval/team_return")]
    per_agent = [[e.value for e in events.Scalars(f"eval/agents/agent_{i}/return")] for i in range(3)]
    np.testing.assert_allclose(team, np.sum(per_agent, axis=0), rtol=1e-5)


def test_mean_ci95_is_the_student_t_interval():
    stats = mean_ci95([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.7764451 * np.sqrt(2.5) / np.sqrt(5)  # t(0.975, df=4) * s / sqrt(n)
    assert stats["mean"] == 3.0 and stats["std"] == pytest.approx(np.sqrt(2.5))
    np.testing.assert_allclose(stats["ci95"], [3.0 - half, 3.0 + half], rtol=1e-6)
    assert np.isnan(mean_ci95([2.0])["ci95"]).all()  # one episode has no interval


def _never_ending(max_steps):
    from marl_ppo.models.team import TeamModel

    config = load_config(
        None,
        [
            "env.id=envs/never_ending_v0",
            "rollout.num_envs=2",
            f"env.kwargs={{num_agents: 2, max_steps: {max_steps}}}",
        ],
    )
    venv = vector_env(config)
    return venv, TeamModel(venv.spec, config)


def test_episode_returns_are_summed_per_agent_and_over_agents():
    venv, model = _never_ending(max_steps=5)  # every agent is paid 1 per step for 5 steps
    result = run_episodes(venv, model, torch.device("cpu"), episodes=3, seed=0, deterministic=False)
    np.testing.assert_array_equal(result.agent_returns, np.full((3, 2), 5.0))
    np.testing.assert_array_equal(result.team_returns, [10.0, 10.0, 10.0])
    assert result.lengths.tolist() == [5, 5, 5]
    assert result.scalars(per_agent=True) == {
        "eval/team_return": 10.0,
        "eval/agent_return": 5.0,
        "eval/episode_length": 5.0,
        "eval/agents/agent_0/return": 5.0,
        "eval/agents/agent_1/return": 5.0,
    }


def test_an_episode_that_never_ends_is_an_error_not_a_hang(monkeypatch):
    monkeypatch.setattr(evaluate, "MAX_EPISODE_STEPS", 50)
    venv, model = _never_ending(max_steps=1000)
    with pytest.raises(EvalError, match="ran 50 steps without ending an episode"):
        run_episodes(venv, model, torch.device("cpu"), episodes=1, seed=0, deterministic=True)


def test_eval_config_steps_at_most_one_copy_per_episode_in_process():
    config = load_config(SPREAD, ["rollout.vector=workers", "rollout.policy_lag=1", "rollout.num_envs=32"])
    evaluated = eval_config(config, 10, render_mode="rgb_array")
    assert (evaluated.rollout.vector, evaluated.rollout.policy_lag, evaluated.rollout.num_envs) == (
        "sync",
        0,
        10,
    )
    assert evaluated.env.kwargs == {**config.env.kwargs, "render_mode": "rgb_array"}
    assert evaluated.model == config.model and evaluated.seed == config.seed


def test_the_random_policy_scores_the_mean_payoff_of_the_matrix_game(tmp_path, capsys):
    """Uniform rows and columns: team return 2 x the mean of the payoff matrix, (10 + 5 + 2) x 2 / 9."""
    expected = 2 * 17.0 / 9
    args = ["eval", "experiments/examples/matrix_game_v0.yaml", "--random", "--episodes", "3000"]
    assert main([*args, "--out", str(tmp_path)]) == 0
    assert "3000 episodes of the uniform random policy: team return" in capsys.readouterr().out
    record = json.loads((tmp_path / "eval.json").read_text())
    team = record["team_return"]
    assert record["policy"] == "uniform random" and abs(team["mean"] - expected) < 0.25
    assert team["ci95"][0] < expected < team["ci95"][1]


def test_the_random_policy_draws_only_allowed_actions():
    """The masked guessing game refuses a masked action, so these episodes drew none; each agent's
    chance of the paid action is E[1 / allowed actions] over the env's masks: team return 6.2 over 8 steps."""
    from marl_ppo.eval.random_floor import evaluate_random

    result = evaluate_random(ROOT / "experiments/examples/masked_guess_v0.yaml", episodes=400).result
    assert len(result.team_returns) == 400 and abs(result.team_returns.mean() - 6.2) < 0.3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["no_such_run", "--random"],
            "--random needs an experiment file or a run directory, not 'no_such_run'",
        ),
        (["experiments/examples/matrix_game_v0.yaml", "--random", "--render", "gif"], "drop --render"),
    ],
)
def test_bad_random_eval_input_is_one_line(args, message, capsys):
    assert main(["eval", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_random_eval_takes_a_run_directory_or_overrides_alone(trained_run, tmp_path, capsys):
    assert main(["eval", str(trained_run), "--random", "--episodes", "4", "--out", str(tmp_path / "a")]) == 0
    assert "4 episodes of the uniform random policy" in capsys.readouterr().out
    record = json.loads((tmp_path / "a" / "eval.json").read_text())
    assert (
        record["experiment"] == str(trained_run / "config.yaml")
        and record["env"]["id"] == "mpe2/simple_spread_v3"
    )
    assert record["per_episode"]["length"] == [25] * 4
    args = ["eval", "--random", "env.id=envs/matrix_game_v0", "--episodes", "2", "--out", str(tmp_path / "b")]
    assert main(args) == 0
    assert json.loads((tmp_path / "b" / "eval.json").read_text())["env"]["id"] == "envs/matrix_game_v0"


def test_random_eval_of_a_game_gives_random_against_random_rates(tmp_path, capsys):
    """Tic-tac-toe between uniform random players: the first mover wins 58.5% of games, the second 28.8%,
    12.7% are drawn; so a seat, over both seats, wins 0.44 of its games."""
    experiment = ROOT / "experiments/classic/tictactoe_v3.yaml"
    assert main(["eval", str(experiment), "--random", "--episodes", "400", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "random against random (seats): win_rate" in out
    rates = json.loads((tmp_path / "eval.json").read_text())["vs_random"]
    assert abs(rates["win_rate"] - 0.436) < 0.05 and abs(rates["draw_rate"] - 0.127) < 0.05
    assert rates["win_rate"] + rates["draw_rate"] + rates["loss_rate"] == pytest.approx(1.0)
    assert abs(rates["player_1/win_rate"] - 0.585) < 0.07 and abs(rates["player_2/win_rate"] - 0.288) < 0.07
