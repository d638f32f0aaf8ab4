"""Bad input, table-driven: every case exits with its status and one line naming the problem, no traceback.

Each row runs `marl-ppo train` in-process and checks the exit status (2: bad input, 1: a fault of the
run), that stderr is one line that names the problem, that no traceback is printed without --debug,
and what is left in the run directory: nothing (rejected before any work), what was already there,
or the checkpoint of update 1, intact and loadable (the env broke during update 2).
"""

import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

from marl_ppo.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from marl_ppo.cli import main
from marl_ppo.envs.adapters.contract import EnvContractError
from tests.broken_envs import BROKEN, TINY_RUN, register_for_test
from tests.helpers import ROOT

SPREAD_YAML = str(ROOT / "experiments/mpe/simple_spread.yaml")
NOTHING, KEPT, UPDATE_1 = "nothing written", "kept as it was", "checkpoint of update 1"


@dataclass(frozen=True)
class Case:
    args: list[str]
    status: int
    names: tuple[str, ...]
    """Fragments the one-line message must contain."""
    leaves: str = NOTHING


def broken(fault: str, *names: str, status: int = 2, extra: tuple[str, ...] = ()) -> Case:
    return Case([f"env.id={BROKEN}", f"env.kwargs.fault={fault}", *TINY_RUN, *extra], status, names, UPDATE_1)


