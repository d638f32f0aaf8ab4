"""log.episodes: `update` writes each update's means of its finished episodes and their count, trains
bit for bit as `each` does, and `report` and the curves weight the means by their episodes."""

from pathlib import Path

import numpy as np
import pytest
import torch

from marl_ppo.analysis.curves import binned_curve
from marl_ppo.analysis.report import run_metrics
from marl_ppo.analysis.runlogs import ReportError, RunLog, read_run
from marl_ppo.config import load_config
from marl_ppo.run.loop import train
from tests.helpers import ROOT

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"


def _series(run_dir: Path, tag: str) -> tuple[list[int], list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    points = events.Scalars(tag)
    return [p.step for p in points], [p.value for p in points]


def test_update_means_are_the_episodes_means_and_training_is_unchanged(tiny_overrides, tmp_path):
    # 25-step episodes in 40-step rollouts of 2 copies: the 3 updates end 2, 4 and 2 episodes
    overrides = [*tiny_overrides, "rollout.rollout_steps=40", "total_steps=240", "log.return_window=1000"]
    runs = {}
    for mode in ("each", "update"):
        runs[mode] = tmp_path / mode
        train(load_config(SPREAD, [*overrides, f"log.episodes={mode}"]), run_dir=runs[mode])

    ends, returns = _series(runs["each"], "rollout/team_return")
    assert ends == [50, 50, 100, 100, 150, 150, 200, 200]  # env steps of both copies
    steps, counts = _series(runs["update"], "rollout/episodes")
    assert steps == [80, 160, 240] and counts == [2.0, 4.0, 2.0]
    steps, means = _series(runs["update"], "rollout/team_return")
    expected = [np.mean(returns[0:2]), np.mean(returns[2:6]), np.mean(returns[6:8])]
    assert steps == [80, 160, 240]
    np.testing.assert_allclose(means, expected, rtol=1e-6)
    _, lengths = _series(runs["update"], "rollout/episode_length")
    assert lengths == [25.0, 25.0, 25.0]

    final = {
        mode: torch.load(path / "checkpoints/final.pt", weights_only=False) for mode, path in runs.items()
    }
    for key, tensor in final["each"]["model"].items():
        assert torch.equal(tensor, final["update"]["model"][key]), key

    # over a window that holds every episode, report's final return is every episode's mean in both
    each, update = (run_metrics(read_run(path))["final_return"] for path in runs.values())
    assert update == pytest.approx(np.mean(returns), rel=1e-6)
    assert each == pytest.approx(np.mean(returns), rel=1e-6)


def _run(values, counts) -> RunLog:
    steps = np.arange(1, len(values) + 1) * 100
    series = {"rollout/team_return": (steps, np.array(values, dtype=np.float64))}
    if counts is not None:
        series["rollout/episodes"] = (steps, np.array(counts, dtype=np.float64))
    return RunLog(Path("run"), {}, series)


def test_the_last_episodes_mean_weights_update_means_by_their_episodes():
    run = _run([1.0, 2.0, 3.0], [3, 2, 4])
    # the last 5 episodes: the last update's 4 (mean 3) and 1 of the update before (mean 2)
    assert run.last_episodes_mean("rollout/team_return", 5) == pytest.approx((4 * 3 + 1 * 2) / 5)
    assert run.last_episodes_mean("rollout/team_return", 4) == pytest.approx(3.0)
    assert run.last_episodes_mean("rollout/team_return", 100) == pytest.approx((3 * 1 + 2 * 2 + 4 * 3) / 9)
    # without counts every point is one episode
    assert _run([1.0, 2.0, 3.0], None).last_episodes_mean("rollout/team_return", 2) == pytest.approx(2.5)


def test_counts_that_do_not_match_the_means_are_refused_in_one_line():
    run = _run([1.0, 2.0, 3.0], [3, 2, 4])
    run.series["rollout/episodes"] = (np.array([100, 200]), np.array([3.0, 2.0]))
    with pytest.raises(ReportError, match="3 points of rollout/team_return against 2 of rollout/episodes"):
        run.last_episodes_mean("rollout/team_return", 5)


def test_a_binned_curve_counts_each_mean_for_its_episodes():
    edges = np.array([0.0, 100.0, 200.0])
    steps = np.array([50, 100, 150])
    values = np.array([1.0, 4.0, 10.0])
    # span (0, 100]: (1 x 1 + 4 x 3) / 4; span (100, 200]: 10
    np.testing.assert_allclose(binned_curve(steps, values, edges, np.array([1, 3, 2])), [13 / 4, 10.0])
    np.testing.assert_allclose(binned_curve(steps, values, edges), [2.5, 10.0])
