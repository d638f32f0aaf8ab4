"""JaxMARL envs as one jitted, vmapped batch: exact steps against JaxMARL's own, auto-reset that keeps
the final observation, masks, wins, DLPack hand-off, exact resume, and 4,000 training steps per family.

Compiled functions go to JAX's persistent cache (`MARL_PPO_JAX_CACHE`, default ~/.cache/marl_ppo/jax),
so only the first run on a machine pays the compile (tens of seconds for SMAX).
"""

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from marl_ppo.config import load_config
from marl_ppo.envs.registry import EnvError, env_spec, id_families
from marl_ppo.envs.vector.base import VectorEnv, WinsEpisodes
from marl_ppo.plan.settle import plan_run
from marl_ppo.run.loop import train
from tests.helpers import vector_env

pytestmark = pytest.mark.jax  # JAX is imported inside the tests, so that collecting them loads nothing

COPIES = 4


def _venv(name, copies=COPIES, **kwargs):
    overrides = [f"env.id=jaxmarl/{name}", f"rollout.num_envs={copies}"]
    if kwargs:
        overrides.append("env.kwargs={" + ", ".join(f"{k}: {v}" for k, v in kwargs.items()) + "}")
    return vector_env(load_config(None, overrides))


def _allowed_actions(venv, generator):
    """A uniformly random allowed action per agent (any action where the env has no masks)."""
    actions = {}
    for group in venv.spec.groups:
        mask = venv.arrays.groups[group.name].action_mask
        if mask.shape[-1] == 0:
            mask = torch.ones((*mask.shape[:-1], group.action_space.n), dtype=torch.bool)
        logits = torch.where(mask, 0.0, float("-inf"))
        actions[group.name] = torch.distributions.Categorical(logits=logits).sample()
    return actions


@pytest.fixture(scope="module")
def smax():
    """SMAX 3m in 4 copies whose episodes last at most 5 steps (one trace shared by the tests here)."""
    return _venv("smax_3m", max_steps=5)


def test_the_family_is_listed_and_builds_a_vector_env(smax):
    (family,) = [family for family in id_families() if family.prefix == "jaxmarl/"]
    ids = set(family.offered_ids())
    for name in ("smax_2s3z", "smax_3s5z", "smax_6h_vs_8z", "smax_5m_vs_6m", "overcooked_cramped_room"):
        assert f"jaxmarl/{name}" in ids
    assert {"jaxmarl/overcooked_coord_ring", "jaxmarl/hanabi", "jaxmarl/mpe_simple_spread_v3"} <= ids
    venv = smax
    assert isinstance(venv, VectorEnv) and isinstance(venv, WinsEpisodes) and venv.tensor_io
    (group,) = venv.spec.groups
    assert group.agents == ("ally_0", "ally_1", "ally_2") and group.mask_dim == 8
    assert venv.spec.state_from_env and venv.spec.state_dim > 0
    arrays = venv.reset(0)
    assert arrays.groups[group.name].obs.shape == (COPIES, 3, group.obs_dim)
    assert arrays.state.shape == (COPIES, venv.spec.state_dim)
    assert not isinstance(_venv("overcooked_cramped_room"), WinsEpisodes)  # no wins to report
    with pytest.raises(EnvError, match="closest: 'jaxmarl/smax_2s3z'"):
        env_spec("jaxmarl/smax_2s3zz")


def test_each_step_is_jaxmarls_own_step_and_a_finished_copy_restarts_from_its_reset(smax):
    """Copy by copy, the batched step equals JaxMARL's `step_env`, and where the episode ended the next
    observation is JaxMARL's `reset` while `final_obs` keeps the last one (the truncation bootstrap)."""
    import jax
    import jax.numpy as jnp

    venv = smax
    env, group = venv.env, venv.spec.groups[0]
    step_env, reset = jax.jit(env.step_env), jax.jit(env.reset)
    venv.reset(7)
    generator = torch.Generator().manual_seed(0)
    ended = 0
    for _ in range(12):
        keys, states = venv._keys, venv._states
        actions = _allowed_actions(venv, generator)
        arrays = venv.step(actions)
        for copy in range(COPIES):
            _, step_key, reset_key = jax.random.split(keys[copy], 3)
            state = jax.tree.map(lambda leaf, c=copy: leaf[c], states)
            chosen = {a: jnp.int32(actions[group.name][copy, i]) for i, a in enumerate(group.agents)}
            obs, after, rewards, dones, _ = step_env(step_key, state, chosen)
            final = np.stack([np.asarray(obs[a]) for a in group.agents])
            np.testing.assert_allclose(arrays.groups[group.name].final_obs[copy].numpy(), final, atol=1e-6)
            np.testing.assert_allclose(
                arrays.final_state[copy].numpy(), np.asarray(obs["world_state"]), atol=1e-6
            )
            reward = np.array([float(rewards[a]) for a in group.agents])
            np.testing.assert_allclose(arrays.groups[group.name].reward[copy].numpy(), reward, atol=1e-6)
            done = bool(dones["__all__"])
            assert bool(venv.episode_over[copy]) == done
            if done:
                ended += 1
                first, _ = reset(reset_key)
                expected = np.stack([np.asarray(first[a]) for a in group.agents])
                np.testing.assert_allclose(arrays.groups[group.name].obs[copy].numpy(), expected, atol=1e-6)
                allies = bool(after.state.unit_alive[:3].any())
                enemies = bool(after.state.unit_alive[3:].any())
                assert bool(arrays.groups[group.name].truncated[copy, 0]) == (allies and enemies)
                assert bool(arrays.groups[group.name].terminated[copy, 0]) == (not (allies and enemies))
                assert bool(venv.episode_won[copy]) == (allies and not enemies)
            else:
                np.testing.assert_array_equal(arrays.groups[group.name].obs[copy].numpy(), final)
                assert not venv.episode_won[copy]
    assert ended >= COPIES  # every copy hit the 5-step limit at least once


