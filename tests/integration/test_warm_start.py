"""Warm starts (`model.init_from`): weights carried exactly, a shared policy mapped onto a team of
another size through its agent-id input, one-line refusals, and the same update as the source's
when the optimizer state is carried."""

import gymnasium as gym
import pytest
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from marl_ppo.config import ConfigError, config_to_dict, load_config
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.run.loop import train
from marl_ppo.run.warm_start import warm_start
from tests.helpers import ROOT

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"
TINY = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=25",
    "total_steps=100",
    "rollout.vector=sync",
    "log.progress=false",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=2",
    "ppo.lr_schedule=constant",
    "model.hidden_sizes=[16,16]",
]


def _team(agents: int) -> TeamSpec:
    """A team of `agents` identical agents with 5-number observations (the same at any team size)."""
    names = tuple(f"agent_{i}" for i in range(agents))
    group = GroupSpec("agent", names, gym.spaces.Box(-1.0, 1.0, (5,)), gym.spaces.Discrete(3), obs_dim=5)
    return TeamSpec("team", names, (group,), state_dim=5 * agents, state_from_env=False)


def _source(tmp_path, agents: int, overrides=()):
    """A checkpoint of a fresh TeamModel for a team of `agents` (torch seed 0)."""
    config = load_config(
        None, ["model.share_actor=true", "ppo.critic=obs", "model.hidden_sizes=[8]", *overrides]
    )
    torch.manual_seed(0)
    model = TeamModel(_team(agents), config)
    spec = model.spec
    path = tmp_path / "source.pt"
    save_checkpoint(
        path,
        {
            "format": FORMAT,
            "config": config_to_dict(config),
            "agents": list(spec.agents),
            "groups": {g.name: list(g.agents) for g in spec.groups},
            "model": model.state_dict(),
        },
    )
    return path, model


def _target(path, agents: int, overrides=()):
    config = load_config(
        None,
        [
            "model.share_actor=true",
            "ppo.critic=obs",
            "model.hidden_sizes=[8]",
            f"model.init_from={path}",
            *overrides,
        ],
    )
    torch.manual_seed(1)
    return TeamModel(_team(agents), config), config


def test_a_shared_policy_of_three_agents_starts_four_with_agent_0s_id_for_the_new_one(tmp_path):
    path, source = _source(tmp_path, 3)
    model, config = _target(path, 4)
    start = warm_start(model, config.model)
    assert start.borrowed == {"agent_3": "agent_0"}
    assert "agent_3 takes agent_0's agent id" in start.describe()
    for kind in ("actor", "critic"):
        old = getattr(source.group("agent"), kind).net.linears[0].weight.detach()  # (1, 8, 5 + 3)
        new = getattr(model.group("agent"), kind).net.linears[0].weight.detach()  # (1, 8, 5 + 4)
        assert old.shape == (1, 8, 8) and new.shape == (1, 8, 9)
        torch.testing.assert_close(new[..., :5], old[..., :5], rtol=0, atol=0)  # the observation's columns
        torch.testing.assert_close(new[..., 5:8], old[..., 5:8], rtol=0, atol=0)  # agents 0-2 keep theirs
        torch.testing.assert_close(new[..., 8], old[..., 5], rtol=0, atol=0)  # agent_3 has agent_0's
    # every other weight is the source's
    theirs = source.state_dict()
    for key, value in model.state_dict().items():
        if "layers.0.weight" not in key:
            torch.testing.assert_close(value, theirs[key], rtol=0, atol=0, msg=key)
    # the new agent acts as agent_0 on the same observation
    obs = torch.randn(1, 1, 4, 5)
    obs[..., 3, :] = obs[..., 0, :]
    flags = torch.ones(1, 1, 4, dtype=torch.bool)
    dist, _ = model.group("agent").actor(
        obs, torch.ones(1, 1, 4, 0, dtype=torch.bool), torch.zeros(1, 4, 0), flags, flags
    )
    logits = dist.parts[0].logits[0, 0]
    torch.testing.assert_close(logits[3], logits[0], rtol=0, atol=0)


def test_per_agent_networks_of_another_team_size_are_refused_in_one_line(tmp_path):
    path, _ = _source(tmp_path, 3, ["model.share_actor=false"])
    model, config = _target(path, 4, ["model.share_actor=false"])
    with pytest.raises(ConfigError) as refused:
        warm_start(model, config.model)
    message = str(refused.value)
    assert "\n" not in message
    assert "group 'agent' has 4 agents here and 3 there, each with its own weights" in message
    assert "model.share_actor / model.share_critic: true" in message


