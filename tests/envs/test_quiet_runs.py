"""A run on LBF or RWARE shows no third-party warning the user can do nothing about."""

import warnings

import numpy as np
import pytest

from marl_ppo.config import load_config
from marl_ppo.envs.registry import make_env
from marl_ppo.run.loop import train
from tests.helpers import ROOT


@pytest.mark.parametrize(
    ("env_id", "module"),
    [("lbf/foraging_8x8_2p_2f_coop_v3", "lbforaging"), ("rware/rware_tiny_2ag_v2", "rware")],
)
def test_team_gymnasium_envs_step_without_warnings(env_id, module):
    pytest.importorskip(module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make_env(env_id)
        env.reset(seed=0)
        for _ in range(5):
            env.step({agent: 0 for agent in env.agents})
        env.close()
    assert [str(w.message) for w in caught] == []


def test_an_lbf_run_prints_no_warning(tmp_path):
    pytest.importorskip("lbforaging")
    config = load_config(
        ROOT / "experiments/lbf/foraging_8x8_2p_2f_coop_v3.yaml",
        [
            "rollout.vector=sync",
            "rollout.num_envs=2",
            "rollout.rollout_steps=50",
            "total_steps=100",
            "log.progress=false",
        ]
        + ["ppo.num_minibatches=1", "ppo.train_pi_iters=1", "ppo.train_vf_iters=1"],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config, tmp_path / "run")
    assert result.env_steps == 100 and np.isfinite(result.team_return_mean)
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []


def test_cooperative_pong_steps_without_its_render_mode_warning():
    pytest.importorskip("pygame")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = make_env("butterfly/cooperative_pong_v6", max_cycles=3)
        env.reset(seed=0)
        for _ in range(3):
            env.step({agent: 0 for agent in env.agents})
        env.close()
    assert [str(w.message) for w in caught] == []
