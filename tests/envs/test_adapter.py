"""The PettingZoo adapter and the sync vector env: grouping, alive masks, flags, final obs, state."""

import numpy as np
import pytest
from gymnasium import spaces
from marl_ppo_examples.early_leaver import EarlyLeaverEnv
from marl_ppo_examples.never_ending import NeverEndingEnv
from pettingzoo.test import parallel_api_test

from marl_ppo.envs.adapters.aec import TurnBasedAdapter
from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.envs.spec import TeamArrays
from marl_ppo.envs.vector.sync import SyncVectorEnv
from tests.broken_envs import BrokenEnv, SilentLeaverAEC
from tests.helpers import LateJoinerEnv


def _adapter(env):
    spec = build_team_spec(env, "test")
    return ParallelEnvAdapter(env, spec), TeamArrays.allocate(spec)


@pytest.mark.parametrize("factory", [EarlyLeaverEnv, NeverEndingEnv])
def test_project_envs_pass_pettingzoo_api_test(factory):
    parallel_api_test(factory(), num_cycles=20)


def test_agent_that_leaves_early_is_masked_and_gets_no_action():
    env = EarlyLeaverEnv(leave_at=2, max_steps=4)
    adapter, out = _adapter(env)
    (group,) = adapter.spec.groups
    assert group.agents == ("agent_0", "agent_1", "agent_2")
    assert adapter.spec.state_dim == 6 and not adapter.spec.state_from_env
    adapter.reset(0, out)
    agents = out.groups["agent"]
    np.testing.assert_array_equal(agents.alive, [True, True, True])
    np.testing.assert_array_equal(agents.obs, [[0, 0], [1, 0], [2, 0]])
    actions = {"agent": np.array([0, 1, 2])}

    assert not adapter.step(actions, out)  # t = 1: everyone still in
    np.testing.assert_array_equal(agents.reward, [1, 2, 3])

    assert not adapter.step(actions, out)  # t = 2: agent_1 terminates
    np.testing.assert_array_equal(agents.terminated, [False, True, False])
    np.testing.assert_array_equal(agents.truncated, [False, False, False])
    np.testing.assert_array_equal(agents.alive, [True, False, True])
    np.testing.assert_array_equal(agents.final_obs[1], [1, 2])  # its last observation is kept
    np.testing.assert_array_equal(agents.obs[1], [0, 0])  # and its slot is zero-padded from now on
    np.testing.assert_array_equal(out.state, [0, 2, 0, 0, 2, 2])  # concatenated obs, gone agent zeroed

    assert not adapter.step(actions, out)  # t = 3: agent_1 absent
    assert set(env.received_actions[-1]) == {"agent_0", "agent_2"}
    np.testing.assert_array_equal(agents.reward, [1, 0, 3])
    np.testing.assert_array_equal(agents.terminated, [False, False, False])

    assert adapter.step(actions, out)  # t = 4: truncation ends the episode
    np.testing.assert_array_equal(agents.truncated, [True, False, True])
    np.testing.assert_array_equal(agents.terminated, [False, False, False])
    np.testing.assert_array_equal(agents.alive, [False, False, False])
    np.testing.assert_array_equal(agents.final_obs, [[0, 4], [0, 0], [2, 4]])


SILENT = "agent left env.agents without being terminated or truncated"


def test_an_agent_that_leaves_with_neither_flag_is_a_contract_error():
    adapter, out = _adapter(BrokenEnv(fault="silent_leave", at=2))
    adapter.reset(0, out)
    actions = {"agent": np.zeros(2, np.int64)}
    assert not adapter.step(actions, out)
    with pytest.raises(EnvContractError) as caught:
        adapter.step(actions, out)
    message = str(caught.value)
    assert message.startswith("env 'test' (copy 0, episode step 2), agent 'agent_1': " + SILENT)
    assert "metadata['agents_can_rejoin'] = True" in message and "\n" not in message


def test_every_agent_ending_with_its_flag_at_the_last_step_is_no_leaver():
    adapter, out = _adapter(BrokenEnv(fault="none", max_steps=3))
    adapter.reset(0, out)
    actions = {"agent": np.zeros(2, np.int64)}
    for _ in range(2):  # two episodes, every agent truncated and removed at its last step
        assert [adapter.step(actions, out) for _ in range(3)] == [False, False, True]
        adapter.reset(None, out)


