"""GAE against hand-computed tables, the truncation bootstrap, and shape checks."""

import pytest
import torch

from marl_ppo.rollout.gae import bootstrap_values, compute_gae


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


def test_bootstrap_values_uses_final_value_only_at_truncation():
    values = _t([[1.0], [2.0], [3.0]])
    final = _t([[10.0], [20.0], [30.0]])
    truncated = _t([[False], [True], [False]], torch.bool)
    next_values = bootstrap_values(values, _t([4.0]), final, truncated)
    torch.testing.assert_close(next_values, _t([[2.0], [20.0], [4.0]]))


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
    with pytest.raises(ValueError, match="last_values"):
        bootstrap_values(
            torch.zeros(3, 2), torch.zeros(3), torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool)
        )
