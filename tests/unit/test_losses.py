"""The pure maths against hand-computed numbers: PPO's clipped policy loss, the value loss (squared,
Huber, clipped), advantage normalization over live samples, and ValueNorm's running statistics."""

import math

import pytest
import torch

from marl_ppo.algo.losses import (
    approx_kl,
    normalize_advantages,
    normalize_advantages_per_agent,
    policy_loss,
    value_loss,
)
from marl_ppo.models.value_norm import ValueNorm

CLIP = 0.2


def _policy_case():
    """Six samples laid out (N=3, A=2); the last is dead and would dominate every term if it counted.

    ratio  advantage  unclipped  clipped        min    why
    1.1     2          2.2       1.1*2 = 2.2    2.2    inside [0.8, 1.2]
    1.5     1          1.5       1.2*1 = 1.2    1.2    above the clip, A > 0: clipped
    0.5    -1         -0.5       0.8*-1 = -0.8  -0.8   below the clip, A < 0: clipped
    1.5    -2         -3.0       1.2*-2 = -2.4  -3.0   above the clip, A < 0: unclipped (pessimistic)
    0.5     1          0.5       0.8*1 = 0.8    0.5    below the clip, A > 0: unclipped (pessimistic)
    3.0   100          (dead)
    """
    ratio = torch.tensor([[1.1, 1.5], [0.5, 1.5], [0.5, 3.0]])
    advantages = torch.tensor([[2.0, 1.0], [-1.0, -2.0], [1.0, 100.0]])
    alive = torch.tensor([[True, True], [True, True], [True, False]])
    logp_old = torch.full((3, 2), -1.0)
    logp = (logp_old + ratio.log()).requires_grad_()
    return logp, logp_old, advantages, alive, ratio


def test_clipped_policy_loss_takes_the_pessimistic_term_of_each_live_sample():
    logp, logp_old, advantages, alive, _ = _policy_case()
    terms = policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP)
    assert terms.loss.item() == pytest.approx(-(2.2 + 1.2 - 0.8 - 3.0 + 0.5) / 5, abs=1e-6)  # -0.02
    assert terms.clipfrac.item() == pytest.approx(4 / 5)  # every live ratio but 1.1 left [0.8, 1.2]
    kl = [(r - 1) - math.log(r) for r in (1.1, 1.5, 0.5, 1.5, 0.5)]
    assert terms.approx_kl.item() == pytest.approx(sum(kl) / 5)  # 0.11601


def test_clipped_samples_and_dead_samples_get_no_gradient():
    logp, logp_old, advantages, alive, ratio = _policy_case()
    policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP).loss.backward()
    # d(-ratio * A / 5) / d logp = -ratio * A / 5 where the unclipped term is taken, else 0
    expected = torch.tensor([[-1.1 * 2 / 5, 0.0], [0.0, 1.5 * 2 / 5], [-0.5 * 1 / 5, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    assert ratio[2, 1] == pytest.approx(3.0)  # the dead sample's ratio was far outside the clip


def test_policy_loss_divides_by_the_given_count_and_is_zero_with_no_live_sample():
    logp, logp_old, advantages, alive, _ = _policy_case()
    terms = policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP, count=torch.tensor(10.0))
    assert terms.loss.item() == pytest.approx(-0.1 / 10, abs=1e-6)
    nobody = torch.zeros_like(alive)
    empty = policy_loss(logp, logp_old, advantages, nobody, clip_ratio=CLIP)
    assert (empty.loss.item(), empty.clipfrac.item(), empty.approx_kl.item()) == (0.0, 0.0, 0.0)


def test_weights_scale_each_samples_clipped_term_and_none_is_the_unweighted_loss():
    """Decoupled PPO's weights multiply each live sample's pessimistic term (2.2, 1.2, -0.8, -3.0, 0.5);
    weights None is PPO's loss exactly, and weights of 1 give the same numbers bit for bit."""
    logp, logp_old, advantages, alive, ratio = _policy_case()
    plain = policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP)
    explicit = torch.min(ratio * advantages, ratio.clamp(1 - CLIP, 1 + CLIP) * advantages)[alive].mean()
    assert plain.loss.item() == pytest.approx(-explicit.item(), abs=1e-7)
    ones = policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP, weights=torch.ones(3, 2))
    assert torch.equal(ones.loss, plain.loss)
    weights = torch.tensor([[0.5, 1.0], [0.25, 1.0], [2.0, 1000.0]])  # the dead sample's weight is ignored
    weighted = policy_loss(logp, logp_old, advantages, alive, clip_ratio=CLIP, weights=weights)
    assert weighted.loss.item() == pytest.approx(
        -(0.5 * 2.2 + 1.2 - 0.25 * 0.8 - 3.0 + 2.0 * 0.5) / 5, abs=1e-6
    )
    # the diagnostics describe the ratio, whatever the weights
    assert (weighted.approx_kl, weighted.clipfrac) == (plain.approx_kl, plain.clipfrac)
    weighted.loss.backward()
    expected = torch.tensor([[-0.5 * 1.1 * 2 / 5, 0.0], [0.0, 1.5 * 2 / 5], [-2.0 * 0.5 * 1 / 5, 0.0]])
    torch.testing.assert_close(logp.grad, expected)


