"""`marl-ppo train --resume`: after kill -9, after SIGTERM / Ctrl-C, and its one-line errors."""

import copy
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from marl_ppo.analysis.runlogs import read_run
from marl_ppo.checkpoint import load_checkpoint, save_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import MOVED_KEYS
from tests.helpers import ROOT, scalars, wait_for_checkpoint

SPREAD = str(ROOT / "experiments/mpe/simple_spread.yaml")
STEPS_PER_UPDATE = 20


def _args(tiny_overrides, *extra):
    return [SPREAD, *tiny_overrides, "rollout.rollout_steps=10", *extra]


def _start(tiny_overrides, run_dir, *extra):
    """A `marl-ppo train` process (2 env worker processes) that would run for a long time."""
    command = [
        sys.executable,
        "-m",
        "marl_ppo",
        "train",
        *_args(tiny_overrides, "total_steps=10_000_000", *extra),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [*command, "--run-dir", str(run_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill_9_then_resume_continues_the_log_without_duplicates(tiny_overrides, tmp_path, capsys):
    run_dir = tmp_path / "run"
    process = _start(tiny_overrides, run_dir, "log.checkpoint_every=2")
    wait_for_checkpoint(process, run_dir, updates=4)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    saved = load_checkpoint(run_dir / "checkpoints/latest.pt")
    total = saved["env_steps"] + 3 * STEPS_PER_UPDATE

    assert main(["train", "--resume", str(run_dir), f"total_steps={total}"]) == 0
    assert f"done: {total} env steps" in capsys.readouterr().out
    logged = scalars(run_dir)
    expected = list(range(STEPS_PER_UPDATE, total + 1, STEPS_PER_UPDATE))
    assert [step for step, _ in logged["train/loss_pi"]] == expected  # no gap, nothing twice
    episode_ends = [step for step, _ in logged["rollout/episode_length"]]
    assert episode_ends == sorted(episode_ends) and len(episode_ends) == 2 * (total // 50)
    assert load_checkpoint(run_dir / "checkpoints/final.pt")["updates"] == total // STEPS_PER_UPDATE


def test_sigterm_writes_a_checkpoint_and_exits_with_143(tiny_overrides, tmp_path):
    signum = signal.SIGTERM
    run_dir = tmp_path / "run"
    process = _start(tiny_overrides, run_dir, "log.checkpoint_every=3")
    wait_for_checkpoint(process, run_dir, updates=3)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signum
    last_line = stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"stopped by {signal.Signals(signum).name} at env step ")
    # started as `python -m marl_ppo`, the hint says so (tests/cli/test_cli.py runs it from a clean shell)
    assert last_line.endswith(f" -m marl_ppo train --resume {run_dir}") and "; continue with: " in last_line
    saved = load_checkpoint(run_dir / "checkpoints/latest.pt")
    assert saved["env_steps"] == saved["updates"] * STEPS_PER_UPDATE and saved["updates"] >= 3
    assert f"at env step {saved['env_steps']}," in last_line
    assert not (run_dir / "summary.json").exists()
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))


def test_sigint_delivered_twice_as_timeout_sends_it_still_checkpoints(tiny_overrides, tmp_path):
    """`timeout -s INT` signals the process, then its process group (the process again): two SIGINTs
    a moment apart are one request to stop, answered with a checkpoint."""
    run_dir = tmp_path / "run"
    process = _start(tiny_overrides, run_dir, "log.checkpoint_every=3")
    wait_for_checkpoint(process, run_dir, updates=3)
    process.send_signal(signal.SIGINT)
    time.sleep(0.3)  # the first one's handler has run by now, and a tiny run may have stopped
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1].startswith("stopped by SIGINT at env step ")
    saved = load_checkpoint(run_dir / "checkpoints/latest.pt")
    assert saved["env_steps"] == saved["updates"] * STEPS_PER_UPDATE and saved["updates"] >= 3


