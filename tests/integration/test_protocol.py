"""The evaluation protocol in a run directory: every periodic evaluation's episodes, the best policy kept,
and the absolute metric (that policy replayed with 10x the episodes) at the end."""

import json

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import build_config, load_config
from marl_ppo.eval.evaluate import eval_config, eval_seed, run_episodes
from marl_ppo.eval.from_checkpoint import evaluate_checkpoint
from marl_ppo.models.team import TeamModel
from marl_ppo.run.loop import train
from marl_ppo.run.protocol import ABSOLUTE_SEED_OFFSET, read_absolute_metric, read_evaluations
from marl_ppo.run.resume import resume_config
from marl_ppo.run.rundir import read_summary
from tests.helpers import ROOT, vector_env


def _config(tiny_overrides, *extra):
    return load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [
            *tiny_overrides,
            "total_steps=150",
            "eval.every=50",
            "eval.episodes=2",
            "log.checkpoint_every=1",
            *extra,
        ],
    )


def test_evaluations_the_best_policy_and_its_absolute_metric_are_recorded(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    train(_config(tiny_overrides), run_dir)
    evaluations = read_evaluations(run_dir)
    assert [e["step"] for e in evaluations] == [50, 100, 150]
    assert all(len(e["team_return"]) == 2 for e in evaluations)
    means = [float(np.mean(e["team_return"])) for e in evaluations]
    best = int(np.argmax(means))  # the first of equals
    checkpoint = load_checkpoint(run_dir / "checkpoints/best.pt")
    assert checkpoint["env_steps"] == evaluations[best]["step"]

    metric = read_absolute_metric(run_dir)
    assert metric is not None
    assert metric["step"] == evaluations[best]["step"] and metric["episodes"] == 20
    assert metric["best_eval_team_return"] == means[best]
    # the same policy replayed on its own gives the same 20 episodes
    config = build_config(checkpoint["config"])
    venv = vector_env(eval_config(config, config.eval.episodes))
    model = TeamModel(venv.spec, config)
    model.load_state_dict(checkpoint["model"])
    seed = eval_seed(config) + ABSOLUTE_SEED_OFFSET
    replay = run_episodes(venv, model, torch.device("cpu"), episodes=20, seed=seed, deterministic=True)
    venv.close()
    assert metric["per_episode"]["team_return"] == replay.team_returns.tolist()
    assert metric["team_return"]["mean"] == float(replay.team_returns.mean())
    summary = read_summary(run_dir)
    assert summary is not None and summary["absolute_team_return"] == metric["team_return"]["mean"]
    # best.pt holds the policy alone, which marl-ppo eval plays
    assert "trainer" not in checkpoint and "envs" not in checkpoint
    output = evaluate_checkpoint(
        run_dir / "checkpoints/best.pt", episodes=2, deterministic=True, out=tmp_path / "e"
    )
    assert output.result.team_returns.tolist() == evaluations[best]["team_return"]


def test_a_resumed_run_keeps_its_evaluations_and_appends_the_new_ones(tmp_path, tiny_overrides):
    run_dir = tmp_path / "run"
    train(_config(tiny_overrides, "total_steps=100"), run_dir)
    before = read_evaluations(run_dir)
    lines = (run_dir / "evaluations.jsonl").read_text()
    stray = json.dumps({**before[-1], "step": 150, "team_return_mean": 1e9}) + "\n"
    (run_dir / "evaluations.jsonl").write_text(
        lines + stray
    )  # as if a killed process evaluated past its checkpoint
    train(resume_config(run_dir, ["total_steps=150"]), run_dir, resume=True)
    after = read_evaluations(run_dir)
    assert [e["step"] for e in after] == [50, 100, 150]
    assert after[:2] == before and after[2]["team_return_mean"] != 1e9
    metric = read_absolute_metric(run_dir)
    assert metric is not None and metric["step"] in (50, 100, 150)


def test_eval_absolute_0_measures_no_absolute_metric(tmp_path, tiny_overrides):
    train(_config(tiny_overrides, "eval.absolute=0"), tmp_path / "run")
    assert read_absolute_metric(tmp_path / "run") is None
    assert len(read_evaluations(tmp_path / "run")) == 3
    summary = read_summary(tmp_path / "run")
    assert summary is not None and "absolute_team_return" not in summary


def test_an_env_that_cannot_render_costs_the_video_a_warning_not_the_run(tmp_path):
    import warnings

    from marl_ppo.run.protocol import VideoWarning

    tiny = [
        "rollout.num_envs=2",
        "rollout.rollout_steps=10",
        "total_steps=20",
        "log.progress=false",
        "rollout.vector=sync",
    ]
    config = load_config(None, ["env.id=envs/matrix_game_v0", *tiny, "log.video=gif"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config, tmp_path / "run")
    assert result.env_steps == 20 and read_summary(tmp_path / "run") is not None
    messages = [str(w.message) for w in caught if issubclass(w.category, VideoWarning)]
    assert len(messages) == 1
    assert messages[0].startswith("log.video: env 'envs/matrix_game_v0' declares render modes")
    assert not (tmp_path / "run/videos").exists()
