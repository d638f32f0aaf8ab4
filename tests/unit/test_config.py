"""Config loading, overrides and the one-line errors that exit with status 2."""

import dataclasses
import subprocess
import sys

import pytest
import yaml

from marl_ppo.cli import main
from marl_ppo.config import (
    MOVED_KEYS,
    ConfigError,
    ExperimentConfig,
    KeyHelp,
    build_config,
    config_keys,
    key_help,
    load_config,
    load_stored_config,
    migrate_stored,
    parse_overrides,
)
from tests.helpers import ROOT

SPREAD_YAML = str(ROOT / "experiments/mpe/simple_spread.yaml")


def test_defaults_live_in_the_dataclass_and_every_key_is_documented():
    config = load_config()
    assert config == ExperimentConfig()
    for key in (
        "env.id",
        "env.kwargs",
        "seed",
        "total_steps",
        "rollout.num_envs",
        "ppo.gamma",
        "ppo.critic",
        "model.share_actor",
    ):
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
    assert config.ppo.target_kl is None and config.ppo.critic == "obs"


def test_parse_overrides_nests_dotted_keys():
    assert parse_overrides(["a.b.c=1", "a.d=x", "e=[1, 2]"]) == {"a": {"b": {"c": 1}, "d": "x"}, "e": [1, 2]}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ppo.pi_lrr=1e-3"], "unknown config key 'ppo.pi_lrr'; did you mean 'ppo.pi_lr'?"),
        (["gama=0.9"], "unknown config key 'gama'; did you mean 'ppo.gamma'?"),
        (["rollout.num_envs=four"], "config key 'rollout.num_envs': input should be a valid integer"),
        (["ppo.pi_lr=-1"], "config key 'ppo.pi_lr': input should be greater than 0, got -1"),
        (["ppo.gamma=1.5"], "config key 'ppo.gamma': input should be less than or equal to 1"),
        (["ppo.gae_lambda=-0.1"], "config key 'ppo.gae_lambda': input should be greater than or equal to 0"),
        (
            ["ppo.critic=central"],
            "config key 'ppo.critic': input should be 'state', 'state+obs', 'obs' or 'team'",
        ),
        (["ppo.critic=team", "model.share_critic=false"], "ppo.critic: team is one network per group"),
        (["model.share_actor=maybe"], "config key 'model.share_actor': input should be a valid boolean"),
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
    assert keys["ppo.gamma"] == KeyHelp("Discount factor.", "0.99", "number in (0, 1]")
    shown = {key: (entry.default, entry.allowed) for key, entry in keys.items()}
    assert shown["ppo.gae_lambda"] == ("0.95", "number in [0, 1]")
    assert shown["total_steps"] == ("1000000", "integer > 0")
    assert shown["seed"] == ("0", "integer >= 0")
    assert shown["ppo.lr_schedule"] == ("constant", "constant, linear")
    assert shown["ppo.target_kl"] == ("0.05", "number > 0 or null")
    assert shown["host.torch_threads"] == ("auto", "integer > 0 or auto")
    assert shown["eval.every"] == ("null", "integer >= 0 or null")
    assert shown["rollout.policy_lag"] == ("0", "0, 1")
    assert shown["model.share_actor"] == ("false", "true, false")
    assert shown["model.hidden_sizes"] == ("[64, 64]", "list of integers > 0")
    assert shown["env.kwargs"] == ("{}", "mapping")
    assert keys["ppo"] == KeyHelp("Returns, the critic's input and the PPO update.", None, None)  # a section
    assert list(keys) == list(config_keys())


def test_every_default_shown_is_the_default_when_written_back():
    # a key of the optional `expected` section has its default within the section, which cannot be
    # written alone: it needs its required keys and a band
    for key, entry in key_help().items():
        if entry.default is not None and not key.startswith("expected."):
            assert load_config(None, [f"{key}={entry.default}"]) == ExperimentConfig(), key


