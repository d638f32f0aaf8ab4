"""A newcomer's session, command by command: train and Ctrl-C it, resume it as printed (each a process of
its own), eval, a two-seed sweep and its report, on the matrix game with tiny steps."""

import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
import yaml

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.cli import main
from tests.helpers import ROOT, TINY_MATRIX, wait_for_checkpoint

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _marl_ppo(args, cwd):
    """`marl-ppo ARGS` run from `cwd`, as the user types it."""
    return subprocess.run(
        [sys.executable, "-m", "marl_ppo", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _started_run_dir(process, runs, timeout=60.0):
    """The run directory `marl-ppo train` made under `runs/` (named runs/<experiment>-<time>)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        made = sorted(runs.glob("matrix-*")) if runs.is_dir() else []
        if made:
            return made[0]
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"no run directory under {runs} after {timeout} s")


def _printed_resume_args(stderr):
    """The arguments of the `continue with: ...` command the stopped run printed, from `train` on."""
    line = stderr.strip().splitlines()[-1]
    words = shlex.split(line.split("continue with: ", 1)[1])
    return words[words.index("train") :]


def test_train_stop_resume_eval_sweep_report(tmp_path, monkeypatch, capsys):
    pytest.importorskip("rliable")
    pytest.importorskip("matplotlib")
    experiment = tmp_path / "matrix.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                **TINY_MATRIX,
                "total_steps": 10_000_000,
                "rollout": {**TINY_MATRIX["rollout"], "vector": "sync"},
            }
        )
    )

    # train, then Ctrl-C once it has checkpointed: exit 130 and a line saying how to continue
    train = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "marl_ppo",
            "train",
            "matrix.yaml",
            "log.progress=false",
            "log.checkpoint_every=1",
        ],
        cwd=tmp_path,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = _started_run_dir(train, tmp_path / "runs")
    saved = wait_for_checkpoint(train, run_dir, updates=1)
    train.send_signal(signal.SIGINT)
    _, stderr = train.communicate(timeout=60)
    assert train.returncode == 130, stderr
    assert not (run_dir / "summary.json").exists()

    # resume with the printed command's arguments, ending the run soon after its checkpoint
    resume = _printed_resume_args(stderr)
    assert resume[:2] == ["train", "--resume"] and (tmp_path / resume[2]).resolve() == run_dir.resolve()
    stopped_at = load_checkpoint(run_dir / "checkpoints/latest.pt")["env_steps"]  # written on the way out
    assert stopped_at >= saved["env_steps"] and f"at env step {stopped_at}," in stderr
    total = stopped_at + 16  # two more updates
    resumed = _marl_ppo([*resume, f"total_steps={total}"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"done: {total} env steps" in resumed.stdout
    assert (run_dir / "summary.json").is_file() and (run_dir / "checkpoints/final.pt").is_file()

    # the rest in this process, from the same directory (sweep starts a process per run itself)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["eval", str(run_dir.relative_to(tmp_path)), "--episodes", "4"]) == 0
    assert "4 episodes: team return" in capsys.readouterr().out and (run_dir / "eval.json").is_file()

    assert main(["sweep", "matrix.yaml", "--seeds", "2", "total_steps=16", "eval.every=8"]) == 0
    assert "sweep matrix: 2 finished, 0 skipped (already finished), 0 failed" in capsys.readouterr().out
    for seed in (0, 1):
        assert (tmp_path / f"runs/matrix/seed{seed}/summary.json").is_file()

    assert main(["report", "runs/matrix", "--out", "report", "--reps", "200"]) == 0
    assert "2 run(s) in 1 configuration(s)" in capsys.readouterr().out
    assert (tmp_path / "report/report.md").is_file() and list((tmp_path / "report").glob("curves_*.png"))