def test_an_env_whose_agents_rejoin_may_keep_one_out_until_the_episode_ends():
    adapter, out = _adapter(BrokenEnv(fault="silent_pause", at=2, max_steps=4, rejoin=True))
    adapter.reset(0, out)
    agents, actions = out.groups["agent"], {"agent": np.zeros(2, np.int64)}
    adapter.step(actions, out)
    adapter.step(actions, out)  # agent_1 steps out with neither flag
    np.testing.assert_array_equal(agents.alive, [True, False])
    adapter.step(actions, out)  # and is back
    np.testing.assert_array_equal(agents.alive, [True, True])
    assert adapter.step(actions, out)

    adapter, out = _adapter(BrokenEnv(fault="silent_leave", at=2, max_steps=4, rejoin=True))
    adapter.reset(0, out)
    for _ in range(3):
        assert not adapter.step(actions, out)  # out, but the episode goes on
    with pytest.raises(
        EnvContractError,
        match=r"episode step 4\), agent 'agent_1': agent left env.agents "
        r"at episode step 2 without being terminated or truncated and the episode ended",
    ):
        adapter.step(actions, out)


def test_a_turn_based_agent_that_leaves_with_neither_flag_is_a_contract_error():
    env = SilentLeaverAEC(at=3)
    spec = build_team_spec(env, "aec")
    adapter, out = TurnBasedAdapter(env, spec), TeamArrays.allocate(spec)
    adapter.reset(0, out)
    actions = {"player": np.zeros(2, np.int64)}
    assert not adapter.step(actions, out) and not adapter.step(actions, out)
    with pytest.raises(EnvContractError, match=r"episode step 3\), agent 'player_1': " + SILENT):
        adapter.step(actions, out)
    env = SilentLeaverAEC(at=99, max_moves=4)  # both truncated and removed through None steps: no error
    adapter = TurnBasedAdapter(env, spec)
    adapter.reset(0, out)
    assert [adapter.step(actions, out) for _ in range(4)] == [False, False, False, True]


def test_vector_env_auto_resets_and_keeps_final_obs_and_state():
    venv = SyncVectorEnv(lambda: _adapter(EarlyLeaverEnv(leave_at=2, max_steps=3))[0], num_envs=2)
    arrays = venv.reset(seed=0)
    agents = arrays.groups["agent"]
    actions = {"agent": np.zeros((2, 3), np.int64)}
    for _ in range(2):
        venv.step(actions)
        assert not venv.episode_over.any()
    venv.step(actions)
    assert venv.episode_over.all()
    np.testing.assert_array_equal(agents.truncated, [[True, False, True]] * 2)
    np.testing.assert_array_equal(agents.final_obs[:, 0], [[0, 3]] * 2)  # pre-reset final observation
    np.testing.assert_array_equal(arrays.final_state[0], [0, 3, 0, 0, 2, 3])
    np.testing.assert_array_equal(agents.obs[0], [[0, 0], [1, 0], [2, 0]])  # the new episode's first obs
    np.testing.assert_array_equal(agents.alive, [[True, True, True]] * 2)
    np.testing.assert_array_equal(arrays.state[0], [0, 0, 1, 0, 2, 0])


def test_mpe_spread_uses_env_state_and_one_group():
    env = make_env("mpe2/simple_spread_v3")
    spec = build_team_spec(env, "mpe2/simple_spread_v3")
    assert [g.agents for g in spec.groups] == [("agent_0", "agent_1", "agent_2")]
    assert spec.state_from_env and spec.state_dim == 54
    assert spec.groups[0].obs_dim == 18


def test_heterogeneous_agents_form_groups_in_agent_order():
    env = make_env("mpe2/simple_adversary_v3")
    spec = build_team_spec(env, "mpe2/simple_adversary_v3")
    assert [(g.name, g.agents) for g in spec.groups] == [
        ("adversary", ("adversary_0",)),
        ("agent", ("agent_0", "agent_1")),
    ]
    assert spec.groups[0].obs_dim != spec.groups[1].obs_dim


