"""Resume is exact: 2K updates straight equal K updates, a crash, and K more from the checkpoint."""

import signal
import threading
import time
import warnings

import pytest
import torch

import marl_ppo
from marl_ppo.algo.schedule import LrSchedule
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.envs.registry import make_env
from marl_ppo.run.loop import train
from marl_ppo.run.resume import NotExactResumeWarning
from marl_ppo.run.signals import Interrupted
from tests.helpers import (
    ROOT,
    K,
    Killed,
    assert_identical,
    assert_same_run_state,
    crash_at_update,
    run_state_only,
    scalars,
)

STEPS_PER_UPDATE = 20  # 2 env copies x 10 steps: 25-step episodes end mid-rollout and span checkpoints


def _config(tiny_overrides, *extra):
    return load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",  # linear lr decay, value normalization
        [
            *tiny_overrides,
            "rollout.rollout_steps=10",
            f"total_steps={2 * K * STEPS_PER_UPDATE}",
            f"log.checkpoint_every={K}",
            *extra,
        ],
    )


HAPPO = (
    "ppo.actor_update=sequential",
    "model.share_actor=false",
)  # the order's generator is in the checkpoint


@pytest.mark.parametrize(
    ("vector", "resumed_vector", "lag", "algo"),
    [
        ("sync", "sync", 0, ()),
        ("subprocess", "subprocess", 0, ()),
        ("subprocess", "sync", 0, ()),
        ("workers", "workers", 0, ()),
        ("workers", "workers", 1, ()),  # a rollout is in flight at every checkpoint
        ("sync", "sync", 0, HAPPO),
        ("workers", "workers", 1, HAPPO),
    ],
)
def test_killed_and_resumed_run_equals_the_uninterrupted_one(
    tiny_overrides, tmp_path, monkeypatch, vector, resumed_vector, lag, algo
):
    config = _config(
        tiny_overrides,
        f"rollout.vector={vector}",
        "rollout.num_workers=2",
        f"rollout.policy_lag={lag}",
        *algo,
    )
    straight = train(config, tmp_path / "straight")

    crash_at_update(monkeypatch, K + 2)  # update K+1 was logged after the checkpoint at K: must be purged
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "resumed/checkpoints/latest.pt")["updates"] == K
    resumed_config = _config(
        tiny_overrides,
        f"rollout.vector={resumed_vector}",
        "rollout.num_workers=2",
        f"rollout.policy_lag={lag}",
        *algo,
    )
    resumed = train(resumed_config, tmp_path / "resumed", resume=True)  # env states are per env copy

    assert (resumed.updates, resumed.env_steps, resumed.episodes) == (2 * K, 120, 4)
    assert resumed.team_return_mean == straight.team_return_mean
    assert_same_run_state(
        tmp_path / "straight/checkpoints/final.pt", tmp_path / "resumed/checkpoints/final.pt"
    )
    logged, expected = scalars(tmp_path / "resumed"), scalars(tmp_path / "straight")
    assert logged.keys() == expected.keys()
    for tag, points in expected.items():
        assert logged[tag] == points, tag  # same steps, same values, nothing twice
    assert [step for step, _ in logged["train/loss_pi"]] == [20, 40, 60, 80, 100, 120]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_mid_update_finishes_it_and_checkpoints(tiny_overrides, tmp_path, monkeypatch, signum):
    config = _config(tiny_overrides, "rollout.vector=sync", "log.checkpoint_every=100")
    real, calls = Trainer.update, []
    # what the run must restore: SIG_DFL and Python's default_int_handler, or SIG_IGN for SIGINT
    # where the tests were started in the background
    handlers_before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)

    def update(self, batches, **options):
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signum)  # arrives in the middle of the second update
        return real(self, batches, **options)

    monkeypatch.setattr(Trainer, "update", update)
    with pytest.raises(Interrupted) as stopped:
        train(config, tmp_path / "run")
    assert stopped.value.exit_status == 128 + signum  # 143 for SIGTERM, 130 for Ctrl-C
    assert "--resume" in str(stopped.value)
    handlers_after = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert handlers_after == handlers_before  # the run's handlers are gone after it
    saved = load_checkpoint(tmp_path / "run/checkpoints/latest.pt")
    assert (saved["updates"], saved["env_steps"]) == (2, 40)  # the interrupted update was completed
    assert not (tmp_path / "run/summary.json").exists()

    monkeypatch.undo()
    train(config, tmp_path / "run", resume=True)
    train(config, tmp_path / "straight")
    assert_same_run_state(tmp_path / "straight/checkpoints/final.pt", tmp_path / "run/checkpoints/final.pt")