CASES = {
    # config keys and values
    "unknown key": Case(
        ["ppo.pi_lrr=1e-3"], 2, ("unknown config key 'ppo.pi_lrr'", "did you mean 'ppo.pi_lr'?")
    ),
    "unknown top key": Case(["gama=0.9"], 2, ("unknown config key 'gama'", "did you mean 'ppo.gamma'?")),
    "unknown section": Case(["ppp.pi_lr=1"], 2, ("unknown config key 'ppp'", "did you mean 'ppo'?")),
    "wrong type": Case(
        ["rollout.num_envs=four"], 2, ("config key 'rollout.num_envs'", "valid integer", "'four'")
    ),
    "wrong type list": Case(["model.hidden_sizes=64"], 2, ("config key 'model.hidden_sizes'",)),
    "zero actor lr": Case(["ppo.pi_lr=0"], 2, ("config key 'ppo.pi_lr'", "greater than 0")),
    "negative critic lr": Case(["ppo.vf_lr=-1e-3"], 2, ("config key 'ppo.vf_lr'", "greater than 0")),
    "gamma zero": Case(["ppo.gamma=0"], 2, ("config key 'ppo.gamma'", "greater than 0")),
    "gamma above one": Case(["ppo.gamma=1.01"], 2, ("config key 'ppo.gamma'", "less than or equal to 1")),
    "lambda above one": Case(
        ["ppo.gae_lambda=1.5"], 2, ("config key 'ppo.gae_lambda'", "less than or equal to 1")
    ),
    "negative lambda": Case(
        ["ppo.gae_lambda=-0.1"], 2, ("config key 'ppo.gae_lambda'", "greater than or equal to 0")
    ),
    "zero clip": Case(["ppo.clip_ratio=0"], 2, ("config key 'ppo.clip_ratio'", "greater than 0")),
    "zero rollout": Case(
        ["rollout.rollout_steps=0"], 2, ("config key 'rollout.rollout_steps'", "greater than 0")
    ),
    "zero width": Case(
        ["model.hidden_sizes=[64,0]"], 2, ("config key 'model.hidden_sizes'", "greater than 0")
    ),
    "negative envs": Case(["rollout.num_envs=-2"], 2, ("config key 'rollout.num_envs'", "greater than 0")),
    "minibatches over batch": Case(
        ["rollout.rollout_steps=2", "rollout.num_envs=1", "ppo.num_minibatches=4"],
        2,
        ("ppo.num_minibatches=4 exceeds the batch",),
    ),
    "bad choice": Case(
        ["ppo.on_nonfinite=ignore"], 2, ("config key 'ppo.on_nonfinite'", "'error' or 'skip'")
    ),
    "zero worker timeout": Case(
        ["rollout.worker_timeout_s=0"], 2, ("config key 'rollout.worker_timeout_s'", "greater than 0")
    ),
    "negative checkpoint period": Case(
        ["log.checkpoint_every=-1"], 2, ("config key 'log.checkpoint_every'",)
    ),
    # command-line arguments
    "not key=value": Case([SPREAD_YAML, "seed"], 2, ("argument 'seed' is neither the experiment file",)),
    "empty key": Case(["=3"], 2, ("override '=3' is not key=value",)),
    "conflicting overrides": Case(
        ["ppo=1", "ppo.pi_lr=1"], 2, ("conflicts with an earlier override of 'ppo'",)
    ),
    # environments named by the config
    "unknown env id": Case(
        ["env.id=mpe2/simple_sprad_v3"], 2, ("unknown env id 'mpe2/simple_sprad_v3'", "did you mean")
    ),
    "missing extra": Case(
        ["env.id=tests/needs_extra_v0"],
        2,
        ("needs the optional package 'no_such_sim'", "pip install 'marl-ppo[nosim]'"),
    ),
    "missing module": Case(["env.id=no_such_module:make"], 2, ("cannot import module 'no_such_module'",)),
    "factory raises": Case(
        ["env.id=tests/factory_raises_v0"], 2, ("its factory raised ConnectionError", "port 5555")
    ),
    "env kwargs rejected": Case(
        [f"env.id={BROKEN}", "env.kwargs.speed=2"], 2, ("rejected its kwargs", "speed")
    ),
    "probe reset raises": Case(
        [f"env.id={BROKEN}", "env.kwargs.fault=first_reset_raises"],
        2,
        ("reset(seed=0) raised RuntimeError", "license"),
    ),
    # environments that break the contract during the run
    "obs nan": broken(
        "obs_nan", "copy 0, episode step 3", "agent 'agent_1'", "observation [1.0, nan] holds NaN or inf"
    ),
    "obs nan at an episode's end": broken(
        "obs_nan", "copy 0, episode step 4", "agent 'agent_1'", "[1.0, nan]", extra=("env.kwargs.at=8",)
    ),
    "obs nan at reset": broken(
        "reset_obs_nan",
        "copy 0, episode step 0",
        "agent 'agent_0'",
        "[nan, 0.0]",
        extra=("env.kwargs.max_steps=6",),
    ),
    "worker obs nan at an episode's end": broken(
        "obs_nan",
        "copy 0, episode step 4",
        "agent 'agent_1'",
        extra=("env.kwargs.at=8", "rollout.vector=subprocess"),
    ),
    "obs inf": broken("obs_inf", "agent 'agent_1'", "[1.0, inf] holds NaN or inf; expected finite values"),
    "obs shape": broken("obs_shape", "agent 'agent_1'", "shape (3,)", "expected shape (2,)"),
    "obs dtype": broken("obs_dtype", "agent 'agent_1'", "dtype <U5", "expected shape (2,) and dtype float32"),
    "obs missing": broken("obs_missing", "agent 'agent_1'", "no observation for this live agent"),
    "reward nan": broken(
        "reward_nan", "agent 'agent_1'", "reward nan is not finite; expected a finite number"
    ),
    "reward missing": broken("reward_missing", "agent 'agent_1'", "no reward for this agent, which acted"),
    "reward not a number": broken("reward_text", "agent 'agent_1'", "reward 'high' is not a number"),
    "unknown agent acts": broken(
        "unknown_agent", "agent 'ghost'", "not in possible_agents ['agent_0', 'agent_1']"
    ),
    "unknown agent observed": broken("unknown_obs_agent", "agent 'ghost'", "not in possible_agents"),
    "agent rejoins": broken(
        "rejoin",
        "agent 'agent_1'",
        "live again after it terminated",
        "metadata['agents_can_rejoin']",
        extra=("env.kwargs.at=6",),
    ),
    "agent leaves with neither flag": broken(
        "silent_leave",
        "copy 0, episode step 3",
        "agent 'agent_1'",
        "left env.agents without being terminated or truncated",
    ),
    "rollout worker agent leaves with neither flag": broken(
        "silent_leave",
        "copy 0, episode step 3",
        "agent 'agent_1'",
        "left env.agents",
        extra=("rollout.vector=workers",),
    ),
    "step raises": broken(
        "step_raises", "copy 0, episode step 3", "step raised ZeroDivisionError", "physics"
    ),
    "step old api": broken("step_old_api", "step returned", "expected (observations, rewards, terminations"),
    "state nan": broken("state_nan", "copy 0, episode step 3", "state() [nan, nan, nan] holds NaN or inf"),
    "reset no agents": broken(
        "reset_no_agents", "reset returned no agents", extra=("env.kwargs.max_steps=6",)
    ),
    "reset raises": broken("reset_raises", "reset raised RuntimeError", extra=("env.kwargs.max_steps=6",)),
    "worker obs nan": broken(
        "obs_nan",
        "copy 0, episode step 3",
        "agent 'agent_1'",
        "NaN or inf",
        extra=("rollout.vector=subprocess",),
    ),
    "worker step raises": broken(
        "step_raises",
        "copy 0",
        "ZeroDivisionError",
        extra=("rollout.vector=subprocess", "rollout.num_workers=2"),
    ),
    "worker hangs": broken(
        "hang",
        "did not answer 'step' within 1 s (rollout.worker_timeout_s)",
        "every worker was stopped",
        status=1,
        extra=("rollout.vector=subprocess", "rollout.worker_timeout_s=1"),
    ),
    "rollout worker obs nan": broken(
        "obs_nan",
        "copy 0, episode step 3",
        "agent 'agent_1'",
        "NaN or inf",
        extra=("rollout.vector=workers",),
    ),
    "rollout worker hangs": broken(
        "hang",
        "RolloutWorkers: worker 0 (pid",
        "did not answer 'collect' within 5 s (rollout.worker_timeout_s per env step)",
        status=1,
        extra=("rollout.vector=workers", "rollout.num_workers=1", "rollout.worker_timeout_s=1"),
    ),
    # a config that does not fit the env's rewards
    "team critic refuses per-agent rewards": broken(
        "unshared_reward",
        "ppo.critic: team with ppo.team_reward: refuse",
        "group 'agent' got different rewards at step 2 of the rollout after env step 10 (copy 0)",
        "agent_0 1, agent_1 0.5",
        "set ppo.team_reward: mean",
        extra=("ppo.critic=team", "ppo.team_reward=refuse"),
    ),
    # numbers that blow up
    "returns overflow": broken(
        "huge_reward",
        "non-finite GAE return or advantage in group 'agent' at update 2",
        "ppo.on_nonfinite=skip",
        status=1,
    ),
}


