"""Sweeps: grid parsing, run directories, one process per run, failures named with their logs."""

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from marl_ppo.analysis import sweep as sweep_module
from marl_ppo.analysis.sweep import parse_grid, plan_sweep, split_values
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.cli import main
from marl_ppo.config import config_to_dict, load_config
from marl_ppo.envs.factory import probe_layout
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.host import settled_epochs
from tests.helpers import TINY_MATRIX


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump(TINY_MATRIX))
    return path


def test_grid_values_split_on_top_level_commas_only():
    assert split_values("3e-4,1e-3") == ["3e-4", "1e-3"]
    assert split_values("[64,64],[32]") == ["[64,64]", "[32]"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    grid = parse_grid(["ppo.pi_lr=3e-4,1e-3", "model.hidden_sizes=[64,64],[32]", "ppo.gamma=0.9"])
    assert grid == {
        "ppo.pi_lr": ["3e-4", "1e-3"],
        "model.hidden_sizes": ["[64,64]", "[32]"],
        "ppo.gamma": ["0.9"],
    }


def test_plan_names_run_dirs_by_the_varying_keys_and_seed(experiment, tmp_path):
    grid = parse_grid(["ppo.pi_lr=0.001,0.002", "ppo.gamma=0.9"])
    runs, config = plan_sweep(experiment, grid, 2, tmp_path / "runs")
    assert [run.name for run in runs] == [
        "ppo.pi_lr=0.001/seed0",
        "ppo.pi_lr=0.001/seed1",
        "ppo.pi_lr=0.002/seed0",
        "ppo.pi_lr=0.002/seed1",
    ]
    assert runs[3].overrides == ("ppo.pi_lr=0.002", "ppo.gamma=0.9", "seed=1")
    assert runs[0].run_dir == tmp_path / "runs/matrix/ppo.pi_lr=0.001/seed0"
    assert runs[0].log_file == tmp_path / "runs/matrix/ppo.pi_lr=0.001/seed0.log"
    assert config.ppo.gamma == 0.9 and config.ppo.pi_lr == 0.001
    only_seeds, _ = plan_sweep(experiment, {}, 2, tmp_path / "runs")
    assert [run.name for run in only_seeds] == ["seed0", "seed1"]


def test_sweep_trains_each_seed_in_its_own_run_dir(experiment, tmp_path, capsys):
    out = tmp_path / "runs"
    args = ["sweep", str(experiment), "--seeds", "2", "ppo.pi_lr=0.002", "--jobs", "2", "--out", str(out)]
    assert main(args) == 0  # two real `marl-ppo train` processes
    for seed in (0, 1):
        run_dir = out / "matrix" / f"seed{seed}"
        assert (run_dir / "summary.json").is_file() and (run_dir / "checkpoints/final.pt").is_file()
        saved = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert saved["seed"] == seed and saved["ppo"]["pi_lr"] == 0.002
        assert "done: 8 env steps" in run_dir.with_name(f"seed{seed}.log").read_text()
    printed = capsys.readouterr().out.splitlines()
    assert "sweep matrix: 2 finished, 0 skipped (already finished), 0 failed" in printed[-2]
    assert printed[-1].startswith("compare the seeds with: ")  # a command as this process was started
    assert printed[-1].endswith(f" -m marl_ppo report {out / 'matrix'}") or printed[-1].endswith(
        f"marl-ppo report {out / 'matrix'}"
    )
    assert main(args) == 0  # a second call finds every run finished and starts nothing
    assert "0 finished, 2 skipped" in capsys.readouterr().out


def test_every_grid_point_and_seed_is_one_process_with_its_overrides(experiment, tmp_path, monkeypatch):
    def fake_train(experiment, run):  # records its arguments where a run would write its summary
        script = "import json, sys, pathlib; d = pathlib.Path(sys.argv[-1]); d.mkdir(); "
        script += "(d / 'summary.json').write_text(json.dumps(sys.argv[1:-1]))"
        return [sys.executable, "-c", script, *run.overrides, str(run.run_dir)]

    monkeypatch.setattr(sweep_module, "_command", fake_train)
    monkeypatch.setattr(sweep_module, "_result_line", lambda run: "ok")
    out = tmp_path / "runs"
    assert (
        main(
            [
                "sweep",
                str(experiment),
                "ppo.pi_lr=0.001,0.002",
                "ppo.gamma=0.9",
                "--seeds",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    for lr in ("0.001", "0.002"):
        for seed in (0, 1):
            recorded = (out / "matrix" / f"ppo.pi_lr={lr}" / f"seed{seed}" / "summary.json").read_text()
            assert json.loads(recorded) == [f"ppo.pi_lr={lr}", "ppo.gamma=0.9", f"seed={seed}"]
    assert sorted(p.name for p in (out / "matrix").iterdir()) == ["ppo.pi_lr=0.001", "ppo.pi_lr=0.002"]


def test_failed_runs_give_exit_status_1_naming_the_run_and_its_log(experiment, tmp_path, capsys, monkeypatch):
    def fake_command(experiment, run):  # a run that fails at once, without the cost of training
        seed = run.overrides[-1]
        return [
            sys.executable,
            "-c",
            f"import sys; print('boom'); sys.exit(3 if '{seed}' == 'seed=1' else 0)",
        ]

    monkeypatch.setattr(sweep_module, "_command", fake_command)
    monkeypatch.setattr(sweep_module, "_result_line", lambda run: "ok")
    assert main(["sweep", str(experiment), "--seeds", "2", "--out", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    log = tmp_path / "matrix" / "seed1.log"
    assert f"FAILED seed1 (exit 3); log {log}" in printed
    assert printed.strip().splitlines()[-1] == (
        f"sweep matrix: 1 finished, 0 skipped (already finished), 1 failed: seed1 (log {log})"
    )
    assert log.read_text() == "boom\n"


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        (["seed=1,2"], "seed cannot be a grid key; use --seeds N"),
        (["ppo.pi_lr"], "grid argument 'ppo.pi_lr' is not key=v1,v2"),
        (["ppo.pi_lr=1e-3,,2e-3"], "has an empty value"),
        (["ppo.pi_lr=1e-3,-1"], "config key 'ppo.pi_lr'"),
        (["ppo.bogus=1,2"], "unknown config key 'ppo.bogus'"),
        (["env.id=nope/v0"], "unknown env id 'nope/v0'"),
        (["--seeds", "0"], "--seeds 0 must be at least 1"),
    ],
)
def test_bad_sweep_input_stops_before_any_run(experiment, tmp_path, capsys, grid, message):
    assert main(["sweep", str(experiment), *grid, "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_an_unfinished_run_of_another_config_is_an_error_not_overwritten(experiment, tmp_path, capsys):
    (tmp_path / "matrix" / "seed0").mkdir(parents=True)
    (tmp_path / "matrix" / "seed0" / "config.yaml").write_text("seed: 0\n")
    assert main(["sweep", str(experiment), "--seeds", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds an unfinished run of another config" in err and err.count("\n") == 1
    assert (tmp_path / "matrix" / "seed0" / "config.yaml").read_text() == "seed: 0\n"


def _children(pid):
    """The process ids of `pid`'s children (Linux's /proc)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _wait_until(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited a minute for the sweep's processes"
        threading.Event().wait(0.01)


def _state(pid):
    """A process's state letter (R running, S sleeping, T stopped, ...), from Linux's /proc."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _pending(pid, signum):
    """Whether `signum` waits, undelivered, for process `pid` (held by SIGSTOP)."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    mask = int(status["ShdPnd"], 16) | int(status["SigPnd"], 16)
    return bool(mask & (1 << (signum - 1)))


def test_a_local_sweep_stopped_midway_and_started_again_resumes_its_unfinished_seed(tmp_path, capsys):
    experiment = tmp_path / "matrix.yaml"
    experiment.write_text(yaml.safe_dump({**TINY_MATRIX, "total_steps": 800, "log": {"checkpoint_every": 2}}))
    out = tmp_path / "runs"
    args = ["sweep", str(experiment), "--seeds", "2", "--jobs", "1", "--out", str(out)]
    first, second = out / "matrix" / "seed0", out / "matrix" / "seed1"
    # Ctrl-C reaches the sweep even where this test runs with SIGINT ignored (a background job's default)
    default_sigint = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
    command = [sys.executable, "-m", "marl_ppo", *args]
    sweep = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        while not (first / "summary.json").exists() or not (second / "checkpoints" / "latest.pt").exists():
            assert sweep.poll() is None, "the sweep ended before it could be stopped"
            threading.Event().wait(0.05)
        # seed 1 is held still until the sweep's SIGTERM reaches it, so that it cannot finish first on a busy machine
        (training,) = _children(sweep.pid)
        os.kill(training, signal.SIGSTOP)
        _wait_until(lambda: _state(training) == "T")  # stopped before the SIGTERM comes, which then waits
        sweep.send_signal(signal.SIGINT)  # Ctrl-C: the sweep stops its training, which checkpoints
        _wait_until(lambda: _pending(training, signal.SIGTERM))
        os.kill(training, signal.SIGCONT)
        sweep.communicate(timeout=120)
    finally:
        for pid in _children(sweep.pid) if sweep.poll() is None else []:
            os.kill(pid, signal.SIGKILL)  # a held training must not outlive a failed test
        sweep.kill()
    assert not (second / "summary.json").exists()
    stopped = load_checkpoint(second / "checkpoints" / "latest.pt")["env_steps"]
    assert 0 < stopped < 800
    finished = (first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns

    assert main(args) == 0
    assert "sweep matrix: 1 finished, 1 skipped (already finished), 0 failed" in capsys.readouterr().out
    assert ((first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns) == finished
    assert json.loads((second / "summary.json").read_text())["env_steps"] == 800
    log = second.with_name("seed1.log").read_text()
    assert "stopped by SIGTERM" in log and "done: 800 env steps" in log  # one log, both parts: resumed


def test_a_run_stopped_before_its_first_checkpoint_starts_over(experiment, tmp_path, monkeypatch):
    run_dir = tmp_path / "matrix" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "tensorboard").mkdir()  # what a run leaves before it writes its config
    runs, _ = plan_sweep(experiment, {}, 1, tmp_path)
    words, mode = sweep_module.launch_words(experiment, runs[0])
    assert mode == "w" and "--resume" not in words and words[-2:] == ["--run-dir", str(run_dir)]
    assert not run_dir.exists()


@pytest.mark.parametrize("command", [[], ["eval"], ["sweep"], ["report"]])
def test_help_of_every_command_prints(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "-h"])
    assert exit_info.value.code == 0 and "usage: marl-ppo" in capsys.readouterr().out


@pytest.mark.parametrize("vector", ["sync", "subprocess", "auto"])
def test_default_jobs_divides_the_cores_by_what_one_run_keeps_busy(vector, monkeypatch):
    monkeypatch.setattr(sweep_module, "usable_cores", lambda: 8)
    config = load_config(
        None, ["env.id=envs/matrix_game_v0", f"rollout.vector={vector}", "rollout.num_workers=2"]
    )
    assert sweep_module.default_jobs(config) == (8 if vector == "sync" else 4)  # torch_threads: auto is 1


def _fake_train_writing_config(experiment, run):
    """A stand-in for `marl-ppo train` that writes config.yaml as a run does, and summary.json."""
    script = (
        "import json, sys, pathlib, yaml; from marl_ppo.config import config_to_dict, load_config; "
        "d = pathlib.Path(sys.argv[-1]); d.mkdir(); "
        "c = load_config(sys.argv[1], sys.argv[2:-1]); "
        "(d / 'config.yaml').write_text(yaml.safe_dump(config_to_dict(c))); "
        "(d / 'summary.json').write_text(json.dumps({'gamma': c.ppo.gamma}))"
    )
    return [sys.executable, "-c", script, str(experiment), *run.overrides, str(run.run_dir)]


def test_a_changed_non_grid_value_never_reuses_a_finished_run_of_another_config(
    experiment, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sweep_module, "_command", _fake_train_writing_config)
    monkeypatch.setattr(sweep_module, "_result_line", lambda run: "ok")
    out = tmp_path / "runs"
    assert main(["sweep", str(experiment), "--seeds", "2", "ppo.gamma=0.95", "--out", str(out)]) == 0
    assert "2 finished, 0 skipped" in capsys.readouterr().out
    summaries = {seed: (out / "matrix" / f"seed{seed}" / "summary.json").read_text() for seed in (0, 1)}
    assert json.loads(summaries[0]) == {"gamma": 0.95}

    # gamma=0.5 lands in the same directories (one value names no directory): refused, nothing touched
    assert main(["sweep", str(experiment), "--seeds", "2", "ppo.gamma=0.5", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert (
        f"run directory '{out / 'matrix' / 'seed0'}' holds a finished run of another config "
        "(ppo.gamma 0.95 there, 0.5 here); pass another --out, or remove the run to train it again"
    ) in captured.err
    for seed in (0, 1):
        assert (out / "matrix" / f"seed{seed}" / "summary.json").read_text() == summaries[seed]

    # a changed value in the experiment file itself is refused the same way
    changed = yaml.safe_load(experiment.read_text())
    changed["model"]["hidden_sizes"] = [16]
    experiment.write_text(yaml.safe_dump(changed))
    assert main(["sweep", str(experiment), "--seeds", "2", "ppo.gamma=0.95", "--out", str(out)]) == 2
    assert "(model.hidden_sizes [8] there, [16] here)" in capsys.readouterr().err

    # the same config as the finished runs (log.progress and an expected band aside) reuses them
    changed["model"]["hidden_sizes"] = [8]
    changed["expected"] = {"steps": 8, "seeds": 2, "team_return": [0.0, 20.0]}
    experiment.write_text(yaml.safe_dump(changed))
    assert main(["sweep", str(experiment), "--seeds", "3", "ppo.gamma=0.95", "--out", str(out)]) == 0
    assert "1 finished, 2 skipped (already finished)" in capsys.readouterr().out


def test_auto_epochs_reuse_only_a_run_that_trained_the_epochs_auto_gives_now():
    planned = load_config(None, ["env.id=envs/pixel_signal_v0"])  # a CNN model: auto gives 4 epochs
    recorded = config_to_dict(settle_copies(planned))  # a run records the copies it settled
    recorded["ppo"].update(train_pi_iters=10, train_vf_iters=10)  # a run of the earlier default
    epochs = ["ppo.train_pi_iters", "ppo.train_vf_iters"]
    assert sweep_module.config_differences(settled_epochs(planned, probe_layout(planned)), recorded) == epochs
    recorded["ppo"].update(train_pi_iters=4, train_vf_iters=4)
    assert sweep_module.config_differences(settled_epochs(planned, probe_layout(planned)), recorded) == []


def test_auto_choices_recorded_by_a_finished_run_match_the_auto_it_was_started_with():
    planned = load_config(None, ["env.id=envs/matrix_game_v0", "rollout.policy_lag=1"])
    recorded = config_to_dict(settle_copies(planned))
    recorded["rollout"].update(vector="sync", policy_lag=0)
    recorded["host"]["torch_threads"] = 1
    recorded["model"]["precision"] = "fp32"
    recorded["ppo"].update(train_pi_iters=10, train_vf_iters=10)
    assert sweep_module.config_differences(settled_epochs(planned, probe_layout(planned)), recorded) == []
    recorded["seed"], recorded["ppo"]["gamma"] = 4, 0.5
    assert sweep_module.config_differences(settled_epochs(planned, probe_layout(planned)), recorded) == [
        "ppo.gamma",
        "seed",
    ]
    without_lag = load_config(None, ["env.id=envs/matrix_game_v0"])  # auto, policy_lag 0
    recorded = config_to_dict(settle_copies(without_lag))
    recorded["rollout"].update(vector="workers", policy_lag=1)  # auto never turns lag on: started otherwise
    assert sweep_module.config_differences(without_lag, recorded) == ["rollout.policy_lag"]