def test_keep_last_prunes_older_periodic_checkpoints(tiny_overrides, tmp_path):
    config = _config(tiny_overrides, "rollout.vector=sync", "log.checkpoint_every=1", "log.keep_last=2")
    train(config, tmp_path)
    names = sorted(path.name for path in (tmp_path / "checkpoints").iterdir())
    assert names == ["final.pt", "latest.pt", "update_00000005.pt", "update_00000006.pt"]
    assert load_checkpoint(tmp_path / "checkpoints/update_00000005.pt")["updates"] == 5
    assert load_checkpoint(tmp_path / "checkpoints/latest.pt")["updates"] == 6


def test_library_resume_checks_the_config_and_keep_last_is_validated(tiny_overrides, tmp_path):
    config = _config(tiny_overrides, "rollout.vector=sync", "total_steps=40")
    train(config, tmp_path)
    changed = _config(tiny_overrides, "rollout.vector=sync", "total_steps=80", "ppo.clip_ratio=0.3")
    with pytest.raises(ConfigError, match=r"config key 'ppo.clip_ratio' is 0.3 but the run .* used 0.2"):
        train(changed, tmp_path, resume=True)
    with pytest.raises(ConfigError, match=r"already finished \(env step 40 of total_steps=40\)"):
        train(config, tmp_path, resume=True)
    with pytest.raises(ConfigError, match=r"config key 'log.keep_last': input should be greater than 0"):
        _config(tiny_overrides, "log.keep_last=0")


@pytest.mark.parametrize("new_total", [200, 400], ids=["shortened", "extended"])
def test_changing_total_steps_on_resume_keeps_the_learning_rate_continuous(
    tiny_overrides, tmp_path, monkeypatch, new_total
):
    config = _config(tiny_overrides, "rollout.vector=sync", "total_steps=240")  # linear decay over 12 updates
    base, stop = config.ppo.pi_lr, K * STEPS_PER_UPDATE
    crash_at_update(monkeypatch, K + 1)
    with pytest.raises(Killed):
        train(config, tmp_path)
    monkeypatch.undo()
    before = scalars(tmp_path)["train/pi_lr"]
    assert [step for step, _ in before] == [20, 40, 60]
    step_down = base * STEPS_PER_UPDATE / 240

    train(_config(tiny_overrides, "rollout.vector=sync", f"total_steps={new_total}"), tmp_path, resume=True)
    after = scalars(tmp_path)["train/pi_lr"][K:]
    assert [step for step, _ in after] == list(
        range(stop + STEPS_PER_UPDATE, new_total + 1, STEPS_PER_UPDATE)
    )
    first = after[0][1]
    assert first == pytest.approx(
        base * (1 - stop / 240), rel=1e-6
    )  # where the stopped run would have gone on
    assert 0 < before[-1][1] - first <= step_down * (1 + 1e-6)
    for step, lr in after:  # then a straight line to zero at the new total
        started = step - STEPS_PER_UPDATE
        assert lr == pytest.approx(first * (new_total - started) / (new_total - stop), rel=1e-6)
    assert after[-1][1] == pytest.approx(first * STEPS_PER_UPDATE / (new_total - stop), rel=1e-6)


def test_the_lr_schedule_is_todays_on_a_straight_run_and_respread_on_a_changed_total():
    straight = LrSchedule("linear", 240)
    steps = range(0, 260, 20)
    assert [straight.scale(s) for s in steps] == [max(0.0, 1.0 - s / 240) for s in steps]  # the same floats
    assert straight.resumed(240, 60) is straight  # an unchanged total resumes exactly
    shorter = straight.resumed(200, 60)
    assert shorter.scale(60) == straight.scale(60) and shorter.scale(200) == 0.0
    assert shorter.scale(130) == pytest.approx(0.75 / 2)
    again = LrSchedule(**shorter.state_dict()).resumed(
        300, 120
    )  # a second resume goes on from the first's line
    assert again.scale(120) == shorter.scale(120) and again.scale(300) == 0.0
    assert LrSchedule("constant", 240).resumed(100, 60).scale(80) == 1.0
    assert LrSchedule.from_checkpoint({"lr_schedule": shorter.state_dict()}) == shorter


