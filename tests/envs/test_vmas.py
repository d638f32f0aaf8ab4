"""VMAS as a native batched env: the rollout stays in torch, truncations keep their final observations."""

import pytest
import torch

pytest.importorskip("vmas")

from marl_ppo.config import load_config  # noqa: E402
from marl_ppo.envs.vmas.adapter import (
    SlowResetWarning,  # noqa: E402
    VmasVectorEnv,
)
from marl_ppo.models.team import TeamModel  # noqa: E402
from marl_ppo.rollout.buffer import RolloutBuffer  # noqa: E402
from marl_ppo.rollout.collector import Collector  # noqa: E402
from tests.helpers import vector_env  # noqa: E402


def _config(max_steps):
    return load_config(
        None, ["env.id=vmas/navigation", f"env.kwargs={{max_steps: {max_steps}}}", "rollout.num_envs=8"]
    )


def test_spec_and_tensor_arrays():
    venv = vector_env(_config(5))
    (group,) = venv.spec.groups
    assert group.agents == ("agent_0", "agent_1", "agent_2", "agent_3") and group.obs_dim == 18
    assert group.action_shape == (2,) and venv.spec.state_dim == 4 * 18
    arrays = venv.reset(0)
    assert list(arrays.groups) == ["agent"]
    agents = arrays.groups["agent"]
    assert isinstance(agents.obs, torch.Tensor) and isinstance(arrays.state, torch.Tensor)
    assert agents.obs.shape == (8, 4, 18)


def test_truncation_keeps_the_final_observation_then_resets():
    venv = vector_env(_config(3))
    arrays = venv.reset(0)
    agents = arrays.groups["agent"]
    actions = {"agent": torch.ones(8, 4, 2)}  # every agent pushes the same way, so positions drift
    for _ in range(2):
        venv.step(actions)
        assert not venv.episode_over.any()
    before_last = agents.obs.clone()
    venv.step(actions)
    assert venv.episode_over.all() and agents.truncated.all() and not agents.terminated.any()
    assert not torch.equal(agents.final_obs, agents.obs)  # obs is the new episode's first
    assert not torch.equal(agents.final_obs, before_last)  # final_obs is after the last move
    torch.testing.assert_close(arrays.final_state, agents.final_obs.reshape(8, -1))


def test_a_vmas_rollout_never_leaves_torch(monkeypatch):
    config = _config(1000)  # no episode ends inside the rollout, so nothing is logged either
    venv = vector_env(config)
    torch.manual_seed(0)
    model = TeamModel(venv.spec, config)
    buffer = RolloutBuffer(venv.spec, 10, config.rollout.copies)
    collector = Collector(venv, model, torch.device("cpu"))
    collector.start(0)

    def refuse(*args, **kwargs):
        raise AssertionError("the VMAS rollout converted a tensor to or from NumPy")

    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    monkeypatch.setattr(torch, "from_numpy", refuse)
    result = collector.collect(buffer)
    monkeypatch.undo()
    assert result.env_steps == 80 and buffer.full
    assert buffer.groups["agent"].rewards.abs().sum() > 0 and buffer.state.abs().sum() > 0


def test_resetting_some_copies_gives_the_observations_of_one_reset_at_a_time():
    """Copies that end at different steps are reset with one observation pass for all of them;
    the observations equal VMAS's one-copy-at-a-time `reset_at`."""
    batched, reference = vector_env(_config(100)), vector_env(_config(100))
    for venv in (batched, reference):
        venv.reset(0)
        venv.step({"agent": torch.ones(8, 4, 2)})  # move away from the spawn points
    assert isinstance(batched, VmasVectorEnv) and isinstance(reference, VmasVectorEnv)
    finished = [1, 4, 6]
    before = batched.arrays.groups["agent"].obs[finished, 0].clone()
    batched.env.seed(7)
    observations = batched._reset_at(finished)
    reference.env.seed(7)
    for index in finished:
        expected = reference.env.reset_at(index)
    for agent in expected:
        torch.testing.assert_close(observations[agent], expected[agent], rtol=0, atol=0)
    assert not torch.equal(observations["agent_0"][finished], before)  # those copies were reset


