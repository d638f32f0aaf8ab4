"""Faults of a running training: a killed worker, NaN losses and gradients, a full disk."""

import errno
import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import marl_ppo.checkpoint as checkpoint_module
from marl_ppo.algo import trainer as trainer_module
from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint, periodic_path
from marl_ppo.cli import main
from marl_ppo.faults import NonFiniteError
from tests.broken_envs import BROKEN, TINY_RUN, register_for_test
from tests.helpers import ROOT, collect_rollout


def _children(pid: int) -> list[int]:
    """Pids of the live (non-zombie) child processes of `pid`, read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_a_worker_mid_rollout_ends_the_run_with_one_line_and_no_orphans(tmp_path):
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "marl_ppo",
        "train",
        "env.id=envs/early_leaver_v0",
        "rollout.vector=subprocess",
    ]
    command += [
        "rollout.num_workers=2",
        "rollout.num_envs=4",
        "rollout.rollout_steps=200",
        "total_steps=100000000",
        "log.progress=false",
    ]
    command += ["--run-dir", str(run_dir)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert run.stderr is not None
    try:
        deadline = time.monotonic() + 120  # bounds a hang, not the start-up time
        while not (run_dir / "tensorboard").exists():  # training has started: workers are stepping
            assert run.poll() is None, run.stderr.read()
            assert time.monotonic() < deadline, "the run did not start training"
            time.sleep(0.05)
        workers = _children(run.pid)
        assert len(workers) == 2, workers
        os.kill(workers[1], signal.SIGKILL)
        _, err = run.communicate(timeout=120)  # the run ends by itself; the limit only bounds a hang
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert (
        err.startswith("error: SubprocessVectorEnv: worker 1 (marl_ppo-env-worker-1")
        and "died during 'step'" in err
    )
    assert "exit code -9" in err
    assert not any(_alive(pid) for pid in workers), "a worker survived the run"


def _trainer_and_batches(spread_config, on_nonfinite="error"):
    import dataclasses

    config = dataclasses.replace(
        spread_config, ppo=dataclasses.replace(spread_config.ppo, on_nonfinite=on_nonfinite)
    )
    model, buffer, rollout = collect_rollout(config)
    batches = rollout_batches(buffer, rollout.last_values, gamma=config.ppo.gamma, lam=config.ppo.gae_lambda)
    return (
        model,
        Trainer(model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)),
        batches,
    )


def _nan_value_loss(monkeypatch):
    original = trainer_module.value_loss
    monkeypatch.setattr(trainer_module, "value_loss", lambda *a, **k: original(*a, **k) * float("nan"))


def test_nan_loss_stops_the_update_naming_group_term_and_update(spread_config, monkeypatch):
    model, trainer, batches = _trainer_and_batches(spread_config)
    trainer.update(batches)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    _nan_value_loss(monkeypatch)
    with pytest.raises(NonFiniteError) as info:
        trainer.update(batches)
    assert str(info.value).startswith(
        "non-finite loss_v (nan) in group 'agent' at update 2 (epoch 0, minibatch 0); no weights were changed by it."
    )
    assert "ppo.on_nonfinite=skip" in str(info.value) and "\n" not in str(info.value)
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, weights[k]) and "norm" not in k]
    assert changed == []


def test_nan_gradient_with_a_finite_loss_is_caught(spread_config):
    model, trainer, batches = _trainer_and_batches(spread_config)
    next(model.actors.parameters()).register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(
        NonFiniteError, match=r"non-finite actor gradient in group 'agent' at update 1 \(epoch 0"
    ):
        trainer.update(batches)


def test_skip_drops_every_poisoned_step_and_counts_it(spread_config, monkeypatch):
    model, trainer, batches = _trainer_and_batches(spread_config, on_nonfinite="skip")
    critic_before = {k: v.clone() for k, v in model.critics.state_dict().items()}
    _nan_value_loss(monkeypatch)
    stats = trainer.update(batches)  # 2 epochs x 2 minibatches, all with a NaN value loss
    assert stats.nonfinite_skips == 4 and stats.stop_iter == 2
    assert all(torch.equal(v, critic_before[k]) for k, v in model.critics.state_dict().items())
    monkeypatch.undo()
    assert trainer.update(batches).nonfinite_skips == 0


def test_overflowing_returns_with_skip_finish_the_run_and_log_the_skips(tmp_path, capsys, monkeypatch):
    register_for_test(monkeypatch)
    run_dir = tmp_path / "run"
    args = [f"env.id={BROKEN}", "env.kwargs.fault=huge_reward", *TINY_RUN, "ppo.on_nonfinite=skip"]
    assert main(["train", *args, "--run-dir", str(run_dir)]) == 0
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    skips = [e.value for e in events.Scalars("train/nonfinite_skips")]
    assert skips[0] == 0 and all(s >= 1 for s in skips[1:]), skips  # from update 2 on, the returns overflow
    payload = load_checkpoint(run_dir / "checkpoints/final.pt")
    assert all(torch.isfinite(t).all() for t in payload["model"].values() if t.is_floating_point())


def test_full_disk_during_a_run_keeps_the_previous_checkpoint(tmp_path, capsys, monkeypatch):
    register_for_test(monkeypatch)
    run_dir = tmp_path / "run"
    latest = run_dir / "checkpoints/latest.pt"
    real_fsync, seen = checkpoint_module.os.fsync, dict[str, bytes]()

    def fsync_until_the_disk_is_full(fd):
        if latest.exists() and stat.S_ISREG(os.fstat(fd).st_mode):  # the second checkpoint's file
            seen.setdefault("before", latest.read_bytes())
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(checkpoint_module.os, "fsync", fsync_until_the_disk_is_full)
    assert main(["train", f"env.id={BROKEN}", *TINY_RUN, "--run-dir", str(run_dir)]) == 1
    monkeypatch.undo()
    err = capsys.readouterr().err
    second = periodic_path(latest.parent, 2)  # written before latest.pt, so latest.pt is never touched
    assert err == (
        f"error: could not write checkpoint '{second}' (No space left on device); the previous checkpoint is "
        "kept, free space or fix permissions and resume from it\n"
    )
    assert latest.read_bytes() == seen["before"] and load_checkpoint(latest)["updates"] == 1
    assert sorted(p.name for p in latest.parent.iterdir()) == [
        "latest.pt",
        periodic_path(latest.parent, 1).name,
    ]


def test_an_env_fault_mid_run_checkpoints_the_last_complete_update_which_resumes(
    tmp_path, capsys, monkeypatch
):
    """The env raises at its copy's 12th step (update 3 of 2 x 5 steps) with no periodic checkpoint due:
    the run writes update 2 (the learner exactly as a clean run has it there), names it, and resumes."""
    register_for_test(monkeypatch)
    rare = [*TINY_RUN, "log.checkpoint_every=50"]
    run_dir, clean_dir = tmp_path / "run", tmp_path / "clean"
    assert (
        main(
            [
                "train",
                f"env.id={BROKEN}",
                "env.kwargs.fault=step_raises",
                "env.kwargs.at=12",
                *rare,
                "--run-dir",
                str(run_dir),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    latest = run_dir / "checkpoints/latest.pt"
    assert (
        f"; {latest} holds the run up to update 2 (env step 20): once the env is fixed, continue with `"
        in err
    )
    assert err.endswith(f" train --resume {run_dir}`\n") and err.count("\n") == 1, err
    assert err.startswith(
        "error: env 'tests/broken_v0' (copy 0, episode step 4): step raised ZeroDivisionError"
    )
    saved = load_checkpoint(latest)
    assert (saved["updates"], saved["env_steps"], saved["collector"]) == (2, 20, {"env_steps": 20})
    assert main(["train", f"env.id={BROKEN}", *TINY_RUN, "--run-dir", str(clean_dir)]) == 0
    clean = load_checkpoint(periodic_path(clean_dir / "checkpoints", 2))
    assert saved["model"].keys() == clean["model"].keys()
    assert all(torch.equal(saved["model"][k], clean["model"][k]) for k in clean["model"])
    assert str(saved["trainer"]) == str(clean["trainer"])  # the optimizers' moments and step counts
    with pytest.warns(UserWarning, match="the run stopped on a fault in an env copy"):
        assert main(["train", "--resume", str(run_dir)]) == 0
    final = load_checkpoint(run_dir / "checkpoints/final.pt")
    assert (final["updates"], final["env_steps"]) == (4, 40)


def test_a_stop_signal_during_an_env_step_that_hangs_drops_the_update_and_not_as_the_envs_fault(
    tmp_path, capsys, monkeypatch
):
    """The drop is raised inside the env's own step (which the adapter guards with `except
    Exception`): it still stops the run as a stop, within seconds, with update 2 kept."""
    from tests.broken_envs import BrokenEnv

    register_for_test(monkeypatch)
    waited = []

    def hang_after_a_stop(self, *results):  # the env's own step, from its copy's 12th step on
        signal.raise_signal(signal.SIGINT)
        start = time.monotonic()
        try:
            while time.monotonic() - start < 60:
                time.sleep(0.01)
        finally:
            waited.append(time.monotonic() - start)

    monkeypatch.setattr(BrokenEnv, "_strike", hang_after_a_stop)
    run_dir = tmp_path / "run"
    args = [
        f"env.id={BROKEN}",
        "env.kwargs.fault=hang",
        "env.kwargs.at=12",
        *TINY_RUN,
        "log.checkpoint_every=50",
        "rollout.vector=sync",  # `auto` would time the probe copy's steps, before the run's handlers
    ]
    assert main(["train", *args, "--run-dir", str(run_dir)]) == 130
    assert len(waited) == 1 and waited[0] < 5.0
    err = capsys.readouterr().err
    assert "stopped by SIGINT at env step 20 (the update under way was dropped to stop at once;" in err
    saved = load_checkpoint(run_dir / "checkpoints/latest.pt")
    assert (saved["updates"], saved["env_steps"]) == (2, 20)
