"""HAPPO (`ppo.actor_update: sequential`): one agent is MAPPO bit for bit, the factor each agent is handed
is the product of the ratios of the agents updated before it, computed here by hand, an agent's turn
moves its own weights only, and the order is a fresh permutation each update."""

import copy
import dataclasses

import pytest
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.sequences import policy
from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.run.loop import train
from tests.helpers import ROOT, assert_identical, vector_env

HAPPO = ["ppo.actor_update=sequential", "model.share_actor=false"]
SMALL = [
    "rollout.num_envs=2",
    "rollout.rollout_steps=25",
    "rollout.vector=sync",
    "rollout.policy_lag=0",
    "ppo.train_pi_iters=2",
    "ppo.train_vf_iters=2",
    "ppo.num_minibatches=2",
    "ppo.target_kl=null",
    "model.hidden_sizes=[16,16]",
    "log.progress=false",
]


@pytest.mark.parametrize(
    "variant",
    [
        [],
        ["env.kwargs.continuous_actions=true"],
        ["model.recurrent=gru", "ppo.chunk_length=5"],
        ["ppo.critic=obs", "ppo.target_kl=0.001"],  # IPPO's critic, and the KL stop inside the one turn
    ],
)
def test_with_one_agent_happos_update_is_mappos_bit_for_bit(tmp_path, variant):
    payloads = {}
    for name, algo in (("mappo", ["model.share_actor=false"]), ("happo", HAPPO)):
        config = load_config(
            ROOT / "experiments/mpe/simple.yaml", [*SMALL, "total_steps=150", *algo, *variant]
        )
        train(config, tmp_path / name)
        payloads[name] = load_checkpoint(tmp_path / name / "checkpoints/final.pt")
    mappo, happo = payloads["mappo"], payloads["happo"]
    assert_identical(happo["model"], mappo["model"], "model")
    for key in ("critic_optimizer", "generator"):
        assert_identical(happo["trainer"][key], mappo["trainer"][key], key)
    (agent,) = happo["trainer"]["actor_optimizers"].values()  # the one agent's Adam is MAPPO's
    assert_identical(agent, mappo["trainer"]["actor_optimizer"], "actor_optimizer")


def _setup(env, *overrides):
    """A HAPPO trainer on a fresh model and the batches of one rollout."""
    config = load_config(None if env is None else ROOT / env, [*SMALL, *HAPPO, *overrides])
    torch.manual_seed(0)
    venv = vector_env(config)
    model = TeamModel(venv.spec, config)
    buffer = RolloutBuffer(
        venv.spec, config.rollout.rollout_steps, config.rollout.copies, memory=model.memory_layout()
    )
    collector = Collector(venv, model, torch.device("cpu"))
    collector.start(0)
    rollout = collector.collect(buffer)
    batches = rollout_batches(
        buffer, rollout.last_values, rollout.last_alive, gamma=config.ppo.gamma, lam=config.ppo.gae_lambda
    )
    trainer = Trainer(
        model, config.ppo.settled(convolutional=False), generator=torch.Generator().manual_seed(0)
    )
    return model, trainer, batches


def _record_turns(monkeypatch):
    """Each turn the trainer takes, with copies of the model and the actor optimizers' states before and
    after it."""
    turns, real = [], Trainer._epochs

    def snapshot(trainer):
        states = {name: o.state_dict() for name, o in trainer.actor_update.optimizers.items()}
        return copy.deepcopy(trainer.model), copy.deepcopy(states)

    def epochs(self, turn):
        before = snapshot(self)
        result = real(self, turn)
        turns.append((turn, before, snapshot(self)))
        return result

    monkeypatch.setattr(Trainer, "_epochs", epochs)
    return turns


def _learner(turn):
    ((group, agents),) = turn.learners.items()
    return group, int(agents.nonzero().item())


def _ratio_by_hand(before, after, batch, group, agent):
    """pi_after(a|o) / pi_before(a|o) of one agent over a prepared batch, 1 where it is absent."""
    with torch.no_grad():
        logp = [
            policy(m.group(group).actor, batch).log_prob(batch.actions)[..., agent] for m in (before, after)
        ]
    return torch.where(batch.alive[..., agent], (logp[1] - logp[0]).exp(), 1.0)


def _lagged(batches):
    """The batches as if a policy one update behind had acted: each logp_old moved by U(-0.5, 0.5)."""
    generator = torch.Generator().manual_seed(1)
    return {
        name: dataclasses.replace(
            batch, logp_old=batch.logp_old + torch.rand(batch.logp_old.shape, generator=generator) - 0.5
        )
        for name, batch in batches.items()
    }


