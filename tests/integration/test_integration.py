"""Two updates in-process: TensorBoard tags (read back with TensorBoard's reader), checkpoint, summary."""

import dataclasses
import json

import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import build_config, load_config
from marl_ppo.models.team import TeamModel
from marl_ppo.run.loop import train
from tests.helpers import ROOT, assert_same_final_weights, vector_env

TRAIN_TAGS = [
    "loss_pi",
    "delta_loss_pi",
    "loss_v",
    "delta_loss_v",
    "kl",
    "entropy",
    "clipfrac",
    "stop_iter",
    "pi_steps",
    "explained_variance",
    "value_mean",
    "return_mean",
]


def test_two_updates_log_every_tag_and_write_a_loadable_checkpoint(spread_config, tmp_path):
    result = train(spread_config, tmp_path)
    assert result.updates == 2 and result.env_steps == 100 and result.episodes == 4

    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {f"train/{t}" for t in TRAIN_TAGS} | {
        "rollout/team_return",
        "rollout/agent_return",
        "rollout/episode_length",
        "perf/sps",
        "perf/env_s",
        "perf/act_s",
        "perf/learn_s",
        "perf/peak_rss_mb",
        "agents/agent_0/return",
        "agents/agent_2/return",
    }
    assert expected <= tags, f"missing: {sorted(expected - tags)}"
    assert [e.step for e in events.Scalars("train/loss_pi")] == [50, 100]
    assert [e.value for e in events.Scalars("rollout/episode_length")] == [25.0] * 4
    team = [e.value for e in events.Scalars("rollout/team_return")]
    agent = [e.value for e in events.Scalars("rollout/agent_return")]
    assert all(
        abs(t - 3 * a) < 1e-3 for t, a in zip(team, agent, strict=True)
    )  # team return = sum over 3 agents

    payload = load_checkpoint(tmp_path / "checkpoints/final.pt")  # weights_only=True inside
    assert payload["updates"] == 2 and payload["env_steps"] == 100
    config = build_config(payload["config"])
    # the run stores its settled config: rollout.compiled's auto is false for an env that is not JAX
    assert config == dataclasses.replace(
        spread_config, rollout=dataclasses.replace(spread_config.rollout, compiled=False)
    )
    model = TeamModel(vector_env(config).spec, config)
    model.load_state_dict(payload["model"])
    assert (tmp_path / "checkpoints/latest.pt").is_file()

    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in (
        "env_steps",
        "episodes",
        "team_return_mean",
        "agent_return_mean",
        "sps",
        "wall_s",
        "peak_rss_mb",
    ):
        assert key in summary
    assert summary["env_steps"] == 100 and summary["episodes"] == 4
    assert abs(summary["team_return_mean"] - 3 * summary["agent_return_mean"]) < 1e-6
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["env"]["id"] == "mpe2/simple_spread_v3"


def test_ippo_experiment_runs_from_the_cli(tiny_overrides, tmp_path, capsys):
    run_dir = tmp_path / "ippo"
    code = main(
        [
            "train",
            str(ROOT / "experiments/mpe/simple_spread_ippo.yaml"),
            *tiny_overrides,
            "--run-dir",
            str(run_dir),
        ]
    )
    assert code == 0
    assert "done: 100 env steps" in capsys.readouterr().out
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["ppo"]["critic"] == "obs"


def test_same_seed_same_run(spread_config, tmp_path):
    first = train(spread_config, tmp_path / "a")
    second = train(spread_config, tmp_path / "b")
    assert first.team_return_mean == second.team_return_mean
    assert_same_final_weights(tmp_path / "a", tmp_path / "b")


def test_subprocess_vector_env_trains_exactly_like_sync(tiny_overrides, tmp_path):
    path = ROOT / "experiments/mpe/simple_spread.yaml"
    sync = train(load_config(path, [*tiny_overrides, "rollout.vector=sync"]), tmp_path / "sync")
    workers = train(
        load_config(path, [*tiny_overrides, "rollout.vector=subprocess", "rollout.num_workers=2"]),
        tmp_path / "sub",
    )
    assert sync.team_return_mean == workers.team_return_mean
    assert_same_final_weights(tmp_path / "sync", tmp_path / "sub")


def test_mpe_state_and_concatenated_observations_train_identically(tiny_overrides, tmp_path):
    # mpe2's state() is the concatenation of the agents' observations, so env.state=concat (cheaper:
    # no second pass over the observations) must give exactly the same run
    path = ROOT / "experiments/mpe/simple_spread.yaml"
    for state in ("env", "concat"):
        train(
            load_config(path, [*tiny_overrides, "rollout.vector=sync", f"env.state={state}"]),
            tmp_path / state,
        )
    assert_same_final_weights(tmp_path / "env", tmp_path / "concat")
