"""`rollout.vector: ray` on Ray's own two-node test cluster (a head and a worker node, one CPU each).

The cluster starts once for the module; tests that remove the worker node add it back.
"""

import dataclasses
import json
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl_ppo.checkpoint import load_checkpoint, periodic_path
from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import ROOT, rollout_log_probs

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # workers compute with one thread: bit-identical products

SPREAD_YAML = ROOT / "experiments/mpe/simple_spread.yaml"
FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}
"""The head notices a removed node within about a second (Ray's default: about 15 s)."""


class TwoNodes:
    """A head node and a worker node, one CPU each; the worker node can be removed and added back."""

    def __init__(self) -> None:
        self.cluster = Cluster(
            initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_NODE_DEATH}
        )
        self.worker = self.cluster.add_node(num_cpus=1)
        ray.init(address=self.cluster.address, logging_level="warning")

    def remove_worker(self) -> None:
        self.cluster.remove_node(self.worker, allow_graceful=False)
        self.worker = None

    def restore_worker(self) -> None:
        if self.worker is None:
            self.worker = self.cluster.add_node(num_cpus=1)
            self.cluster.wait_for_nodes()

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()


@pytest.fixture(scope="module")
def nodes():
    cluster = TwoNodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture
def two_nodes(nodes):
    """The cluster with both nodes up, before and after the test."""
    nodes.restore_worker()
    yield nodes
    nodes.restore_worker()


def _config(tiny_overrides, *extra):
    overrides = [
        *tiny_overrides,
        "rollout.num_envs=5",
        "rollout.rollout_steps=7",
        "env.kwargs.max_cycles=4",
        *extra,
    ]
    return load_config(SPREAD_YAML, overrides)


def _scalars(run_dir, tag):
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_one_ray_worker_collects_and_trains_exactly_as_one_local_worker(two_nodes, tiny_overrides, tmp_path):
    config = _config(tiny_overrides, "rollout.num_workers=1", "rollout.policy_lag=0", "total_steps=105")
    rollouts: dict[str, list[Any]] = {}
    for vector in ("workers", "ray"):
        torch.manual_seed(0)
        source, model = build_collector(
            plan_run(dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=vector)))
        )
        try:
            source.start(seed=3)
            rollouts[vector] = []
            for _ in range(2):
                buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
                result = source.collect(buffer)
                rollouts[vector].append((buffer, result))
        finally:
            source.close()
    for (local, local_result), (remote, remote_result) in zip(
        rollouts["workers"], rollouts["ray"], strict=True
    ):
        assert len(local.tensors()) == len(remote.tensors())
        assert all(torch.equal(a, b) for a, b in zip(local.tensors(), remote.tensors(), strict=True))
        assert all(
            torch.equal(local_result.last_values[g], remote_result.last_values[g])
            for g in model.group_names()
        )
        assert [e.team_return for e in local_result.episodes] == [
            e.team_return for e in remote_result.episodes
        ]
        assert [e.end_step for e in local_result.episodes] == [e.end_step for e in remote_result.episodes]
        assert remote_result.env_steps == 7 * 5
        assert remote_result.perf == {"perf/ray_live_workers": 1.0, "perf/ray_worker_rejoins": 0.0}
    assert sum(len(result.episodes) for _, result in rollouts["ray"]) == 15  # 5 copies x ends at 4, 8, 12

    final = {}
    for vector in ("workers", "ray"):
        train(
            dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=vector)),
            tmp_path / vector,
        )
        final[vector] = load_checkpoint(tmp_path / vector / "checkpoints/final.pt")
    assert final["ray"]["env_steps"] == final["workers"]["env_steps"] == 105
    weights = final["workers"]["model"]
    assert weights.keys() == final["ray"]["model"].keys()
    assert all(torch.equal(weights[k], final["ray"]["model"][k]) for k in weights)
    assert _scalars(tmp_path / "ray", "perf/ray_live_workers") == [(35, 1.0), (70, 1.0), (105, 1.0)]


def test_a_recurrent_policy_trains_on_one_ray_worker_exactly_as_on_one_local_worker(
    two_nodes, tiny_overrides, tmp_path
):
    # the actors' rollouts carry the stored recurrent states and is_first flags beside the steps
    config = _config(
        tiny_overrides,
        "rollout.num_workers=1",
        "rollout.policy_lag=1",
        "total_steps=105",
        "model.recurrent=gru",
    )
    final = {}
    for vector in ("workers", "ray"):
        train(
            dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=vector)),
            tmp_path / vector,
        )
        final[vector] = load_checkpoint(tmp_path / vector / "checkpoints/final.pt")
    weights = final["workers"]["model"]
    assert any(k.endswith("core.weight_hh") for k in weights)
    assert weights.keys() == final["ray"]["model"].keys()
    assert all(torch.equal(weights[k], final["ray"]["model"][k]) for k in weights)


