"""MaMuJoCo through its ids: agent splits, the critic's state, the time limit as truncation, falls as
terminations, continuous actions, and 4,000 training steps of a registered id and of a prefix id."""

import json

import numpy as np
import pytest

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.envs.factory import probe_spec
from marl_ppo.envs.registry import EnvError, env_spec, make_env, registered_ids
from marl_ppo.envs.vector.sync import SyncVectorEnv
from marl_ppo.run.loop import train
from tests.helpers import ROOT, assert_same_runs, vector_env

HALFCHEETAH = ROOT / "experiments/mamujoco/halfcheetah_2x3.yaml"


def test_ids_split_the_robot_between_agents_and_give_the_critic_the_robot_state():
    env = make_env("mamujoco/HalfCheetah-2x3", agent_obsk=0)
    observations, _ = env.reset(seed=0)
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert [env.action_space(a).shape for a in env.possible_agents] == [(3,), (3,)]  # 6 joints, 3 each
    assert env.state_space.shape == (17,) and env.state().shape == (17,)  # HalfCheetah-v5's observation
    # agent_obsk=0: each agent sees its own 3 joints' positions and velocities plus the root's velocities
    assert {a: o.shape for a, o in observations.items()} == {"agent_0": (11,), "agent_1": (11,)}
    ant = make_env("mamujoco/Ant-4x2")
    assert len(ant.possible_agents) == 4 and ant.action_space("agent_3").shape == (2,)
    assert make_env("mamujoco/Hopper-3x1").action_space("agent_2").shape == (1,)  # any split, by prefix
    assert len(make_env("mamujoco/ManySegmentSwimmer-3x2").possible_agents) == 3  # any NxK


def test_the_team_critic_reads_the_env_state_and_the_actions_are_boxes():
    config = load_config(HALFCHEETAH, ["rollout.num_envs=2", "rollout.vector=sync"])
    spec = probe_spec(config)
    (group,) = spec.groups
    assert group.agents == ("agent_0", "agent_1") and group.action_shape == (3,)
    assert spec.state_dim == 17  # the env's state, not the 22 numbers of the two observations


def test_the_1000_step_limit_is_a_truncation_and_a_fall_a_termination():
    config = load_config(HALFCHEETAH, ["rollout.num_envs=1", "rollout.vector=sync"])
    venv = vector_env(config)
    rng = np.random.default_rng(0)
    try:
        arrays = venv.reset(0)
        (name,) = arrays.groups
        for step in range(1, 1001):
            arrays = venv.step({name: rng.uniform(-1, 1, size=(1, 2, 3)).astype(np.float32)})
            assert bool(venv.episode_over[0]) == (step == 1000)
        group = arrays.groups[name]
        assert np.asarray(group.truncated)[0].all() and not np.asarray(group.terminated)[0].any()
    finally:
        venv.close()
    walker = make_env("mamujoco/Walker2d-2x3")
    walker.reset(seed=0)
    for _ in range(1000):  # random torques topple the walker within a few dozen steps
        _, _, terminated, truncated, _ = walker.step(
            {a: walker.action_space(a).sample() for a in walker.agents}
        )
        if not walker.agents:
            break
    assert all(terminated.values()) and not any(truncated.values())


def test_every_agent_is_paid_the_robot_reward():
    env = make_env("mamujoco/Ant-4x2")
    env.reset(seed=3)
    _, rewards, _, _, _ = env.step({a: env.action_space(a).sample() for a in env.agents})
    assert len(set(rewards.values())) == 1 and np.isfinite(list(rewards.values())).all()


@pytest.mark.parametrize("env_id", ["mamujoco/HalfCheetah-2x3", "mamujoco/Hopper-3x1"])
def test_a_registered_id_and_a_prefix_id_train_4000_steps(env_id, tmp_path):
    overrides = [
        f"env.id={env_id}",
        "total_steps=4000",
        "rollout.num_envs=4",
        "rollout.rollout_steps=500",
        "rollout.vector=sync",
        "log.progress=false",
        "ppo.train_pi_iters=2",
        "ppo.train_vf_iters=2",
    ]
    result = train(load_config(HALFCHEETAH, overrides), tmp_path)
    assert result.env_steps == 4000 and result.updates == 2
    assert np.isfinite(result.team_return_mean) and result.episodes >= 4  # Hopper falls; the cheetah at 1000
    assert (tmp_path / "checkpoints/final.pt").is_file()


