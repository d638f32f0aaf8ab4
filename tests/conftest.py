"""Shared fixtures: small configs and a run directory."""

from pathlib import Path

import pytest

from marl_ppo.config import load_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def tiny_overrides():
    """Overrides that make any experiment run in a second or two."""
    return [
        "num_envs=2",
        "rollout_steps=25",
        "total_steps=100",
        "log.progress=false",
        "ppo.train_pi_iters=2",
        "ppo.train_vf_iters=2",
        "ppo.num_minibatches=2",
        "model.hidden_sizes=[16,16]",
    ]


@pytest.fixture
def spread_config(tiny_overrides):
    return load_config(ROOT / "experiments/mpe/simple_spread.yaml", tiny_overrides)