def test_losing_the_worker_node_leaves_the_run_going_on_the_other(
    two_nodes, tiny_overrides, tmp_path, capsys
):
    """Two workers, one per node: after the worker node goes, each update counts one worker's env copies."""
    config = _config(
        tiny_overrides,
        "rollout.num_envs=2",
        "rollout.vector=ray",
        "rollout.num_workers=2",
        "ray.placement=spread",
        "ray.min_workers=1",
        "total_steps=98",  # 4 updates of 14 steps with both workers, then 6 of 7 steps with one
    )

    def lose_the_node(updates):
        if updates == 4:
            two_nodes.remove_worker()

    result = train(config, tmp_path, on_update=lose_the_node)
    assert result.env_steps == 98
    logged = _scalars(tmp_path, "perf/ray_live_workers")
    live = [value for _, value in logged]
    # the node's actor may still finish the rollout under way as its node goes down
    assert live[:4] == [2.0] * 4 and live.count(1.0) >= 3 and live == sorted(live, reverse=True)
    steps = [0] + [step for step, _ in logged]
    assert [b - a for a, b in zip(steps, steps[1:], strict=False)] == [
        7 * value for value in live
    ]  # 1 env copy each
    assert "Ray rollout worker" in capsys.readouterr().err  # the loss is said as it happens
    saved = load_checkpoint(tmp_path / "checkpoints/final.pt")
    assert saved["envs"]["unavailable"].startswith("Ray rollout worker(s)")


def _when_written(path, then, done):
    """Call `then()` once `path` exists, unless `done` is set first."""
    while not path.exists():
        if done.wait(0.2):
            return
    then()


