"""Opponent pools: snapshots are the policy at their update, snapshots play the other side without
training, a league run resumes exactly, `latest` leaves learning alone, bad settings are refused."""

import json

import numpy as np
import pytest
import torch

from marl_ppo.checkpoint import FORMAT, load_checkpoint
from marl_ppo.config import ConfigError, config_to_dict, load_config
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.league.league import League
from marl_ppo.league.pool import pool_files, snapshot_path
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import ROOT, K, Killed, assert_identical, crash_at_update, run_state_only, scalars

TICTACTOE = ROOT / "experiments/classic/tictactoe_v3.yaml"
RPS = ROOT / "experiments/classic/rps_v2.yaml"


def _tiny(tiny_overrides, *extra):
    return [*tiny_overrides, "rollout.vector=sync", "eval.every=0", *extra]


def test_each_snapshot_is_bitwise_the_policy_at_its_update(tiny_overrides, tmp_path):
    config = load_config(
        TICTACTOE,
        _tiny(
            tiny_overrides,
            "total_steps=200",  # 4 updates of 2 copies x 25 steps
            "league.opponents=pfsp",
            "league.snapshot_every=2",
            "league.rating_episodes=0",
            "log.checkpoint_every=1",
            "log.keep_last=null",
        ),
    )
    train(config, tmp_path / "run")
    files = pool_files(tmp_path / "run")
    assert list(files) == [0, 2, 4]
    for updates in (2, 4):
        snapshot = load_checkpoint(files[updates])
        checkpoint = load_checkpoint(tmp_path / f"run/checkpoints/update_{updates:08d}.pt")
        assert snapshot["updates"] == updates and snapshot["env_steps"] == 50 * updates
        assert_identical(snapshot["model"], checkpoint["model"], f"snapshot u{updates}")
        assert set(snapshot) == {"format", "config", "agents", "groups", "updates", "env_steps", "model"}
    first = load_checkpoint(files[0])
    assert first["updates"] == 0 and first["env_steps"] == 0
    events = scalars(tmp_path / "run")
    assert [v for _, v in events["league/pool_size"]] == [1.0, 2.0, 2.0, 3.0]
    assert all(0.0 <= v <= 1.0 for _, v in events["league/score_vs_pool"])


def _rock(model: TeamModel) -> TeamModel:
    """The policy that always plays rock (action 0): logits 30, 0, 0."""
    linear = model.group("player").actor.net.linears[-1]
    with torch.no_grad():
        linear.weight.zero_()
        linear.bias.zero_()
        linear.bias[..., 0] = 30.0
    return model


def test_a_snapshot_plays_the_other_seat_and_its_moves_do_not_train(tiny_overrides, tmp_path):
    config = load_config(
        RPS,
        _tiny(tiny_overrides, "rollout.num_envs=4", "rollout.rollout_steps=40", "league.opponents=uniform"),
    )
    plan = plan_run(config)
    collector, model = build_collector(plan)
    assert isinstance(collector, Collector)
    spec = model.spec
    league = League(plan.config, spec, tmp_path, lambda: TeamModel(spec, plan.config), plan.device)
    league.attach(collector)
    rock = _rock(TeamModel(spec, plan.config))
    payload = {"format": FORMAT, "config": config_to_dict(plan.config), "model": rock.state_dict()}
    collector.start(0)
    league.begin(None, lambda: payload)
    seats = league.seats
    assert seats is not None

    sent, acting, learner_side = [], [], []
    step = collector.venv.step

    def recording_step(actions):
        sent.append(actions["player"].copy())
        acting.append(collector.venv.arrays.groups["player"].alive.copy())
        learner_side.append(seats.side.copy())
        step(actions)

    collector.venv.step = recording_step  # type: ignore[method-assign]  # records what reaches the env
    buffer = RolloutBuffer(spec, 40, 4, plan.device, model.memory_layout())
    collector.collect(buffer)
    trained = buffer.groups["player"].alive.numpy()  # (T, E, 2)
    sent_, acting_, side_ = np.stack(sent), np.stack(acting), np.stack(learner_side)  # (T, E, 2), (T, E)
    learner = np.stack([side_ == 0, side_ == 1], axis=-1)  # seats: side i is player_i
    # the snapshot's agent, whenever it is its move, plays rock; it never trains
    assert (sent_[acting_ & ~learner] == 0).all() and (acting_ & ~learner).sum() >= 70
    assert not trained[~learner].any()
    # the learner's agent trains exactly where it moves, and its moves are its own samples
    assert np.array_equal(trained[learner], acting_[learner])
    mine = sent_[acting_ & learner]
    assert len(mine) >= 70 and {0, 1, 2} <= set(mine.tolist())
    # what reached the env is what was scored: the learner's reward is +1 for paper, -1 for scissors
    rewards = buffer.groups["player"].rewards.numpy()
    total = rewards[learner].sum()
    assert total != 0 and league.sampler is not None
    assert league.sampler.games[0] > 0  # ended games were scored against snapshot u0


