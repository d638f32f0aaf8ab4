"""The command line as a newcomer meets it: closed pipes, visible defaults, flags in any order, and
commands printed for the user that run as printed."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from marl_ppo import cli, console
from marl_ppo.checkpoint import CheckpointError, load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import ConfigError, ExperimentConfig, config_keys, config_to_dict, load_config
from marl_ppo.config.keys import KEY_COLUMN, defaults_notice, help_config_lines
from marl_ppo.plan.copies import settle_copies
from tests.helpers import ROOT

SPREAD = str(ROOT / "experiments/mpe/simple_spread.yaml")
MATRIX = [
    "env.id=envs/matrix_game_v0",
    "rollout.num_envs=2",
    "rollout.rollout_steps=5",
    "rollout.vector=sync",
    "ppo.num_minibatches=1",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "model.hidden_sizes=[8]",
    "log.progress=false",
]
"""A run whose updates take milliseconds (10 env steps each)."""


def _environment(**extra):
    """The environment of a shell that knows nothing of the venv; PYTHONPATH only where this test has one
    (a source checkout run without installing)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _terminal_free_environment():
    return {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}


# -- a closed pipe is a normal end ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "statuses"),
    [
        (["train", "--help-config"], {128 + signal.SIGPIPE}),  # as if ended by SIGPIPE
        (["envs"], {128 + signal.SIGPIPE}),
        (["--help"], {0, 128 + signal.SIGPIPE}),  # argparse drops a help it cannot write and exits 0
    ],
    ids=["help-config", "envs", "help"],
)
def test_output_into_a_closed_pipe_ends_quietly(args, statuses):
    process = subprocess.Popen(
        [sys.executable, "-m", "marl_ppo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader leaves before the first line (as `| head` does after its lines)
    _, stderr = process.communicate(timeout=120)
    assert stderr.decode() == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
    assert process.returncode in statuses


def test_help_config_into_head_prints_its_lines_and_nothing_else():
    marl_ppo = shlex.join([sys.executable, "-m", "marl_ppo"])
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {marl_ppo} train --help-config | head -3"],
        capture_output=True,
        text=True,
        env={**_terminal_free_environment(), "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.stderr == ""
    assert result.stdout.splitlines() == help_config_lines(100)[:3]  # piped: 100 columns unless COLUMNS
    assert result.returncode in (0, 128 + signal.SIGPIPE)  # 0 when it all fitted in the pipe first


def test_a_broken_pipe_elsewhere_is_not_silenced(monkeypatch):
    def worker_pipe_breaks(options):
        raise BrokenPipeError(32, "Broken pipe")  # stdout is fine: an env worker's pipe broke

    monkeypatch.setattr(cli, "_train", worker_pipe_breaks)
    with pytest.raises(BrokenPipeError):
        main(["train"])


# -- defaults you can see -------------------------------------------------------------------------


def test_help_config_lists_each_key_with_its_default_and_allowed_values(capsys):
    assert main(["train", "--help-config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    starts = {line.split()[0]: i for i, line in enumerate(lines) if line and not line.startswith(" ")}
    assert set(config_keys()) <= set(starts)
    gamma = lines[starts["ppo.gamma"] : starts["ppo.gae_lambda"]]
    assert gamma == [
        "ppo.gamma" + " " * (KEY_COLUMN - 9) + "Discount factor.",
        " " * KEY_COLUMN + "default: 0.99; allowed: number in (0, 1]",
    ]
    schedule = " ".join(lines[starts["ppo.lr_schedule"] : starts["ppo.clip_ratio"]])
    assert "default: constant; allowed: constant, linear" in schedule
    total = " ".join(lines[starts["total_steps"] : starts["rollout"]])
    assert "default: 1000000; allowed: integer > 0" in total


def test_help_config_continuation_lines_sit_under_their_text():
    lines = help_config_lines(80)
    keys = set(config_keys())
    for line in lines[1:]:
        if line and not line.startswith(" "):
            assert line.split()[0] in keys and line[KEY_COLUMN - 1] == " " and line[KEY_COLUMN] != " ", line
        elif line:
            assert line.startswith(" " * KEY_COLUMN) and line[KEY_COLUMN] != " ", line
        assert len(line) <= 80 or " " not in line.strip(), line
    # the multi-line docstrings wrap into several indented lines, none at column 0
    at = lines.index(next(line for line in lines if line.startswith("model.precision ")))
    assert sum(1 for line in lines[at + 1 : at + 8] if line.startswith(" " * KEY_COLUMN)) >= 5


def test_print_config_prints_the_resolved_config_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "run"
    args = ["train", SPREAD, "total_steps=1e5", "ppo.pi_lr=3e-4", "--print-config", "--run-dir", str(run_dir)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    config = load_config(SPREAD, ["total_steps=100000", "ppo.pi_lr=0.0003"])
    assert yaml.safe_load(printed) == config_to_dict(config)  # what config.yaml would hold
    assert printed.startswith("env:\n  id: mpe2/simple_spread_v3\n")
    assert list(tmp_path.iterdir()) == []  # no run directory, no runs/
    assert main(["train", "--print-config", "seed=3"]) == 0  # no experiment file, default run dir
    bare = capsys.readouterr().out
    # the copies the config leaves to the env are settled as the run settles them
    assert yaml.safe_load(bare) == config_to_dict(settle_copies(load_config(None, ["seed=3"])))
    assert yaml.safe_load(bare)["rollout"]["num_envs"] == 16
    assert bare.splitlines()[-1] == (
        "# rollout.vector and rollout.compiled: auto is chosen when the run starts; its config.yaml "
        "records the choice"
    )
    assert list(tmp_path.iterdir()) == []


def test_bare_train_says_first_which_defaults_it_runs_with(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert defaults_notice(settle_copies(ExperimentConfig()), []) == (
        "no experiment file: library defaults (ppo.gamma 0.99, rollout.rollout_steps 100, rollout.num_envs 16, "
        "model.share_actor false, ppo.lr_schedule constant, ...); the default experiment is "
        "experiments/mpe/simple_spread.yaml"
    )
    assert Path("experiments/mpe/simple_spread.yaml").is_file()  # the path works from here
    run_dir = tmp_path / "run"
    assert main(["train", *MATRIX, "total_steps=20", "--run-dir", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "no experiment file: library defaults and overrides (ppo.gamma 0.99, rollout.rollout_steps 5, "
        "rollout.num_envs 2, model.share_actor false, ppo.lr_schedule constant, ...); the default experiment is "
        "experiments/mpe/simple_spread.yaml"
    )
    assert lines[-1].startswith("done: 20 env steps")
    monkeypatch.chdir(tmp_path)  # elsewhere, the notice names the file so that it is found from there
    assert defaults_notice(ExperimentConfig(), []).endswith(
        f"is {ROOT / 'experiments/mpe/simple_spread.yaml'}"
    )


def test_an_experiment_file_gets_no_notice(tmp_path, capsys):
    experiment = tmp_path / "matrix.yaml"
    experiment.write_text("env:\n  id: envs/matrix_game_v0\n")
    assert (
        main(["train", str(experiment), *MATRIX[1:], "total_steps=10", "--run-dir", str(tmp_path / "r")]) == 0
    )
    assert capsys.readouterr().out.startswith("done: 10 env steps")


# -- flags where users put them ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--debug", "train", "gama=1"], ["train", "gama=1", "--debug"], ["train", "--debug", "gama=1"]],
    ids=["before", "after", "between"],
)
def test_debug_before_or_after_the_subcommand_raises_with_the_traceback(argv, capsys):
    with pytest.raises(ConfigError, match="unknown config key 'gama'"):
        main(argv)
    assert main([arg for arg in argv if arg != "--debug"]) == 2
    assert capsys.readouterr().err == "error: unknown config key 'gama'; did you mean 'ppo.gamma'?\n"


@pytest.mark.parametrize("where", ["before", "after"])
def test_console_script_debug_prints_the_traceback_either_side(where, tmp_path):
    args = ["train", "gama=1", "--run-dir", str(tmp_path / "r")]
    argv = ["--debug", *args] if where == "before" else [*args, "--debug"]
    result = subprocess.run(
        [sys.executable, "-m", "marl_ppo", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 1  # Python's own status for an uncaught exception
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert result.stderr.strip().splitlines()[-1] == (
        "marl_ppo.config.ConfigError: unknown config key 'gama'; did you mean 'ppo.gamma'?"
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (
            ["train", "--run-dir", "D", "seed=1", "ppo.gamma=0.9"],
            ["train", "seed=1", "--run-dir", "D", "ppo.gamma=0.9"],
        ),
        (
            ["train", "--run-dir", "D", "exp.yaml", "seed=1"],
            ["train", "exp.yaml", "--run-dir", "D", "seed=1"],
        ),
        (["train", "--resume", "D", "total_steps=9"], ["train", "total_steps=9", "--resume", "D"]),
        (["eval", "R", "k=1", "--episodes", "3", "j=2"], ["eval", "--episodes", "3", "R", "k=1", "j=2"]),
        (
            ["sweep", "e.yaml", "--seeds", "2", "a=1,2", "b=3"],
            ["sweep", "e.yaml", "a=1,2", "--seeds", "2", "b=3"],
        ),
        (["envs", "check", "X", "a=1", "b=2", "--debug"], ["envs", "check", "X", "--debug", "a=1", "b=2"]),
    ],
)
def test_flags_and_positionals_in_any_order(first, second):
    parse = cli._parser().parse_args
    assert vars(parse(first)) == vars(parse(second))


def test_overrides_after_an_option_reach_the_config(tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert main(["train", SPREAD, "--run-dir", run_dir, "seed=3", "--print-config", "ppo.gamma=0.9"]) == 0
    after = yaml.safe_load(capsys.readouterr().out)
    assert main(["train", "seed=3", "ppo.gamma=0.9", "--print-config", SPREAD, "--run-dir", run_dir]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == after
    assert (after["seed"], after["ppo"]["gamma"], after["rollout"]["rollout_steps"]) == (
        3,
        0.9,
        25,
    )  # the file, overridden


def test_two_experiment_files_are_one_too_many(capsys):
    assert main(["train", SPREAD, "seed=1", "other.yaml"]) == 2
    assert capsys.readouterr().err == (
        f"error: argument 'other.yaml' is neither the experiment file ('{SPREAD}' is) nor key=value\n"
    )


def test_unknown_options_are_still_refused(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "seed=1", "--bogus"])
    assert info.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


# -- commands that work as printed -------------------------------------------------------------


def test_the_program_is_named_as_it_was_started(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    script = venv_bin / "marl-ppo"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys.modules["__main__"], "__spec__", None, raising=False)
    monkeypatch.setattr(sys, "argv", [str(script), "train"])
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert console.command_words() == [".venv/bin/marl-ppo"]  # not on PATH: the path, from the cwd
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")
    assert console.command_words() == ["marl-ppo"]  # PATH finds this very program
    other = tmp_path / "elsewhere" / "bin"
    other.mkdir(parents=True)
    (other / "marl-ppo").write_text("#!/bin/sh\n")
    (other / "marl-ppo").chmod(0o755)
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    assert console.command_words() == [".venv/bin/marl-ppo"]  # PATH finds another one
    monkeypatch.chdir(other)
    assert console.command_words() == [str(script)]  # outside the cwd: absolute


def test_messages_quote_commands_as_invoked(monkeypatch):
    monkeypatch.setattr(console, "command_words", lambda: [".venv/bin/marl-ppo"])
    monkeypatch.setattr(console, "_pip", lambda: ".venv/bin/python -m pip")
    assert console.as_invoked("see `marl-ppo train --help-config` for the keys") == (
        "see `.venv/bin/marl-ppo train --help-config` for the keys"
    )
    assert console.as_invoked("install it with: pip install 'marl-ppo[vmas]'") == (
        "install it with: .venv/bin/python -m pip install 'marl-ppo[vmas]'"
    )
    assert console.as_invoked("marl-ppo report needs rliable") == "marl-ppo report needs rliable"
    monkeypatch.setattr(console, "command_words", lambda: ["/opt/my venv/bin/python", "-m", "marl_ppo"])
    assert console.shell_command("train", "--resume", "runs/a b") == (
        "'/opt/my venv/bin/python' -m marl_ppo train --resume 'runs/a b'"
    )


def _wait_for_checkpoint(process, path, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if path.exists():
            try:
                return load_checkpoint(path)
            except CheckpointError:  # replaced between exists() and the read
                pass
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"no checkpoint after {timeout} s")


@pytest.mark.parametrize("started_as", ["console script", "python -m"])
def test_the_printed_resume_command_resumes_from_a_shell_without_the_venv(started_as, tmp_path):
    venv = Path(sys.executable).parent.parent
    if started_as == "console script":
        if not (venv / "bin" / "marl-ppo").is_file():
            pytest.skip(f"no marl-ppo console script beside {sys.executable}")
        (tmp_path / ".venv").symlink_to(venv)  # the project's .venv, as `make install` makes it
        command = [".venv/bin/marl-ppo"]
    else:
        command = [sys.executable, "-m", "marl_ppo"]
    total = 1000  # 100 updates of 10 env steps; the signal lands after the first checkpoint, at update 10
    train = [
        *command,
        "train",
        *MATRIX,
        f"total_steps={total}",
        "log.checkpoint_every=10",
        "--run-dir",
        "run",
    ]
    process = subprocess.Popen(
        train, cwd=tmp_path, env=_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _wait_for_checkpoint(process, tmp_path / "run/checkpoints/latest.pt")
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    hint = stderr.strip().splitlines()[-1]
    printed = re.fullmatch(r"stopped by SIGINT at env step (\d+), checkpoint \S+; continue with: (.+)", hint)
    assert printed, hint
    stopped_at, resume = int(printed[1]), printed[2]
    assert stopped_at < total
    if started_as == "console script":
        assert resume == ".venv/bin/marl-ppo train --resume run"
    else:
        assert resume == f"{shlex.quote(sys.executable)} -m marl_ppo train --resume run"

    result = subprocess.run(
        ["bash", "-c", resume], cwd=tmp_path, env=_environment(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith(f"done: {total} env steps")
    final = load_checkpoint(tmp_path / "run/checkpoints/final.pt")
    assert final["env_steps"] == total and final["updates"] == total // 10