def _unpicklable_spread(**kwargs):
    env = make_env("mpe2/simple_spread_v3", **kwargs)
    env.lock = threading.Lock()  # a lock cannot be pickled, so neither can the env
    return env


@pytest.mark.parametrize("vector", ["sync", "subprocess", "workers"])
def test_unpicklable_env_resumes_with_fresh_episodes_and_a_warning(
    tiny_overrides, tmp_path, monkeypatch, vector
):
    marl_ppo.register_env("tests/unpicklable_spread_v0", _unpicklable_spread)
    config = _config(tiny_overrides, f"rollout.vector={vector}", "env.id=tests/unpicklable_spread_v0")
    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path)
    monkeypatch.undo()
    saved = load_checkpoint(tmp_path / "checkpoints/latest.pt")
    assert "cannot pickle '_thread.lock'" in saved["envs"]["unavailable"]

    with pytest.warns(NotExactResumeWarning, match="resume is not exact"):
        result = train(config, tmp_path, resume=True)
    assert (result.updates, result.env_steps) == (2 * K, 120)
    # the resets at the resume (env step 60) start 25-step episodes that end at env step 60 + 2 * 25
    lengths = scalars(tmp_path)["rollout/episode_length"]
    assert lengths == [(50, 25.0), (50, 25.0), (110, 25.0), (110, 25.0)]
    steps = [step for step, _ in scalars(tmp_path)["train/loss_pi"]]
    assert steps == [20, 40, 60, 80, 100, 120]


@pytest.mark.parametrize(("vector", "resumed_vector"), [("workers", "sync"), ("sync", "workers")])
def test_resuming_across_rollout_workers_is_refused_with_one_line(
    tiny_overrides, tmp_path, vector, resumed_vector
):
    train(_config(tiny_overrides, f"rollout.vector={vector}", "total_steps=40"), tmp_path)
    extended = _config(tiny_overrides, f"rollout.vector={resumed_vector}", "total_steps=80")
    with pytest.raises(
        ConfigError,
        match=f"used rollout.vector={vector} and cannot continue with rollout.vector={resumed_vector}",
    ):
        train(extended, tmp_path, resume=True)


def test_killed_and_resumed_vmas_run_equals_the_uninterrupted_one(tiny_overrides, tmp_path, monkeypatch):
    """A VMAS scenario does not pickle; its per-copy tensors are saved instead and the resume is
    exact (balance: the package falls at different steps, so finished copies come from the spare)."""
    pytest.importorskip("vmas")
    config = load_config(
        None,
        [
            *tiny_overrides,
            "env.id=vmas/balance",
            "env.kwargs={max_steps: 30}",
            "rollout.num_envs=8",
            "rollout.rollout_steps=10",
            f"total_steps={2 * K * 80}",
            f"log.checkpoint_every={K}",
        ],
    )
    straight = train(config, tmp_path / "straight")
    assert straight.episodes > 8  # copies ended at different steps

    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NotExactResumeWarning)
        resumed = train(config, tmp_path / "resumed", resume=True)

    assert (resumed.updates, resumed.env_steps, resumed.episodes) == (2 * K, 2 * K * 80, straight.episodes)
    a = load_checkpoint(tmp_path / "straight/checkpoints/final.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoints/final.pt")
    assert_identical(run_state_only(a), run_state_only(b))
    assert scalars(tmp_path / "resumed") == scalars(tmp_path / "straight")


def test_a_checkpoint_of_another_format_is_refused_with_one_line(tiny_overrides, tmp_path):
    """The format is versioned: a checkpoint written in another layout is never read field by field."""
    train(_config(tiny_overrides, "rollout.vector=sync", "total_steps=40"), tmp_path)
    latest = tmp_path / "checkpoints/latest.pt"
    payload = load_checkpoint(latest)
    assert payload["format"] == "marl_ppo.checkpoint.v2"
    save_checkpoint(latest, {**payload, "format": "marl_ppo.checkpoint.v1"})
    with pytest.raises(CheckpointError) as info:
        train(_config(tiny_overrides, "rollout.vector=sync", "total_steps=80"), tmp_path, resume=True)
    assert str(info.value) == (
        f"checkpoint '{latest}' has format 'marl_ppo.checkpoint.v1' but this marl_ppo reads only "
        "'marl_ppo.checkpoint.v2'; train the run again, or use the marl_ppo version that wrote it"
    )


