"""The Python API: `marl_ppo.__all__` is what the package documents, light to import, and trains and evaluates."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import marl_ppo
from marl_ppo.config import ConfigError, load_config
from tests.helpers import TINY_MATRIX

API = [
    "ExperimentConfig",
    "GymnasiumTeamEnv",
    "TrainResult",
    "evaluate",
    "load_config",
    "load_policy",
    "make_env",
    "register_env",
    "train",
]

MATRIX = [
    "env.id=envs/matrix_game_v0",
    "rollout.num_envs=2",
    "rollout.rollout_steps=4",
    "total_steps=8",
    "rollout.vector=sync",
    "log.progress=false",
    "ppo.num_minibatches=1",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "model.hidden_sizes=[8]",
]
"""A one-update run on the matrix game (2 copies x 4 steps)."""


def test_all_is_the_documented_api_and_every_name_has_a_docstring():
    assert sorted(marl_ppo.__all__) == API
    for name in marl_ppo.__all__:
        value = getattr(marl_ppo, name)
        doc = value.__doc__
        assert doc and doc.strip() and not doc.startswith(f"{name}("), f"{name} needs a docstring"
        assert name in dir(marl_ppo)
    with pytest.raises(AttributeError, match="has no attribute 'trian'"):
        marl_ppo.trian  # noqa: B018


def test_import_marl_ppo_leaves_torch_the_training_loop_and_tensorboard_unimported():
    code = (
        "import sys, marl_ppo; marl_ppo.train;"  # naming the verb imports no more than the package does
        "print(sorted(m for m in ('marl_ppo.run.loop', 'marl_ppo.eval.from_checkpoint', 'torch', 'tensorboard',"
        " 'gymnasium', 'pettingzoo') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_train_and_evaluate_from_python(tmp_path):
    run_dir = tmp_path / "run"
    result = marl_ppo.train(load_config(None, MATRIX), run_dir)
    assert isinstance(result, marl_ppo.TrainResult)
    assert (result.run_dir, result.env_steps, result.updates) == (run_dir, 8, 1)
    assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 8

    output = marl_ppo.evaluate(run_dir, episodes=2)
    assert len(output.result.team_returns) == 2 and output.video is None
    assert output.eval_json == run_dir / "eval.json"
    assert json.loads(output.eval_json.read_text())["episodes"] == 2

    extended = marl_ppo.train(load_config(run_dir / "config.yaml", ["total_steps=16"]), run_dir, resume=True)
    assert (extended.env_steps, extended.updates) == (16, 2)
    with pytest.raises(ConfigError, match="already finished"):
        marl_ppo.train(None, run_dir, resume=True)  # the run's own config: total_steps=16, reached
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        marl_ppo.train(load_config(None, MATRIX), run_dir)


def test_train_takes_an_experiment_file_and_names_the_run_dir_as_the_cli_does(tmp_path, monkeypatch):
    experiment = tmp_path / "matrix.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                **TINY_MATRIX,
                "log": {"progress": False},
                "rollout": {**TINY_MATRIX["rollout"], "vector": "sync"},
            }
        )
    )
    monkeypatch.chdir(tmp_path)
    result = marl_ppo.train(experiment)
    assert result.run_dir.parent == Path("runs") and result.run_dir.name.startswith("matrix-")
    assert (tmp_path / result.run_dir / "checkpoints/final.pt").is_file()
    with pytest.raises(ConfigError, match="needs resume=True"):
        marl_ppo.train(None)
