"""Action heads against torch.distributions: log-probabilities, exact entropies, sampling frequencies."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical as TorchCategorical
from torch.distributions import Normal

from marl_ppo.fast.distributions import Categorical, DiagGaussian, MultiCategorical
from marl_ppo.models.distributions import head_size, make_distribution


def test_categorical_matches_torch_and_samples_by_probability():
    torch.manual_seed(0)
    logits = torch.randn(4, 3, 5)
    ours, reference = Categorical(logits), TorchCategorical(logits=logits)
    actions = reference.sample()
    torch.testing.assert_close(ours.log_prob(actions), reference.log_prob(actions))
    torch.testing.assert_close(ours.entropy(), reference.entropy())
    probs = torch.tensor([0.1, 0.2, 0.7])
    draws = Categorical(probs.log().expand(20000, 3)).sample()
    frequencies = torch.bincount(draws, minlength=3).float() / 20000
    torch.testing.assert_close(frequencies, probs, atol=0.015, rtol=0)
    assert Categorical(probs.log()).mode().item() == 2


def test_multi_categorical_is_the_sum_of_its_parts():
    torch.manual_seed(1)
    logits = torch.randn(6, 2, 3 + 4)
    ours = MultiCategorical(logits, [3, 4])
    first, second = TorchCategorical(logits=logits[..., :3]), TorchCategorical(logits=logits[..., 3:])
    actions = torch.stack([first.sample(), second.sample()], dim=-1)
    torch.testing.assert_close(
        ours.log_prob(actions), first.log_prob(actions[..., 0]) + second.log_prob(actions[..., 1])
    )
    torch.testing.assert_close(ours.entropy(), first.entropy() + second.entropy())
    assert ours.sample().shape == (6, 2, 2)


def test_diag_gaussian_matches_torch():
    torch.manual_seed(2)
    mean, log_std = torch.randn(5, 3, 2), torch.randn(3, 2)
    ours, reference = DiagGaussian(mean, log_std), Normal(mean, log_std.exp())
    actions = reference.sample()
    torch.testing.assert_close(ours.log_prob(actions), reference.log_prob(actions).sum(-1))
    torch.testing.assert_close(ours.entropy(), reference.entropy().sum(-1))


@pytest.mark.parametrize(
    ("space", "size", "kind"),
    [
        (gym.spaces.Discrete(4), 4, Categorical),
        (gym.spaces.MultiDiscrete([3, 2]), 5, MultiCategorical),
        (gym.spaces.Box(-1, 1, (2,), np.float32), 2, DiagGaussian),
    ],
)
def test_heads_fit_their_spaces(space, size, kind):
    assert head_size(space) == size
    assert isinstance(make_distribution(space, torch.zeros(1, 2, size), torch.zeros(1, size)), kind)
