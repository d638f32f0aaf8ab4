"""The league's opponent sampler: PFSP's weights on a hand-made table, draws, its state."""

import numpy as np
import pytest

from marl_ppo.league.sampling import CURRENT, OpponentSampler


def _table(sampler):
    """Snapshot 0: 3 wins in 4; snapshot 5: a win, a draw and 2 losses; snapshot 10: not played."""
    for score in (1, 1, 0, 1):
        sampler.record(0, score)
    for points in (1.0, 0.5, 0.0, 0.0):
        sampler.record(5, points)


def test_pfsp_hard_weights_equal_the_formula_on_a_hand_made_table():
    sampler = OpponentSampler("pfsp", seed=0, decay=1.0, power=2.0)
    _table(sampler)
    assert [sampler.score(s) for s in (0, 5, 10)] == [0.75, 0.375, 0.5]
    # (1 - x)^2: 0.0625, 0.390625, 0.25; sum 0.703125
    expected = np.array([0.0625, 0.390625, 0.25]) / 0.703125
    np.testing.assert_allclose(sampler.weights([0, 5, 10]), expected, rtol=1e-15)
    np.testing.assert_allclose(expected, [0.0888888889, 0.5555555556, 0.3555555556], atol=1e-10)


def test_pfsp_variance_and_power_and_uniform_weights():
    variance = OpponentSampler("pfsp", seed=0, decay=1.0, pfsp="variance")
    _table(variance)
    # x (1 - x): 0.1875, 0.234375, 0.25; sum 0.671875
    np.testing.assert_allclose(variance.weights([0, 5, 10]), np.array([0.1875, 0.234375, 0.25]) / 0.671875)
    linear = OpponentSampler("pfsp", seed=0, decay=1.0, power=1.0)
    _table(linear)
    np.testing.assert_allclose(linear.weights([0, 5, 10]), np.array([0.25, 0.625, 0.5]) / 1.375)
    uniform = OpponentSampler("uniform", seed=0)
    _table(uniform)
    np.testing.assert_allclose(uniform.weights([0, 5, 10]), [1 / 3] * 3)


def test_scores_are_discounted_by_decay_per_game():
    sampler = OpponentSampler("pfsp", seed=0, decay=0.9)
    sampler.record(3, 1.0)
    sampler.record(3, 0.0)  # games 0.9 + 1 = 1.9, points 0.9 + 0 = 0.9
    assert sampler.score(3) == pytest.approx(0.9 / 1.9, rel=1e-15)


def test_a_pool_the_learner_beats_entirely_is_drawn_uniformly():
    sampler = OpponentSampler("pfsp", seed=0, decay=1.0)
    sampler.record(0, 1.0)
    sampler.record(1, 1.0)
    np.testing.assert_allclose(sampler.weights([0, 1]), [0.5, 0.5])


def test_draws_follow_the_weights_and_pool_size_keeps_the_latest():
    sampler = OpponentSampler("pfsp", seed=1, decay=1.0, pool_size=3)
    _table(sampler)
    pool = [99, 0, 5, 10]  # 99 is older than the latest 3
    assert sampler.eligible(pool) == [0, 5, 10]
    draws = [sampler.draw(pool, sides=2) for _ in range(20_000)]
    opponents = np.array([o for _, o in draws])
    sides = np.array([s for s, _ in draws])
    frequencies = [(opponents == s).mean() for s in (0, 5, 10)]
    np.testing.assert_allclose(frequencies, [0.0888889, 0.5555556, 0.3555556], atol=0.012)  # > 3 sigma
    assert not (opponents == 99).any()
    assert abs(sides.mean() - 0.5) < 0.012


def test_self_play_share_draws_the_current_policy():
    sampler = OpponentSampler("uniform", seed=2, self_play=0.25)
    opponents = np.array([sampler.draw([0, 1], sides=2)[1] for _ in range(20_000)])
    assert abs((opponents == CURRENT).mean() - 0.25) < 0.01


def test_state_round_trip_continues_the_same_draws():
    sampler = OpponentSampler("pfsp", seed=3, decay=0.95)
    _table(sampler)
    for _ in range(7):
        sampler.draw([0, 5, 10], sides=3)
    state = sampler.state_dict()
    after = [sampler.draw([0, 5, 10], sides=3) for _ in range(50)]
    restored = OpponentSampler("pfsp", seed=999, decay=0.95)
    restored.load_state_dict(state)
    assert [restored.score(s) for s in (0, 5, 10)] == [OpponentSampler.score(sampler, s) for s in (0, 5, 10)]
    assert [restored.draw([0, 5, 10], sides=3) for _ in range(50)] == after


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="league.opponents 'latest' draws no snapshots"):
        OpponentSampler("latest", seed=0)
