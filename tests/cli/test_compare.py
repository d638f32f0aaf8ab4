"""`marl-ppo compare`: normalised scores, aggregates and probability of improvement checked against
hand-computed values, the figures and the marl-eval JSON of 2 configurations x 2 tasks x 3 seeds."""

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from marl_ppo.analysis.compare import aggregates_of, improvements_of, write_comparison
from marl_ppo.analysis.runlogs import ReportError
from marl_ppo.analysis.scores import RunScores, ScoreTable, marl_eval_json
from marl_ppo.cli import main
from tests.helpers import fake_run

# absolute metrics (one episode each) of algorithms x and y on two tasks, three seeds each; every
# run's first evaluation returned 0, so each task's bounds are 0 and its highest absolute return
ABSOLUTE = {
    ("mpe2/a", "x"): [10.0, 6.0, 4.0],
    ("mpe2/a", "y"): [2.0, 4.0, 8.0],
    ("mpe2/b", "x"): [5.0, 5.0, 3.0],
    ("mpe2/b", "y"): [5.0, 1.0, 2.0],
}


def _table():
    runs = tuple(
        RunScores(
            task,
            algorithm,
            seed,
            Path(f"{task}-{algorithm}-{seed}"),
            (10, 20),
            ((0.0,), (value,)),
            (value,),
            True,
        )
        for (task, algorithm), values in ABSOLUTE.items()
        for seed, value in enumerate(values)
    )
    return ScoreTable(runs, ("mpe2/a", "mpe2/b"), ("x", "y"), {"mpe2/a": (0.0, 10.0), "mpe2/b": (0.0, 5.0)})


def test_aggregates_and_probability_of_improvement_match_the_hand_computed_values():
    table = _table()
    # normalised: x = [1, .6, .4] on a, [1, 1, .6] on b; y = [.2, .4, .8] and [1, .2, .4]
    aggregates = aggregates_of(table, reps=200, seed=0)
    # IQM of six scores drops the lowest and the highest: x (.6 + .6 + 1 + 1) / 4, y (.2 + .4 + .4 + .8) / 4
    assert aggregates["x"]["iqm"].value == pytest.approx(0.8, abs=1e-5)
    assert aggregates["y"]["iqm"].value == pytest.approx(0.45, abs=1e-5)
    # median (rliable's): over tasks of each task's mean over runs, (2 / 3 + 2.6 / 3) / 2
    assert aggregates["x"]["median"].value == pytest.approx(4.6 / 6, abs=1e-5)
    assert aggregates["x"]["mean"].value == pytest.approx(4.6 / 6, abs=1e-5)
    assert aggregates["y"]["optimality_gap"].value == pytest.approx(
        (0.8 + 0.6 + 0.2 + 0 + 0.8 + 0.6) / 6, abs=1e-5
    )
    low, high = aggregates["x"]["iqm"].low, aggregates["x"]["iqm"].high
    assert 0.4 <= low <= 0.8 <= high <= 1.0
    # P(x > y): on a, 6.5 of 9 pairs (4 vs 4 counts half); on b, 7 of 9 (5 vs 5 counts half)
    improvement = improvements_of(table, reps=200, seed=0)
    assert list(improvement) == [("x", "y")]
    assert improvement[("x", "y")].value == pytest.approx((6.5 / 9 + 7 / 9) / 2)


def test_bootstrap_intervals_follow_their_seed_not_numpys_global_generator():
    """rliable's bootstraps draw from NumPy's global generator: two calls with one seed after different
    global states give the very same intervals, and the global generator is left as it was."""
    pytest.importorskip("rliable")
    from marl_ppo.analysis.stats import interval_estimates, iqm

    generator = np.random.default_rng(0)
    scores = {algorithm: generator.uniform(size=(5, 3)) for algorithm in ("x", "y")}  # 5 runs, 3 tasks
    intervals, continued = [], []
    for state in (1, 2):
        np.random.seed(state)
        intervals.append(interval_estimates(scores, iqm, reps=200, seed=0)[1])
        continued.append(np.random.random() == np.random.RandomState(state).random_sample())
    for algorithm in scores:
        np.testing.assert_array_equal(intervals[0][algorithm], intervals[1][algorithm])
    assert continued == [True, True]  # the caller's generator draws on where it was
    other = interval_estimates(scores, iqm, reps=200, seed=1)[1]
    assert any(not np.array_equal(other[a], intervals[0][a]) for a in scores)


