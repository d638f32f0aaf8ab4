"""`marl-ppo tune`: bad input refused in one line before any trial, and a real study from start to outputs."""

import csv
import json

import pytest
import yaml

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.tune.score import trial_score
from tests.helpers import TINY_MATRIX


@pytest.fixture
def files(tmp_path):
    experiment = tmp_path / "matrix.yaml"
    experiment.write_text(
        yaml.safe_dump({**TINY_MATRIX, "total_steps": 32, "eval": {"every": 8, "episodes": 4}})
    )
    space = tmp_path / "space.yaml"
    space.write_text(
        "ppo.pi_lr: {low: 1.0e-4, high: 1.0e-2, log: true}\nppo.clip_ratio: {choices: [0.1, 0.3]}\n"
    )
    return experiment, space


@pytest.mark.parametrize(
    ("arguments", "space_text", "message"),
    [
        (["--trials", "0"], None, "--trials 0 must be at least 1"),
        (["--seeds", "0"], None, "--seeds 0 must be at least 1"),
        (["--pruner", "hyperband"], None, "--pruner hyperband is not one of median, halving, none"),
        (["--score", "best"], None, "--score best is not one of curve, final"),
        (["seed=3"], None, "seed cannot be set for a search"),
        (["eval.every=0"], None, "set eval.every (e.g. eval.every=3)"),
        (["env.id=nowhere/none_v0"], None, "nowhere/none_v0"),
        (
            [],
            "ppo.pi_lr: {low: 1.0e-4, high: 2}\nppo.gama: {low: 0.9, high: 0.99}\n",
            "did you mean ppo.gamma?",
        ),
        ([], "model.hidden_sizes: {low: 8, high: 16}\n", "a range needs a number key"),
    ],
)
def test_bad_input_is_refused_in_one_line_before_any_trial(
    files, tmp_path, capsys, arguments, space_text, message
):
    experiment, space = files
    if space_text is not None:
        space.write_text(space_text)
    out = tmp_path / "out"
    status = main(
        ["tune", str(experiment), "--space", str(space), "--trials", "2", "--out", str(out), *arguments]
    )
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and err.count("\n") == 1
    assert not out.exists()  # nothing started


def test_a_study_trains_its_trials_and_writes_best_table_and_fresh_comparison(files, tmp_path, capsys):
    experiment, space = files
    out = tmp_path / "out"
    arguments = [
        "tune",
        str(experiment),
        "--space",
        str(space),
        "--trials",
        "2",
        "--seeds",
        "2",
        "--jobs",
        "2",
    ]
    status = main([*arguments, "--out", str(out), "--pruner", "none", "--fresh-seeds", "2"])
    printed = capsys.readouterr().out
    assert status == 0, printed
    directory = out / "matrix"
    rows = list(csv.DictReader((directory / "trials.csv").open()))
    assert [row["state"] for row in rows] == ["complete", "complete"]
    # each trial's score is the IQM (two seeds: the mean) of its seeds' mean evaluation returns
    for row in rows:
        seeds = []
        for seed in (0, 1):
            lines = (directory / f"trials/{int(row['number']):04d}/seed{seed}/evaluations.jsonl").read_text()
            seeds.append([json.loads(line)["team_return_mean"] for line in lines.splitlines()])
        assert len(seeds[0]) >= 4
        assert float(row["score"]) == pytest.approx(trial_score(seeds, "curve"))
    best = load_config(directory / "best.yaml")
    winner = max(rows, key=lambda row: float(row["score"]))
    assert best.ppo.pi_lr == pytest.approx(float(winner["ppo.pi_lr"]))
    assert best.ppo.clip_ratio == float(winner["ppo.clip_ratio"])
    assert best.eval.absolute == 10  # the trials' eval.absolute=0 stays out of the tuned file
    # the fresh seeds are none the search saw, and compare read them as two algorithms
    best_dir = directory / f"fresh/trial{int(winner['number']):04d}"
    fresh = sorted(p.name for p in best_dir.iterdir() if p.is_dir())
    assert fresh == ["seed10000", "seed10001"]
    assert (directory / "compare/compare.md").is_file()
    assert "P(" in printed and "best: trial" in printed
    # started again with the same arguments, it finds the study done and trains nothing more
    assert main([*arguments, "--out", str(out), "--pruner", "none"]) == 0
    assert len(list(csv.DictReader((directory / "trials.csv").open()))) == 2
