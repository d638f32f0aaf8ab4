"""The tuner's study on a deterministic toy trainer: scores as computed by hand, pruning, resume after SIGKILL."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import optuna
import pytest

from marl_ppo.tune.launch import ProcessLauncher
from marl_ppo.tune.outputs import write_best, write_tables
from marl_ppo.tune.study import open_study, run_study, storage_url
from tests.helpers import ROOT
from tests.integration import tune_toy

TOY = Path(tune_toy.__file__)


def _run(setup, lines=None):
    echo = lines.append if lines is not None else (lambda line: None)
    return run_study(setup, ProcessLauncher(setup.experiment, tune_toy.command), echo)


def _means(run_dir: Path) -> list[float]:
    return [
        json.loads(line)["team_return_mean"]
        for line in (run_dir / "evaluations.jsonl").read_text().splitlines()
    ]


def test_a_trials_score_is_the_iqm_of_its_seeds_evaluation_files(tmp_path):
    setup = tune_toy.setup(tmp_path, trials=1, seeds=4, jobs=4)
    study = _run(setup)
    trial = study.trials[0]
    x = trial.params["ppo.clip_ratio"]
    seeds = [_means(setup.directory / "trials/0000" / f"seed{k}") for k in range(4)]
    assert seeds[3] == pytest.approx([tune_toy.toy_return(x, 3, i) for i in range(4)])
    # by hand: a seed's curve score is the mean of its 4 evaluations (base + 0.5 seed + 0.15); the IQM of 4
    # seeds drops the lowest and highest and averages seeds 1 and 2
    base = 10.0 - 100.0 * (x - 0.2) ** 2
    per_seed = [np.mean(means) for means in seeds]
    assert per_seed == pytest.approx([base + 0.5 * k + 0.15 for k in range(4)])
    assert trial.value == pytest.approx((per_seed[1] + per_seed[2]) / 2)
    assert trial.value == pytest.approx(base + 0.75 + 0.15)
    # the intermediate score after evaluation k: the same IQM over each seed's first k + 1 evaluations
    assert trial.intermediate_values == pytest.approx({k: base + 0.75 + 0.05 * k for k in range(4)})
    low, high = trial.user_attrs["ci95"]
    assert low <= trial.value <= high and high - low <= 1.5 + 1e-9  # within the seeds' spread


def test_the_median_rule_stops_a_trial_scoring_below_the_completed_trials_median(tmp_path):
    setup = tune_toy.setup(tmp_path, trials=3, pruner="median", seeds=2, jobs=2)
    os.environ["TUNE_TOY_DELAY"] = "0.4"
    os.environ["TUNE_TOY_HOLD_BELOW"] = "0.15"  # the low trial waits after its second evaluation: pruning
    # comes before its end on a loaded machine too
    try:
        study = open_study(setup)
        for clip in (0.2, 0.22, 0.1):  # scores about 10.4, 10.36 and 9.4
            study.enqueue_trial({"ppo.clip_ratio": clip})
        lines: list[str] = []
        study = _run(setup, lines)
    finally:
        del os.environ["TUNE_TOY_DELAY"], os.environ["TUNE_TOY_HOLD_BELOW"]
    states = [t.state for t in study.trials]
    assert states == [
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.COMPLETE,
        optuna.trial.TrialState.PRUNED,
    ]
    pruned = study.trials[2]
    # median of the complete trials after evaluation 1 (the first the rule reads): (10.3 + 10.26) / 2
    completed_at_1 = [t.intermediate_values[1] for t in study.trials[:2]]
    assert completed_at_1 == pytest.approx([10.0 + 0.25 + 0.05, 10.0 - 0.04 + 0.25 + 0.05])
    assert pruned.intermediate_values == pytest.approx({0: 9.0 + 0.25, 1: 9.0 + 0.25 + 0.05})
    assert pruned.intermediate_values[1] < np.median(completed_at_1)
    # its runs were stopped: fewer than the 4 evaluations, and no summary
    run_dir = setup.directory / "trials/0002/seed0"
    assert len(_means(run_dir)) < 4 and not (run_dir / "summary.json").exists()
    assert any(line.startswith("trial 2 pruned after evaluation 2") for line in lines)


def _finished(directory: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="tune", storage=storage_url(directory))
    return study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))


def test_a_study_killed_mid_trial_resumes_to_exactly_n_trials_and_the_same_best(tmp_path):
    trials = 5
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNE_TOY_DELAY": "0.15"}
    whole = tmp_path / "whole"
    subprocess.run(
        [sys.executable, str(TOY), "drive", str(whole), str(trials), "none"], env=env, check=True, cwd=ROOT
    )

    killed = tmp_path / "killed"
    process = subprocess.Popen(
        [sys.executable, str(TOY), "drive", str(killed), str(trials), "none"], env=env, cwd=ROOT
    )
    middle = killed / "tune/trials/0002/seed0/evaluations.jsonl"
    deadline = time.monotonic() + 60
    while not (middle.is_file() and middle.read_text().count("\n") >= 2):  # trial 2 is half trained
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    time.sleep(0.5)  # its trainings die with it
    assert not (killed / "tune/trials/0002/seed0/summary.json").exists()
    # trials 0 and 1 done, or trial 1 still running beside trial 2 on a busy machine: both resume
    assert 1 <= len(_finished(killed / "tune")) <= 2
    subprocess.run(
        [sys.executable, str(TOY), "drive", str(killed), str(trials), "none"], env=env, check=True, cwd=ROOT
    )

    study = optuna.load_study(study_name="tune", storage=storage_url(killed / "tune"))
    reference = optuna.load_study(study_name="tune", storage=storage_url(whole / "tune"))
    assert len(study.trials) == trials  # none run twice, none lost
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * trials
    assert [t.params for t in study.trials] == [t.params for t in reference.trials]
    assert [t.value for t in study.trials] == pytest.approx([t.value for t in reference.trials])
    assert study.best_trial.number == reference.best_trial.number
    # the killed trial continued its runs: each seed wrote each of its 4 evaluations once
    assert len(_means(killed / "tune/trials/0002/seed0")) == 4


def test_outputs_a_best_experiment_train_accepts_and_a_trial_table(tmp_path):
    from marl_ppo.config import load_config

    setup = tune_toy.setup(
        tmp_path,
        trials=4,
        space="ppo.clip_ratio: {low: 0.1, high: 0.3}\nppo.gamma: {choices: [0.5, 1.0]}\n",
    )
    study = _run(setup)
    best_path = write_best(study, setup)
    config = load_config(best_path)
    assert config.ppo.clip_ratio == pytest.approx(study.best_params["ppo.clip_ratio"])
    assert config.ppo.gamma == study.best_params["ppo.gamma"]
    assert config.env.id == "envs/matrix_game_v0" and config.eval.every == 8
    table, importances, summary = write_tables(study, setup)
    rows = table.read_text().splitlines()
    assert rows[0].startswith(
        "number,state,score,ci95_low,ci95_high,evaluations,seconds,error,ppo.clip_ratio,ppo.gamma"
    )
    assert len(rows) == 5
    weights = json.loads(importances.read_text())
    assert set(weights) <= {"ppo.clip_ratio", "ppo.gamma"} and weights
    assert f"| {study.best_trial.number} | complete | {study.best_value:.4g} |" in summary.read_text()


def test_a_study_of_another_search_is_refused_but_not_one_an_older_version_recorded(tmp_path):
    import dataclasses

    from marl_ppo.tune.space import TuneError

    setup = tune_toy.setup(tmp_path, trials=1)
    study = open_study(setup)
    search = dict(study.user_attrs["search"])
    # as a version without the `env.shaped_reward` keys recorded it: they take their defaults
    older = json.loads(search["config"])
    del older["env"]["shaped_reward"], older["env"]["shaped_reward_steps"]
    study.set_user_attr("search", {**search, "config": json.dumps(older, sort_keys=True)})
    assert open_study(setup).user_attrs["search"]["config"] == json.dumps(older, sort_keys=True)
    other = dataclasses.replace(setup, fixed=("ppo.gamma=0.5",))
    with pytest.raises(TuneError) as refused:
        open_study(other)
    assert str(refused.value) == (
        f"tuning directory '{setup.directory}' holds a study of another search (experiment config differ); "
        "pass another --out, or remove the directory to start over"
    )
    with pytest.raises(TuneError, match=r"\(--seeds differ\)"):
        open_study(dataclasses.replace(setup, seeds=3))