def test_latest_takes_snapshots_and_leaves_learning_bitwise_unchanged(tiny_overrides, tmp_path):
    plain = load_config(TICTACTOE, _tiny(tiny_overrides, "total_steps=150"))
    league = load_config(
        TICTACTOE,
        _tiny(tiny_overrides, "total_steps=150", "league.opponents=latest", "league.snapshot_every=1"),
    )
    train(plain, tmp_path / "plain")
    train(league, tmp_path / "league")
    a = load_checkpoint(tmp_path / "plain/checkpoints/final.pt")
    b = load_checkpoint(tmp_path / "league/checkpoints/final.pt")
    assert_identical(a["model"], b["model"], "model")
    assert_identical(a["trainer"], b["trainer"], "trainer")
    assert_identical(a["rng"], b["rng"], "rng")
    assert list(pool_files(tmp_path / "league")) == [0, 1, 2, 3]
    assert b["league"]["pool"] == {"snapshots": [0, 1, 2, 3]}
    # each snapshot was rated against random and earlier ones without touching training's numbers
    assert set(b["league"]["ratings"]["players"]) == {"random", "u0", "u1", "u2", "u3"}
    games = {p: r["games"] for p, r in b["league"]["ratings"]["players"].items()}
    # a match is 16 games (each of the two on each seat, 4 episodes each); u0 plays random; u1 random
    # and u0; u2 random, u1 and u0 (the only other); u3 random, u2, u0 and u1: 4 matches each
    assert games == {"u0": 64, "u1": 64, "u2": 64, "u3": 64, "random": 64}


@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_a_killed_league_run_resumes_exactly(tiny_overrides, tmp_path, monkeypatch, recurrent):
    extra = [] if recurrent is None else [f"model.recurrent={recurrent}", "model.recurrent_size=8"]
    config = load_config(
        TICTACTOE,
        _tiny(
            tiny_overrides,
            "rollout.rollout_steps=10",
            f"total_steps={2 * K * 20}",
            f"log.checkpoint_every={K}",
            "league.opponents=pfsp",
            "league.snapshot_every=2",
            "league.self_play=0.2",
            "league.rating_episodes=1",
            *extra,
        ),
    )
    straight = train(config, tmp_path / "straight")
    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "resumed/checkpoints/latest.pt")["league"]["pool"]["snapshots"] == [
        0,
        2,
    ]
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert (resumed.updates, resumed.episodes) == (straight.updates, straight.episodes)
    a = load_checkpoint(tmp_path / "straight/checkpoints/final.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoints/final.pt")
    assert a["league"]["pool"]["snapshots"] == [0, 2, 4, 6]
    assert a["league"]["sampler"]["games"]  # games against snapshots were scored
    assert_identical(run_state_only(a), run_state_only(b))
    for updates in (2, 4, 6):
        assert_identical(
            load_checkpoint(snapshot_path(tmp_path / "straight", updates))["model"],
            load_checkpoint(snapshot_path(tmp_path / "resumed", updates))["model"],
        )
    logged, expected = scalars(tmp_path / "resumed"), scalars(tmp_path / "straight")
    for tag in ("league/pool_size", "league/score_vs_pool", "train/loss_pi"):
        assert logged[tag] == expected[tag], tag


def test_a_league_on_a_game_of_one_side_is_refused_in_one_line(tiny_overrides, tmp_path):
    config = load_config(
        ROOT / "experiments/mpe/simple_spread.yaml",
        [*tiny_overrides, "league.opponents=uniform", "league.sides=teams", "rollout.vector=sync"],
    )
    with pytest.raises(ConfigError, match=r"league.sides: teams needs two or more sides.*one team") as err:
        train(config, tmp_path / "run")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["league.opponents=naive"], "league.opponents"),
        (["league.opponents=pfsp", "ppo.critic=team"], "ppo.critic: team values the sum"),
        (["league.opponents=pfsp", "league.pfsp=soft"], "league.pfsp"),
    ],
)
def test_bad_league_settings_are_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_config(TICTACTOE, overrides)
    assert "\n" not in str(err.value)


