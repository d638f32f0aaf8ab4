"""Config loading, overrides and the one-line errors that exit with status 2."""

import subprocess
import sys

import pytest
from conftest import ROOT

from marl_ppo.cli import main
from marl_ppo.config import ConfigError, ExperimentConfig, config_keys, load_config, parse_overrides

SPREAD_YAML = str(ROOT / "experiments/mpe/simple_spread.yaml")


def test_defaults_live_in_the_dataclass_and_every_key_is_documented():
    config = load_config()
    assert config == ExperimentConfig()
    for key in ("env.id", "env.kwargs", "seed", "total_steps", "num_envs", "gamma", "critic", "share_actor"):
        assert config_keys()[key], f"{key} has no documentation"
    assert all(config_keys().values())


def test_yaml_then_overrides_with_types():
    config = load_config(
        SPREAD_YAML,
        [
            "seed=7",
            "ppo.pi_lr=1e-3",
            "model.hidden_sizes=[32, 32]",
            "env.kwargs.N=4",
            "ppo.target_kl=null",
            "critic=obs",
        ],
    )
    assert config.seed == 7 and config.ppo.pi_lr == pytest.approx(1e-3)
    assert config.model.hidden_sizes == (32, 32)
    assert config.env.kwargs == {
        "N": 4,
        "max_cycles": 25,
        "continuous_actions": False,
    }  # merged, not replaced
    assert config.ppo.target_kl is None and config.critic == "obs"


def test_parse_overrides_nests_dotted_keys():
    assert parse_overrides(["a.b.c=1", "a.d=x", "e=[1, 2]"]) == {"a": {"b": {"c": 1}, "d": "x"}, "e": [1, 2]}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ppo.pi_lrr=1e-3"], "unknown config key 'ppo.pi_lrr'; did you mean 'ppo.pi_lr'?"),
        (["gama=0.9"], "unknown config key 'gama'; did you mean 'gamma'?"),
        (["num_envs=four"], "config key 'num_envs': input should be a valid integer"),
        (["ppo.pi_lr=-1"], "config key 'ppo.pi_lr': input should be greater than 0, got -1"),
        (["gamma=1.5"], "config key 'gamma': input should be less than or equal to 1"),
        (["gae_lambda=-0.1"], "config key 'gae_lambda': input should be greater than or equal to 0"),
        (["critic=central"], "config key 'critic': input should be 'state', 'state+obs', 'obs' or 'team'"),
        (["critic=team", "share_critic=false"], "critic: team is one network per group"),
        (["share_actor=maybe"], "config key 'share_actor': input should be a valid boolean"),
        (["total_steps=0"], "config key 'total_steps': input should be greater than 0"),
        (
            ["rollout_steps=2", "num_envs=1", "ppo.num_minibatches=4"],
            "ppo.num_minibatches=4 exceeds the batch",
        ),
        (["seed"], "override 'seed' is not key=value"),
    ],
)
def test_bad_config_raises_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(SPREAD_YAML, overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_exits_2_with_one_line_and_no_traceback(tmp_path, capsys):
    assert main(["train", SPREAD_YAML, "ppo.lr=0.1", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown config key 'ppo.lr'") and err.count("\n") == 1
    assert not (tmp_path / "r").exists(), "nothing is written when the config is rejected"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.yaml"], "experiment file 'missing.yaml' does not exist"),
        ([SPREAD_YAML, "env.id=mpe2/simple_sprad_v3"], "unknown env id 'mpe2/simple_sprad_v3'; did you mean"),
        ([SPREAD_YAML, "env.id=no_such_module:make"], "cannot import module 'no_such_module'"),
    ],
)
def test_cli_input_errors(args, message, tmp_path, capsys):
    assert main(["train", *args, "--run-dir", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err


def test_bad_yaml_and_non_empty_run_dir(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    assert main(["train", str(bad)]) == 2
    assert "is not valid YAML at line" in capsys.readouterr().err
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("precious")
    assert main(["train", SPREAD_YAML, "--run-dir", str(used)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert (used / "keep.txt").read_text() == "precious"


def test_console_script_prints_no_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "marl_ppo", "train", SPREAD_YAML, "seed=-3"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "error: config key 'seed': input should be greater than or equal to 0, got -3 "
        "(Seed for Python, NumPy, torch and the environments.)"
    )
    assert "Traceback" not in result.stderr