@pytest.mark.parametrize("old", sorted(MOVED_KEYS))
def test_a_moved_key_is_refused_in_one_line_naming_its_new_place(old, tmp_path):
    new = MOVED_KEYS[old]
    line = f"config key '{old}' moved to '{new}'; write it there in the experiment file or the overrides"
    written = key_help()[new].default
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"{old}={written}"])
    assert str(info.value) == line
    experiment = tmp_path / "old.yaml"
    experiment.write_text(f"env:\n  id: mpe2/simple_spread_v3\n{old}: {written}\n")
    with pytest.raises(ConfigError) as info:
        load_config(experiment)
    assert str(info.value) == line
    assert load_config(None, [f"{new}={written}"]) == ExperimentConfig()  # the new place takes it


def test_a_moved_key_on_the_command_line_exits_2_with_its_new_place(tmp_path, capsys):
    assert main(["train", SPREAD_YAML, "num_envs=4", "--run-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err == (
        "error: config key 'num_envs' moved to 'rollout.num_envs'; "
        "write it there in the experiment file or the overrides\n"
    )
    assert not (tmp_path / "r").exists()


STORED_BEFORE_SECTIONS = {
    "env": {"id": "mpe2/simple_spread_v3", "kwargs": {"N": 3}},
    "seed": 4,
    "total_steps": 5000,
    "num_envs": 8,
    "vector": "workers",
    "num_workers": 4,
    "policy_lag": 1,
    "worker_timeout_s": 30.0,
    "rollout_steps": 25,
    "gamma": 0.95,
    "gae_lambda": 0.9,
    "critic": "obs",
    "team_reward": "refuse",
    "share_actor": True,
    "share_critic": False,
    "device": "auto",
    "torch_threads": 2,
    "memory_check": False,
    "eval_every": 1000,
    "eval_episodes": 3,
    "eval_absolute": 0,
    "eval_vs_random": "teams",
    "eval_teams": {"a": ["agent_0"], "b": ["agent_1", "agent_2"]},
    "ppo": {"pi_lr": 0.001},
    "model": {"hidden_sizes": [32]},
}
"""A config as a run of the layout before sections stored it (every moved key off its default)."""


def test_a_stored_config_of_the_layout_before_sections_is_migrated_key_by_key(tmp_path):
    sectioned = load_config(
        None,
        [
            "env.id=mpe2/simple_spread_v3",
            "env.kwargs={N: 3}",
            "seed=4",
            "total_steps=5000",
            "rollout={num_envs: 8, vector: workers, num_workers: 4, policy_lag: 1, worker_timeout_s: 30.0}",
            "rollout.compiled=false",  # a run stored before the compiled rollout stepped per step
            "rollout.rollout_steps=25",
            "ppo={gamma: 0.95, gae_lambda: 0.9, critic: obs, team_reward: refuse, pi_lr: 0.001}",
            "model={share_actor: true, share_critic: false, hidden_sizes: [32]}",
            "host={device: auto, torch_threads: 2, memory_check: false}",
            "eval={every: 1000, episodes: 3, absolute: 0, vs_random: teams}",
            "eval.teams={a: [agent_0], b: [agent_1, agent_2]}",
        ],
    )
    assert build_config(migrate_stored(STORED_BEFORE_SECTIONS)) == sectioned
    assert "num_envs" in STORED_BEFORE_SECTIONS  # the stored dict itself is left as it was
    stored = tmp_path / "config.yaml"
    stored.write_text(yaml.safe_dump(STORED_BEFORE_SECTIONS))
    assert load_stored_config(stored, ["seed=5"]) == dataclasses.replace(sectioned, seed=5)
    with pytest.raises(ConfigError, match="config key 'gamma' moved to 'ppo.gamma'"):
        load_stored_config(stored, ["gamma=0.9"])  # what the user writes now is refused
    with pytest.raises(ConfigError, match="config key 'num_envs' moved to 'rollout.num_envs'"):
        load_config(stored)  # as an experiment file it is the user's: refused


def test_the_moved_keys_map_to_documented_keys_of_todays_sections():
    keys = config_keys()
    assert not set(MOVED_KEYS) & set(keys)  # no old name is a key again
    assert all(new in keys and "." in new for new in MOVED_KEYS.values())
    assert [key for key in keys if "." not in key] == [
        "env", "seed", "total_steps", "rollout", "host", "eval", "expected", "ppo", "model", "log", "fast", "ray", "league",
    ]  # fmt: skip
