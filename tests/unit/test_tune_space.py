"""The search space file: read into ranges and choices, every bad key, range or type refused in one line."""

import numpy as np
import pytest
import yaml

from marl_ppo.tune.score import common_evaluations, seed_score, trial_score
from marl_ppo.tune.space import Choices, Range, TuneError, read_space
from marl_ppo.tune.study import trial_overrides
from tests.helpers import TINY_MATRIX


@pytest.fixture
def experiment(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(yaml.safe_dump({**TINY_MATRIX, "eval": {"every": 8}}))
    return path


def _space(tmp_path, experiment, text):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return read_space(path, experiment)


def test_a_space_reads_ranges_log_ranges_integer_ranges_and_choices(tmp_path, experiment):
    space = _space(
        tmp_path,
        experiment,
        "ppo.pi_lr: {low: 1.0e-4, high: 3e-3, log: true}\n"
        "ppo.num_minibatches: {low: 1, high: 4}\n"
        "rollout.rollout_steps: {low: 4, high: 16, step: 4}\n"
        "model.hidden_sizes: {choices: [[8], [16, 16]]}\n"
        "ppo.lr_schedule: {choices: [constant, linear]}\n",
    )
    assert space.dimensions["ppo.pi_lr"] == Range(1e-4, 3e-3, log=True, step=None, integer=False)
    assert space.dimensions["ppo.num_minibatches"] == Range(1, 4, log=False, step=None, integer=True)
    assert space.dimensions["rollout.rollout_steps"] == Range(4, 16, log=False, step=4, integer=True)
    assert space.dimensions["model.hidden_sizes"] == Choices(([8], [16, 16]))
    # a list choice travels through Optuna as its YAML text and comes back as the override it was
    params = {
        "ppo.pi_lr": 0.0003,
        "ppo.num_minibatches": 2,
        "rollout.rollout_steps": 8,
        "model.hidden_sizes": "[16, 16]",
        "ppo.lr_schedule": "linear",
    }
    assert trial_overrides(space, params) == [
        "ppo.pi_lr=0.0003",
        "ppo.num_minibatches=2",
        "rollout.rollout_steps=8",
        "model.hidden_sizes=[16, 16]",
        "ppo.lr_schedule=linear",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "ppo.pi_lrr: {low: 1.0e-4, high: 1.0e-3}",
            "'ppo.pi_lrr': not a config key; did you mean ppo.pi_lr?",
        ),
        ("seed: {low: 0, high: 9}", "seed cannot be tuned"),
        ("total_steps: {low: 8, high: 16}", "total_steps cannot be tuned"),
        ("eval.episodes: {choices: [5, 10]}", "eval.episodes cannot be tuned"),
        ("ppo: {low: 1, high: 2}", "'ppo': a section, not a key"),
        ("ppo.pi_lr: 0.001", "write a range {low: A, high: B} or {choices: [A, B]}, got 0.001"),
        ("ppo.pi_lr: {low: 1.0e-3, high: 1.0e-4}", "low 0.001 must be below high 0.0001"),
        ("ppo.pi_lr: {low: 0, high: 1.0e-3, log: true}", "a log range needs low > 0, got 0"),
        ("ppo.pi_lr: {low: 1.0e-4}", "low and high are both needed"),
        ("ppo.pi_lr: {low: 1.0e-4, high: 1.0e-3, scale: log}", "'scale' is not one of them"),
        ("ppo.pi_lr: {low: a, high: 1.0e-3}", "range bounds and step must be numbers, got 'a'"),
        ("ppo.num_minibatches: {low: 1, high: 2.5}", "the key takes whole numbers, got 2.5"),
        (
            "ppo.lr_schedule: {low: 1, high: 2}",
            "a range needs a number key; list the values as {choices: [...]}",
        ),
        ("ppo.gamma: {low: 0.9, high: 1.5}", "the value 1.5 is refused"),
        ("ppo.pi_lr: {low: -1.0, high: 1.0e-3}", "the value -1.0 is refused"),
        ("ppo.lr_schedule: {choices: [constant, cosine]}", "the value cosine is refused"),
        ("ppo.lr_schedule: {choices: []}", "choices must be a non-empty list"),
        ("ppo.lr_schedule: {choices: [linear, linear]}", "choices list a value twice"),
        ("ppo.pi_lr: {low: 1.0e-4, high: 1.0e-3, log: true, step: 1.0e-4}", "either log or stepped"),
        ("{}", "names no keys"),
        ("ppo.pi_lr: [", "is not valid YAML"),
    ],
)
def test_a_bad_key_range_or_type_is_refused_in_one_line_naming_it(tmp_path, experiment, text, message):
    with pytest.raises(TuneError) as caught:
        _space(tmp_path, experiment, text + "\n")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_seed_and_trial_scores_by_hand():
    seeds = [[1.0, 3.0], [2.0, 6.0], [0.0, 0.0], [10.0, 30.0]]
    assert seed_score(seeds[1], "curve") == 4.0 and seed_score(seeds[1], "final") == 6.0
    # curve scores 2, 4, 0, 20: the IQM of four drops 0 and 20 and averages 2 and 4
    assert trial_score(seeds, "curve") == pytest.approx(3.0)
    # final scores 3, 6, 0, 30 -> (3 + 6) / 2; after the first evaluation only: 1, 2, 0, 10 -> 1.5
    assert trial_score(seeds, "final") == pytest.approx(4.5)
    assert trial_score(seeds, "curve", upto=0) == pytest.approx(1.5)
    # with three seeds nothing is trimmed: the mean
    assert trial_score(seeds[:3], "curve") == pytest.approx(np.mean([2.0, 4.0, 0.0]))
    assert common_evaluations([[1.0, 2.0], [1.0]]) == 1


def test_each_trial_draws_from_its_own_well_mixed_seed():
    from marl_ppo.tune.study import trial_seed

    seeds = [trial_seed(0, number) for number in range(200)]
    assert seeds == [trial_seed(0, number) for number in range(200)] and len(set(seeds)) == 200
    assert trial_seed(1, 0) != trial_seed(0, 1)
    # Mersenne Twister seeded 0 and 3 starts alike (0.549, 0.715 and 0.551, 0.708): mixed seeds do not
    first = np.array([np.random.RandomState(seed).rand(2) for seed in seeds[:4]])
    assert min(np.abs(first[i] - first[j]).max() for i in range(4) for j in range(i)) > 0.05