def test_approx_kl_is_the_k3_estimate_over_live_samples():
    logp_old = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    logp = logp_old + torch.tensor([[0.1, -0.2], [0.0, 5.0]])
    alive = torch.tensor([[True, True], [True, False]])
    k3 = [math.exp(d) - 1 - d for d in (0.1, -0.2, 0.0)]
    assert approx_kl(logp, logp_old, alive).item() == pytest.approx(sum(k3) / 3, rel=1e-5)  # 0.0079672
    assert approx_kl(logp_old, logp_old, alive).item() == 0.0


def test_value_loss_squared_and_huber():
    values = torch.tensor([0.5, 3.0, -2.0, 50.0])
    targets = torch.zeros(4)
    alive = torch.tensor([True, True, True, False])
    squared = value_loss(values, values, targets, alive, huber_delta=None, clip=None)
    assert squared.item() == pytest.approx((0.5 * 0.25 + 0.5 * 9 + 0.5 * 4) / 3)  # 2.2083
    # Huber, delta 1: 0.5 x^2 inside |x| < 1, else |x| - 0.5 (delta * (|x| - delta / 2))
    huber = value_loss(values, values, targets, alive, huber_delta=1.0, clip=None)
    assert huber.item() == pytest.approx((0.125 + 2.5 + 1.5) / 3)  # 1.375
    wide = value_loss(values, values, targets, alive, huber_delta=10.0, clip=None)
    assert wide.item() == pytest.approx(squared.item())  # every live error is inside delta


def test_value_clipping_is_pessimistic():
    """Old value 1.0 and clip 0.2: the clipped value is the new one moved at most 0.2 from 1.0.

    new   target  unclipped 0.5 (new-t)^2   clipped value  0.5 (clipped-t)^2   max
    1.5   2.0     0.125                     1.2            0.32                0.32  (clipped)
    1.5   1.0     0.125                     1.2            0.02                0.125 (unclipped)
    1.1   3.0     1.805                     1.1            1.805               1.805 (inside the clip)
    """
    values = torch.tensor([1.5, 1.5, 1.1, -40.0], requires_grad=True)
    values_old = torch.tensor([1.0, 1.0, 1.0, 1.0])
    targets = torch.tensor([2.0, 1.0, 3.0, 0.0])
    alive = torch.tensor([True, True, True, False])
    loss = value_loss(values, values_old, targets, alive, huber_delta=None, clip=0.2)
    assert loss.item() == pytest.approx((0.32 + 0.125 + 1.805) / 3)  # 0.75
    loss.backward()
    # the first sample's loss is the clipped value's, which does not move with the new value
    torch.testing.assert_close(values.grad, torch.tensor([0.0, 0.5 / 3, -1.9 / 3, 0.0]))


def test_advantages_are_standardized_over_live_samples_and_dead_ones_are_shifted_alike():
    advantages = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    alive = torch.tensor([[True, True], [True, False]])
    normalized = normalize_advantages(advantages, alive)
    std = math.sqrt(2 / 3)  # live samples 1, 2, 3: mean 2, population variance 2/3
    expected = torch.tensor([[-1 / std, 0.0], [1 / std, 98 / std]])  # live: -1.2247, 0, 1.2247
    torch.testing.assert_close(normalized, expected)
    live = normalized[alive]
    assert live.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert live.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)
    # the dead sample is neither zeroed nor left as it was: the same shift and scale apply to it
    assert normalized[1, 1].item() == pytest.approx(98 / std) and normalized[1, 1].item() != 100.0


