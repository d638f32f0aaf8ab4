"""Env state pickling: whole objects (not EzPickle's constructor arguments), and honest refusals."""

import pickle

import numpy as np
import pytest
from gymnasium.utils import EzPickle

from marl_ppo.envs.registry import make_env
from marl_ppo.envs.vector.state import EnvStateError, dump_env_state, load_env_state


class Counter(EzPickle):
    """EzPickle, like Gymnasium's and PettingZoo's envs: plain pickle rebuilds it from `start`."""

    def __init__(self, start=0):
        EzPickle.__init__(self, start)
        self.value = start
        self.rng = np.random.default_rng(start)


def test_ezpickle_objects_keep_their_state_not_just_their_arguments():
    counter = Counter(3)
    counter.value = 10
    counter.rng.random(5)
    assert pickle.loads(pickle.dumps(counter)).value == 3  # what EzPickle alone would give back
    restored = load_env_state(dump_env_state(counter))
    assert restored.value == 10
    assert restored.rng.random() == counter.rng.random()  # the RNG continues where it was


def test_mpe2_env_continues_identically_after_a_round_trip():
    env = make_env("mpe2/simple_spread_v3", N=3, max_cycles=25)
    env.reset(seed=4)
    actions = {agent: 1 for agent in env.possible_agents}
    for _ in range(7):
        env.step(actions)
    copy = load_env_state(dump_env_state(env))  # holds pygame surfaces and a font, saved by value
    for _ in range(30):  # past the episode end: the auto-reset draws from the env's own np_random
        if not env.agents:
            env.reset()
            copy.reset()
        observed, rewards = env.step(actions)[:2]
        observed_copy, rewards_copy = copy.step(actions)[:2]
        assert rewards == rewards_copy
        for agent, obs in observed.items():
            assert np.array_equal(obs, observed_copy[agent])


def test_cooperative_pong_read_from_one_screen_copy_continues_identically_after_a_round_trip():
    """The screen copy's patches travel with the env: the restored copy still reads one screen copy
    per frame and steps, through an episode end and auto-reset, as the original does."""
    pytest.importorskip("pygame")
    from marl_ppo.fast.screen_copy import one_screen_copy

    env = one_screen_copy(make_env("butterfly/cooperative_pong_v6", max_cycles=20))
    env.reset(seed=4)
    for t in range(7):
        env.step({agent: t % 3 for agent in env.agents})
    copy = load_env_state(dump_env_state(env))
    assert type(copy.aec_env.unwrapped.env.__dict__["render"]).__name__ == "_Drawing"
    for t in range(40):
        if not env.agents:
            np.testing.assert_equal(copy.reset(), env.reset())
        actions = {agent: (t + i) % 3 for i, agent in enumerate(env.agents)}
        np.testing.assert_equal(copy.step(actions), env.step(actions))
        np.testing.assert_array_equal(copy.state(), env.state())


def test_unpicklable_and_inexactly_pickled_objects_are_refused():
    import threading

    with pytest.raises(EnvStateError, match="cannot pickle '_thread.lock'"):
        dump_env_state({"lock": threading.Lock()})
    pymunk = pytest.importorskip("pymunk")
    with pytest.raises(EnvStateError, match="pymunk.Space pickles without its contact cache"):
        dump_env_state({"space": pymunk.Space()})


def test_a_state_written_with_the_removed_lean_cycle_resumes_on_pettingzoos_wrapper(monkeypatch):
    """Runs checkpointed before `fast.lean_cycle` was removed saved their AEC-converted envs with the
    env's class swapped to `marl_ppo.fast.lean_cycle.LeanCycleParallel`; they load as PettingZoo's
    AEC-to-parallel wrapper, whose `step` gives the same trajectories, and continue identically."""
    import sys
    import types

    from pettingzoo.utils.conversions import aec_to_parallel_wrapper

    old_module = types.ModuleType("marl_ppo.fast.lean_cycle")
    old_class = type("LeanCycleParallel", (aec_to_parallel_wrapper,), {"__module__": old_module.__name__})
    old_module.LeanCycleParallel = old_class  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, old_module.__name__, old_module)
    env = make_env("mpe2/simple_spread_v3", max_cycles=25)
    env.reset(seed=3)
    assert type(env) is aec_to_parallel_wrapper
    env.__class__ = old_class  # as the lean cycle left it
    blob = dump_env_state(env)
    monkeypatch.delitem(sys.modules, old_module.__name__)  # the module is gone, as it is now
    restored = load_env_state(blob)
    assert type(restored) is aec_to_parallel_wrapper
    env.__class__ = aec_to_parallel_wrapper
    actions = {agent: 1 for agent in env.agents}
    ours, theirs = env.step(actions), restored.step(actions)
    for name, mine, other in zip(("obs", "rewards"), ours[:2], theirs[:2], strict=True):
        assert mine.keys() == other.keys(), name
        for agent in mine:
            assert np.array_equal(mine[agent], other[agent]), (name, agent)
