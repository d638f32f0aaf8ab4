"""Shared fixtures: small configs and a run directory."""

from pathlib import Path

import pytest
import torch

from marl_ppo.config import load_config

ROOT = Path(__file__).resolve().parent.parent


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


def collect_rollout(config, seed=0):
    """Build the config's vector env and a fresh model, and collect one full rollout."""
    import torch

    from marl_ppo.envs.factory import build_vector_env, probe_layout
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.buffer import RolloutBuffer
    from marl_ppo.rollout.collector import Collector

    torch.manual_seed(seed)
    venv = build_vector_env(config, probe_layout(config))
    model = TeamModel(venv.spec, config)
    buffer = RolloutBuffer(venv.spec, config.rollout.rollout_steps, config.rollout.num_envs)
    collector = Collector(venv, model, torch.device("cpu"))
    collector.start(seed)
    return model, buffer, collector.collect(buffer)


def values_of(model, state, obs):
    """A feed-forward model's values in return units for one step of `len(state)` env copies, every
    agent acting, from the critics' own forward (learning's path): `state` `(E, S)`, `obs` per group
    `(E, A_g, D)`."""
    import torch

    values = {}
    for name, group_obs in obs.items():
        critic, norm = model.group(name).critic, model.group(name).value_norm
        flags = torch.ones((1, *group_obs.shape[:-1]), dtype=torch.bool, device=group_obs.device)
        carry = torch.zeros(group_obs.shape[0], critic.carry_rows, 0, device=group_obs.device)
        raw, _ = critic(state.unsqueeze(0), group_obs.unsqueeze(0), carry, flags, flags)
        values[name] = norm.denormalize(raw[0])
    return values


def common_twin(net):
    """The same AgentMLP, weights shared, reading one input row that every agent sees (`common_input`)."""
    import copy

    twin = copy.copy(net)
    twin.common_input = True
    return twin


def rollout_log_probs(model, buffer, name):
    """Group `name`'s log-probabilities of the stored actions under `model`, `(T, E, A)`: each env copy's
    rollout replayed as one sequence from the carry stored at its first step."""
    storage, memory = buffer.groups[name], buffer.memory[name]
    dist, _ = model.group(name).actor(
        storage.obs, storage.action_mask, memory.actor_state[0], memory.is_first, storage.alive
    )
    return dist.log_prob(storage.actions)


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
