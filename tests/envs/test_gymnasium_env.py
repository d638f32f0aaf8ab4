"""GymnasiumTeamEnv: single-agent and Tuple-spaces Gymnasium envs as PettingZoo teams, time limits
reported as truncation, and training through the framework."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from gymnasium import spaces
from pettingzoo.test import parallel_api_test

from marl_ppo.cli import main
from marl_ppo.envs.adapters.gymnasium import GymnasiumTeamEnv, detect_time_limit, placeholder_action

# lbforaging and rware return a list of rewards, which Gymnasium's env checker warns about once
pytestmark = pytest.mark.filterwarnings("ignore:.*reward returned by `step\\(\\)` must be:UserWarning")


class TwoAgentGymEnv(gymnasium.Env):
    """Two agents in Tuple spaces; like lbforaging it says `terminated=True` at its step limit.

    Agent i observes `[i, step]` as a list (the wrapper must make float32 arrays of it). Rewards are
    `[action_0, 10 + action_1]`, or their sum as one float with `shared_reward`. `end_at` ends the
    episode for real before the limit; `leave_at` terminates agent_1 alone (per-agent flags).
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        max_steps: int = 5,
        end_at: int | None = None,
        leave_at: int | None = None,
        shared_reward: bool = False,
    ) -> None:
        box = spaces.Box(0.0, 100.0, (2,), np.float32)
        self.observation_space = spaces.Tuple((box, box))
        self.action_space = spaces.Tuple((spaces.Discrete(3), spaces.Discrete(3)))
        self.max_steps = max_steps  # rware's attribute name: auto-detected as the time limit
        self.end_at = end_at
        self.leave_at = leave_at
        self.shared_reward = shared_reward
        self.t = 0
        self.received: list[tuple[int, ...]] = []

    def _obs(self) -> tuple[list[float], list[float]]:
        return [0.0, float(self.t)], [1.0, float(self.t)]

    def reset(self, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {"t": 0}

    def step(self, actions):
        self.t += 1
        self.received.append(tuple(int(a) for a in actions))
        rewards = [float(actions[0]), 10.0 + float(actions[1])]
        done = self.t >= self.max_steps or (self.end_at is not None and self.t >= self.end_at)
        terminated: bool | list[bool] = done
        if self.leave_at is not None:
            terminated = [done, done or self.t >= self.leave_at]
        reward = sum(rewards) if self.shared_reward else rewards
        return self._obs(), reward, terminated, False, {"t": self.t}


def cartpole() -> GymnasiumTeamEnv:
    """Factory for the training check (env.id=<this file>:cartpole)."""
    return GymnasiumTeamEnv(gymnasium.make("CartPole-v1"))


def two_agents() -> GymnasiumTeamEnv:
    """Factory for the training check of a Tuple-spaces team."""
    return GymnasiumTeamEnv(TwoAgentGymEnv(max_steps=5, leave_at=3))


def run_episode(env: GymnasiumTeamEnv, seed: int, actions=None) -> list[tuple]:
    """Step with random (or given) actions until no agent is left; returns each step's results."""
    obs, _ = env.reset(seed=seed)
    for agent in env.possible_agents:
        assert env.observation_space(agent).contains(obs[agent])
        env.action_space(agent).seed(seed)
    steps = []
    while env.agents:
        chosen = actions or {a: env.action_space(a).sample() for a in env.agents}
        result = env.step({a: chosen[a] for a in env.agents})
        for agent, observation in result[0].items():
            assert env.observation_space(agent).contains(observation)
        steps.append(result)
    return steps


@pytest.mark.parametrize(("env_id", "limit"), [("CartPole-v1", 500), ("Pendulum-v1", 200)])
def test_single_agent_envs_pass_the_parallel_api_test(env_id, limit):
    gym_env = gymnasium.make(env_id)
    env = GymnasiumTeamEnv(gym_env)
    assert env.possible_agents == ["agent_0"] and not env.multi_agent
    assert env.observation_space("agent_0") is gym_env.unwrapped.observation_space
    assert env.action_space("agent_0") is gym_env.unwrapped.action_space
    assert env.time_limit == limit and env.metadata["name"] == env_id
    parallel_api_test(env, num_cycles=100)


def test_pendulum_time_limit_is_a_truncation():
    steps = run_episode(GymnasiumTeamEnv(gymnasium.make("Pendulum-v1")), seed=0)
    assert len(steps) == 200
    _, _, terminated, truncated, _ = steps[-1]
    assert truncated == {"agent_0": True} and terminated == {"agent_0": False}


def test_tuple_spaces_make_a_team_with_per_agent_rewards():
    inner = TwoAgentGymEnv()
    env = GymnasiumTeamEnv(inner, agent_prefix="robot")
    assert env.multi_agent and env.possible_agents == ["robot_0", "robot_1"]
    assert isinstance(inner.observation_space, spaces.Tuple) and isinstance(inner.action_space, spaces.Tuple)
    assert env.observation_space("robot_1") is inner.observation_space[1]
    assert env.action_space("robot_0") is inner.action_space[0]
    obs, infos = env.reset(seed=0)
    assert obs["robot_1"].dtype == np.float32 and obs["robot_1"].tolist() == [1.0, 0.0]
    assert infos == {"robot_0": {"t": 0}, "robot_1": {"t": 0}}
    _, rewards, _, _, infos = env.step({"robot_0": 2, "robot_1": 1})
    assert rewards == {"robot_0": 2.0, "robot_1": 11.0}
    assert inner.received == [(2, 1)] and infos["robot_0"] == {"t": 1}


def test_a_single_float_reward_goes_to_every_agent():
    env = GymnasiumTeamEnv(TwoAgentGymEnv(shared_reward=True))
    env.reset(seed=0)
    _, rewards, _, _, _ = env.step({"agent_0": 1, "agent_1": 2})
    assert rewards == {"agent_0": 13.0, "agent_1": 13.0}


@pytest.mark.parametrize("time_limit", [5, None])
def test_a_termination_at_the_step_limit_is_reported_as_truncation(time_limit):
    env = GymnasiumTeamEnv(TwoAgentGymEnv(max_steps=5), time_limit=time_limit)
    assert env.time_limit == 5  # None: found in the env's `max_steps`
    steps = run_episode(env, seed=0)
    assert len(steps) == 5
    for _, _, terminated, truncated, _ in steps[:-1]:
        assert not any(terminated.values()) and not any(truncated.values())
    _, _, terminated, truncated, _ = steps[-1]
    assert terminated == {"agent_0": False, "agent_1": False}
    assert truncated == {"agent_0": True, "agent_1": True}
    assert env.agents == []


def test_a_real_termination_before_the_limit_stays_a_termination():
    env = GymnasiumTeamEnv(TwoAgentGymEnv(max_steps=5, end_at=3), time_limit=5)
    steps = run_episode(env, seed=0)
    assert len(steps) == 3
    _, _, terminated, truncated, _ = steps[-1]
    assert terminated == {"agent_0": True, "agent_1": True}
    assert truncated == {"agent_0": False, "agent_1": False}


def test_a_shorter_time_limit_truncates_the_episode():
    env = GymnasiumTeamEnv(TwoAgentGymEnv(max_steps=5), time_limit=3)
    steps = run_episode(env, seed=0)
    assert len(steps) == 3 and steps[-1][3] == {"agent_0": True, "agent_1": True}


def test_an_agent_done_on_its_own_leaves_and_gets_a_placeholder_action():
    inner = TwoAgentGymEnv(max_steps=5, leave_at=2)
    env = GymnasiumTeamEnv(inner)
    steps = run_episode(env, seed=0, actions={"agent_0": 2, "agent_1": 1})
    assert steps[1][2] == {"agent_0": False, "agent_1": True}  # step 2: agent_1 terminates
    assert set(steps[2][0]) == {"agent_0"}  # afterwards only agent_0 acts and is reported
    assert inner.received == [(2, 1), (2, 1), (2, 0), (2, 0), (2, 0)]
    assert steps[-1][2] == {"agent_0": False} and steps[-1][3] == {"agent_0": True}


@pytest.mark.parametrize(
    "kwargs", [{}, {"end_at": 3}, {"leave_at": 2}, {"shared_reward": True, "max_steps": 150}]
)
def test_the_tuple_team_passes_the_parallel_api_test(kwargs):
    parallel_api_test(GymnasiumTeamEnv(TwoAgentGymEnv(**kwargs)), num_cycles=100)


def test_placeholder_actions_lie_in_their_spaces():
    space: spaces.Space
    for space in (
        spaces.Discrete(4, start=2),
        spaces.MultiDiscrete([3, 2]),
        spaces.MultiBinary(3),
        spaces.Box(1.0, 2.0, (2,), np.float32),
        spaces.Tuple((spaces.Discrete(2), spaces.Box(-1, 1, (1,), np.float32))),
    ):
        assert space.contains(placeholder_action(space))


def test_rejects_a_bad_time_limit():
    with pytest.raises(ValueError, match="time_limit"):
        GymnasiumTeamEnv(TwoAgentGymEnv(), time_limit=0)


def test_lbforaging_limit_is_truncation_and_food_collection_is_termination():
    pytest.importorskip("lbforaging")
    env = GymnasiumTeamEnv(gymnasium.make("Foraging-8x8-2p-2f-coop-v3"))
    assert env.possible_agents == ["agent_0", "agent_1"] and env.time_limit == 50
    assert detect_time_limit(env.env) == 50
    parallel_api_test(env, num_cycles=100)
    steps = run_episode(env, seed=1)
    assert len(steps) == 50
    assert steps[-1][2] == {"agent_0": False, "agent_1": False}
    assert steps[-1][3] == {"agent_0": True, "agent_1": True}
    env.reset(seed=2)
    env.env.unwrapped.field[:] = 0  # type: ignore[attr-defined]  # lbforaging's own env; all food gone: the env's next step is a true end
    _, _, terminated, truncated, _ = env.step({"agent_0": 0, "agent_1": 0})
    assert terminated == {"agent_0": True, "agent_1": True} and not any(truncated.values())


def test_rware_limit_is_truncation():
    pytest.importorskip("rware")
    env = GymnasiumTeamEnv(gymnasium.make("rware-tiny-2ag-v2"))
    assert env.possible_agents == ["agent_0", "agent_1"] and env.time_limit == 500
    parallel_api_test(env, num_cycles=100)
    steps = run_episode(env, seed=0)
    assert len(steps) == 500
    assert steps[-1][2] == {"agent_0": False, "agent_1": False}
    assert steps[-1][3] == {"agent_0": True, "agent_1": True}


@pytest.mark.parametrize("factory", ["cartpole", "two_agents"])
def test_trains_through_the_framework(tmp_path, factory):
    args = [
        "train",
        f"env.id={__file__}:{factory}",
        "rollout.num_envs=2",
        "rollout.rollout_steps=16",
        "total_steps=64",
        "log.progress=false",
        "ppo.num_minibatches=2",
        "--run-dir",
        str(tmp_path / "r"),
    ]
    assert main(args) == 0