def test_a_state_that_grows_with_the_team_is_refused_unless_only_the_actors_start(tmp_path):
    path, source = _source(tmp_path, 3, ["ppo.critic=state"])
    model, config = _target(path, 4, ["ppo.critic=state"])
    with pytest.raises(
        ConfigError,
        match=r"critics\.0\.net\.norm_weight' is \(1, 15\) but this run's is \(1, 20\): in group 'agent' the",
    ):
        warm_start(model, config.model)
    model, config = _target(path, 4, ["ppo.critic=state", "model.init_networks=actors"])
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    assert warm_start(model, config.model).borrowed == {"agent_3": "agent_0"}
    for key, value in model.state_dict().items():
        if key.startswith("critics."):  # not started from the source: as initialized
            torch.testing.assert_close(value, fresh[key], rtol=0, atol=0)


def test_the_optimizer_state_needs_the_same_team_and_a_full_checkpoint(tmp_path):
    path, _ = _source(tmp_path, 3)
    with pytest.raises(ConfigError, match="holds no optimizer state"):
        model, config = _target(path, 3, ["model.init_optimizer=true"])
        warm_start(model, config.model)
    with pytest.raises(
        ConfigError, match="model.init_networks and model.init_optimizer choose what a warm start"
    ):
        load_config(None, ["model.init_networks=actors"])
    with pytest.raises(ConfigError, match="carries the optimizer state of every network"):
        load_config(None, ["model.init_from=x", "model.init_networks=actors", "model.init_optimizer=true"])


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("warm") / "source"
    train(load_config(SPREAD, TINY), run_dir)
    return run_dir


def _update(config, model, trainer, seed=5):
    """One update of `trainer` on a rollout collected by `model` with env seed `seed`."""
    plan = plan_run(config)
    venv = build_vector_env(plan.config, plan.layout)
    buffer = RolloutBuffer(venv.spec, config.rollout.rollout_steps, config.rollout.copies)
    collector = Collector(venv, model, torch.device("cpu"))
    torch.manual_seed(seed)
    collector.start(seed)
    rollout = collector.collect(buffer)
    venv.close()
    batches = rollout_batches(
        buffer, rollout.last_values, rollout.last_alive, gamma=config.ppo.gamma, lam=config.ppo.gae_lambda
    )
    trainer.update(batches)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _trainer(model, plan):
    return Trainer(
        model, plan.ppo, generator=torch.Generator().manual_seed(123), optimizer=plan.config.fast.optimizer
    )


def test_with_its_optimizer_state_a_warm_start_learns_as_the_source_would(source_run):
    """The source's next update (its weights and trainer restored, as `--resume` restores them) and a
    warm start's first, on the same rollout: bitwise the same weights after. Without the optimizer
    state the warm start's Adam starts fresh, and its first update differs."""
    payload = load_checkpoint(source_run / "checkpoints" / "final.pt")
    base = load_config(SPREAD, TINY)
    plan = plan_run(base)
    assert isinstance(plan.layout, TeamSpec)
    original = TeamModel(plan.layout, plan.config)
    original.load_state_dict(payload["model"])
    trainer = _trainer(original, plan)
    trainer.load_state_dict(payload["trainer"])
    expected = _update(plan.config, original, trainer)

    results = {}
    for carried in (True, False):
        config = load_config(
            SPREAD, [*TINY, f"model.init_from={source_run}", f"model.init_optimizer={carried}"]
        )
        warm_plan = plan_run(config)
        assert isinstance(warm_plan.layout, TeamSpec)
        model = TeamModel(warm_plan.layout, warm_plan.config)
        start = warm_start(model, warm_plan.config.model)
        for key, value in model.state_dict().items():  # the weights are the source's, exactly
            torch.testing.assert_close(value, payload["model"][key], rtol=0, atol=0)
        warm_trainer = _trainer(model, warm_plan)
        start.carry_optimizer(warm_trainer, warm_plan.config.model)
        results[carried] = _update(warm_plan.config, model, warm_trainer)
    for key, value in expected.items():
        torch.testing.assert_close(results[True][key], value, rtol=0, atol=0, msg=key)
    changed = [key for key, value in expected.items() if not torch.equal(results[False][key], value)]
    assert changed  # a fresh Adam takes other steps


def test_a_run_started_from_another_names_its_source_and_refuses_before_writing(source_run, tmp_path, capsys):
    config = load_config(
        SPREAD, [*TINY, "log.progress=true", "total_steps=50", f"model.init_from={source_run}"]
    )
    train(config, tmp_path / "warm")
    assert (
        f"starting the actors and critics from {source_run}/checkpoints/final.pt" in capsys.readouterr().err
    )
    four = load_config(SPREAD, [*TINY, "env.kwargs.N=4", f"model.init_from={source_run}"])
    with pytest.raises(ConfigError, match=r"the observations, global state or network sizes differ"):
        train(four, tmp_path / "four")
    assert not (tmp_path / "four").exists()