@pytest.fixture(autouse=True)
def _test_envs(monkeypatch):
    register_for_test(monkeypatch)


def _files(directory):
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_bad_input_exits_with_one_line_and_keeps_the_run_directory(case, tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", *case.args, "--run-dir", str(run_dir)]) == case.status
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err + out
    for fragment in case.names:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    if case.leaves == NOTHING:
        assert not run_dir.exists(), "nothing is written when the input is rejected"
    else:
        assert not (run_dir / "checkpoints/final.pt").exists() and not (run_dir / "summary.json").exists()
        payload = load_checkpoint(run_dir / "checkpoints/latest.pt")
        assert payload["updates"] == 1 and payload["env_steps"] == 10


def test_experiment_files_and_run_directories(tmp_path, capsys):
    cases = {
        "missing.yaml": "experiment file 'missing.yaml' does not exist",
        "bad.yaml": "is not valid YAML at line 3",
        "list.yaml": "must hold a mapping of keys, not list",
        "binary.yaml": "is not UTF-8 text",
    }
    (tmp_path / "bad.yaml").write_text("seed: 1\nenv: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- seed\n- 1\n")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(128, 256)))
    for name, message in cases.items():
        path = name if name == "missing.yaml" else str(tmp_path / name)
        assert main(["train", path, "--run-dir", str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("precious")
    assert main(["train", "--run-dir", str(used)]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert _files(used) == {used.joinpath("keep.txt").relative_to(used): b"precious"}
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["train", "--run-dir", str(blocker / "run")]) == 2
    assert f"cannot be created: '{blocker}' is a file" in capsys.readouterr().err
    assert blocker.read_text() == "x"


def test_debug_shows_the_traceback_with_the_envs_own_error(tmp_path):
    args = [
        "train",
        f"env.id={BROKEN}",
        "env.kwargs.fault=step_raises",
        *TINY_RUN,
        "--run-dir",
        str(tmp_path / "r"),
    ]
    with pytest.raises(EnvContractError, match="step raised ZeroDivisionError") as info:
        main([*args, "--debug"])
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(Exception, match="unknown config key"):
        main(["train", "gama=1", "--debug"])


def test_console_script_debug_prints_the_worker_traceback(tmp_path):
    env_id = f"{ROOT / 'tests/broken_envs.py'}:make"
    args = [
        f"env.id={env_id}",
        "env.kwargs.fault=step_raises",
        *TINY_RUN,
        "rollout.vector=subprocess",
        "rollout.num_workers=1",
    ]
    command = [sys.executable, "-m", "marl_ppo", "train", *args, "--run-dir", str(tmp_path / "r"), "--debug"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1  # an uncaught exception: Python's own status
    assert "Traceback" in result.stderr and "RemoteTraceback" in result.stderr
    assert 'raise ZeroDivisionError("division by zero in the physics step")' in result.stderr


@pytest.mark.parametrize(
    "damage", ["truncated", "empty", "random bytes", "foreign pickle", "no format tag", "directory"]
)
def test_corrupted_checkpoints_give_one_line_errors(tmp_path, damage):
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"format": FORMAT, "model": {"w": torch.zeros(64)}})
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "random bytes":
        path.write_bytes(bytes(range(256)) * 4)
    elif damage == "foreign pickle":
        torch.save({"state_dict": {}}, path)
    elif damage == "no format tag":
        torch.save([1, 2, 3], path)
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert f"checkpoint '{path}'" in message and "\n" not in message