@pytest.mark.slow  # minutes on a two-core machine: `make test-slow`
def test_below_min_workers_the_run_checkpoints_stops_and_resumes_on_the_mended_cluster(
    two_nodes, tiny_overrides, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    args = ["train", str(SPREAD_YAML), *tiny_overrides, "rollout.num_envs=2", "rollout.rollout_steps=7"]
    args += ["rollout.vector=ray", "rollout.num_workers=2", "ray.placement=spread", "ray.min_workers=2"]
    args += ["total_steps=2800", "log.checkpoint_every=1", "--run-dir", str(run_dir)]
    done = threading.Event()
    remover = threading.Thread(
        target=_when_written, args=(periodic_path(run_dir / "checkpoints", 3), two_nodes.remove_worker, done)
    )
    remover.start()
    try:
        status = main(args)
    finally:
        done.set()
        remover.join()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert status == 1
    assert len(errors) == 1
    assert "only 1 of 2 Ray rollout workers answered, fewer than ray.min_workers=2" in errors[0]
    assert f"--resume {run_dir}" in errors[0]
    stopped = load_checkpoint(run_dir / "checkpoints/latest.pt")
    assert stopped["updates"] >= 3 and stopped["env_steps"] == 14 * stopped["updates"]
    assert stopped["env_steps"] < 2800

    two_nodes.restore_worker()
    total = stopped["env_steps"] + 28
    assert main(["train", "--resume", str(run_dir), f"total_steps={total}"]) == 0
    finished = load_checkpoint(run_dir / "checkpoints/final.pt")
    assert finished["env_steps"] == total and finished["updates"] == stopped["updates"] + 2
    assert [value for _, value in _scalars(run_dir, "perf/ray_live_workers")][-2:] == [2.0, 2.0]


def test_too_few_cpus_on_the_cluster_is_a_config_error_naming_the_numbers(
    two_nodes, tiny_overrides, tmp_path, capsys
):
    args = [
        "train",
        str(SPREAD_YAML),
        *tiny_overrides,
        "rollout.vector=ray",
        "rollout.num_workers=2",
        "rollout.worker_timeout_s=3",
    ]
    args += ["ray.num_cpus_per_worker=2", "--run-dir", str(tmp_path / "run")]
    assert main(args) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "fewer than rollout.num_workers=2 x ray.num_cpus_per_worker=2" in error
    assert not (tmp_path / "run").exists()


def test_without_ray_installed_vector_ray_names_the_install(tiny_overrides, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    args = [
        "train",
        str(SPREAD_YAML),
        *tiny_overrides,
        "rollout.vector=ray",
        "--run-dir",
        str(tmp_path / "run"),
    ]
    assert main(args) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: vector: ray needs Ray") and "install 'marl-ppo[ray]'" in error
    assert "\n" not in error
    assert not (tmp_path / "run").exists()


def test_min_workers_above_num_workers_is_refused(tiny_overrides, capsys):
    assert (
        main(
            [
                "train",
                *tiny_overrides,
                "rollout.vector=ray",
                "rollout.num_workers=2",
                "ray.min_workers=3",
                "--print-config",
            ]
        )
        == 2
    )
    assert "ray.min_workers=3 exceeds rollout.num_workers=2" in capsys.readouterr().err


TINY_MATRIX = {
    "env": {"id": "envs/matrix_game_v0"},
    "rollout": {"vector": "sync", "num_envs": 2, "rollout_steps": 4},
    "ppo": {"num_minibatches": 1, "train_pi_iters": 1, "train_vf_iters": 1},
    "model": {"hidden_sizes": [8]},
}


def _matrix_experiment(tmp_path, **changes):
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump({**TINY_MATRIX, **changes}))
    return path


@pytest.mark.slow  # two training processes as Ray tasks: a minute here
def test_a_sweep_on_ray_runs_its_seeds_on_both_nodes_in_the_local_layout(two_nodes, tmp_path, capsys):
    experiment = _matrix_experiment(tmp_path, total_steps=400)
    out = tmp_path / "runs"
    args = ["sweep", str(experiment), "--seeds", "2", "--ray", two_nodes.cluster.address, "--out", str(out)]
    assert main(args) == 0
    for seed in (0, 1):
        run_dir = out / "matrix" / f"seed{seed}"
        assert json.loads((run_dir / "summary.json").read_text())["env_steps"] == 400
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == seed
        assert "done: 400 env steps" in run_dir.with_name(f"seed{seed}.log").read_text()
    printed = capsys.readouterr().out
    nodes = {
        line.split(" on node ")[1].split(":")[0] for line in printed.splitlines() if " done seed" in line
    }
    assert len(nodes) == 2  # one CPU per node, one CPU per run: the two ran side by side
    assert "sweep matrix: 2 finished, 0 skipped (already finished), 0 failed" in printed


@pytest.mark.slow  # minutes on a two-core machine: `make test-slow`
def test_a_sweep_stopped_midway_and_started_again_resumes_without_rerunning_the_finished_seed(
    two_nodes, tmp_path, capsys
):
    experiment = _matrix_experiment(tmp_path, total_steps=3000, log={"checkpoint_every": 1})
    out = tmp_path / "runs"
    args = ["sweep", str(experiment), "--seeds", "2", "--ray", two_nodes.cluster.address, "--out", str(out)]
    first, second = out / "matrix" / "seed0", out / "matrix" / "seed1"
    sweep = subprocess.Popen(
        [sys.executable, "-m", "marl_ppo", *args, "--jobs", "1"], stdout=subprocess.PIPE, text=True
    )
    try:
        while not (first / "summary.json").exists() or not (second / "checkpoints" / "latest.pt").exists():
            assert sweep.poll() is None, "the sweep ended before it could be stopped"
            threading.Event().wait(0.1)
        sweep.send_signal(signal.SIGINT)
        sweep.communicate(timeout=180)
    finally:
        sweep.kill()
    assert not (second / "summary.json").exists()
    stopped = load_checkpoint(second / "checkpoints" / "latest.pt")["env_steps"]
    assert 0 < stopped < 3000
    finished = (first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns

    assert main(args) == 0
    assert "sweep matrix: 1 finished, 1 skipped (already finished), 0 failed" in capsys.readouterr().out
    assert ((first / "summary.json").read_bytes(), (first / "summary.json").stat().st_mtime_ns) == finished
    assert json.loads((second / "summary.json").read_text())["env_steps"] == 3000
    log = second.with_name("seed1.log").read_text()
    assert "stopped by SIGTERM" in log and "done: 3000 env steps" in log  # one log, both parts


@pytest.mark.parametrize(
    "algo", [(), ("ppo.actor_update=sequential", "model.share_actor=false")], ids=["mappo", "happo"]
)
def test_with_policy_lag_one_ray_worker_trains_as_one_local_worker(two_nodes, tiny_overrides, tmp_path, algo):
    """The rollout collected ahead, with the weights before the update, is the same on Ray (for
    HAPPO too, whose decoupled turns read the lagged batch)."""
    config = _config(
        tiny_overrides, "rollout.num_workers=1", "rollout.policy_lag=1", "total_steps=105", *algo
    )
    final = {}
    for vector in ("workers", "ray"):
        train(
            dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=vector)),
            tmp_path / vector,
        )
        final[vector] = load_checkpoint(tmp_path / vector / "checkpoints/final.pt")
    assert final["ray"]["collector"]["env_steps"] == final["workers"]["collector"]["env_steps"] == 105
    assert final["ray"]["collector"]["pending"] is None  # no rollout collected past the last update
    weights = final["workers"]["model"]
    assert all(torch.equal(weights[k], final["ray"]["model"][k]) for k in weights)


