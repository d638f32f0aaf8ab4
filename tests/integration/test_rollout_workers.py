"""Rollout workers (`rollout.vector: workers`): exactly the sync collector's data per slice, declared policy lag."""

import copy
import dataclasses
import os
import signal

import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.envs.factory import probe_layout
from marl_ppo.envs.spec import BatchedLayout
from marl_ppo.models.encoders import has_cnn
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.slice import worker_seed
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import ROOT, rollout_log_probs, within

pytestmark = pytest.mark.usefixtures("one_thread")  # workers compute with one thread: bit-identical products

SPREAD_YAML = ROOT / "experiments/mpe/simple_spread.yaml"
EARLY_LEAVER = "envs/early_leaver_v0"


def _config(tiny_overrides, *extra, env=None):
    overrides = [*tiny_overrides, "rollout.num_envs=5", "rollout.rollout_steps=7", *extra]
    if env is None:  # simple_spread, with episodes that end inside the rollouts
        return load_config(SPREAD_YAML, [*overrides, "env.kwargs.max_cycles=4"])
    return load_config(None, [*overrides, f"env.id={env}", "env.kwargs={leave_at: 2, max_steps: 5}"])


def _workers(config, num_workers, policy_lag=0):
    """Rollout workers and the team model, built the way train() builds them."""
    torch.manual_seed(0)
    config = dataclasses.replace(
        config,
        rollout=dataclasses.replace(
            config.rollout, vector="workers", num_workers=num_workers, policy_lag=policy_lag
        ),
    )
    return build_collector(plan_run(config))


def _sync_slice(config, model, envs, seed, worker, rollouts):
    """What one process collects for env copies `envs` with worker `worker`'s sampling seed."""
    sliced = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, num_envs=len(envs), vector="sync")
    )
    collector, _ = build_collector(plan_run(sliced))
    assert isinstance(collector, Collector)
    collector.model = model  # act with the workers' weights
    collector.start(seed + envs.start)
    torch.manual_seed(worker_seed(seed, worker))
    buffers, results = [], []
    for _ in range(rollouts):
        buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, len(envs))
        results.append(collector.collect(buffer))
        buffers.append(buffer)
    collector.close()
    return buffers, results


