"""Every scenario of an installed family by id (`vmas/`, `magent2/`, `pettingzoo/`), Hanabi, the listing,
the closest ids for an unknown one, and the conformance check of a batched simulator."""

import json

import numpy as np
import pytest

import marl_ppo
from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.envs.registry import EnvError, env_spec, make_env
from marl_ppo.plan.copies import settle_copies
from marl_ppo.plan.settle import plan_run
from marl_ppo.run.conformance import check_env
from marl_ppo.run.loop import train
from tests.helpers import ROOT

SMALL = [
    "total_steps=4000",
    "log.progress=false",
    "rollout.vector=sync",
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
    "model.hidden_sizes=[32,32]",
]


@pytest.mark.parametrize(
    ("env_id", "overrides"),
    [
        # a VMAS scenario the catalog has no id for, batched as the catalog's are
        ("vmas/flocking", ["rollout.num_envs=40", "rollout.rollout_steps=100", "env.kwargs={max_steps: 50}"]),
        (
            "magent2/tiger_deer_v4",
            [
                "rollout.num_envs=2",
                "rollout.rollout_steps=2000",
                "env.kwargs={map_size: 10, max_cycles: 100}",
            ],
        ),
        (
            "pettingzoo/classic/leduc_holdem_v4",
            ["rollout.num_envs=4", "rollout.rollout_steps=1000", "ppo.critic=obs", "model.share_actor=true"],
        ),
        ("classic/hanabi_v5", ["rollout.num_envs=4", "rollout.rollout_steps=1000"]),
    ],
)
def test_an_id_of_each_family_trains_4000_steps(env_id, overrides, tmp_path):
    experiment = ROOT / "experiments/classic/hanabi_v5.yaml" if env_id == "classic/hanabi_v5" else None
    config = load_config(experiment, [f"env.id={env_id}", *overrides, *SMALL])
    result = train(config, tmp_path)
    assert result.env_steps == 4000 and result.updates == 1
    assert result.episodes > 0 and np.isfinite(result.team_return_mean)


def test_hanabi_is_two_player_hanabi_full_with_masked_moves():
    env = make_env("classic/hanabi_v5")
    env.reset(seed=0)
    observation, _, _, _, _ = env.last()
    assert env.possible_agents == ["player_0", "player_1"]
    # 20 moves: 5 discards, 5 plays, and a colour or rank hint to the partner (5 + 5)
    assert observation["observation"].shape == (658,) and observation["action_mask"].shape == (20,)
    assert observation["action_mask"][:5].sum() == 0  # no discard while all 8 hint tokens are left
    assert observation["action_mask"][5:10].all() and observation["action_mask"].sum() < 20


def test_a_registered_id_is_built_the_catalogs_way_under_the_pettingzoo_prefix():
    # the catalog draws pistonball's frames (render_mode rgb_array); PettingZoo's bare env would not
    assert make_env("pettingzoo/butterfly/pistonball_v6").unwrapped.render_mode == "rgb_array"
    assert env_spec("vmas/flocking").batched and env_spec("vmas/flocking").extra == "vmas"


@pytest.mark.parametrize(
    ("env_id", "closest"),
    [
        ("vmas/flockin", "'vmas/flocking'"),
        ("magent2/tiger_dear_v4", "'magent2/tiger_deer_v4'"),
        ("pettingzoo/classic/hanabi_v4", "'pettingzoo/classic/hanabi_v5'"),
    ],
)
def test_an_unknown_id_names_the_closest_ones_in_one_line(env_id, closest):
    with pytest.raises(EnvError) as caught:
        make_env(env_id)
    message = str(caught.value)
    assert "\n" not in message and f"unknown env id '{env_id}'" in message and closest in message


def test_marl_ppo_envs_lists_what_each_family_offers(capsys):
    assert main(["envs", "--json"]) == 0
    ids = {row["id"] for row in json.loads(capsys.readouterr().out)}
    assert {"vmas/flocking", "vmas/football", "magent2/tiger_deer_v4", "magent2/combined_arms_v6"} <= ids
    assert {"pettingzoo/classic/chess_v6", "pettingzoo/classic/texas_holdem_v4", "classic/hanabi_v5"} <= ids


def test_envs_check_passes_a_batched_simulator():
    report = check_env("vmas/navigation", max_steps=10)
    assert report.passed, report.render()
    statuses = [result.status for result in report.results]
    assert statuses == ["SKIP", "PASS", "PASS", "PASS"]


def test_a_batched_factory_without_the_vmas_flags_is_refused_in_one_line(tmp_path):
    import vmas

    marl_ppo.register_env(
        "tests/plain_vmas_v0",
        lambda num_envs, device, seed, **kwargs: vmas.make_env(
            "flocking", num_envs=num_envs, device=device, seed=seed
        ),
        batched=True,
    )
    config = load_config(
        None, ["env.id=tests/plain_vmas_v0", "rollout.num_envs=2", "total_steps=200", "log.progress=false"]
    )
    with pytest.raises(Exception) as caught:
        train(config, tmp_path)
    message = str(caught.value)
    assert "\n" not in message and "dict_spaces=True" in message and "terminated_truncated=True" in message


def test_a_batched_family_picks_its_own_copies_unless_the_config_sets_num_envs(tmp_path):
    def copies(*overrides, experiment=None):
        config = load_config(experiment, list(overrides))
        return config.rollout.num_envs, settle_copies(config).rollout.num_envs

    # the config leaves the number to the env (null); the plan settles it from the registration
    assert copies("env.id=vmas/flocking") == (None, 1024)  # any VMAS scenario
    assert copies("env.id=vmas/navigation") == (None, 1024)  # a catalog id
    assert copies("env.id=jaxmarl/smax_2s3z") == (None, 64)
    assert copies("env.id=mpe2/simple_spread_v3") == (None, 16)  # one env per copy
    assert copies("env.id=vmas/flocking", "rollout.num_envs=8") == (8, 8)
    experiment = tmp_path / "flocking.yaml"
    experiment.write_text("env: {id: vmas/flocking}\nrollout: {num_envs: 32}\n")
    assert copies(experiment=experiment) == (32, 32)
    user_file = tmp_path / "my_sim.py"
    user_file.write_text(
        "import marl_ppo\n"
        "marl_ppo.register_env('mine/sim_v0', lambda num_envs, device, seed: None, batched=True, copies=256)\n"
    )
    assert copies(f"env.id={user_file}:mine/sim_v0") == (None, 256)
    # a plan's config records the number, and the config package never reads the registry
    assert plan_run(load_config(None, ["env.id=envs/matrix_game_v0"])).config.rollout.num_envs == 16
