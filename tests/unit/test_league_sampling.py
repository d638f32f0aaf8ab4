"""The league's opponent sampler: PFSP's weights on a hand-made table, the plans copies draw by, its state."""

import numpy as np
import pytest

from marl_ppo.league.sampling import CURRENT, DrawPlan, OpponentSampler, copy_generator


def _table(sampler):
    """Snapshot 0: 3 wins in 4; snapshot 5: a win, a draw and 2 losses; snapshot 10: not played."""
    for score in (1, 1, 0, 1):
        sampler.record(0, score)
    for points in (1.0, 0.5, 0.0, 0.0):
        sampler.record(5, points)


def test_pfsp_hard_weights_equal_the_formula_on_a_hand_made_table():
    sampler = OpponentSampler("pfsp", decay=1.0, power=2.0)
    _table(sampler)
    assert [sampler.score(s) for s in (0, 5, 10)] == [0.75, 0.375, 0.5]
    # (1 - x)^2: 0.0625, 0.390625, 0.25; sum 0.703125
    expected = np.array([0.0625, 0.390625, 0.25]) / 0.703125
    np.testing.assert_allclose(sampler.weights([0, 5, 10]), expected, rtol=1e-15)
    np.testing.assert_allclose(expected, [0.0888888889, 0.5555555556, 0.3555555556], atol=1e-10)


def test_pfsp_variance_and_power_and_uniform_weights():
    variance = OpponentSampler("pfsp", decay=1.0, pfsp="variance")
    _table(variance)
    # x (1 - x): 0.1875, 0.234375, 0.25; sum 0.671875
    np.testing.assert_allclose(variance.weights([0, 5, 10]), np.array([0.1875, 0.234375, 0.25]) / 0.671875)
    linear = OpponentSampler("pfsp", decay=1.0, power=1.0)
    _table(linear)
    np.testing.assert_allclose(linear.weights([0, 5, 10]), np.array([0.25, 0.625, 0.5]) / 1.375)
    uniform = OpponentSampler("uniform")
    _table(uniform)
    np.testing.assert_allclose(uniform.weights([0, 5, 10]), [1 / 3] * 3)


def test_scores_are_discounted_by_decay_per_game():
    sampler = OpponentSampler("pfsp", decay=0.9)
    sampler.record(3, 1.0)
    sampler.record(3, 0.0)  # games 0.9 + 1 = 1.9, points 0.9 + 0 = 0.9
    assert sampler.score(3) == pytest.approx(0.9 / 1.9, rel=1e-15)


def test_a_pool_the_learner_beats_entirely_is_drawn_uniformly():
    sampler = OpponentSampler("pfsp", decay=1.0)
    sampler.record(0, 1.0)
    sampler.record(1, 1.0)
    np.testing.assert_allclose(sampler.weights([0, 1]), [0.5, 0.5])


def test_draws_follow_the_weights_and_pool_size_keeps_the_latest():
    sampler = OpponentSampler("pfsp", decay=1.0, pool_size=3)
    _table(sampler)
    pool = [99, 0, 5, 10]  # 99 is older than the latest 3
    assert sampler.eligible(pool) == [0, 5, 10]
    plan = sampler.plan(pool)
    assert plan.snapshots == (0, 5, 10) and plan.self_play == 0.0
    np.testing.assert_allclose(plan.probabilities, [0.0625 / 0.703125, 0.390625 / 0.703125, 0.25 / 0.703125])
    rng = copy_generator(1, 0)
    draws = [plan.draw(rng, sides=2) for _ in range(20_000)]
    opponents = np.array([o for _, o in draws])
    sides = np.array([s for s, _ in draws])
    frequencies = [(opponents == s).mean() for s in (0, 5, 10)]
    np.testing.assert_allclose(frequencies, [0.0888889, 0.5555556, 0.3555556], atol=0.012)  # > 3 sigma
    assert not (opponents == 99).any()
    assert abs(sides.mean() - 0.5) < 0.012


def test_a_draw_is_the_side_then_the_self_play_coin_then_the_snapshot_from_the_copys_generator():
    plan = DrawPlan((0, 5, 10), (0.2, 0.3, 0.5), self_play=0.25)
    replay = np.random.default_rng([7, 0x1EA6, 3])  # copy 3's stream in a run of seed 7, by hand
    rng = copy_generator(7, 3)
    for _ in range(200):
        side = int(replay.integers(3))
        if replay.random() < 0.25:
            expected = (side, CURRENT)
        else:
            expected = (side, (0, 5, 10)[int(replay.choice(3, p=np.array([0.2, 0.3, 0.5])))])
        assert plan.draw(rng, sides=3) == expected
    assert copy_generator(7, 3).random() != copy_generator(7, 4).random()  # each copy its own stream


def test_self_play_share_draws_the_current_policy():
    plan = OpponentSampler("uniform", self_play=0.25).plan([0, 1])
    rng = copy_generator(2, 0)
    opponents = np.array([plan.draw(rng, sides=2)[1] for _ in range(20_000)])
    assert abs((opponents == CURRENT).mean() - 0.25) < 0.01


def test_state_round_trip_keeps_the_scores_and_the_plan():
    sampler = OpponentSampler("pfsp", decay=0.95)
    _table(sampler)
    restored = OpponentSampler("pfsp", decay=0.95)
    restored.load_state_dict(sampler.state_dict())
    assert [restored.score(s) for s in (0, 5, 10)] == [sampler.score(s) for s in (0, 5, 10)]
    assert restored.plan([0, 5, 10]) == sampler.plan([0, 5, 10])
    old = {**sampler.state_dict(), "rng": np.random.default_rng(0).bit_generator.state}
    restored.load_state_dict(old)  # a checkpoint from when the copies shared one generator
    assert restored.plan([0, 5, 10]) == sampler.plan([0, 5, 10])


def test_an_unknown_rule_is_refused():
    with pytest.raises(ValueError, match="league.opponents 'latest' draws no snapshots"):
        OpponentSampler("latest")