@pytest.mark.parametrize("env", [None, EARLY_LEAVER], ids=["simple_spread", "early_leaver"])
@pytest.mark.parametrize("num_workers", [1, 2])
def test_each_worker_slice_equals_a_sync_collector(tiny_overrides, env, num_workers):
    """Every tensor of two consecutive rollouts, the bootstrap values and the episode log match."""
    config = _config(tiny_overrides, env=env)
    workers, model = _workers(config, num_workers)
    try:
        workers.start(seed=3)
        got = []
        for _ in range(2):
            buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
            got.append((buffer, workers.collect(buffer)))
    finally:
        workers.close()
    slices = workers._slices
    expected = [_sync_slice(config, model, envs, 3, k, 2) for k, envs in enumerate(slices)]
    for r, (buffer, result) in enumerate(got):
        for position, tensor in enumerate(buffer.tensors()):
            pieces = [buffers[r].tensors()[position] for buffers, _ in expected]
            assert torch.equal(tensor, torch.cat(pieces, dim=1)), f"rollout {r} tensor {position}"
        assert list(result.last_values) == list(model.group_names())
        for name, values in result.last_values.items():
            pieces = [results[r].last_values[name] for _, results in expected]
            assert torch.equal(values, torch.cat(pieces)), f"rollout {r} last values of {name}"
        assert list(result.last_alive) == list(model.group_names())
        for name, alive in result.last_alive.items():
            pieces = [results[r].last_alive[name] for _, results in expected]
            assert torch.equal(alive, torch.cat(pieces)), f"rollout {r} last alive flags of {name}"
    # episodes in the order one process over all envs logs them (by step, then env), team step counts
    reference = sorted(
        (e.end_step // len(envs), k, n, e.team_return)
        for k, (envs, (_, results)) in enumerate(zip(slices, expected, strict=True))
        for n, e in enumerate(e for result in results for e in result.episodes)
    )
    episodes = [e for _, result in got for e in result.episodes]
    assert [e.team_return for e in episodes] == [ret for *_, ret in reference]
    assert [e.end_step for e in episodes] == [t * config.rollout.copies for t, *_ in reference]
    assert len(episodes) > 0
    assert workers.env_steps == 2 * config.rollout.rollout_steps * config.rollout.copies


def _logp(model, buffer):
    return rollout_log_probs(model, buffer, "agent")


@pytest.mark.parametrize("policy_lag", [0, 1])
def test_policy_lag_decides_which_weights_act(tiny_overrides, policy_lag):
    """With lag 1 the rollout after an update was collected by the pre-update weights; lag 0 by the new ones."""
    config = _config(tiny_overrides, "rollout.vector=workers", f"rollout.policy_lag={policy_lag}")
    workers, model = _workers(config, 2, policy_lag)
    before = copy.deepcopy(model)
    try:
        workers.start(seed=0)
        buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
        workers.collect(buffer)
        with torch.no_grad():  # "the update"
            for parameter in model.actors.parameters():
                parameter.add_(0.5 * torch.randn_like(parameter))
        workers.collect(buffer)
    finally:
        workers.close()
    acting, other = (before, model) if policy_lag else (model, before)
    stored = buffer.groups["agent"].logp
    with torch.no_grad():
        torch.testing.assert_close(_logp(acting, buffer), stored, rtol=0, atol=1e-5)
        assert (_logp(other, buffer) - stored).abs().max() > 1e-2


def test_training_with_workers_is_deterministic(tiny_overrides, tmp_path):
    config = _config(tiny_overrides, "rollout.vector=workers", "rollout.policy_lag=1", "total_steps=140")
    weights = []
    for run in ("a", "b"):
        train(config, tmp_path / run)
        weights.append(torch.load(tmp_path / run / "checkpoints/final.pt", weights_only=True)["model"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_lagged_workers_collect_no_rollout_past_the_last_update(tiny_overrides, tmp_path):
    """The last update's rollout launches none after it: a finished run stepped exactly total_steps."""
    config = _config(
        tiny_overrides,
        "rollout.vector=workers",
        "rollout.num_workers=2",
        "rollout.policy_lag=1",
        "total_steps=140",
    )
    train(config, tmp_path)
    state = torch.load(tmp_path / "checkpoints/final.pt", weights_only=True)["collector"]
    assert state["pending"] is None
    assert state["env_steps"] == sum(w["collector"]["env_steps"] for w in state["workers"]) == 140


def test_a_pending_rollout_keeps_its_last_alive_flags(tiny_overrides):
    """A rollout in flight is saved with the alive flags after its last step and handed back with them."""
    config = _config(tiny_overrides, env=EARLY_LEAVER)
    workers, model = _workers(config, 2, policy_lag=1)
    try:
        workers.start(seed=0)
        buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
        workers.collect(buffer)  # launches the next rollout
        state = workers.state_dict()
        saved = {name: alive.clone() for name, alive in state["pending"]["last_alive"].items()}
        assert not saved["agent"].all(), "the leaver is gone after the rollout's last step"
        workers.load_state_dict(state)
        result = workers.collect(buffer, ahead=False)
        for name, alive in result.last_alive.items():
            assert torch.equal(alive, saved[name])
    finally:
        workers.close()


def test_policy_lag_is_zero_without_rollout_workers(tiny_overrides):
    from marl_ppo.envs.factory import resolve_vector

    for vector in ("sync", "subprocess"):
        config = load_config(
            SPREAD_YAML, [*tiny_overrides, f"rollout.vector={vector}", "rollout.policy_lag=1"]
        )
        assert resolve_vector(config, batched=False, step_seconds=_untimed).rollout.policy_lag == 0
    config = load_config(SPREAD_YAML, [*tiny_overrides, "rollout.vector=workers", "rollout.policy_lag=1"])
    assert resolve_vector(config, batched=False, step_seconds=_untimed).rollout.policy_lag == 1


def _untimed() -> float:
    raise AssertionError("an explicit vector mode needs no step timing")


def test_a_killed_worker_stops_the_run_with_a_clear_error(tiny_overrides):
    config = _config(tiny_overrides, "rollout.rollout_steps=2000")
    workers, model = _workers(config, 2)
    workers.start(seed=0)
    victim = workers._processes[1]
    buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
    workers._launch()
    os.kill(victim.pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"worker 1 .* died during 'collect' \(exit code -9\)"):
        within(120, lambda: workers.collect(buffer))  # noticed by its death, not the per-step limit
    assert not any(p.is_alive() for p in workers._processes)


@pytest.mark.parametrize(
    ("cores", "num_envs", "step_s", "expected"),
    [
        (2, 32, 300e-6, "workers"),  # simple_spread-like cost
        (2, 32, 10e-6, "sync"),  # a toy env: bookkeeping would dominate
        (1, 32, 300e-6, "sync"),  # nothing to overlap on one core
        (2, 3, 300e-6, "sync"),  # too few copies to split
        (2, 2, 30e-3, "workers"),  # a pistonball-like step: one copy per worker pays
        (1, 2, 30e-3, "sync"),
    ],
)
def test_auto_vector_picks_by_cores_copies_and_step_cost(
    tiny_overrides, monkeypatch, cores, num_envs, step_s, expected
):
    import marl_ppo.envs.factory as factory

    monkeypatch.setattr(factory, "usable_cores", lambda: cores)
    config = load_config(
        SPREAD_YAML,
        [*tiny_overrides, "rollout.vector=auto", f"rollout.num_envs={num_envs}", "rollout.policy_lag=1"],
    )
    resolved = factory.resolve_vector(config, batched=False, step_seconds=lambda: step_s)
    assert resolved.rollout.vector == expected
    assert resolved.rollout.policy_lag == (1 if expected == "workers" else 0)
    if expected == "workers":  # two workers, whether the copies are split in halves or one each
        assert resolved.rollout.num_workers == 2


def test_auto_vector_probe_tells_a_toy_env_from_simple_spread(tiny_overrides):
    from marl_ppo.envs.factory import make_team_env, probe_step_seconds, team_spec

    def step_seconds(config):
        probe = make_team_env(config)
        try:
            return probe_step_seconds(config, probe, team_spec(config, probe))
        finally:
            probe.close()

    spread = step_seconds(load_config(SPREAD_YAML, tiny_overrides))
    toy = step_seconds(load_config(None, [*tiny_overrides, "env.id=envs/matrix_game_v0"]))
    # A ratio within one process, not a wall-clock bound: a loaded machine slows both probes alike
    # (about 10x apart on an idle one), while the fixed threshold is tested with a patched probe above.
    assert spread > 3 * toy


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["rollout.vector=sync"], 1),
        (["rollout.vector=workers", "rollout.num_workers=2"], 1),
        (["env.id=vmas/navigation", "env.kwargs={}", "rollout.vector=workers"], 2),  # batched: big tensors
        (["rollout.vector=workers", "host.torch_threads=3"], 3),
    ],
)
def test_learner_threads_are_one_except_for_batched_simulators(
    tiny_overrides, monkeypatch, overrides, expected
):
    import marl_ppo.plan.host as host

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    config = load_config(SPREAD_YAML, [*tiny_overrides, *overrides])
    assert host.learner_threads(config, probe_layout(config)) == expected


