"""Action masks: a masked action is never sampled or chosen, in rollouts, updates or greedy play."""

import gymnasium as gym
import pytest
import torch
from marl_ppo_examples.masked_guess import MaskedGuessEnv
from pettingzoo.test import parallel_api_test

from marl_ppo.config import load_config
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.models.distributions import make_distribution
from marl_ppo.run.loop import train

VARIANTS = [
    {"mask_in": "obs"},
    {"mask_in": "info"},
    {"mask_in": "obs", "multi": True},
    {"mask_in": "info", "multi": True},
]


@pytest.mark.parametrize("kwargs", VARIANTS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_masked_guess_passes_the_api_test(kwargs):
    parallel_api_test(MaskedGuessEnv(**kwargs, strict=False), num_cycles=30)


@pytest.mark.parametrize("kwargs", VARIANTS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_spec_finds_the_masks(kwargs):
    (group,) = build_team_spec(MaskedGuessEnv(**kwargs), "masked").groups
    assert group.mask_source == kwargs["mask_in"]
    assert group.mask_dim == (6 if kwargs.get("multi") else 5)
    assert group.obs_dim == group.mask_dim  # the Dict's mask is not part of the network input


@pytest.mark.parametrize("kwargs", VARIANTS, ids=lambda k: "-".join(f"{v}" for v in k.values()))
def test_training_never_sends_a_masked_action_and_learns_to_pick_the_best(tmp_path, kwargs):
    flow = "{" + ", ".join(f"{k}: {v}" for k, v in kwargs.items()) + "}"
    config = load_config(
        None,
        [
            "env.id=envs/masked_guess_v0",
            f"env.kwargs={flow}",
            "rollout.num_envs=4",
            "rollout.rollout_steps=16",
            "total_steps=3200",
            "log.progress=false",
            "ppo.pi_lr=3e-3",
            "model.hidden_sizes=[32]",
            "ppo.entropy_coef=0.0",
            "ppo.train_pi_iters=4",
            "ppo.train_vf_iters=4",
            "ppo.num_minibatches=2",
        ],
    )
    result = train(config, tmp_path)  # the env raises on any masked action
    chance = 0.58 if kwargs.get("multi") else 0.39  # measured reward of uniform choices among allowed actions
    assert result.agent_return_mean / 8 > chance + 0.2, "the policy should prefer the highest allowed action"


def test_masked_categorical_never_samples_or_picks_a_masked_action():
    torch.manual_seed(0)
    logits = torch.randn(2000, 3, 6) * 5
    mask = torch.rand(2000, 3, 6) < 0.4
    mask[..., 0] |= ~mask[..., :2].any(-1)  # at least one allowed action in each part of [2, 4]
    mask[..., 2] |= ~mask[..., 2:].any(-1)
    dist = make_distribution(gym.spaces.Discrete(6), logits, None, mask)
    for actions in (dist.sample(), dist.mode()):
        assert mask.gather(-1, actions.unsqueeze(-1)).all()
    assert torch.isfinite(dist.entropy()).all()
    assert (dist.log_prob(dist.sample()) > -50).all()
    multi = make_distribution(gym.spaces.MultiDiscrete([2, 4]), logits, None, mask)
    for actions in (multi.sample(), multi.mode()):
        assert mask[..., :2].gather(-1, actions[..., :1]).all()
        assert mask[..., 2:].gather(-1, actions[..., 1:]).all()
