"""GAE against hand-computed tables, the truncation bootstrap, and shape checks."""

import pytest
import torch

from marl_ppo.algo.gae import compute_gae, fold_turns


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    terminated = _t(terminated, torch.bool)
    done = terminated | _t(truncated, torch.bool)
    return compute_gae(_t(rewards), _t(values), _t(next_values), terminated, done, gamma=gamma, lam=lam)


# r = [1, 1, 1], V = 0, gamma = 0.5, lambda = 1 (worked by hand):
#   no done:                       A = [1 + .5*1.5, 1 + .5*1, 1]          = [1.75, 1.5, 1]
#   truncated at t=1, V(final)=2:  A1 = 1 + .5*2 = 2 (trace cut), A0 = 1 + .5*2 = 2
#   terminated at t=1:             A1 = 1 (no bootstrap),          A0 = 1 + .5*1 = 1.5
@pytest.mark.parametrize(
    ("next_values", "terminated", "truncated", "expected"),
    [
        ([0, 0, 0], [0, 0, 0], [0, 0, 0], [1.75, 1.5, 1.0]),
        ([0, 2, 0], [0, 0, 0], [0, 1, 0], [2.0, 2.0, 1.0]),
        ([0, 2, 0], [0, 1, 0], [0, 0, 0], [1.5, 1.0, 1.0]),
    ],
    ids=["no-done", "truncated-bootstrap", "terminated"],
)
def test_gae_hand_table(next_values, terminated, truncated, expected):
    adv, ret = _gae([1, 1, 1], [0, 0, 0], next_values, terminated, truncated, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv, _t(expected))
    torch.testing.assert_close(ret, _t(expected))  # V = 0, so returns equal advantages


def test_gae_hand_table_with_values_and_lambda():
    # gamma = lambda = 0.5, V = [1, 2, 4], value after the last step 8, no done:
    #   deltas: d2 = 2 + .5*8 - 4 = 2, d1 = 0 + .5*4 - 2 = 0, d0 = 1 + .5*2 - 1 = 1
    #   A2 = 2, A1 = 0 + .25*2 = 0.5, A0 = 1 + .25*0.5 = 1.125; returns = A + V
    adv, ret = _gae([1, 0, 2], [1, 2, 4], [2, 4, 8], [0, 0, 0], [0, 0, 0], gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, _t([1.125, 0.5, 2.0]))
    torch.testing.assert_close(ret, _t([2.125, 2.5, 6.0]))


def test_gae_matches_scalar_loop_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    steps, envs, agents, gamma, lam = 17, 4, 3, 0.97, 0.9
    rewards = torch.randn(steps, envs, agents, generator=generator)
    values = torch.randn(steps, envs, agents, generator=generator)
    next_values = torch.randn(steps, envs, agents, generator=generator)
    terminated = torch.rand(steps, envs, agents, generator=generator) < 0.1
    done = terminated | (torch.rand(steps, envs, agents, generator=generator) < 0.1)
    adv, ret = compute_gae(rewards, values, next_values, terminated, done, gamma=gamma, lam=lam)
    for e in range(envs):
        for a in range(agents):
            running = 0.0
            for t in reversed(range(steps)):
                bootstrap = 0.0 if terminated[t, e, a] else float(next_values[t, e, a])
                delta = float(rewards[t, e, a]) + gamma * bootstrap - float(values[t, e, a])
                running = delta + (0.0 if done[t, e, a] else gamma * lam * running)
                assert adv[t, e, a].item() == pytest.approx(running, abs=1e-5)
    torch.testing.assert_close(ret, adv + values)


def test_fold_turns_is_the_one_step_transition_when_everyone_always_acts():
    generator = torch.Generator().manual_seed(3)
    steps, width = 9, 5
    rewards, values, finals = (torch.randn(steps, width, generator=generator) for _ in range(3))
    last = torch.randn(width, generator=generator)
    terminated = torch.rand(steps, width, generator=generator) < 0.15
    truncated = ~terminated & (torch.rand(steps, width, generator=generator) < 0.15)
    alive = torch.ones(steps, width, dtype=torch.bool)
    folded = fold_turns(rewards, values, last, finals, terminated, truncated, alive)
    following = torch.cat([values[1:], last[None]])
    expected_next = torch.where(truncated, finals, torch.where(terminated, 0.0, following))
    torch.testing.assert_close(folded.rewards, rewards)
    torch.testing.assert_close(folded.next_values, expected_next)
    assert torch.equal(folded.terminated, terminated) and torch.equal(folded.done, terminated | truncated)


def test_turn_based_game_by_hand():
    # agent a acts at t = 0, 2 and b at t = 1, 3; b's move at t = 3 wins: b +1, a -1, both terminated.
    # gamma = 0.5, lambda = 1, V_a(t=0) = 0.5, V_a(2) = 0.2, V_b(1) = 0.4, V_b(3) = 0.6.
    #   a at t=2: r = 0 + (-1 at t=3, its opponent's move), terminated: A = -1 - 0.2 = -1.2
    #   a at t=0: r = 0 + 0, next acting step t=2: delta = 0.5*0.2 - 0.5 = -0.4, A = -0.4 + 0.5*(-1.2) = -1.0
    #   b at t=3: A = 1 - 0.6 = 0.4; b at t=1: delta = 0.5*0.6 - 0.4 = -0.1, A = -0.1 + 0.5*0.4 = 0.1
    alive = _t([[1, 0], [0, 1], [1, 0], [0, 1]], torch.bool)
    rewards = _t([[0, 0], [0, 0], [0, 0], [-1, 1]])
    values = _t([[0.5, 9], [9, 0.4], [0.2, 9], [9, 0.6]])  # 9: values of waiting steps, never used
    terminated = _t([[0, 0], [0, 0], [0, 0], [1, 1]], torch.bool)
    folded = fold_turns(
        rewards, values, _t([7, 7]), torch.zeros(4, 2), terminated, torch.zeros_like(alive), alive
    )
    adv, _ = compute_gae(
        folded.rewards,
        values,
        folded.next_values,
        folded.terminated,
        folded.done,
        gamma=0.5,
        lam=1.0,
        alive=alive,
    )
    torch.testing.assert_close(adv[alive], _t([-1.0, 0.1, -1.2, 0.4]))


def test_truncation_while_waiting_bootstraps_from_the_final_value():
    # one agent acts at t = 0 only; the episode is truncated at t = 2 with V(final) = 4; gamma = 0.5
    alive = _t([[1], [0], [0]], torch.bool)
    truncated = _t([[0], [0], [1]], torch.bool)
    folded = fold_turns(
        _t([[1.0], [2.0], [3.0]]),
        _t([[0.0], [9], [9]]),
        _t([9.0]),
        _t([[0.0], [0.0], [4.0]]),
        torch.zeros_like(alive),
        truncated,
        alive,
    )
    assert folded.rewards[0].item() == 6.0 and folded.next_values[0].item() == 4.0
    assert folded.done[0] and not folded.terminated[0]


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae(
            torch.zeros(3, 2),
            torch.zeros(3, 1),
            torch.zeros(3, 2),
            torch.zeros(3, 2, dtype=torch.bool),
            torch.zeros(3, 2, dtype=torch.bool),
            gamma=0.9,
            lam=0.9,
        )
    with pytest.raises(ValueError, match="alive has shape"):
        zeros, flags = torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool)
        compute_gae(
            zeros, zeros, zeros, flags, flags, gamma=0.9, lam=0.9, alive=torch.ones(3, 1, dtype=torch.bool)
        )