def test_the_marl_eval_layout_nests_env_task_algorithm_run_step():
    data = marl_eval_json(_table())
    run = data["mpe2"]["a"]["x"]["run_0"]
    assert run == {
        "step_0": {"step_count": 10, "return": [0.0]},
        "step_1": {"step_count": 20, "return": [10.0]},
        "absolute_metrics": {"return": [10.0]},
    }
    assert sorted(data["mpe2"]) == ["a", "b"]
    assert sorted(data["mpe2"]["b"]["y"]) == ["run_0", "run_1", "run_2"]


def test_the_marl_eval_runs_line_up_by_rank_when_algorithms_ran_different_seeds():
    """marl-eval reads every algorithm and task by the first one's run keys: y's seeds 3, 4, 5 must
    export under x's keys, its k-th lowest seed as run k, as the score matrices' rows."""
    table = _table()
    shifted = tuple(dataclasses.replace(r, seed=r.seed + 3) if r.algorithm == "y" else r for r in table.runs)
    data = marl_eval_json(dataclasses.replace(table, runs=shifted))
    first = list(data["mpe2"]["a"]["x"])
    assert first == ["run_0", "run_1", "run_2"]
    for task, values in (("a", [2.0, 4.0, 8.0]), ("b", [5.0, 1.0, 2.0])):
        assert list(data["mpe2"][task]["x"]) == list(data["mpe2"][task]["y"]) == first
        assert [data["mpe2"][task]["y"][run]["absolute_metrics"]["return"] for run in first] == [
            [v] for v in values
        ]