def _slow_in_call(real, at, seconds_waited, signum=signal.SIGINT):
    """`real` that, on its `at`-th call, receives a stop signal and then works in Python for 60 s."""
    calls = []

    def slow(self, *args, **options):
        calls.append(1)
        if len(calls) == at:
            signal.raise_signal(signum)
            start = time.monotonic()
            try:
                while time.monotonic() - start < 60:  # a long rollout or update, in small steps
                    time.sleep(0.01)
            finally:
                seconds_waited.append(time.monotonic() - start)
        return real(self, *args, **options)

    return slow


@pytest.mark.parametrize("where", ["update", "rollout"])
def test_a_stop_signal_that_a_long_update_outlasts_drops_it_within_seconds(
    tiny_overrides, tmp_path, monkeypatch, where
):
    """Ctrl-C in the third update, which would take a minute: answered within 5 s, with a checkpoint
    of update 2 whose weights and optimizers equal a run stopped there; it resumes to the end."""
    from marl_ppo.rollout.collector import Collector

    config = _config(tiny_overrides, "rollout.vector=sync", "log.checkpoint_every=100")
    waited: list[float] = []
    owner, name = (Trainer, "update") if where == "update" else (Collector, "collect")
    monkeypatch.setattr(owner, name, _slow_in_call(getattr(owner, name), 3, waited))
    with pytest.raises(Interrupted) as stopped:
        train(config, tmp_path / "run")
    assert len(waited) == 1 and waited[0] < 5.0, waited  # GRACE_S (2 s) and the next Python step
    assert str(stopped.value) == (
        f"stopped by SIGINT at env step {2 * STEPS_PER_UPDATE} (the update under way was dropped to stop at once; on resume the "
        f"env copies start fresh episodes), checkpoint {tmp_path / 'run/checkpoints/latest.pt'}; continue with: "
        f"marl-ppo train --resume {tmp_path / 'run'}"
    )
    saved = load_checkpoint(tmp_path / "run/checkpoints/latest.pt")
    assert (saved["updates"], saved["env_steps"]) == (2, 2 * STEPS_PER_UPDATE)
    monkeypatch.undo()
    straight_config = _config(
        tiny_overrides, "rollout.vector=sync", "log.checkpoint_every=1", "log.keep_last=100"
    )
    train(straight_config, tmp_path / "straight")
    straight = load_checkpoint(tmp_path / "straight/checkpoints/update_00000002.pt")
    assert all(torch.equal(saved["model"][k], straight["model"][k]) for k in straight["model"])
    assert str(saved["trainer"]) == str(straight["trainer"])
    with pytest.warns(NotExactResumeWarning, match="the update under way was dropped to stop at once"):
        train(config, tmp_path / "run", resume=True)
    assert load_checkpoint(tmp_path / "run/checkpoints/final.pt")["env_steps"] == config.total_steps


def test_a_linear_entropy_schedule_follows_its_line_and_resumes_exactly(
    tiny_overrides, tmp_path, monkeypatch
):
    schedule = ("ppo.entropy_schedule=linear", "ppo.entropy_coef=0.1", "ppo.entropy_final=0.02")
    config = _config(tiny_overrides, *schedule)
    weights: list[float] = []
    set_coef = Trainer.set_entropy_coef

    def recorded(self, coef):
        weights.append(coef)
        set_coef(self, coef)

    monkeypatch.setattr(Trainer, "set_entropy_coef", recorded)
    straight = train(config, tmp_path / "straight")
    total = 2 * K * STEPS_PER_UPDATE
    expected = [0.02 + 0.08 * (1 - STEPS_PER_UPDATE * u / total) for u in range(2 * K)]
    assert weights == pytest.approx(expected, abs=1e-12)
    monkeypatch.undo()

    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "resumed/checkpoints/latest.pt")["entropy_schedule"]["kind"] == "linear"
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert resumed.team_return_mean == straight.team_return_mean
    assert_same_run_state(
        tmp_path / "straight/checkpoints/final.pt", tmp_path / "resumed/checkpoints/final.pt"
    )