class _TwoArmies:
    """combined_arms' naming: red and blue melee units with identical spaces, two red ranged units."""

    possible_agents = ["redmelee_0", "redmelee_1", "redranged_0", "bluemelee_0", "bluemelee_1"]

    def observation_space(self, agent):
        return spaces.Box(0.0, 1.0, (3,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(4)

    def reset(self, seed=None, options=None):
        return {a: np.zeros(3, np.float32) for a in self.possible_agents}, {}


def test_automatic_groups_keep_sides_apart_whose_names_differ_though_spaces_match():
    spec = build_team_spec(_TwoArmies(), "armies")
    assert [(g.name, g.agents) for g in spec.groups] == [
        ("redmelee", ("redmelee_0", "redmelee_1")),
        ("redranged", ("redranged_0",)),
        ("bluemelee", ("bluemelee_0", "bluemelee_1")),
    ]
    # names without a number say nothing about sides: the matrix game's row and column share a group
    spec = build_team_spec(make_env("envs/matrix_game_v0"), "envs/matrix_game_v0")
    assert [(g.name, g.agents) for g in spec.groups] == [("row", ("row", "column"))]


def test_env_groups_may_name_agents_by_their_name_without_the_number():
    env = _TwoArmies()
    spec = build_team_spec(env, "armies", {"red": ["redmelee", "redranged_0"], "blue": ["bluemelee"]})
    assert [(g.name, g.agents) for g in spec.groups] == [
        ("red", ("redmelee_0", "redmelee_1", "redranged_0")),
        ("blue", ("bluemelee_0", "bluemelee_1")),
    ]
    with pytest.raises(EnvContractError, match=r"unknown: \['green'\]"):
        build_team_spec(env, "armies", {"red": ["redmelee", "redranged"], "blue": ["bluemelee", "green"]})


def test_groups_by_name_must_cover_every_agent():
    env = make_env("mpe2/simple_spread_v3")
    spec = build_team_spec(env, "x", {"left": ["agent_0"], "right": ["agent_1", "agent_2"]})
    assert [g.name for g in spec.groups] == ["left", "right"]
    with pytest.raises(EnvContractError, match="missing"):
        build_team_spec(env, "x", {"left": ["agent_0"]})


def test_box_actions_are_clipped_to_bounds():
    env = make_env("mpe2/simple_spread_v3", continuous_actions=True)
    adapter, out = _adapter(env)
    (group,) = adapter.spec.groups
    assert isinstance(group.action_space, spaces.Box) and group.action_shape == (5,)
    clipped = adapter._to_env_action(group, np.array([-3.0, 0.5, 2.0, 0.0, 1.0], np.float32))
    np.testing.assert_array_equal(clipped, [0.0, 0.5, 1.0, 0.0, 1.0])


@pytest.mark.parametrize(
    "space",
    [
        spaces.Box(-1.0, 1.0, (5,), np.float32),
        spaces.Box(np.array([-2.0, 0.0, -0.5]), np.array([0.0, 3.0, 0.5]), dtype=np.float64),
        spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    ],
)
def test_box_action_conversion_is_np_clip_value_for_value(space):
    from marl_ppo.envs.adapters.pettingzoo import action_converter

    convert = action_converter(space)
    rng = np.random.default_rng(0)
    for _ in range(50):
        action = (rng.standard_normal(int(np.prod(space.shape))) * 3).astype(np.float32)
        action[rng.integers(action.size)] = np.nan  # a NaN stays NaN, as np.clip keeps it
        expected = np.clip(action.reshape(space.shape), space.low, space.high).astype(space.dtype, copy=False)
        got = convert(action)
        assert got.dtype == expected.dtype and got.shape == space.shape
        np.testing.assert_array_equal(got, expected)


def test_vector_observations_take_the_short_path_with_the_same_checks():
    from marl_ppo.envs.layout import flatten_value

    env = make_env("mpe2/simple_spread_v3")
    adapter, _ = _adapter(env)
    (group,) = adapter.spec.groups
    assert adapter._vector_box[group.name] is group.observation_space
    observation = np.random.default_rng(0).standard_normal(group.obs_dim)  # float64, as MPE gives
    fast = adapter._flatten("agent_0", observation)
    assert fast.dtype == np.float32
    np.testing.assert_array_equal(fast, flatten_value(group.obs_layout, group.observation_space, observation))
    with pytest.raises(EnvContractError, match="observation has shape"):
        adapter._flatten("agent_0", observation[:-1])
    with pytest.raises(EnvContractError, match="observation has shape"):
        adapter._flatten("agent_0", [0.0] * (group.obs_dim - 1))  # not an array: the general path


def test_pool_image_averages_blocks_and_scales_uint8():
    from marl_ppo.envs.grouping import pool_image

    image = np.arange(5 * 4 * 2, dtype=np.uint8).reshape(5, 4, 2)  # 5 rows: the last is cropped
    pooled = pool_image(image, 2)
    assert pooled.shape == (2, 2, 2)
    # top-left block, channel 0: pixels (0,0)=0, (0,1)=2, (1,0)=8, (1,1)=10 -> mean 5
    assert pooled[0, 0, 0] == pytest.approx(5 / 255)
    assert pooled[1, 1, 1] == pytest.approx(np.mean([21, 23, 29, 31]) / 255)


def test_image_pool_shrinks_obs_and_state_dims():
    env = make_env("butterfly/pistonball_v6")
    spec = build_team_spec(env, "pistonball", image_pool=8)
    assert spec.groups[0].obs_dim == (457 // 8) * (120 // 8) * 3
    assert spec.state_dim == (560 // 8) * (880 // 8) * 3
    adapter = ParallelEnvAdapter(env, spec)
    out = TeamArrays.allocate(spec)
    adapter.reset(0, out)
    pistons = out.groups["piston"].obs
    assert pistons.min() >= 0.0 and pistons.max() <= 1.0 and out.state.max() > 0


def test_an_agent_that_joins_later_becomes_alive_with_its_first_observation():
    env = LateJoinerEnv(leave_at=10, max_steps=5)
    spec = build_team_spec(env, "late")
    adapter, out = ParallelEnvAdapter(env, spec), TeamArrays.allocate(spec)
    adapter.reset(0, out)
    agents = out.groups["agent"]
    np.testing.assert_array_equal(agents.alive, [True, True, False])
    np.testing.assert_array_equal(agents.obs[2], [0, 0])
    actions = {"agent": np.zeros(3, np.int64)}
    adapter.step(actions, out)
    assert set(env.received_actions[-1]) == {"agent_0", "agent_1"}  # no action for an absent agent
    np.testing.assert_array_equal(agents.reward, [1, 2, 0])
    adapter.step(actions, out)  # agent_2 joins with this step's observations
    np.testing.assert_array_equal(agents.alive, [True, True, True])
    np.testing.assert_array_equal(agents.obs[2], [2, 2])
    adapter.step(actions, out)
    assert set(env.received_actions[-1]) == {"agent_0", "agent_1", "agent_2"}
    np.testing.assert_array_equal(agents.reward, [1, 2, 3])


@pytest.mark.parametrize("continuous", [False, True])
def test_stepping_without_check_wrappers_keeps_every_trajectory(continuous):
    """The assertion-only wrappers go; behaviour-changing ones (action clipping) stay; data is identical."""
    from pettingzoo.utils.wrappers import ClipOutOfBoundsWrapper

    from marl_ppo.envs.adapters.check_wrappers import without_check_wrappers

    def build(strip):
        env = make_env("mpe2/simple_spread_v3", max_cycles=7, continuous_actions=continuous)
        return without_check_wrappers(env) if strip else env

    stripped = build(True)
    core = stripped.aec_env
    assert isinstance(core, ClipOutOfBoundsWrapper) if continuous else type(core).__name__ == "raw_env"
    runs = []
    for strip in (False, True):
        adapter, out = _adapter(build(strip))
        rng = np.random.default_rng(0)
        adapter.reset(5, out)
        trace = []
        for _ in range(30):
            (group,) = adapter.spec.groups
            if continuous:  # partly out of bounds, so that clipping matters
                actions: dict[str, np.ndarray] = {
                    group.name: rng.uniform(-0.5, 1.5, size=(3, *group.action_shape)).astype(np.float32)
                }
            else:
                actions = {group.name: rng.integers(0, 5, size=3)}
            if adapter.step(actions, out):
                adapter.reset(None, out)
            agents = out.groups[group.name]
            trace.append([a.copy() for a in (agents.obs, agents.reward, out.state, agents.truncated)])
        runs.append(trace)
    for wrapped, bare in zip(*runs, strict=True):
        for a, b in zip(wrapped, bare, strict=True):
            np.testing.assert_array_equal(a, b)
