"""Every catalog id has an experiment file, steps through whole episodes with auto-reset (terminations and
truncations) and trains one update (skipped, with the reason, where its extra is missing)."""

import numpy as np
import pytest
import torch

from marl_ppo.config import load_config, yaml_value
from marl_ppo.envs.factory import probe_spec
from marl_ppo.eval.random_policy import random_actions
from marl_ppo.eval.versus import sides_of
from marl_ppo.run.loop import train
from tests.helpers import CATALOG, EPISODES, TERM, TRUNC, experiments, vector_env

ONE_UPDATE = [
    "rollout.vector=sync",
    "rollout.num_envs=2",
    "rollout.rollout_steps=16",
    "total_steps=32",
    "log.progress=false",
    "eval.every=0",  # the evaluations' scores are tested in test_evaluate.py and test_versus.py
    "ppo.train_pi_iters=1",
    "ppo.train_vf_iters=1",
    "ppo.num_minibatches=1",
]


def test_every_catalog_id_has_an_experiment_file():
    missing = [spec.id for spec in CATALOG if spec.id not in experiments()]
    assert not missing, f"no experiments/*.yaml for {missing}"


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_catalog_env_trains_one_update(spec, tmp_path):
    if not spec.installed:
        pytest.skip(
            f"{spec.id}: missing {', '.join(spec.missing_modules)} (pip install 'marl-ppo[{spec.extra}]')"
        )
    config = load_config(experiments()[spec.id], ONE_UPDATE)
    file = load_config(experiments()[spec.id])
    if file.eval.vs_random is not None:  # its sides exist in the env
        assert len(sides_of(probe_spec(config), file.eval.vs_random, file.eval.teams)) >= 2
    result = train(config, tmp_path)
    assert result.updates == 1 and result.env_steps == 32
    assert (tmp_path / "checkpoints/final.pt").is_file()


def test_every_catalog_id_says_how_its_episodes_end():
    assert sorted(EPISODES) == sorted(spec.id for spec in CATALOG)


@pytest.mark.parametrize("spec", CATALOG, ids=lambda spec: spec.id)
def test_catalog_env_runs_whole_episodes_with_auto_reset(spec):
    """Two or more episodes per env copy under random actions, ending as the env ends them, each followed
    by an auto-reset with live agents; an env asked for its state after it terminated would fail here.
    The observations change from step to step (an env that draws its frames only under a render mode
    would show the first frame all episode)."""
    if not spec.installed:
        pytest.skip(f"{spec.id}: missing {', '.join(spec.missing_modules)}")
    kwargs, ends = EPISODES[spec.id]
    overrides = [f"env.kwargs.{key}={yaml_value(value)}" for key, value in kwargs.items()]
    config = load_config(
        experiments()[spec.id],
        ["rollout.vector=sync", "rollout.num_envs=2", "ppo.num_minibatches=1", *overrides],
    )
    venv = vector_env(config)
    torch.manual_seed(0)
    seen, episodes, observations_changed = set[str](), np.zeros(2, dtype=np.int64), False
    try:
        arrays = venv.reset(0)
        for _ in range(2000):
            actions = random_actions(venv.spec, arrays, torch.device("cpu"))
            before = {name: _snapshot(g.obs) for name, g in arrays.groups.items()}
            arrays = venv.step(actions if venv.tensor_io else {k: a.numpy() for k, a in actions.items()})
            observations_changed = observations_changed or any(
                not np.array_equal(before[name], _snapshot(g.obs)) for name, g in arrays.groups.items()
            )
            over = np.asarray(venv.episode_over)
            for i in np.flatnonzero(over):
                flags = [
                    (np.asarray(g.terminated[i]).any(), np.asarray(g.truncated[i]).any())
                    for g in arrays.groups.values()
                ]
                assert any(term or trunc for term, trunc in flags), "an episode ended without a flag"
                seen.update(
                    kind
                    for kind, on in ((TERM, any(t for t, _ in flags)), (TRUNC, any(u for _, u in flags)))
                    if on
                )
                assert any(np.asarray(g.alive[i]).any() for g in arrays.groups.values())  # reset: live agents
            episodes += over
            if episodes.min() >= 2 and ends <= seen:
                break
    finally:
        venv.close()
    assert episodes.min() >= 2 and seen == ends, f"episodes per copy {episodes.tolist()}, ends seen {seen}"
    assert observations_changed


def _snapshot(x):
    return x.detach().cpu().numpy().copy() if torch.is_tensor(x) else np.array(x)


def test_a_butterfly_pixel_env_refuses_no_render_mode_with_one_line():
    """Pistonball draws its frames only under a render mode: asked for none, the run would learn from a
    frozen first frame, so building it says so in one line."""
    from marl_ppo.envs.registry import EnvError, make_env

    pytest.importorskip("pymunk")
    with pytest.raises(EnvError) as caught:
        make_env("butterfly/pistonball_v6", render_mode=None)
    message = str(caught.value)
    assert "\n" not in message and "freeze every frame" in message and "render_mode" in message


def test_battle_agents_that_die_leave_mid_episode_and_return_at_the_reset():
    """Random play never kills in battle, so both armies are scripted to meet and fight: red steps right
    and blue left until they stand side by side, then all attack at random. A killed agent is seen
    terminated while its episode goes on, is absent for the rest of it, and is alive again after the
    auto-reset that follows the time limit."""
    pytest.importorskip("magent2")
    config = load_config(
        experiments()["magent2/battle_v4"],
        ["rollout.vector=sync", "rollout.num_envs=1", "env.kwargs.map_size=12", "env.kwargs.max_cycles=100"],
    )
    venv = vector_env(config)
    (group,) = venv.spec.groups
    red = np.array([agent.startswith("red") for agent in group.agents])
    rng = np.random.default_rng(0)
    deaths, gone, episodes, t = 0, np.zeros(len(red), dtype=bool), 0, 0
    try:
        arrays = venv.reset(0)
        while episodes < 2:
            if t < 2:  # both sides close in (blue's first move lands a step late), then red takes one more
                moves = np.where(red, 8, 4)
            elif t == 2:
                moves = np.where(red, 7, 6)
            else:
                moves = rng.integers(13, 21, size=len(red))  # the eight attack directions
            arrays = venv.step({group.name: moves[None]})
            flags = arrays.groups[group.name]
            terminated, alive = np.asarray(flags.terminated)[0], np.asarray(flags.alive)[0]
            if venv.episode_over[0]:
                assert np.asarray(flags.truncated)[0][~gone].all()  # the time limit ends it
                assert alive.all()  # the reset brings every agent back
                episodes, t, gone = episodes + 1, 0, np.zeros(len(red), dtype=bool)
                continue
            assert not alive[gone].any()  # the dead stay out
            deaths += int(terminated.sum())
            gone |= terminated
            t += 1
    finally:
        venv.close()
    assert deaths >= 2, deaths
