"""VMAS as a native batched env: the rollout stays in torch, truncations keep their final observations."""

import pytest
import torch

pytest.importorskip("vmas")

from marl_ppo.config import load_config  # noqa: E402
from marl_ppo.models.team import TeamModel  # noqa: E402
from marl_ppo.rollout.buffer import RolloutBuffer  # noqa: E402
from marl_ppo.rollout.collector import Collector  # noqa: E402
from marl_ppo.train import build_vector_env  # noqa: E402


def _config(max_steps):
    return load_config(
        None, ["env.id=vmas/navigation", f"env.kwargs={{max_steps: {max_steps}}}", "num_envs=8"]
    )


def test_spec_and_tensor_arrays():
    venv = build_vector_env(_config(5))
    (group,) = venv.spec.groups
    assert group.agents == ("agent_0", "agent_1", "agent_2", "agent_3") and group.obs_dim == 18
    assert group.action_shape == (2,) and venv.spec.state_dim == 4 * 18
    arrays = venv.reset(0)
    assert all(isinstance(o, torch.Tensor) for o in arrays.obs) and isinstance(arrays.state, torch.Tensor)
    assert arrays.obs[0].shape == (8, 4, 18)


def test_truncation_keeps_the_final_observation_then_resets():
    venv = build_vector_env(_config(3))
    arrays = venv.reset(0)
    actions = [torch.ones(8, 4, 2)]  # every agent pushes the same way, so positions drift
    for _ in range(2):
        venv.step(actions)
        assert not venv.episode_over.any()
    before_last = arrays.obs[0].clone()
    venv.step(actions)
    assert venv.episode_over.all() and arrays.truncated[0].all() and not arrays.terminated[0].any()
    assert not torch.equal(arrays.final_obs[0], arrays.obs[0])  # obs is the new episode's first
    assert not torch.equal(arrays.final_obs[0], before_last)  # final_obs is after the last move
    torch.testing.assert_close(arrays.final_state, arrays.final_obs[0].reshape(8, -1))


def test_a_vmas_rollout_never_leaves_torch(monkeypatch):
    config = _config(1000)  # no episode ends inside the rollout, so nothing is logged either
    venv = build_vector_env(config)
    torch.manual_seed(0)
    model = TeamModel(venv.spec, config)
    buffer = RolloutBuffer(venv.spec, 10, config.num_envs)
    collector = Collector(venv, model, torch.device("cpu"))
    collector.start(0)

    def refuse(*args, **kwargs):
        raise AssertionError("the VMAS rollout converted a tensor to or from NumPy")

    monkeypatch.setattr(torch.Tensor, "numpy", refuse)
    monkeypatch.setattr(torch, "from_numpy", refuse)
    result = collector.collect(buffer)
    monkeypatch.undo()
    assert result.env_steps == 80 and buffer.full
    assert buffer.groups[0].rewards.abs().sum() > 0 and buffer.state.abs().sum() > 0


def test_resetting_some_copies_gives_the_observations_of_one_reset_at_a_time():
    """Copies that end at different steps are reset with one observation pass for all of them;
    the observations equal VMAS's one-copy-at-a-time `reset_at`."""
    batched, reference = build_vector_env(_config(100)), build_vector_env(_config(100))
    for venv in (batched, reference):
        venv.reset(0)
        venv.step([torch.ones(8, 4, 2)])  # move away from the spawn points
    finished = [1, 4, 6]
    before = batched.arrays.obs[0][finished, 0].clone()
    batched.env.seed(7)
    observations = batched._reset_at(finished)
    reference.env.seed(7)
    for index in finished:
        expected = reference.env.reset_at(index)
    for agent in expected:
        torch.testing.assert_close(observations[agent], expected[agent], rtol=0, atol=0)
    assert not torch.equal(observations["agent_0"][finished], before)  # those copies were reset
