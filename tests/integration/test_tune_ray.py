"""`marl-ppo tune --ray`: a study's seed runs as Ray tasks on a two-node cluster, one node lost midway."""

import threading

import pytest
import yaml

from marl_ppo.tune.launch import RayLauncher
from marl_ppo.tune.space import read_space
from marl_ppo.tune.study import TuneSetup, run_study
from tests.helpers import TINY_MATRIX

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

FAST_NODE_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 2}


@pytest.mark.slow  # a Ray cluster and four short trainings: minutes on a two-core machine
def test_a_study_on_two_nodes_ends_with_every_trial_after_losing_one_node(tmp_path):
    experiment = tmp_path / "matrix.yaml"
    matrix = {**TINY_MATRIX, "total_steps": 480, "eval": {"every": 160}, "log": {"checkpoint_every": 2}}
    experiment.write_text(yaml.safe_dump(matrix))
    space = tmp_path / "space.yaml"
    space.write_text("ppo.clip_ratio: {low: 0.1, high: 0.3}\n")
    setup = TuneSetup(
        experiment=experiment,
        space=read_space(space, experiment),
        directory=tmp_path / "tune",
        trials=2,
        seeds=2,
        jobs=2,
        pruner="none",
    )
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": FAST_NODE_DEATH})
    worker = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="warning")
    try:
        first = setup.directory / "trials/0000"

        def lose_the_worker_node() -> None:  # once trial 0's runs have checkpoints
            while not all((first / f"seed{k}/checkpoints/latest.pt").exists() for k in (0, 1)):
                threading.Event().wait(0.1)
            cluster.remove_node(worker, allow_graceful=False)

        killer = threading.Thread(target=lose_the_worker_node, daemon=True)
        killer.start()
        lines: list[str] = []
        study = run_study(setup, RayLauncher(experiment, 1, cluster.address), lines.append)
        killer.join(timeout=1)
        assert not killer.is_alive(), "the node was never removed"
        assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2, lines
        for trial in study.trials:  # every run trained to its end, its evaluations written once each
            for k in (0, 1):
                run_dir = setup.directory / f"trials/{trial.number:04d}/seed{k}"
                steps = [
                    yaml.safe_load(line)["step"]
                    for line in (run_dir / "evaluations.jsonl").read_text().splitlines()
                ]
                assert steps == sorted(set(steps)) and steps[-1] == 480
    finally:
        ray.shutdown()
        cluster.shutdown()