@pytest.mark.parametrize(("encoder", "expected"), [("cnn", 2), ("mlp", 1)])
def test_a_cnn_learner_gets_every_core(monkeypatch, encoder, expected):
    """Convolutions over many frames per minibatch use the cores the env copies leave idle while a
    synchronous run learns; the same image env through an MLP stays on one thread."""
    import marl_ppo.plan.host as host
    from marl_ppo.run.build import build_collector

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    config = load_config(
        None,
        [
            "env.id=envs/pixel_signal_v0",
            "rollout.vector=sync",
            "rollout.num_envs=2",
            f"model.encoder={encoder}",
        ],
    )
    _, model = build_collector(plan_run(config))
    layout = probe_layout(config)
    assert host.learner_threads(config, layout) == 1
    assert host.learner_threads(config, layout, convolutional=has_cnn(model)) == expected


@pytest.mark.parametrize(
    ("overrides", "cores", "expected"),
    [
        (
            ["rollout.vector=subprocess", "rollout.num_workers=2"],
            2,
            1,
        ),  # two env workers on two cores: one thread
        (["rollout.vector=workers", "rollout.num_workers=2"], 2, 1),
        (["rollout.vector=workers", "rollout.num_workers=2"], 8, 6),
        (["rollout.vector=subprocess", "rollout.num_workers=4"], 2, 1),
        (["rollout.vector=sync"], 2, 2),
    ],
)
def test_a_cnn_learner_leaves_the_cores_its_workers_use(monkeypatch, overrides, cores, expected):
    """torch_threads: auto never oversubscribes the cores with the run's own processes: acting leaves
    the workers theirs, an update without policy lag (the workers idle) takes them all."""
    import marl_ppo.plan.host as host
    from marl_ppo.plan.settle import plan_run

    monkeypatch.setattr(host, "usable_cores", lambda: cores)
    written = ["env.id=envs/pixel_signal_v0", "rollout.num_envs=4", "model.encoder=cnn", *overrides]
    plan = plan_run(load_config(None, written))
    assert plan.convolutional and plan.threads == expected
    # the workers wait for the next rollout while the learner updates: it takes every core then
    assert plan.update_threads == cores
    lagged = plan_run(load_config(None, [*written, "rollout.policy_lag=1"]))
    # rollout workers collect the next rollout meanwhile; env workers cannot (the lag is settled to 0)
    assert lagged.update_threads == (lagged.threads if lagged.config.rollout.policy_lag else cores)