@pytest.mark.parametrize(
    ("env", "overrides", "lagged"),
    [
        ("experiments/mpe/simple_speaker_listener.yaml", [], False),  # two groups of one agent each
        ("experiments/mpe/simple_spread.yaml", [], False),  # three agents in one group
        ("experiments/mpe/simple_spread.yaml", ["model.recurrent=lstm", "ppo.chunk_length=5"], False),
        ("experiments/mpe/simple_spread.yaml", [], True),  # decoupled lag: ratios from the start policy
        ("experiments/mpe/simple_spread.yaml", ["ppo.critic=team"], False),
        # a Box and a MultiDiscrete agent in two groups; the signaller leaves after step 4 (ratio 1 after)
        (None, ["env.id=envs/mixed_actions_v0", "env.kwargs={signaller_leaves_at: 4}"], False),
    ],
)
def test_each_agent_is_handed_the_product_of_the_earlier_agents_ratios(monkeypatch, env, overrides, lagged):
    model, trainer, batches = _setup(env, *overrides)
    turns = _record_turns(monkeypatch)
    trainer.update(_lagged(batches) if lagged else batches, lagged=lagged)
    lag_weights = {name: batch.weight for name, batch in turns[0][0].batches.items()}
    assert lagged != all(torch.equal(w, torch.ones_like(w)) for w in lag_weights.values())
    assert len(turns) == sum(g.num_agents for g in model.spec.groups)
    expected = None  # the factor the next agent should be handed: the product of the ratios so far
    for k, (turn, (before, _), (after, _)) in enumerate(turns):
        group, agent = _learner(turn)
        batch = turn.batches[group]
        assert turn.critic == (k == 0)
        if expected is None:
            assert torch.equal(batch.weight, lag_weights[group])
        else:  # the lag's weight (1 on-policy) times the factor, the same for every agent of the env step
            torch.testing.assert_close(
                batch.weight, lag_weights[group] * expected.unsqueeze(-1), rtol=1e-5, atol=1e-6
            )
        ratio = _ratio_by_hand(before, after, batch, group, agent)
        assert float((ratio - 1).abs().max()) > 1e-3  # the agent's update moved its policy
        expected = ratio if expected is None else expected * ratio
    assert expected is not None
    assert float((expected - 1).abs().max()) > 1e-2


@pytest.mark.parametrize(
    ("env", "overrides"),
    [
        ("experiments/mpe/simple_spread.yaml", []),
        ("experiments/mpe/simple_spread.yaml", ["model.recurrent=gru", "ppo.chunk_length=5"]),
        # two agents' CNN encoders as one grouped convolution, and action masks
        (None, ["env.id=envs/pixel_compass_v0"]),
    ],
)
def test_a_turn_moves_its_agents_weights_and_adam_moments_only(monkeypatch, env, overrides):
    model, trainer, batches = _setup(env, *overrides)
    (group,) = model.spec.groups
    agents = group.num_agents
    trainer.update(batches)  # the first update leaves every agent's Adam moments non-zero
    turns = _record_turns(monkeypatch)
    trainer.update(batches)
    for turn, (before, states_before), (after, states_after) in turns:
        group, agent = _learner(turn)
        for (name, p0), p1 in zip(before.named_parameters(), after.parameters(), strict=True):
            if not name.startswith("actors."):
                continue
            rows0, rows1 = p0.detach().view(agents, -1), p1.detach().view(agents, -1)
            others = [i for i in range(agents) if i != agent]
            assert torch.equal(rows0[others], rows1[others]), name
            assert not torch.equal(rows0[agent], rows1[agent]), name
        learner = model.spec.group(group).agents[agent]
        assert turn.optimizer is trainer.actor_update.optimizers[learner]
        for name, state in states_after.items():  # every other agent's Adam is as it was
            if name != learner:
                assert_identical(state, states_before[name], name)
                assert all(bool(entry["exp_avg"].abs().sum() > 0) for entry in state["state"].values())
        moved = states_after[learner]["state"]
        assert all(
            entry["exp_avg"].shape[0] * agents == p.shape[0]
            for entry, p in zip(moved.values(), model.group(group).actor.parameters(), strict=True)
        )  # moments of the agent's rows only
    # every agent has its own Adam step count: 2 updates x 2 epochs x 2 minibatches
    for optimizer in trainer.actor_update.optimizers.values():
        assert [float(entry["step"]) for entry in optimizer.state_dict()["state"].values()] == [8.0] * len(
            optimizer.state
        )


def test_the_order_is_a_fresh_permutation_each_update():
    model, trainer, batches = _setup("experiments/mpe/simple_spread.yaml")
    orders = []
    for _ in range(6):
        trainer.update(batches)
        orders.append(tuple(trainer.actor_update.order))
    assert all(sorted(order) == [0, 1, 2] for order in orders)
    assert len(set(orders)) > 2
    stats = trainer.update(batches)
    tags = {
        f"agents/agent_{i}/{key}"
        for i in range(3)
        for key in ("turn", "factor_mean", "factor_std", "kl", "clipfrac")
    }
    assert set(stats.agents) == tags
    first = [i for i in range(3) if stats.agents[f"agents/agent_{i}/turn"] == 0.0]
    assert len(first) == 1 and stats.agents[f"agents/agent_{first[0]}/factor_std"] == 0.0
    assert all(stats.agents[f"agents/agent_{i}/kl"] > 0 for i in range(3))