def test_masks_are_smaxs_available_actions_and_hanabis_legal_moves(smax):
    import jax

    venv = smax
    venv.reset(0)
    (group,) = venv.spec.groups
    expected = venv.env.get_avail_actions(jax.tree.map(lambda leaf: leaf[0], venv._states))
    mask = venv.arrays.groups[group.name].action_mask
    assert mask.dtype == torch.bool
    np.testing.assert_array_equal(
        mask[0].numpy(), np.stack([np.asarray(expected[a]) > 0 for a in group.agents])
    )
    hanabi = _venv("hanabi")
    hanabi.reset(0)
    (players,) = hanabi.spec.groups
    legal = hanabi.arrays.groups[players.name].action_mask
    assert legal.shape == (COPIES, 2, 21)
    assert legal[:, 0].sum(-1).gt(1).all() != legal[:, 1].sum(-1).gt(1).all()  # one player moves, one waits


def test_arrays_reach_torch_without_a_copy():
    """The tensors handed out share memory with JAX's outputs (DLPack): no pass through NumPy."""
    venv = _venv("mpe_simple_spread_v3")
    venv.reset(0)
    calls = []
    real = torch.from_dlpack

    def spy(array):
        tensor = real(array)
        calls.append((tensor.data_ptr(), array.unsafe_buffer_pointer()))
        return tensor

    import marl_ppo.envs.jax.vector as vector

    vector_from_dlpack, vector.torch.from_dlpack = vector.torch.from_dlpack, spy  # type: ignore[assignment]  # a spy
    try:
        venv.step({g.name: torch.zeros((COPIES, g.num_agents), dtype=torch.int64) for g in venv.spec.groups})
    finally:
        vector.torch.from_dlpack = vector_from_dlpack
    assert calls and all(pointer == jax_pointer for pointer, jax_pointer in calls)


def test_saved_copies_continue_exactly():
    venv = _venv("overcooked_cramped_room")
    venv.reset(3)
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        venv.step(_allowed_actions(venv, generator))
    saved = venv.env_states()
    plan = [_allowed_actions(venv, generator) for _ in range(4)]
    first = [venv.step(actions).state.clone() for actions in plan]
    other = _venv("overcooked_cramped_room")
    other.reset(99)
    other.load_env_states(saved)
    again = [other.step(actions).state.clone() for actions in plan]
    for a, b in zip(first, again, strict=True):
        torch.testing.assert_close(a, b)


def test_the_learner_keeps_one_torch_thread_beside_jax():
    plan = plan_run(load_config(None, ["env.id=jaxmarl/smax_3m", "rollout.num_envs=4"]))
    assert plan.threads == 1 and plan.config.rollout.vector == "sync" and plan.batched


@pytest.mark.parametrize(
    ("name", "compiled"),
    [
        ("smax_3m", "auto"),
        ("overcooked_cramped_room", "auto"),
        ("hanabi", "auto"),
        ("mpe_simple_spread_v3", "auto"),
        ("smax_3m", "false"),  # the per-step path, which LSTM policies and league opponents take
    ],
    ids=lambda value: value if value != "auto" else "compiled",
)
def test_each_family_trains_4000_steps(name, compiled, tmp_path):
    config = load_config(
        None,
        [
            f"env.id=jaxmarl/{name}",
            f"rollout.compiled={compiled}",
            "rollout.num_envs=8",
            "rollout.rollout_steps=50",
            "total_steps=4000",
            "model.share_actor=true",
            "ppo.train_pi_iters=2",
            "ppo.train_vf_iters=2",
            "log.progress=false",
        ],
    )
    result = train(config, tmp_path)
    assert plan_run(config).config.rollout.compiled is (compiled == "auto")  # every family's is covered
    assert result.env_steps == 4000 and result.updates == 10
    assert result.episodes > 0 and np.isfinite(result.team_return_mean)
    tags = EventAccumulator(str(tmp_path / "tensorboard")).Reload().Tags()["scalars"]
    assert ("rollout/won" in tags) == name.startswith("smax")
    if name.startswith("smax"):
        wins = [
            event.value
            for event in EventAccumulator(str(tmp_path / "tensorboard")).Reload().Scalars("rollout/won")
        ]
        assert set(wins) <= {0.0, 1.0} and len(wins) == result.episodes