def test_compare_on_two_configurations_two_tasks_three_seeds_writes_every_output(tmp_path, capsys):
    for task, offset in (("mpe2/simple_spread_v3", -60.0), ("mpe2/simple_reference_v3", -30.0)):
        for critic, gain in (("state", 10.0), ("obs", 5.0)):
            for seed in range(3):
                finals = [offset, offset + gain / 2 + seed, offset + gain + seed]
                fake_run(
                    tmp_path / "runs" / f"{task.split('/')[1]}-{critic}-{seed}", task, critic, seed, finals
                )
    out = tmp_path / "out"
    assert main(["compare", str(tmp_path / "runs"), "--out", str(out), "--reps", "300"]) == 0
    printed = capsys.readouterr().out
    assert "2 algorithm(s) x 2 task(s) x 3 seed(s)" in printed
    markdown = (out / "compare.md").read_text()
    assert "| ppo.critic=state |" in markdown and "| ppo.critic=obs |" in markdown
    assert "P(X > Y)" in markdown
    for name in ("performance_profiles.png", "sample_efficiency.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    data = json.loads((out / "marl_eval.json").read_text())
    run = data["mpe2"]["simple_spread_v3"]["ppo.critic=state"]["run_2"]
    assert run["step_2"] == {"step_count": 300, "return": [-49.0, -47.0]}
    assert run["absolute_metrics"]["return"] == [-48.5, -47.5, -48.0, -48.0]
    rows = list(csv.DictReader((out / "scores.csv").open()))
    assert len(rows) == 2 * 2 * 3 * 4  # 3 evaluations and the absolute metric per run
    spread = [float(r["return_mean"]) for r in rows if r["task"] == "simple_spread_v3"]
    low, high = -61.0, -47.0  # the task's lowest and highest episode return
    normalised = [float(r["normalised_return_mean"]) for r in rows if r["task"] == "simple_spread_v3"]
    assert np.allclose(normalised, (np.array(spread) - low) / (high - low + 1e-6))


def test_compare_refuses_an_incomplete_table(tmp_path):
    fake_run(tmp_path / "a", "mpe2/simple_spread_v3", "state", 0, [0.0, 1.0, 2.0])
    fake_run(tmp_path / "b", "mpe2/simple_spread_v3", "obs", 0, [0.0, 1.0, 2.0])
    fake_run(tmp_path / "c", "mpe2/simple_spread_v3", "obs", 1, [0.0, 1.0, 2.0])
    with pytest.raises(ReportError, match="same number of seeds"):
        write_comparison([tmp_path], tmp_path / "out", reps=10)


def test_every_task_exports_as_many_evaluations_as_the_task_with_fewest():
    table = _table()
    longer = tuple(
        RunScores(
            r.task, r.algorithm, r.seed, r.run_dir, (10, 20, 30), (*r.returns, (1.0,)), r.absolute, True
        )
        if r.task == "mpe2/b"
        else r
        for r in table.runs
    )
    table = ScoreTable(longer, table.tasks, table.algorithms, table.bounds)
    data = marl_eval_json(table)
    assert sorted(data["mpe2"]["b"]["x"]["run_0"]) == ["absolute_metrics", "step_0", "step_1"]
    steps, curves = table.curve_scores()
    assert steps.tolist() == [10, 20] and curves["x"].shape == (3, 2, 2)


def test_compare_by_a_moved_key_reads_runs_stored_before_the_sections(tmp_path, capsys):
    for seed in range(2):
        fake_run(tmp_path / "runs" / f"new-{seed}", "mpe2/simple_spread_v3", "state", seed, [0.0, 1.0, 2.0])
        old = tmp_path / "runs" / f"old-{seed}"
        fake_run(old, "mpe2/simple_spread_v3", "obs", seed, [0.0, 2.0, 3.0])
        config = yaml.safe_load((old / "config.yaml").read_text())
        config["critic"], config["eval_every"] = config.pop("ppo")["critic"], config.pop("eval")["every"]
        (old / "config.yaml").write_text(yaml.safe_dump(config))  # as a run before the sections stored it
    out, runs = str(tmp_path / "out"), str(tmp_path / "runs")
    assert main(["compare", runs, "--out", out, "--reps", "100", "--by", "ppo.critic"]) == 0
    markdown = (tmp_path / "out" / "compare.md").read_text()
    assert "| ppo.critic=state |" in markdown and "| ppo.critic=obs |" in markdown
    capsys.readouterr()
    assert main(["compare", runs, "--out", out, "--reps", "100", "--by", "critic"]) == 2
    err = capsys.readouterr().err
    assert "has no config key critic (moved to ppo.critic)" in err and err.count("\n") == 1


def test_compare_by_one_key_warns_when_the_runs_also_differ_in_another(tmp_path, capsys):
    for seed in range(2):
        for critic, lag in (("state", 1), ("obs", 0)):
            path = tmp_path / "runs" / f"{critic}-{seed}"
            fake_run(path, "mpe2/simple_spread_v3", critic, seed, [0.0, 1.0, 2.0 + lag])
            config = yaml.safe_load((path / "config.yaml").read_text())
            config["rollout"] = {"policy_lag": lag, "vector": "workers" if lag else "subprocess"}
            (path / "config.yaml").write_text(yaml.safe_dump(config))
    out, runs = str(tmp_path / "out"), str(tmp_path / "runs")
    assert main(["compare", runs, "--out", out, "--reps", "100", "--by", "ppo.critic"]) == 0
    warning = (
        "--by ppo.critic: the runs also differ in rollout.policy_lag (0 for ppo.critic=obs; 1 for "
        "ppo.critic=state), which this comparison credits to ppo.critic; compare runs that differ only "
        "there, or name every difference with --by ppo.critic,rollout.policy_lag"
    )
    assert capsys.readouterr().err == f"warning: {warning}\n"  # rollout.vector is how it ran, not what
    assert f"**Warning**: {warning}." in (tmp_path / "out" / "compare.md").read_text()
    assert (
        main(["compare", runs, "--out", out, "--reps", "100", "--by", "ppo.critic,rollout.policy_lag"]) == 0
    )
    assert capsys.readouterr().err == ""


def test_compare_shows_algorithms_under_the_names_given(tmp_path, capsys):
    for seed in range(2):
        for critic in ("state", "obs"):
            fake_run(
                tmp_path / "runs" / f"{critic}-{seed}", "mpe2/simple_spread_v3", critic, seed, [0.0, 1.0, 2.0]
            )
    out, runs = tmp_path / "out", str(tmp_path / "runs")
    names = ["--name", "MAPPO=ppo.critic=state", "--name", "IPPO=ppo.critic=obs"]
    assert main(["compare", runs, "--out", str(out), "--reps", "100", *names]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed[1:]] == ["IPPO", "MAPPO"]
    assert "| MAPPO | " in (out / "compare.md").read_text()
    assert set(json.loads((out / "marl_eval.json").read_text())["mpe2"]["simple_spread_v3"]) == {
        "MAPPO",
        "IPPO",
    }
