"""envs/spread_nearest_v0: mpe2's simple_spread with observations of one size at any team size."""

import numpy as np
import pytest
from pettingzoo.test import parallel_api_test

from marl_ppo.envs.registry import make_env
from tests.helpers import ROOT

pytest.importorskip("mpe2")

NEAREST = f"{ROOT / 'envs/spread_nearest.py'}:parallel_env"
"""The env by its file (the same code as the registered `envs/spread_nearest_v0`)."""


@pytest.mark.parametrize("agents", [3, 4, 5])
def test_it_passes_the_api_test_with_14_numbers_per_agent_at_any_team_size(agents):
    parallel_api_test(make_env(NEAREST, N=agents), num_cycles=30)
    env = make_env(NEAREST, N=agents)
    observations, _ = env.reset(seed=0)
    assert {agent: obs.shape for agent, obs in observations.items()} == {
        f"agent_{i}": (14,) for i in range(agents)
    }


def test_it_pays_simple_spreads_rewards_and_shows_the_nearest_first():
    from mpe2 import simple_spread_v3

    ours = make_env(NEAREST, N=4)
    theirs = simple_spread_v3.parallel_env(N=4, max_cycles=25, local_ratio=0.5, continuous_actions=False)
    observations, _ = ours.reset(seed=3)
    full, _ = theirs.reset(seed=3)
    rng = np.random.default_rng(0)
    for _ in range(10):
        for agent, obs in observations.items():
            # mpe2's observation: velocity, position, the 4 landmarks', then the 3 others' positions
            np.testing.assert_array_equal(obs[:4], full[agent][:4])
            landmarks = full[agent][4:12].reshape(4, 2)
            others = full[agent][12:18].reshape(3, 2)
            nearest = landmarks[np.argsort(np.linalg.norm(landmarks, axis=1), kind="stable")[:3]]
            np.testing.assert_allclose(obs[4:10], nearest.reshape(-1), atol=1e-6)
            neighbours = others[np.argsort(np.linalg.norm(others, axis=1), kind="stable")[:2]]
            np.testing.assert_allclose(obs[10:14], neighbours.reshape(-1), atol=1e-6)
        actions = {agent: int(rng.integers(5)) for agent in ours.agents}
        observations, rewards, _, _, _ = ours.step(actions)
        full, expected, _, _, _ = theirs.step(actions)
        assert rewards == expected


def test_a_team_too_small_for_its_neighbours_is_refused():
    with pytest.raises(ValueError, match="N=2 agents have N landmarks and N - 1 neighbours each"):
        make_env(NEAREST, N=2)
