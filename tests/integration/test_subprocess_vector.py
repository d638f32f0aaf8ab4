"""The subprocess vector env: bit-identical to the sync one, errors and dead workers surface, no orphans."""

import functools
import multiprocessing as mp
import os
import signal
from dataclasses import fields

import numpy as np
import pytest
from gymnasium import spaces
from marl_ppo_examples.early_leaver import EarlyLeaverEnv

from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.envs.vector.subprocess import SubprocessVectorEnv
from marl_ppo.envs.vector.sync import SyncVectorEnv
from tests.helpers import within

SPREAD = "mpe2/simple_spread_v3"


class FailingEnv(EarlyLeaverEnv):
    """EarlyLeaverEnv whose third step raises."""

    def step(self, actions):
        if self._t == 2:
            raise ValueError("boom at step 3")
        return super().step(actions)


def _make_adapter(factory, spec):
    return ParallelEnvAdapter(factory(), spec)


def _adapter_factory(factory, env_id="test"):
    """A picklable adapter factory, built the way train.py builds it."""
    probe = factory()
    spec = build_team_spec(probe, env_id)
    probe.close()
    return functools.partial(_make_adapter, factory, spec)


def _random_actions(spec, num_envs, rng):
    actions = {}
    for group in spec.groups:
        lead = (num_envs, group.num_agents)
        space = group.action_space
        if isinstance(space, spaces.Discrete):
            actions[group.name] = rng.integers(0, space.n, size=lead)
        elif isinstance(space, spaces.MultiDiscrete):
            actions[group.name] = rng.integers(0, space.nvec.reshape(-1), size=lead + group.action_shape)
        else:
            low, high = space.low.reshape(-1), space.high.reshape(-1)
            actions[group.name] = rng.uniform(low, high, size=lead + group.action_shape).astype(np.float32)
    return actions


def _named_arrays(arrays):
    """Every array of a TeamArrays by a readable name: `group.field` per group, then the states."""
    named = {
        f"{name}.{f.name}": getattr(group, f.name)
        for name, group in arrays.groups.items()
        for f in fields(group)
    }
    return {**named, "state": arrays.state, "final_state": arrays.final_state}


def _assert_same(sync, sub):
    expected, actual = _named_arrays(sync.arrays), _named_arrays(sub.arrays)
    assert list(actual) == list(expected)
    for name, e in expected.items():
        a = actual[name]
        assert a.dtype == e.dtype and a.shape == e.shape, name
        np.testing.assert_array_equal(a, e, err_msg=name)
    np.testing.assert_array_equal(sub.episode_over, sync.episode_over)


@pytest.mark.parametrize(
    ("factory", "env_id", "start_method", "steps"),
    [
        (functools.partial(EarlyLeaverEnv, leave_at=2, max_steps=5), "early_leaver", None, 60),
        (functools.partial(make_env, SPREAD), SPREAD, None, 60),
        (functools.partial(EarlyLeaverEnv, leave_at=2, max_steps=4), "early_leaver", "spawn", 10),
    ],
    ids=["early_leaver", "simple_spread", "early_leaver_spawn"],
)
def test_matches_sync_vector_env_bit_for_bit(factory, env_id, start_method, steps):
    make_adapter = _adapter_factory(factory, env_id)
    sync = SyncVectorEnv(make_adapter, num_envs=5)
    sub = SubprocessVectorEnv(make_adapter, num_envs=5, num_workers=2, start_method=start_method)
    try:
        assert sub.spec == sync.spec and sub.num_envs == 5
        sync.reset(seed=7)
        assert sub.reset(seed=7) is sub.arrays
        _assert_same(sync, sub)
        rng = np.random.default_rng(0)
        resets = 0
        for _ in range(steps):
            actions = _random_actions(sync.spec, 5, rng)
            sync.step(actions)
            assert sub.step(actions) is sub.arrays
            _assert_same(sync, sub)
            resets += int(sync.episode_over.sum())
        assert resets > 0, "the check must cross auto-resets"
    finally:
        sync.close()
        sub.close()


def test_env_error_in_a_worker_raises_with_its_message():
    sub = SubprocessVectorEnv(_adapter_factory(FailingEnv), num_envs=3, num_workers=2)
    sub.reset(seed=0)
    actions = {"agent": np.zeros((3, 3), np.int64)}
    sub.step(actions)
    sub.step(actions)
    with pytest.raises(RuntimeError, match="ValueError: boom at step 3"):
        sub.step(actions)
    assert not any(p.is_alive() for p in sub._processes)


def test_killed_worker_is_noticed_and_the_others_are_stopped():
    sub = SubprocessVectorEnv(_adapter_factory(EarlyLeaverEnv), num_envs=4, num_workers=2)
    sub.reset(seed=0)
    victim = sub._processes[1].pid
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="worker 1 .*died"):  # noticed by its death, not a time limit
        within(120, lambda: sub.step({"agent": np.zeros((4, 3), np.int64)}))
    assert not any(p.is_alive() for p in sub._processes)
    with pytest.raises(RuntimeError, match="closed"):
        sub.step({"agent": np.zeros((4, 3), np.int64)})


def test_close_and_garbage_collection_leave_no_child_processes():
    sub = SubprocessVectorEnv(_adapter_factory(EarlyLeaverEnv), num_envs=3, num_workers=3)
    processes = list(sub._processes)
    assert len(processes) == 3 and all(p.is_alive() for p in processes)
    sub.close()
    sub.close()  # idempotent
    assert not any(p.is_alive() for p in processes)
    assert not set(processes) & set(mp.active_children())

    sub = SubprocessVectorEnv(_adapter_factory(EarlyLeaverEnv), num_envs=2, num_workers=5)
    processes = list(sub._processes)
    assert len(processes) == 2  # never more workers than envs
    del sub  # no reference cycle keeps it alive, so this finalizes it
    assert not any(p.is_alive() for p in processes)
