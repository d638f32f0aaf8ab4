"""The time-limit bootstrap against the analytic value 1 / (1 - gamma) on a never-ending task."""

import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import load_config
from marl_ppo.models.team import TeamModel
from marl_ppo.run.loop import train
from tests.helpers import values_of, vector_env

GAMMA = 0.9


def _learned_value(tmp_path, env_kwargs):
    config = load_config(
        None,
        [
            "env.id=envs/never_ending_v0",
            f"env.kwargs={env_kwargs}",
            f"ppo.gamma={GAMMA}",
            "ppo.gae_lambda=0.95",
            "rollout.num_envs=4",
            "rollout.rollout_steps=20",
            "total_steps=4800",
            "log.progress=false",
            "ppo.vf_lr=3e-3",
            "ppo.train_vf_iters=10",
            "ppo.train_pi_iters=1",
            "ppo.num_minibatches=2",
            "model.hidden_sizes=[16]",
        ],
    )
    train(config, tmp_path)
    venv = vector_env(config)
    model = TeamModel(venv.spec, config)
    model.load_state_dict(load_checkpoint(tmp_path / "checkpoints/final.pt")["model"])
    arrays = venv.reset(seed=0)
    with torch.no_grad():
        obs = {name: torch.from_numpy(group.obs) for name, group in arrays.groups.items()}
        values = values_of(model, torch.from_numpy(arrays.state), obs)
    return values["agent"].numpy()


def test_truncated_never_ending_task_learns_the_infinite_horizon_value(tmp_path):
    values = _learned_value(tmp_path, "{max_steps: 5, num_agents: 2}")
    analytic = 1.0 / (1.0 - GAMMA)  # = 10; treating the time limit as termination would give 2.63
    np.testing.assert_allclose(values, analytic, atol=0.3)


def test_the_same_limit_as_termination_learns_the_finite_horizon_value(tmp_path):
    values = _learned_value(tmp_path, "{max_steps: 5, num_agents: 2, end_by: termination}")
    # one observation for all 5 steps, so V is the mean of (1 - gamma^k) / (1 - gamma) for k = 5..1 steps left
    finite = np.mean([(1 - GAMMA**k) / (1 - GAMMA) for k in range(1, 6)])  # = 2.63
    np.testing.assert_allclose(values, finite, atol=0.3)