def test_a_cnn_run_updates_on_every_core_and_acts_on_the_cores_its_workers_leave(
    tiny_overrides, monkeypatch, tmp_path
):
    """The thread count switches around each update, and back before the next rollout."""
    import marl_ppo.plan.host as host
    from marl_ppo.algo.trainer import Trainer

    monkeypatch.setattr(host, "usable_cores", lambda: 2)
    seen: list[tuple[str, int]] = []
    update = Trainer.update

    def counting_update(self, *args, **kwargs):
        seen.append(("update", torch.get_num_threads()))
        return update(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "update", counting_update)
    config = load_config(
        None,
        [
            *tiny_overrides,
            "env.id=envs/pixel_signal_v0",
            "model.encoder=cnn",
            "rollout.vector=subprocess",
            "rollout.num_workers=2",
            "total_steps=150",
        ],
    )
    before = torch.get_num_threads()
    try:
        train(config, tmp_path, on_update=lambda _: seen.append(("after", torch.get_num_threads())))
    finally:
        torch.set_num_threads(before)
    assert seen == [("update", 2), ("after", 1)] * 3


def test_acting_that_dwarfs_the_env_steps_with_several_threads_gets_one_line_naming_the_key():
    from marl_ppo.plan.host import acting_hint

    sync = load_config(None, ["rollout.vector=sync"])
    layout = probe_layout(sync)
    line = acting_hint(sync, layout, threads=2, act_s=24.5, env_s=1.2)
    assert (
        line is not None
        and "host.torch_threads=1" in line
        and "24.50 s per update" in line
        and "\n" not in line
    )
    assert acting_hint(sync, layout, threads=1, act_s=24.5, env_s=1.2) is None  # one thread already
    assert (
        acting_hint(sync, layout, threads=2, act_s=2.0, env_s=1.2) is None
    )  # the env steps take their share
    workers = load_config(None, ["rollout.vector=workers"])
    assert (
        acting_hint(workers, layout, threads=2, act_s=24.5, env_s=1.2) is None
    )  # workers act, one thread each
    # a batched simulator acts in this process whatever `vector` says
    assert acting_hint(workers, BatchedLayout(), threads=2, act_s=24.5, env_s=1.2) is not None


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["rollout.vector=sync"], 8),  # a CNN learner on every core
        (["rollout.vector=sync", "model.encoder=mlp"], 1),
        (
            ["rollout.vector=subprocess", "rollout.num_workers=3"],
            8,
        ),  # its workers wait while a CNN learner updates
        (
            ["rollout.vector=subprocess", "rollout.num_workers=3", "rollout.policy_lag=1"],
            5,
        ),  # they collect while it updates
        (["rollout.vector=subprocess", "rollout.num_workers=3", "model.encoder=mlp"], 3),
        (["rollout.vector=sync", "host.torch_threads=2"], 2),
        (["rollout.vector=ray"], 1),  # Ray workers reserve their own CPUs
    ],
)
def test_a_run_keeps_busy_its_workers_or_its_learner_threads_whichever_are_more(
    monkeypatch, overrides, expected
):
    """What a sweep divides the cores by: an image env's CNN learner counts every core, before any
    model is built."""
    import marl_ppo.plan.host as host

    monkeypatch.setattr(host, "usable_cores", lambda: 8)
    config = load_config(None, ["env.id=envs/pixel_signal_v0", "rollout.num_envs=2", *overrides])
    assert host.run_cores(config) == expected


def test_a_command_between_rollouts_keeps_the_rollout_in_flight(tiny_overrides):
    """With policy lag, asking the workers anything (here their env states) must not drop the next rollout."""
    config = _config(tiny_overrides)
    rollouts = []
    for ask_between in (False, True):
        workers, model = _workers(config, 2, policy_lag=1)
        try:
            workers.start(seed=0)
            buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
            workers.collect(buffer)  # launches the next rollout
            if ask_between:
                assert len(workers.env_states()) == config.rollout.copies
            workers.collect(buffer)
            rollouts.append([t.clone() for t in buffer.tensors()])
        finally:
            workers.close()
    assert workers.env_steps == 2 * config.rollout.rollout_steps * config.rollout.copies
    assert all(torch.equal(a, b) for a, b in zip(*rollouts, strict=True))