def test_the_family_lists_its_tasks_and_refuses_unknown_ones_in_one_line():
    assert {"mamujoco/HalfCheetah-2x3", "mamujoco/Ant-4x2", "mamujoco/Walker2d-2x3"} <= set(registered_ids())
    assert env_spec("mamujoco/Hopper-3x1").extra == "mamujoco"
    for bad, says in [
        ("mamujoco/Halfcheetah-2x3", "closest: 'mamujoco/HalfCheetah-2x3'"),
        ("mamujoco/HalfCheetah-3x2", "HalfCheetah splits as 2x3, 6x1"),
        ("mamujoco/Ant", "ids are mamujoco/<Scenario>-<split>"),
    ]:
        with pytest.raises(EnvError, match=says) as caught:
            make_env(bad)
        assert "\n" not in str(caught.value)


def test_marl_ppo_envs_lists_every_split_the_family_offers(capsys):
    assert main(["envs", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    for env_id in ("mamujoco/HalfCheetah-2x3", "mamujoco/HalfCheetah-6x1", "mamujoco/Humanoid-9|8"):
        assert rows[env_id]["installed"] and rows[env_id]["extra"] == "mamujoco"


def test_every_split_the_family_lists_builds_and_steps_with_the_installed_libraries():
    from marl_ppo.envs import mamujoco

    listed = mamujoco.names()
    assert "HalfCheetah-2x3" in listed and len(listed) >= 14
    for name in listed:
        env = make_env(f"mamujoco/{name}")
        env.reset(seed=0)
        observations, *_ = env.step({agent: env.action_space(agent).sample() for agent in env.agents})
        assert observations.keys() == set(env.possible_agents), name
        env.close()


def test_a_split_the_libraries_fail_to_build_is_not_listed_and_is_refused_in_one_line(monkeypatch, capsys):
    """CoupledHalfCheetah's observation reads MuJoCo's tendon Jacobian as dense, which MuJoCo 3.6 made
    sparse: with MuJoCo 3.6 and Gymnasium-Robotics 1.4.2 `marl-ppo envs` leaves it out and building it
    says why; with an older MuJoCo or a newer Gymnasium-Robotics it is listed."""
    from marl_ppo.envs import mamujoco

    monkeypatch.setattr(mamujoco, "_version", {"mujoco": (3, 6, 0), "gymnasium-robotics": (1, 4, 2)}.get)
    assert main(["envs", "--json"]) == 0
    listed = {row["id"] for row in json.loads(capsys.readouterr().out)}
    assert "mamujoco/CoupledHalfCheetah-1p1" not in listed and "mamujoco/HalfCheetah-6x1" in listed
    with pytest.raises(EnvError) as caught:
        make_env("mamujoco/CoupledHalfCheetah-1p1")
    assert str(caught.value) == (
        "env 'mamujoco/CoupledHalfCheetah-1p1' does not build with the installed libraries: "
        "Gymnasium-Robotics 1.4.2 and earlier read MuJoCo's tendon Jacobian `ten_J` as a dense matrix, "
        "which MuJoCo 3.6 made sparse; pip install 'mujoco<3.6' to build it"
    )
    for versions in (
        {"mujoco": (3, 5, 1), "gymnasium-robotics": (1, 4, 2)},
        {"mujoco": (3, 6, 0), "gymnasium-robotics": (1, 4, 3)},
    ):
        monkeypatch.setattr(mamujoco, "_version", versions.get)
        assert "CoupledHalfCheetah-1p1" in mamujoco.names()


def _same_step(ours, theirs):
    """Two step results (or reset results) hold the same numbers, keys and flags."""
    for mine, library in zip(ours, theirs, strict=True):
        assert mine.keys() == library.keys()
        for agent, value in mine.items():
            if isinstance(value, np.ndarray):
                assert value.dtype == library[agent].dtype and np.array_equal(value, library[agent]), agent
            elif isinstance(value, dict):  # the MuJoCo env's info, one per agent
                assert value.keys() == library[agent].keys()
                assert all(np.array_equal(value[k], library[agent][k]) for k in value)
            else:
                assert value == library[agent], agent


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("mamujoco/HalfCheetah-2x3", {"agent_obsk": 0}),  # through a truncation at 1,000 steps
        ("mamujoco/Ant-4x2", {"agent_obsk": 1}),  # clipped contact forces, falls
        ("mamujoco/Hopper-3x1", {}),  # a clipped velocity item, falls
        ("mamujoco/Humanoid-9|8", {"agent_obsk": 1}),  # inertias, body velocities, actuator forces
    ],
)
def test_the_gathered_step_gives_the_librarys_observations_rewards_flags_and_states(env_id, kwargs):
    from marl_ppo.fast.mamujoco_gather import GatheredMaMuJoCo, gathered_mamujoco

    library, ours = make_env(env_id, **kwargs), gathered_mamujoco(make_env(env_id, **kwargs))
    assert type(ours) is GatheredMaMuJoCo
    _same_step(ours.reset(seed=3), library.reset(seed=3))
    rng = np.random.default_rng(1)
    episodes = 0
    for _ in range(1_100):
        actions = {
            a: rng.uniform(-1.2, 1.2, library.action_space(a).shape).astype(np.float32)
            for a in library.agents
        }
        _same_step(ours.step(actions), library.step(actions))
        assert np.array_equal(ours.state(), library.state()) and ours.agents == library.agents
        if not library.agents:
            episodes += 1
            _same_step(ours.reset(), library.reset())
            assert np.array_equal(ours.state(), library.state())
    assert episodes >= 1