SCENARIOS = ["navigation", "balance", "transport", "wheel", "sampling"]


def _venv(scenario, max_steps, num_envs=8, spare=True, device="cpu"):
    config = load_config(
        None,
        [f"env.id=vmas/{scenario}", f"env.kwargs={{max_steps: {max_steps}}}", f"rollout.num_envs={num_envs}"],
    )
    venv = vector_env(config, torch.device(device))
    if not spare:
        assert isinstance(venv, VmasVectorEnv)
        venv._fresh_off = True
    return venv


def _random_actions(venv, generator):
    (group,) = venv.spec.groups
    shape = (venv.num_envs, len(group.agents), *group.action_shape)
    return {group.name: (torch.rand(shape, generator=generator) * 2 - 1).to(venv.device)}


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize(
    ("scenario", "device"),
    [*((scenario, "cpu") for scenario in SCENARIOS), pytest.param("navigation", "cuda", marks=CUDA)],
)
def test_copies_given_fresh_states_follow_the_spares_episodes(scenario, device):
    """Finished copies get the initial states of the spare's copies; stepped with the same actions,
    they reproduce the spare's observations and rewards, and the other copies are untouched."""
    venv, reference = _venv(scenario, 100, device=device), _venv(scenario, 100, spare=False, device=device)
    generator = torch.Generator().manual_seed(0)
    for v in (venv, reference):
        v.reset(0)
    for _ in range(3):
        actions = _random_actions(venv, generator)
        venv.step(actions)
        reference.step(actions)
    finished, others = [1, 4, 6], [0, 2, 3, 5, 7]
    agents = venv.arrays.groups["agent"]
    before = agents.obs.clone()
    venv._reset_some(finished)
    spare = venv._fresh.spare
    assert venv._fresh.next == 3  # the spare was reset in one batch and its copies 0-2 were used
    (spare_obs,) = spare.get_from_scenario(
        get_observations=True, get_rewards=False, get_infos=False, get_dones=False
    )
    names = venv.spec.group("agent").agents
    for i, agent in enumerate(names):  # first observations: the spare's, recomputed
        torch.testing.assert_close(agents.obs[finished, i], spare_obs[agent][:3].reshape(3, -1))
    torch.testing.assert_close(agents.obs[others], before[others], rtol=0, atol=0)
    for _ in range(4):
        actions = _random_actions(venv, generator)
        got = venv.step(actions).groups["agent"]
        spare_actions = {a: actions["agent"][finished, i] for i, a in enumerate(names)}
        spare_actions = {
            a: torch.cat([x, x.new_zeros(spare.num_envs - 3, x.shape[1])]) for a, x in spare_actions.items()
        }
        spare_obs, spare_rewards, *_ = spare.step(spare_actions)
        expected = reference.step(actions).groups["agent"]
        for i, agent in enumerate(names):
            torch.testing.assert_close(got.obs[finished, i], spare_obs[agent][:3].reshape(3, -1))
            torch.testing.assert_close(got.reward[finished, i], spare_rewards[agent][:3].reshape(3))
        torch.testing.assert_close(got.obs[others], expected.obs[others], rtol=0, atol=0)
        torch.testing.assert_close(got.reward[others], expected.reward[others], rtol=0, atol=0)


def test_a_copy_given_a_fresh_state_ends_exactly_max_steps_later():
    venv = _venv("navigation", 5)
    venv.reset(0)
    actions = {"agent": torch.zeros(8, 4, 2)}
    agents = venv.arrays.groups["agent"]
    for _ in range(2):
        venv.step(actions)
    venv._reset_some([3])  # copy 3 starts over at step 2
    for step in range(3, 9):
        venv.step(actions)
        expected = {5: [i for i in range(8) if i != 3], 7: [3]}.get(step, [])
        assert torch.nonzero(venv.episode_over).flatten().tolist() == expected, step
        assert agents.truncated[expected].all() and not agents.terminated.any()


