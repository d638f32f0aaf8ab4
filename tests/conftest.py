"""Shared fixtures: small configs and one torch thread (tests/helpers.py holds the helpers)."""

import pytest
import torch

from marl_ppo.config import load_config
from tests.helpers import ROOT


@pytest.fixture
def tiny_overrides():
    """Overrides that make any experiment run in a second or two."""
    return [
        "rollout.num_envs=2",
        "rollout.rollout_steps=25",
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `jax` run last: once JAX is loaded, every worker process this session starts uses
    spawn rather than fork (`marl_ppo.envs.vector.pool.default_start_method`), and tests that run
    before it keep the fork they were written for."""
    items.sort(key=lambda item: item.get_closest_marker("jax") is not None)


@pytest.fixture
def one_thread():
    """One torch thread inside the test, as rollout workers and MLP learners compute: products of
    different batch shapes then agree bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
