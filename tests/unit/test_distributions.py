"""Action heads: each space's torch distribution, its masks, its products, and its sampling frequencies."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from marl_ppo.models.distributions import head_size, make_distribution


def test_a_masked_categorical_samples_by_the_allowed_probabilities_and_never_a_masked_action():
    logits = torch.tensor([[[0.0, 1.0, 2.0, -1.0]]]).expand(20000, 1, 4)
    mask = torch.tensor([True, True, True, False]).expand(20000, 1, 4)
    torch.manual_seed(3)
    dist = make_distribution(gym.spaces.Discrete(4), logits, None, mask)
    frequencies = torch.bincount(dist.sample().flatten(), minlength=4).double() / 20000
    expected = torch.softmax(torch.tensor([0.0, 1.0, 2.0]), 0)
    assert frequencies[3] == 0.0
    torch.testing.assert_close(frequencies[:3].float(), expected, atol=0.012, rtol=0)
    assert dist.mode()[0].item() == 2
    p = expected.double()
    torch.testing.assert_close(dist.entropy()[0, 0].double(), -(p * p.log()).sum(), rtol=1e-6, atol=0)
    assert dist.log_prob(torch.tensor([[3]]).expand(20000, 1))[0, 0] < -1e8  # masked: probability 0


def test_multi_discrete_log_probability_and_entropy_are_the_sums_of_its_parts():
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25, 0.1, 0.9]]]))  # parts of 3 and 2 actions
    dist = make_distribution(gym.spaces.MultiDiscrete([3, 2]), logits, None)
    log_prob = dist.log_prob(torch.tensor([[[0, 1]]]))
    torch.testing.assert_close(log_prob, torch.tensor([[math.log(0.5) + math.log(0.9)]]))
    first = -(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25))
    second = -(0.1 * math.log(0.1) + 0.9 * math.log(0.9))
    torch.testing.assert_close(dist.entropy(), torch.tensor([[first + second]]))
    assert dist.sample().shape == (1, 1, 2) and dist.mode().tolist() == [[[0, 1]]]


def test_a_box_action_is_a_diagonal_gaussian_summed_over_its_dimensions():
    mean, log_std = torch.zeros(1, 3, 2), torch.log(torch.tensor([[1.0, 2.0]]))
    dist = make_distribution(gym.spaces.Box(-1, 1, (2,), np.float32), mean, log_std)
    log_prob = dist.log_prob(torch.ones(1, 3, 2))
    expected = -0.5 * (1 + 0.25) - math.log(2.0) - math.log(2 * math.pi)
    torch.testing.assert_close(log_prob, torch.full((1, 3), expected))
    torch.testing.assert_close(dist.entropy(), torch.full((1, 3), 1 + math.log(2 * math.pi) + math.log(2.0)))
    assert torch.equal(dist.mode(), mean)


@pytest.mark.parametrize(
    ("space", "size"),
    [(gym.spaces.Discrete(4), 4), (gym.spaces.MultiDiscrete([3, 2]), 5), (gym.spaces.Box(-1, 1, (2,)), 2)],
)
def test_heads_fit_their_spaces(space, size):
    assert head_size(space) == size
    dist = make_distribution(space, torch.zeros(7, 2, size), torch.zeros(1, size))
    assert dist.log_prob(dist.sample()).shape == dist.entropy().shape == (7, 2)
