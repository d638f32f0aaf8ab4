"""The compiled rollout's episode accounting (`EpisodeTally.account`) sums each copy's rewards from one
episode end to the next as a step-by-step loop does, bit for bit, across rollouts."""

from types import SimpleNamespace

import numpy as np

from marl_ppo.rollout.compiled import EpisodeTally


def _stepwise(returns, lengths, columns, rewards, over, won):
    """The accounting one step at a time: float32 rewards added into float64 totals in step order."""
    steps = over.shape[0]
    team = np.zeros((steps, *returns.shape))
    for name, cols in columns.items():
        team[:, :, cols] = rewards[name]
    ended = []
    for t in range(steps):
        returns += team[t]
        lengths += 1
        for copy in np.flatnonzero(over[t]).tolist():
            ended.append((t, copy, returns[copy].copy(), int(lengths[copy]), bool(won[t, copy])))
        returns[over[t]] = 0.0
        lengths[over[t]] = 0
    return ended


def test_episode_ends_and_running_returns_equal_a_step_by_step_loop_bit_for_bit():
    spec = SimpleNamespace(
        agents=["a0", "b0", "a1"],
        num_agents=3,
        groups=[SimpleNamespace(name="a", agents=["a0", "a1"]), SimpleNamespace(name="b", agents=["b0"])],
    )
    copies, steps = 5, 40
    tally = EpisodeTally(spec, copies)  # type: ignore[arg-type]  # the names the tally reads
    returns, lengths = np.zeros((copies, 3)), np.zeros(copies, dtype=np.int64)
    generator = np.random.default_rng(0)
    for rollout in range(4):
        rewards = {
            "a": generator.normal(size=(steps, copies, 2)).astype(np.float32) * 1e3,
            "b": generator.normal(size=(steps, copies, 1)).astype(np.float32) / 7,
        }
        over = generator.random((steps, copies)) < 0.08
        over[-1, rollout % copies] = rollout % 2 == 0  # an end at the rollout's last step in some
        over[7] = rollout == 1  # every copy at once
        won = generator.random((steps, copies)) < 0.5
        expected = _stepwise(returns, lengths, tally.columns, rewards, over, won)
        got = tally.account(rewards, over, won)
        assert len(got) == len(expected) == int(over.sum())
        for (t, episode), (t_expected, copy, total, length, copy_won) in zip(got, expected, strict=True):
            assert (t, episode.copy, episode.length, episode.won) == (t_expected, copy, length, copy_won)
            assert np.array_equal(episode.agent_returns, total)
        assert np.array_equal(tally.returns, returns) and np.array_equal(tally.lengths, lengths)