def test_each_snapshot_logs_the_nash_conv_of_the_pools_average(tiny_overrides, tmp_path):
    from open_spiel.python.algorithms import exploitability, policy_aggregator

    from marl_ppo.eval.exploitability import actor_policy, load_game

    kuhn = tmp_path / "kuhn.yaml"
    kuhn.write_text("env: {id: classic/kuhn_poker}\nppo: {critic: obs}\nmodel: {share_actor: true}\n")
    config = load_config(
        kuhn,
        _tiny(
            tiny_overrides,
            "total_steps=150",
            "league.opponents=pfsp",
            "league.snapshot_every=1",
            "league.rating_episodes=0",
            "eval.nash_conv=true",
        ),
    )
    train(config, tmp_path / "run")
    logged = dict(scalars(tmp_path / "run")["league/pool_nash_conv"])
    assert sorted(logged) == [50, 100, 150]
    game = load_game("classic/kuhn_poker")
    plan = plan_run(config)
    assert isinstance(plan.layout, TeamSpec)
    spec_model = TeamModel(plan.layout, plan.config)
    tables = []
    for updates, path in pool_files(tmp_path / "run").items():
        spec_model.load_state_dict(load_checkpoint(path)["model"])
        tables.append(actor_policy(spec_model, game))
        if updates == 0:
            continue
        weights = [1.0 / len(tables)] * len(tables)
        average = policy_aggregator.PolicyAggregator(game).aggregate(
            [0, 1], [tables, tables], [weights, weights]
        )
        expected = exploitability.nash_conv(game, average)
        assert logged[50 * updates] == np.float32(expected)  # TensorBoard keeps float32
    assert min(logged.values()) > 0.0 and max(logged.values()) < 0.917  # below the uniform policy's

    # `marl-ppo eval` reports the same pool average, over the snapshots the final checkpoint lists
    from marl_ppo.api import evaluate

    output = evaluate(tmp_path / "run", episodes=2, out=tmp_path / "eval")
    assert output.pool is not None
    assert output.pool.snapshots == ["u0", "u1", "u2", "u3"]
    assert output.pool.nash_conv == pytest.approx(expected, abs=1e-12)
    stored = json.loads((tmp_path / "eval" / "eval.json").read_text())["pool_nash_conv"]
    assert stored == {
        "snapshots": ["u0", "u1", "u2", "u3"],
        "nash_conv": output.pool.nash_conv,
        "missing": [],
    }
    # a snapshot file lost: the policy's own NashConv is still reported, the pool's names the file
    snapshot_path(tmp_path / "run", 2).unlink()
    output = evaluate(tmp_path / "run", episodes=2, out=tmp_path / "eval")
    assert output.nash_conv is not None and output.pool is not None
    assert output.pool.nash_conv is None and output.pool.missing == ["u2"]


@pytest.mark.parametrize(("step_s", "expected"), [(1e-6, "sync"), (30e-3, "workers")])
def test_auto_vector_picks_for_a_league_as_for_self_play(tiny_overrides, monkeypatch, step_s, expected):
    """A league's seats act in rollout workers too, so `auto` weighs the same costs with or without one."""
    import marl_ppo.envs.factory as factory

    monkeypatch.setattr(factory, "usable_cores", lambda: 2)
    for opponents in ("pfsp", "latest"):
        config = load_config(
            TICTACTOE,
            [*tiny_overrides, "rollout.vector=auto", "rollout.num_envs=4", f"league.opponents={opponents}"],
        )
        resolved = factory.resolve_vector(config, batched=False, step_seconds=lambda: step_s)
        assert resolved.rollout.vector == expected, opponents
        assert resolved.rollout.policy_lag == 0


def test_seats_of_a_checkpoint_from_before_each_copy_drew_apart_go_on_with_fresh_generators(
    tiny_overrides, tmp_path
):
    from marl_ppo.league.sampling import copy_generator

    config = load_config(RPS, _tiny(tiny_overrides, "rollout.num_envs=3", "league.opponents=uniform"))
    plan = plan_run(config)
    collector, model = build_collector(plan)
    collector.close()
    league = League(
        plan.config, model.spec, tmp_path, lambda: TeamModel(model.spec, plan.config), plan.device
    )
    league.attach(collector)
    assert league.seats is not None
    old = {"side": torch.tensor([1, 0, 1]), "opponent": torch.tensor([-1, 0, 0]), "memories": {}}
    league.seats.load_state_dict(old)
    assert league.seats.side.tolist() == [1, 0, 1] and league.seats.opponent.tolist() == [-1, 0, 0]
    assert league.seats.drawn  # the episodes under way keep their opponents
    fresh = [copy_generator(plan.config.seed, copy).bit_generator.state for copy in range(3)]
    assert [rng.bit_generator.state for rng in league.seats.rngs] == fresh