def test_an_observation_item_that_is_computed_keeps_the_librarys_step():
    from marl_ppo.fast.mamujoco_gather import gathered_mamujoco

    reacher = make_env("mamujoco/Reacher-2x1")  # the fingertip's distance to the target: computed
    assert gathered_mamujoco(reacher) is reacher and type(reacher).__name__ == "MultiAgentMujocoEnv"
    cheetah = make_env("mamujoco/HalfCheetah-2x3", agent_obsk=0)
    node = cheetah.k_dicts[1][0][0]
    node.body_fn, node.bodies = (lambda _body, items: [2 * v for v in items]), [1]  # a scaled item
    cheetah.local_categories = [["qpos", "qvel", "cvel"]]
    assert type(gathered_mamujoco(cheetah)).__name__ == "MultiAgentMujocoEnv"


def test_a_run_on_the_librarys_step_learns_the_very_same_weights(tmp_path):
    """`fast.mamujoco_gather: false`: the same run, bit for bit, on Gymnasium-Robotics' own step."""
    overrides = [
        "env.kwargs={agent_obsk: 0, max_episode_steps: 30}",
        "rollout.num_envs=2",
        "rollout.rollout_steps=25",
    ]
    overrides += [
        "total_steps=100",
        "rollout.vector=sync",
        "log.progress=false",
    ]  # episodes end: returns logged
    overrides += ["ppo.train_pi_iters=2", "ppo.train_vf_iters=2", "model.hidden_sizes=[16,16]"]
    assert_same_runs(HALFCHEETAH, overrides, ["fast.mamujoco_gather=false"], tmp_path)


def test_the_switch_picks_the_step_each_env_copy_takes():
    kinds = {}
    for switch in ("true", "false"):
        venv = vector_env(
            load_config(
                HALFCHEETAH, ["rollout.num_envs=2", "rollout.vector=sync", f"fast.mamujoco_gather={switch}"]
            )
        )
        assert isinstance(venv, SyncVectorEnv)
        kinds[switch] = {type(adapter.env).__name__ for adapter in venv.adapters}
        venv.close()
    assert kinds == {"true": {"GatheredMaMuJoCo"}, "false": {"MultiAgentMujocoEnv"}}


def test_a_wrapped_mujoco_env_keeps_the_librarys_state():
    """A wrapper of the user's around the MuJoCo env may change its observations: the state is then
    built by the library, as its `state()` does, not taken from the step."""
    import gymnasium as gym

    from marl_ppo.fast.mamujoco_gather import gathered_mamujoco

    class Shifted(gym.ObservationWrapper):
        def observation(self, observation):
            return observation + 1.0

    env = make_env("mamujoco/HalfCheetah-2x3", agent_obsk=0)
    env.single_agent_env = Shifted(env.single_agent_env)
    env = gathered_mamujoco(env)
    assert not env._gathered_keeps_state
    env.reset(seed=0)
    env.step({a: np.zeros(3, dtype=np.float32) for a in env.possible_agents})
    assert np.array_equal(env.state(), env.single_agent_env.unwrapped._get_obs())
    plain = gathered_mamujoco(make_env("mamujoco/HalfCheetah-2x3", agent_obsk=0))
    assert plain._gathered_keeps_state
