"""Every hand-written piece of `marl_ppo/fast/` against the library piece its `fast.*` switch selects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from marl_ppo.config import ConfigError, build_config, load_config, migrate_stored
from marl_ppo.config.fast import REMOVED_FAST_KEYS
from marl_ppo.envs.factory import make_adapter, probe_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.fast.screen_copy import one_screen_copy
from tests.helpers import ROOT, assert_same_runs

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"
PISTONBALL = ROOT / "experiments/butterfly/pistonball_v6.yaml"


PISTONBALL_TINY = [
    "env.kwargs={max_cycles: 15}",
    "rollout.num_envs=1",
    "rollout.rollout_steps=10",
    "total_steps=20",
    "rollout.vector=sync",
    "host.torch_threads=1",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
    "model.hidden_sizes=[16]",
    "log.progress=false",
]


def test_a_pistonball_run_reading_its_own_screen_learns_the_very_same_weights(tmp_path):
    """`fast.screen_copy: false` in a run where it acts: pistonball's pixels come from the env's own
    observe() and state(), and the run learns and logs exactly what the screen copy's run does."""
    for module in ("pymunk", "pygame"):
        pytest.importorskip(module)
    for value, module in (("true", "marl_ppo.fast.screen_copy"), ("false", "pettingzoo.butterfly")):
        config = load_config(PISTONBALL, [*PISTONBALL_TINY, f"fast.screen_copy={value}"])
        adapter = make_adapter(config, probe_spec(config))
        assert adapter.env.aec_env.unwrapped.observe.__func__.__module__.startswith(module)
        adapter.close()
    assert_same_runs(PISTONBALL, PISTONBALL_TINY, ["fast.screen_copy=false"], tmp_path)


@pytest.mark.parametrize(
    ("env_id", "kept_agent"),
    [("butterfly/pistonball_v6", "piston_3"), ("butterfly/cooperative_pong_v6", "paddle_1")],
)
def test_butterfly_read_from_one_screen_copy_gives_the_envs_own_observations_and_states(env_id, kept_agent):
    """Over short episodes (seeded and unseeded resets between, a render in the middle), every agent's
    observation, the rewards and ends, and the state equal what the env's own calls give, and an
    observation kept from an earlier frame is not changed by later ones."""
    for module in ("pymunk", "pygame"):
        pytest.importorskip(module)
    stock = make_env(env_id, max_cycles=15)
    fast = one_screen_copy(make_env(env_id, max_cycles=15))
    assert fast.aec_env.unwrapped.observe.__func__.__module__ == "marl_ppo.fast.screen_copy"
    kept = None
    for env in (stock, fast):
        env.reset(seed=3)
        for agent in env.possible_agents:
            env.action_space(agent).seed(11)
    episodes = 0
    for t in range(60):
        if not stock.agents:
            episodes += 1
            seed = 5 if episodes == 2 else None
            np.testing.assert_equal(fast.reset(seed=seed), stock.reset(seed=seed))
        actions = {agent: stock.action_space(agent).sample() for agent in stock.agents}
        (obs_stock, *rest_stock), (obs_fast, *rest_fast) = stock.step(actions), fast.step(actions)
        np.testing.assert_equal(obs_fast, obs_stock)
        np.testing.assert_equal(rest_fast, rest_stock)
        np.testing.assert_array_equal(fast.state(), stock.state())
        if t == 5:
            kept, kept_copy = obs_fast[kept_agent], obs_fast[kept_agent].copy()
        if t == 20:
            np.testing.assert_array_equal(fast.render(), stock.render())
    assert kept is not None and episodes >= 2
    np.testing.assert_array_equal(kept, kept_copy)


def _network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.parametrize("key", sorted(REMOVED_FAST_KEYS))
def test_a_removed_switch_is_refused_in_one_line_naming_the_library_piece_and_the_fix(key):
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"fast.{key}=false"])
    assert str(error.value) == (
        f"config key 'fast.{key}' was removed: {REMOVED_FAST_KEYS[key]} is always used now; "
        "delete the key from the experiment file or the overrides"
    )


def test_the_removed_flat_adam_is_refused_in_one_line_and_a_stored_config_takes_torchs_adam():
    with pytest.raises(ConfigError) as error:
        load_config(None, ["fast.optimizer=flat_adam"])
    assert str(error.value) == (
        "fast.optimizer=flat_adam was removed: torch.optim.Adam's single-tensor step computes the same "
        "numbers; set fast.optimizer=adam (the default) or drop the key"
    )
    # a run of an older version recorded the removed pieces' switches: it resumes and evaluates on
    # the library pieces in their place
    stored = {"fast": {"optimizer": "flat_adam", "lean_cycle": True, "sigmoid_tanh": False}}
    assert migrate_stored(stored)["fast"] == {"optimizer": "adam"}
    assert build_config(migrate_stored(stored)).fast.optimizer == "adam"


def test_the_recurrent_cell_switch_and_the_activation_reach_every_layer_they_name():
    from marl_ppo.models.layers import AgentMLP
    from marl_ppo.models.recurrent import StackedRecurrent
    from marl_ppo.models.team import TeamModel

    for overrides, library, activation in (
        ([], False, torch.tanh),
        (["fast.recurrent_cell=false", "model.activation=relu"], True, torch.relu),
    ):
        config = load_config(SPREAD, ["model.recurrent=gru", *overrides])
        model = TeamModel(probe_spec(config), config)
        cells = [m for m in model.modules() if isinstance(m, StackedRecurrent)]
        mlps = [m for m in model.modules() if isinstance(m, AgentMLP)]
        assert len(cells) == 2 and all(cell.library_cell is library for cell in cells), overrides
        assert len(mlps) == 2 and all(mlp.activation is activation for mlp in mlps), overrides