def test_a_second_stop_signal_after_the_first_moment_aborts_without_a_checkpoint(monkeypatch):
    from marl_ppo.run.signals import StopSignals

    with StopSignals() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the same request, as timeout delivers it
        assert stop.received == signal.SIGINT
        monkeypatch.setattr(StopSignals, "REPEAT_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)  # asked again: stop now
            time.sleep(1)  # the handler runs here at the latest


@pytest.fixture
def finished_run(tiny_overrides, tmp_path):
    run_dir = tmp_path / "finished"
    assert main(["train", *_args(tiny_overrides, "total_steps=100"), "--run-dir", str(run_dir)]) == 0
    return run_dir


def test_print_config_on_resume_shows_the_continued_config_and_touches_nothing(finished_run, capsys):
    files = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()}
    assert main(["train", "--resume", str(finished_run), "total_steps=200", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (
        printed["total_steps"] == 200
        and printed["rollout"]["rollout_steps"] == 10
        and printed["rollout"]["num_envs"] == 2
    )
    assert {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()} == files


def _before_sections(config):
    """`config` (a dict) as a run of the layout before sections stored it: each moved key back at the top."""
    old = copy.deepcopy(config)
    for top, moved in MOVED_KEYS.items():
        section, name = moved.split(".")
        old[top] = old[section].pop(name)
    # keys that came later than the sections: an old run never stored them
    old["eval"].pop("nash_conv")
    old["eval"].pop("partners")
    old["rollout"].pop("compiled")
    old["ppo"].pop("entropy_schedule")
    old["ppo"].pop("entropy_final")
    old.pop("league")
    for name in [key for key in old["model"] if key.startswith("init_")]:
        old["model"].pop(name)
    for section in ("rollout", "eval", "host"):
        assert not old.pop(section)  # nothing else lived in these sections
    return old


def test_a_run_stored_before_the_sections_resumes_evaluates_and_reports(finished_run, tmp_path, capsys):
    for path in (*(finished_run / "checkpoints").glob("*.pt"), finished_run / "config.yaml"):
        if path.suffix == ".pt":
            payload = torch.load(path, weights_only=True)
            save_checkpoint(path, {**payload, "config": _before_sections(payload["config"])})
        else:
            path.write_text(yaml.safe_dump(_before_sections(yaml.safe_load(path.read_text()))))
    stored = yaml.safe_load((finished_run / "config.yaml").read_text())
    assert stored["num_envs"] == 2 and "rollout" not in stored

    assert read_run(finished_run).config["rollout"]["num_envs"] == 2  # report, compare, sweep
    assert main(["eval", str(finished_run), "--episodes", "2", "--out", str(tmp_path / "eval")]) == 0
    assert main(["eval", "--random", str(finished_run), "--episodes", "2", "--out", str(tmp_path / "r")]) == 0
    err = _one_line_error(
        capsys, ["train", "--resume", str(finished_run), "total_steps=160", "torch_threads=1"]
    )
    assert err == (
        "error: config key 'torch_threads' moved to 'host.torch_threads'; "
        "write it there in the experiment file or the overrides"
    )
    assert main(["train", "--resume", str(finished_run), "total_steps=160", "host.torch_threads=1"]) == 0
    assert "done: 160 env steps" in capsys.readouterr().out
    final = load_checkpoint(finished_run / "checkpoints/final.pt")["config"]
    assert final["host"]["torch_threads"] == 1 and final["ppo"]["gamma"] == 0.95 and "gamma" not in final


def _one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


def test_finished_run_resumes_only_when_extended(finished_run, capsys):
    capsys.readouterr()
    err = _one_line_error(capsys, ["train", "--resume", str(finished_run)])
    assert "already finished (env step 100 of total_steps=100)" in err and "total_steps=N" in err
    assert main(["train", "--resume", str(finished_run), "total_steps=160", "log.keep_last=1"]) == 0
    assert "done: 160 env steps" in capsys.readouterr().out
    names = sorted(path.name for path in (finished_run / "checkpoints").iterdir())
    assert names == ["final.pt", "latest.pt", "update_00000008.pt"]


def test_resume_rejects_changes_that_would_make_another_run(finished_run, capsys):
    err = _one_line_error(
        capsys, ["train", "--resume", str(finished_run), "total_steps=200", "ppo.pi_lr=0.1"]
    )
    assert "config key 'ppo.pi_lr' cannot change when resuming" in err
    err = _one_line_error(capsys, ["train", "--resume", str(finished_run), SPREAD])
    assert "drop the experiment file" in err


@pytest.mark.parametrize("damage", ["truncate", "foreign", "missing", "no_run_dir"])
def test_damaged_or_missing_checkpoint_is_a_one_line_error(finished_run, tmp_path, capsys, damage):
    run_dir = tmp_path / "damaged"
    shutil.copytree(finished_run, run_dir)
    latest = run_dir / "checkpoints/latest.pt"
    if damage == "truncate":
        latest.write_bytes(latest.read_bytes()[:-1])
    elif damage == "foreign":
        torch.save({"state_dict": {"w": torch.zeros(3)}}, latest)
    elif damage == "missing":
        latest.unlink()
    else:
        shutil.rmtree(run_dir)
    err = _one_line_error(capsys, ["train", "--resume", str(run_dir), "total_steps=200"])
    expected = {
        "truncate": "is unreadable (",
        "foreign": "is not a marl_ppo checkpoint",
        "missing": "has no checkpoints/latest.pt",
        "no_run_dir": "does not exist",
    }[damage]
    assert expected in err and str(run_dir) in err