def _hidden_state_venv(num_envs=8):
    """Navigation whose observations carry a per-copy phase kept as a `(1, copies)` tensor, a layout
    the fresh-copy walk cannot recognise as per-copy state."""
    import vmas
    from vmas.scenarios.navigation import Scenario

    from marl_ppo.envs.vmas.adapter import VmasVectorEnv

    class HiddenPhase(Scenario):
        def make_world(self, batch_dim, device, **kwargs):
            world = super().make_world(batch_dim, device, **kwargs)
            self.phase = torch.zeros(1, batch_dim, device=device)
            return world

        def reset_world_at(self, env_index=None):
            super().reset_world_at(env_index)
            if env_index is None:
                self.phase.uniform_()
            else:
                self.phase[:, env_index] = torch.rand(())

        def observation(self, agent):
            return torch.cat([super().observation(agent), self.phase.T], dim=-1)

    def make(seed=None):
        return vmas.make_env(
            HiddenPhase(),
            num_envs=num_envs,
            max_steps=100,
            seed=seed,
            dict_spaces=True,
            terminated_truncated=True,
        )

    return VmasVectorEnv(make(0), "hidden_phase", make_spare=make), make


def test_a_scenario_with_state_the_copy_misses_fails_the_check_and_resets_one_at_a_time():
    venv, make = _hidden_state_venv()
    reference = type(venv)(make(0), "hidden_phase")  # no spare: always reset_at
    for v in (venv, reference):
        v.reset(0)
        v.step({"agent": torch.ones(8, 4, 2)})
    venv.env.seed(7)  # VMAS simulators share one random stream: each reset starts it from the same seed
    with pytest.warns(SlowResetWarning, match=r"hidden_phase: .* observations differed right after the copy"):
        venv._reset_some([2, 5])
    reference.env.seed(7)
    reference._reset_some([2, 5])
    torch.testing.assert_close(
        venv.arrays.groups["agent"].obs, reference.arrays.groups["agent"].obs, rtol=0, atol=0
    )
    assert venv._fresh is None and venv._fresh_off  # checked once, then off for good


@pytest.mark.parametrize(
    ("scenario", "device"),
    [*((scenario, "cpu") for scenario in SCENARIOS), pytest.param("navigation", "cuda", marks=CUDA)],
)
def test_a_saved_simulator_continues_exactly_in_a_new_one(scenario, device):
    """VMAS's scenarios do not pickle; their per-copy tensors, VMAS's random streams and the spare's
    unused fresh copies are saved instead. A new simulator that loads them continues the episodes
    exactly: the same observations, rewards and ends, through partial resets and full ones."""
    from marl_ppo.envs.vector.state import load_env_state
    from marl_ppo.envs.vmas.adapter import COPY_STATE
    from marl_ppo.run.seeding import restore_rng_state, rng_state

    generator = torch.Generator().manual_seed(0)
    actions = [_random_actions(_venv(scenario, 6, device=device), generator) for _ in range(14)]

    def run(venv, steps):
        trace = []
        for k in steps:
            arrays = venv.step(actions[k])
            if k in (2, 9):
                venv._reset_some([1, 4, 6])  # partial resets from the spare
            agents = arrays.groups["agent"]
            trace.append([t.clone() for t in (agents.obs, agents.reward, agents.truncated, arrays.state)])
        return trace

    straight = _venv(scenario, 6, device=device)
    straight.reset(3)
    run(straight, range(5))
    (blob,) = straight.env_states()
    assert load_env_state(blob)["kind"] == COPY_STATE  # saved as tensors, not pickled whole
    rng = rng_state()  # the run restores every global stream after the envs (CUDA's too)
    expected = run(straight, range(5, 14))

    resumed = _venv(scenario, 6, device=device)
    resumed.reset(99)  # another seed: everything that matters must come from the saved state
    resumed.load_env_states([blob])
    restore_rng_state(rng)
    got = run(resumed, range(5, 14))
    for step, (a, b) in enumerate(zip(got, expected, strict=True)):
        for x, y in zip(a, b, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=f"step {step + 5}")