@pytest.mark.slow  # waits for Ray to restart an actor on a re-added node
def test_a_lost_worker_rejoins_with_the_current_weights_once_its_node_is_back(two_nodes, tiny_overrides):
    config = _config(
        tiny_overrides,
        "rollout.num_envs=2",
        "rollout.vector=ray",
        "rollout.num_workers=2",
        "ray.placement=spread",
    )
    torch.manual_seed(0)
    source, model = build_collector(plan_run(config))
    buffer = RolloutBuffer(model.spec, config.rollout.rollout_steps, config.rollout.copies)
    try:
        source.start(seed=0)
        assert source.collect(buffer).perf["perf/ray_live_workers"] == 2.0
        two_nodes.remove_worker()
        lost = source.collect(buffer)
        assert lost.perf["perf/ray_live_workers"] == 1.0 and lost.env_steps == 7
        from marl_ppo.rollout.ray_workers import RayRolloutWorkers

        assert isinstance(source, RayRolloutWorkers)
        gone = source._slices[next(iter(source._lost))]  # the lost worker's env copies
        assert (
            not buffer.groups["agent"].alive[:, gone.start : gone.stop].any()
        )  # the lost copy enters no loss
        two_nodes.restore_worker()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(0.1)  # "an update": the rejoined worker must act with these weights
        for _ in range(120):  # Ray restarts the actor on the new node within seconds
            result = source.collect(buffer)
            if result.perf["perf/ray_live_workers"] == 2.0:
                break
            threading.Event().wait(0.5)
        assert result.perf == {"perf/ray_live_workers": 2.0, "perf/ray_worker_rejoins": 1.0}
        assert result.env_steps == 14 and buffer.groups["agent"].alive[:, gone.start : gone.stop].all()
        agents = buffer.groups["agent"]
        with torch.no_grad():
            logp = rollout_log_probs(model, buffer, "agent")
        torch.testing.assert_close(logp, agents.logp, rtol=0, atol=1e-5)
    finally:
        source.close()


def test_a_league_on_two_ray_workers_trains_as_on_two_local_workers(two_nodes, tiny_overrides, tmp_path):
    """The pool's snapshots reach the actors through the object store with each rollout's draws' plan;
    the run (weights, win table, each copy's seat) is the run of two local workers, which read the
    snapshots' files, and every game was played against a snapshot of the pool."""
    config = load_config(
        ROOT / "experiments/classic/tictactoe_v3.yaml",
        [
            *tiny_overrides,
            "rollout.num_envs=4",
            "rollout.rollout_steps=12",
            "rollout.num_workers=2",
            "rollout.policy_lag=0",
            "total_steps=240",
            "eval.every=0",
            "league.opponents=pfsp",
            "league.snapshot_every=1",
            "league.self_play=0.2",
            "league.rating_episodes=0",
        ],
    )
    final = {}
    for vector in ("workers", "ray"):
        train(
            dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, vector=vector)),
            tmp_path / vector,
        )
        final[vector] = load_checkpoint(tmp_path / vector / "checkpoints/final.pt")
    weights = final["workers"]["model"]
    assert all(torch.equal(weights[k], final["ray"]["model"][k]) for k in weights)
    assert final["ray"]["league"] == final["workers"]["league"]
    seats = [w["opponents"] for w in final["ray"]["collector"]["workers"]]
    for local, remote in zip(final["workers"]["collector"]["workers"], seats, strict=True):
        assert torch.equal(local["opponents"]["opponent"], remote["opponent"])
        assert local["opponents"]["rngs"] == remote["rngs"]
    pool = final["ray"]["league"]["pool"]["snapshots"]
    assert pool == [0, 1, 2, 3, 4, 5]
    played = set(final["ray"]["league"]["sampler"]["games"])
    assert len(played) >= 2 and played <= set(pool)
    in_use = {int(s) for state in seats for s in state["opponent"] if s >= 0}
    assert in_use <= set(pool)