def test_per_agent_normalization_standardizes_each_agents_live_samples():
    """Agent 0 lives at 1, 2, 3 (mean 2, variance 2/3); agent 1 at 10 and 30 (mean 20, variance 100),
    its dead 100 shifted and scaled alike; agent 2 is constant and becomes zeros."""
    advantages = torch.tensor([[1.0, 10.0, 4.0], [2.0, 30.0, 4.0], [3.0, 100.0, 4.0]])
    alive = torch.tensor([[True, True, True], [True, True, True], [True, False, True]])
    normalized = normalize_advantages_per_agent(advantages, alive)
    std = math.sqrt(2 / 3)
    expected = torch.tensor([[-1 / std, -1.0, 0.0], [0.0, 1.0, 0.0], [1 / std, 8.0, 0.0]])
    torch.testing.assert_close(normalized, expected)
    # one agent: the group's normalization
    torch.testing.assert_close(
        normalize_advantages_per_agent(advantages[:, :1], alive[:, :1]),
        normalize_advantages(advantages[:, :1], alive[:, :1]),
    )


def test_constant_advantages_normalize_to_zero_not_nan():
    normalized = normalize_advantages(torch.full((4, 1), 5.0), torch.ones(4, 1, dtype=torch.bool))
    assert torch.equal(normalized, torch.zeros(4, 1))


def test_value_norm_keeps_the_exact_running_mean_and_variance():
    norm = ValueNorm(enabled=True)
    assert (norm.mean.item(), norm.var.item(), norm.count.item()) == (0.0, 1.0, 0.0)
    norm.update(torch.tensor([1.0, 2.0, 3.0]))
    assert norm.count.item() == 3
    assert norm.mean.item() == pytest.approx(2.0)
    assert norm.var.item() == pytest.approx(2 / 3)  # population variance, not the unbiased 1.0
    norm.update(torch.tensor([[4.0], [6.0]]))  # any shape; merged by the parallel-variance formula
    # all five: mean 16/5 = 3.2, E[x^2] = 66/5 = 13.2, var = 13.2 - 3.2^2 = 2.96
    assert norm.count.item() == 5
    assert norm.mean.item() == pytest.approx(3.2)
    assert norm.var.item() == pytest.approx(2.96)
    # exact statistics with no exponential decay, so no debiasing step: after the batches, the
    # statistics are those of all targets seen, whatever the batch sizes
    pooled = torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
    assert norm.mean.item() == pytest.approx(pooled.mean().item())
    assert norm.std.item() == pytest.approx(pooled.std(unbiased=False).item())
    assert norm.mean.dtype == torch.float64


def test_value_norm_normalize_and_denormalize_round_trip():
    norm = ValueNorm(enabled=True)
    norm.update(torch.tensor([1.0, 2.0, 3.0, 4.0, 6.0]))
    returns = torch.tensor([3.2, 3.2 + math.sqrt(2.96), -10.0])
    normalized = norm.normalize(returns)
    assert normalized.dtype == torch.float32
    torch.testing.assert_close(normalized[:2], torch.tensor([0.0, 1.0]))
    assert normalized[2].item() == pytest.approx((-10 - 3.2) / math.sqrt(2.96), rel=1e-6)
    torch.testing.assert_close(norm.denormalize(normalized), returns)


def test_value_norm_edge_cases():
    norm = ValueNorm(enabled=True, var_floor=1e-5)
    norm.update(torch.tensor([]))  # nothing to merge
    assert norm.count.item() == 0
    norm.update(torch.full((4,), 5.0))
    assert norm.var.item() == 0.0 and norm.std.item() == pytest.approx(math.sqrt(1e-5))  # floor
    assert ValueNorm(enabled=True).var_floor == 1e-2  # MAPPO's floor by default
    off = ValueNorm(enabled=False)
    off.update(torch.tensor([10.0, 20.0]))
    values = torch.tensor([1.0, -2.0])
    assert off.count.item() == 0
    assert torch.equal(off.normalize(values), values) and torch.equal(off.denormalize(values), values)


@pytest.mark.parametrize(("var_floor", "expected"), [(1e-2, 9.0), (1e-5, 183.5)])
def test_value_norm_floor_on_a_sparse_return_stream(var_floor, expected):
    """100 batches of 1,000 zero returns, then one batch with three returns of 0.9 among zeros.

    The running variance is then 0.81 * 3 / 100,999 = 2.4e-5 (std 0.0049): above the 1e-5 floor, so
    that floor lets a 0.9 return become a target of 183.5, where MAPPO's 1e-2 (std >= 0.1) gives 9.
    """
    norm = ValueNorm(enabled=True, var_floor=var_floor)
    for _ in range(100):
        norm.update(torch.zeros(1000))
    norm.update(torch.tensor([0.9, 0.9, 0.9] + [0.0] * 996))
    assert norm.var.item() == pytest.approx(0.81 * 3 / 100_999 - (2.7 / 100_999) ** 2)
    target = norm.normalize(torch.tensor([0.9])).item()
    assert target == pytest.approx(expected, rel=1e-3)
