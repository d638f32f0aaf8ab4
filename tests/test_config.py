"""Config loading, overrides and the one-line errors that exit with status 2."""

import subprocess
import sys

import pytest
from conftest import ROOT

from marl_ppo.cli import main
from marl_ppo.config import (
    ConfigError,
    ExperimentConfig,
    KeyHelp,
    config_keys,
    key_help,
    load_config,
    parse_overrides,
)

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
            "ppo.critic=obs",
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
        (["rollout.num_envs=four"], "config key 'num_envs': input should be a valid integer"),
        (["ppo.pi_lr=-1"], "config key 'ppo.pi_lr': input should be greater than 0, got -1"),
        (["ppo.gamma=1.5"], "config key 'gamma': input should be less than or equal to 1"),
        (["ppo.gae_lambda=-0.1"], "config key 'gae_lambda': input should be greater than or equal to 0"),
        (
            ["ppo.critic=central"],
            "config key 'critic': input should be 'state', 'state+obs', 'obs' or 'team'",
        ),
        (["ppo.critic=team", "model.share_critic=false"], "critic: team is one network per group"),
        (["model.share_actor=maybe"], "config key 'share_actor': input should be a valid boolean"),
        (["total_steps=0"], "config key 'total_steps': input should be greater than 0"),
        (
            ["rollout.rollout_steps=2", "rollout.num_envs=1", "ppo.num_minibatches=4"],
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


@pytest.mark.parametrize("written", ["1e6", "1E6", "1_000_000", "1000000", "1.0e6", "1e+6", "1000000.0"])
def test_integers_as_people_write_them(written, tmp_path):
    from_override = load_config(None, [f"total_steps={written}"])
    assert from_override == load_config(None, ["total_steps=1000000"])
    assert type(from_override.total_steps) is int and from_override.total_steps == 1_000_000
    path = tmp_path / "experiment.yaml"
    path.write_text(f"total_steps: {written}\nmodel:\n  hidden_sizes: [{written}, 64]\n")
    from_file = load_config(path)
    assert from_file.total_steps == 1_000_000 and from_file.model.hidden_sizes == (1_000_000, 64)
    assert type(from_file.model.hidden_sizes[0]) is int


def test_floats_in_scientific_notation_are_numbers_and_fractions_stay_errors(tmp_path):
    assert load_config(None, ["ppo.pi_lr=3e-4"]).ppo.pi_lr == pytest.approx(3e-4)
    assert parse_overrides(["env.kwargs.scale=1e3", "env.kwargs.name=e3"]) == {
        "env": {"kwargs": {"scale": 1000.0, "name": "e3"}}
    }
    with pytest.raises(ConfigError) as info:
        load_config(None, ["total_steps=1.5"])
    assert str(info.value).startswith(
        "config key 'total_steps' takes a whole number, got 1.5; write it as 1000000, 1_000_000 or 1e6"
    )
    path = tmp_path / "experiment.yaml"
    path.write_text("ppo:\n  num_minibatches: 2.5e0\n")
    with pytest.raises(ConfigError, match=r"config key 'ppo.num_minibatches' takes a whole number, got 2.5"):
        load_config(path)


def test_a_list_key_given_comma_separated_words_names_the_yaml_list_form():
    with pytest.raises(ConfigError) as info:
        load_config(None, ["log.backends=tensorboard, csv"])
    assert str(info.value) == (
        "config key 'log.backends' takes a list, got 'tensorboard, csv'; "
        "write it as log.backends=[tensorboard,csv] (YAML's list form)"
    )
    assert load_config(None, ["log.backends=[tensorboard,csv]"]).log.backends == ("tensorboard", "csv")


@pytest.mark.parametrize(
    ("typo", "offered"),
    [
        (
            "ppo.clip",
            "did you mean 'ppo.clip_ratio', 'ppo.grad_clip' or 'ppo.value_clip'?",
        ),  # the key's parts
        ("ppo.lr", "did you mean 'ppo.lr_schedule', 'ppo.pi_lr' or 'ppo.vf_lr'?"),
        (
            "ppo.norm_adv",
            "did you mean 'ppo.normalize_advantages' or 'ppo.advantage_norm'?",
        ),  # prefixes of parts
        ("clip_ratio", "did you mean 'ppo.clip_ratio'?"),  # the right name in another section
        ("model.hidden", "did you mean 'model.hidden_sizes'?"),
        ("ppo.pi_lrr", "did you mean 'ppo.pi_lr'?"),  # a misspelling: the closest spelling
        ("ppo.clip_ratoi", "did you mean 'ppo.clip_ratio'?"),
        ("log.progres", "did you mean 'log.progress'?"),
        ("zzz", "see `marl-ppo train --help-config` for the keys"),
    ],
)
def test_close_matches_on_the_parts_of_a_dotted_key(typo, offered):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{typo}=1"])
    assert str(info.value) == f"unknown config key '{typo}'; {offered}"


def test_key_help_gives_each_default_and_its_allowed_values():
    keys = key_help()
    assert keys["gamma"] == KeyHelp("Discount factor.", "0.99", "number in (0, 1]")
    shown = {key: (entry.default, entry.allowed) for key, entry in keys.items()}
    assert shown["gae_lambda"] == ("0.95", "number in [0, 1]")
    assert shown["total_steps"] == ("1000000", "integer > 0")
    assert shown["seed"] == ("0", "integer >= 0")
    assert shown["ppo.lr_schedule"] == ("constant", "constant, linear")
    assert shown["ppo.target_kl"] == ("0.05", "number > 0 or null")
    assert shown["torch_threads"] == ("auto", "integer > 0 or auto")
    assert shown["eval_every"] == ("null", "integer >= 0 or null")
    assert shown["policy_lag"] == ("0", "0, 1")
    assert shown["share_actor"] == ("false", "true, false")
    assert shown["model.hidden_sizes"] == ("[64, 64]", "list of integers > 0")
    assert shown["env.kwargs"] == ("{}", "mapping")
    assert keys["ppo"] == KeyHelp("PPO optimisation settings.", None, None)  # a section
    assert list(keys) == list(config_keys())


def test_every_default_shown_is_the_default_when_written_back():
    # a key of the optional `expected` section has its default within the section, which cannot be
    # written alone: it needs its required keys and a band
    for key, entry in key_help().items():
        if entry.default is not None and not key.startswith("expected."):
            assert load_config(None, [f"{key}={entry.default}"]) == ExperimentConfig(), key