def test_a_shared_actor_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="model.share_actor=false") as refused:
        load_config(
            ROOT / "experiments/mpe/simple_spread.yaml",
            ["ppo.actor_update=sequential", "model.share_actor=true"],
        )
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("kind", ["adam", "adam_foreach"])
@pytest.mark.parametrize("overrides", [[], ["model.recurrent=gru", "ppo.chunk_length=5"]])
def test_each_agent_steps_as_a_plain_adam_over_its_own_weights(kind, overrides):
    """Beside the trainer, one torch.optim.Adam per agent over clones of its rows, stepped with the
    agent's rows of every gradient the trainer steps with: after two updates (every agent stepping in its
    turns, the others' steps between) each agent's weights and moments are the plain Adam's, bit for bit.
    The clip binds at every step (max_grad_norm far below the gradients' norms) and bounds the agent's own."""
    max_norm = 1e-3
    model, trainer, batches = _setup(
        "experiments/mpe/simple_spread.yaml",
        f"fast.optimizer={kind}",
        f"ppo.max_grad_norm={max_norm}",
        *overrides,
    )
    plain, norms = {}, []
    for name, optimizer in trainer.actor_update.optimizers.items():
        params = optimizer.param_groups[0]["params"]
        clones = [optimizer.rows(p).detach().clone().requires_grad_() for p in params]
        adam = torch.optim.Adam(clones, lr=optimizer.param_groups[0]["lr"], eps=1e-5, foreach=False)
        plain[name] = clones, adam

        def step(original=optimizer.step, optimizer=optimizer, params=params, clones=clones, adam=adam):
            for clone, p in zip(clones, params, strict=True):
                clone.grad = optimizer.rows(p.grad).clone()
            norms.append(float(torch.nn.utils.get_total_norm([c.grad for c in clones])))
            adam.step()
            original()

        optimizer.step = step
    for _ in range(2):
        trainer.update(batches)
    assert len(norms) == 2 * 3 * 2 * 2 and norms == pytest.approx([max_norm] * len(norms), rel=1e-4)
    for name, optimizer in trainer.actor_update.optimizers.items():
        clones, adam = plain[name]
        for clone, p in zip(clones, optimizer.param_groups[0]["params"], strict=True):
            assert torch.equal(optimizer.rows(p), clone), name
            ours, theirs = optimizer.state[p], adam.state[clone]
            for key in ("step", "exp_avg", "exp_avg_sq"):
                assert torch.equal(ours[key], theirs[key]), (name, key)
        assert float(adam.state[clones[0]]["step"]) == 2 * 2 * 2


def test_a_checkpoint_with_one_adam_over_every_actor_resumes_each_agents_own():
    """The layout written before the agents had optimizers of their own (one Adam state over every actor
    parameter, each agent's rows in it, and each agent's step count) loads as each agent's Adam."""
    model, trainer, batches = _setup("experiments/mpe/simple_spread.yaml")
    for _ in range(2):
        trainer.update(batches)
    trainer.actor_update.optimizers["agent_2"].step()  # the agents' step counts differ: 8, 8 and 9
    state = trainer.state_dict()
    agents = trainer.actor_update.optimizers
    team = {}
    for index, p in enumerate(model.actors.parameters()):
        rows = [optimizers.state[p] for optimizers in agents.values()]
        team[index] = {
            "step": torch.tensor(9.0),  # the largest count, as that layout kept in every parameter
            **{key: torch.cat([entry[key] for entry in rows]) for key in ("exp_avg", "exp_avg_sq")},
        }
    (settings,) = state["actor_optimizers"]["agent_0"]["param_groups"]
    old = {
        **{key: value for key, value in state.items() if key != "actor_optimizers"},
        "actor_optimizer": {"state": team, "param_groups": [settings]},
        "actor_adam_steps": torch.tensor([8.0, 8.0, 9.0], dtype=torch.float64),
    }
    _, resumed, _ = _setup("experiments/mpe/simple_spread.yaml")
    resumed.load_state_dict(old)
    assert_identical(resumed.state_dict(), state, "trainer")


def test_a_checkpoint_of_the_other_actor_update_is_refused_in_one_line():
    _, happo, _ = _setup("experiments/mpe/simple_spread.yaml")
    config = load_config(ROOT / "experiments/mpe/simple_spread.yaml", [*SMALL, "model.share_actor=false"])
    venv = vector_env(config)
    mappo = Trainer(
        TeamModel(venv.spec, config),
        config.ppo.settled(convolutional=False),
        generator=torch.Generator().manual_seed(0),
    )
    for trainer, saved, written in ((mappo, happo, "sequential"), (happo, mappo, "simultaneous")):
        with pytest.raises(
            ValueError, match=f"ppo.actor_update={written}; resume it with that setting"
        ) as refused:
            trainer.load_state_dict(saved.state_dict())
        assert "\n" not in str(refused.value)
