"""At an episode's end by termination the adapters ask the finished env for nothing a bootstrap does not need."""

import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marl_ppo.config import load_config
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.spec import TeamArrays
from tests.helpers import vector_env


class FreesItsBodies(ParallelEnv):
    """Two agents; the episode ends by termination at step 3 (or by truncation at `truncate_at`), after
    which `state()` fails, as multiwalker's does once a fallen walker's body is destroyed."""

    metadata = {"name": "frees_its_bodies_v0"}
    possible_agents = ["a_0", "a_1"]
    state_space = spaces.Box(-10.0, 10.0, (3,), np.float32)

    def __init__(self, truncate_at: int | None = None):
        self.truncate_at = truncate_at

    def observation_space(self, agent):
        return spaces.Box(-10.0, 10.0, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        self.agents, self.t, self.freed, self.state_calls = list(self.possible_agents), 0, False, 0
        return {a: np.zeros(2, np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def state(self):
        if self.freed:
            raise AttributeError("'NoneType' object has no attribute 'position'")
        self.state_calls += 1
        return np.full(3, self.t, np.float32)

    def step(self, actions):
        self.t += 1
        truncated = self.truncate_at is not None and self.t >= self.truncate_at
        terminated = self.t >= 3 and not truncated
        self.freed = terminated
        obs = {a: np.full(2, self.t, np.float32) for a in self.agents}
        rewards = {a: 1.0 for a in self.agents}
        flags = {a: terminated for a in self.agents}
        cut = {a: truncated for a in self.agents}
        self.agents = [] if terminated or truncated else self.agents
        return obs, rewards, flags, cut, {a: {} for a in obs}


@pytest.mark.parametrize("truncate_at", [None, 2])
def test_no_state_call_on_an_env_that_terminated_but_the_final_state_where_it_truncated(truncate_at):
    env = FreesItsBodies(truncate_at)
    spec = build_team_spec(env, "frees_its_bodies_v0", None, state="env")
    adapter, arrays = ParallelEnvAdapter(env, spec), TeamArrays.allocate(spec)
    adapter.reset(0, arrays)
    steps = 0
    while True:
        steps += 1
        if adapter.step({"a": np.zeros(2, np.int64)}, arrays):
            break
    group = arrays.groups["a"]
    if truncate_at is None:  # terminated at step 3: state() read after reset and steps 1, 2 only
        assert steps == 3 and group.terminated.all() and not group.truncated.any()
        assert env.state_calls == 3 and not arrays.final_state.any()
    else:  # truncated at step 2: the bootstrap's final state is the env's state at that step
        assert steps == 2 and group.truncated.all() and not group.terminated.any()
        np.testing.assert_array_equal(arrays.final_state, [2.0, 2.0, 2.0])


def test_multiwalker_steps_through_a_walkers_fall_and_auto_resets():
    pytest.importorskip("Box2D")
    config = load_config(
        "experiments/sisl/multiwalker_v9.yaml",
        ["rollout.vector=sync", "rollout.num_envs=2", "ppo.num_minibatches=1"],
    )
    venv = vector_env(config)
    rng = np.random.default_rng(0)
    falls = 0
    try:
        arrays = venv.reset(0)
        for _ in range(400):  # random walkers fall within about 50 steps
            actions = {
                name: rng.uniform(-1, 1, g.final_obs.shape[:2] + (4,)).astype(np.float32)
                for name, g in arrays.groups.items()
            }
            arrays = venv.step(actions)
            walker = arrays.groups["walker"]
            for i in np.flatnonzero(venv.episode_over):
                assert walker.terminated[i].all() and not walker.truncated[i].any()
                assert walker.reward[i].min() <= -100.0  # the fall's terminate_reward
                assert walker.alive[i].all()  # auto-reset: the next episode's walkers are live
                falls += 1
            if falls >= 4:
                break
    finally:
        venv.close()
    assert falls >= 4


def test_multiwalker_reports_its_time_limit_as_truncation_with_the_state_to_bootstrap_from():
    """PettingZoo's multiwalker marks its walkers terminated at `max_cycles`; the catalog's multiwalker
    truncates them there (a fall still terminates, the test above)."""
    pytest.importorskip("Box2D")
    config = load_config(
        "experiments/sisl/multiwalker_v9.yaml",
        ["rollout.vector=sync", "rollout.num_envs=1", "ppo.num_minibatches=1", "env.kwargs.max_cycles=5"],
    )
    venv = vector_env(config)
    try:
        arrays = venv.reset(0)
        zeros = {
            name: np.zeros(g.final_obs.shape[:2] + (4,), np.float32) for name, g in arrays.groups.items()
        }
        for step in range(1, 6):  # standing still, nobody falls within 5 frames
            arrays = venv.step(zeros)
            walker = arrays.groups["walker"]
            assert bool(venv.episode_over[0]) == (step == 5)
            assert not walker.terminated.any()
            assert walker.truncated[0].all() == (step == 5)
        assert np.abs(arrays.final_state[0]).sum() > 0  # the state at the limit, for the bootstrap
        assert walker.alive[0].all()  # auto-reset
    finally:
        venv.close()
