"""Opponent pools in rollout workers (`rollout.vector: workers`): each worker plays its copies' seats as
one process over those copies would, the learner's win table gets the games in one process's order,
a killed run resumes exactly, and with policy lag a rollout draws from the pool as of its launch."""

import dataclasses

import pytest
import torch

from marl_ppo.checkpoint import FORMAT, load_checkpoint
from marl_ppo.config import config_to_dict, load_config
from marl_ppo.league.league import League
from marl_ppo.league.pool import snapshot_path
from marl_ppo.league.sampling import CURRENT
from marl_ppo.league.seats import LeagueSeats
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_run
from marl_ppo.rollout.buffer import RolloutBuffer
from marl_ppo.rollout.collector import Collector
from marl_ppo.rollout.opponents import merge_games
from marl_ppo.rollout.slice import worker_seed
from marl_ppo.rollout.workers import RolloutWorkers
from marl_ppo.run.build import build_collector
from marl_ppo.run.loop import train
from tests.helpers import ROOT, K, Killed, assert_identical, crash_at_update, run_state_only, scalars

pytestmark = pytest.mark.usefixtures("one_thread")  # workers compute with one thread: bit-identical products

TICTACTOE = ROOT / "experiments/classic/tictactoe_v3.yaml"
SEED = 3


def _config(tiny_overrides, *extra):
    return load_config(
        TICTACTOE,
        [
            *tiny_overrides,
            "rollout.num_envs=4",
            "rollout.rollout_steps=12",
            "eval.every=0",
            "league.opponents=pfsp",
            "league.self_play=0.2",
            "league.rating_episodes=0",
            *extra,
        ],
    )


def _payload(config, model, scale):
    """A snapshot's file contents: `model`'s weights moved by `scale` (each snapshot plays differently)."""
    generator = torch.Generator().manual_seed(int(scale * 100))
    weights = {
        k: v + scale * torch.randn(v.shape, generator=generator) for k, v in model.state_dict().items()
    }
    return {"format": FORMAT, "config": config_to_dict(config), "model": weights}


def _league(plan, spec, run_dir, model):
    league = League(plan.config, spec, run_dir, lambda: TeamModel(spec, plan.config), plan.device)
    for snapshot, scale in ((0, 0.0), (1, 0.5), (2, 1.0)):
        league.pool.add(snapshot, _payload(plan.config, model, scale))
    assert league.sampler is not None
    for opponent, score in ((0, 1.0), (0, 1.0), (1, 0.0), (2, 0.5)):  # a hand-made win table: PFSP uneven
        league.sampler.record(opponent, score)
    return league


def test_each_worker_plays_its_copies_seats_as_one_process_and_the_win_table_gets_every_game(
    tiny_overrides, tmp_path
):
    """Two workers over 4 copies, two rollouts, a snapshot added between them: every buffer tensor, the
    games and the win table equal those of one process per slice (the worker's sampling seed, the
    copies' own draw streams) whose games the learner records in step-then-copy order."""
    config = _config(tiny_overrides, "rollout.vector=workers", "rollout.num_workers=2")
    torch.manual_seed(0)
    plan = plan_run(config)
    workers, model = build_collector(plan)
    assert isinstance(workers, RolloutWorkers)
    spec = model.spec
    league = _league(plan, spec, tmp_path, model)
    recorded: list[list] = []
    record = league.record

    def recording(games):
        recorded.append(list(games))
        record(games)

    league.record = recording  # the games the learner is handed
    league.attach(workers)
    got, tables = [], []
    try:
        workers.start(SEED)
        for rollout in range(2):
            if rollout == 1:
                league.pool.add(3, _payload(plan.config, model, 1.5))
            buffer = RolloutBuffer(spec, 12, 4)
            workers.collect(buffer)
            got.append(buffer)
            tables.append(league.sampler.state_dict())
        seats_states = [w["opponents"] for w in workers.state_dict()["workers"]]
    finally:
        workers.close()

    # one process per slice, the learner's win table taking each rollout's games before the next plan
    reference = _league(plan, spec, tmp_path / "reference", model)  # the same snapshots and table
    sliced = dataclasses.replace(
        plan.config, rollout=dataclasses.replace(plan.config.rollout, num_envs=2, vector="sync")
    )
    slices = workers._slices
    assert slices == [range(0, 2), range(2, 4)]
    collectors, seats, rngs, games = [], [], [], []
    for k, envs in enumerate(slices):
        collector, _ = build_collector(plan_run(sliced))
        assert isinstance(collector, Collector)
        collector.model = model
        copy_games: list = []
        seat = LeagueSeats(
            spec,
            reference.sides,
            envs,
            seed=config.seed,
            models=reference.pool.model,
            plans=reference.plan,
            record=copy_games.append,
            device=plan.device,
        )
        collector.opponents = seat
        collector.start(SEED + envs.start)
        torch.manual_seed(worker_seed(SEED, k))
        collectors.append(collector)
        seats.append(seat)
        games.append(copy_games)
        rngs.append(torch.get_rng_state())
    expected_games = []
    for rollout in range(2):
        if rollout == 1:
            reference.pool.add(3, _payload(plan.config, model, 1.5))
        pieces = []
        for k, collector in enumerate(collectors):
            torch.set_rng_state(rngs[k])
            buffer = RolloutBuffer(spec, 12, 2)
            collector.collect(buffer)
            rngs[k] = torch.get_rng_state()
            pieces.append(buffer)
        for position, tensor in enumerate(got[rollout].tensors()):
            joined = torch.cat([piece.tensors()[position] for piece in pieces], dim=1)
            assert torch.equal(tensor, joined), f"rollout {rollout} tensor {position}"
        merged = merge_games([game for copy_games in games for game in copy_games])
        for copy_games in games:
            copy_games.clear()
        expected_games.append(merged)
        reference.record(merged)
        assert tables[rollout] == reference.sampler.state_dict(), f"win table after rollout {rollout}"
    for collector in collectors:
        collector.close()
    assert recorded == expected_games
    played = [game for rollout_games in recorded for game in rollout_games]
    assert [(g.step, g.copy) for g in played[: len(recorded[0])]] == sorted(
        (g.step, g.copy) for g in recorded[0]
    )
    assert {g.copy for g in played} == {0, 1, 2, 3}  # both workers' copies played snapshots
    assert len({g.opponent for g in played}) >= 2 and {g.opponent for g in played} <= {0, 1, 2, 3}
    for state, seat in zip(seats_states, seats, strict=True):
        assert_identical(state, seat.state_dict(), "seats")
    sides = torch.cat([torch.as_tensor(s["side"]) for s in seats_states])
    opponents = torch.cat([torch.as_tensor(s["opponent"]) for s in seats_states])
    assert sides.shape == opponents.shape == (4,) and ((opponents >= 0) | (opponents == CURRENT)).all()


@pytest.mark.parametrize(
    ("policy_lag", "recurrent"), [(0, None), (1, None), (0, "gru")], ids=["lag0", "lag1", "lag0-gru"]
)
def test_a_killed_league_run_with_workers_resumes_exactly(
    tiny_overrides, tmp_path, monkeypatch, policy_lag, recurrent
):
    extra = [] if recurrent is None else [f"model.recurrent={recurrent}", "model.recurrent_size=8"]
    config = _config(
        tiny_overrides,
        "rollout.vector=workers",
        "rollout.num_workers=2",
        f"rollout.policy_lag={policy_lag}",
        "rollout.rollout_steps=10",
        f"total_steps={2 * K * 40}",
        f"log.checkpoint_every={K}",
        "league.snapshot_every=2",
        "league.rating_episodes=1",
        *extra,
    )
    straight = train(config, tmp_path / "straight")
    crash_at_update(monkeypatch, K + 2)
    with pytest.raises(Killed):
        train(config, tmp_path / "resumed")
    monkeypatch.undo()
    resumed = train(config, tmp_path / "resumed", resume=True)
    assert (resumed.updates, resumed.episodes) == (straight.updates, straight.episodes)
    a = load_checkpoint(tmp_path / "straight/checkpoints/final.pt")
    b = load_checkpoint(tmp_path / "resumed/checkpoints/final.pt")
    assert a["league"]["pool"]["snapshots"] == [0, 2, 4, 6]
    assert sum(a["league"]["sampler"]["games"].values()) > 5  # games against snapshots were scored
    assert "seats" not in a["league"]  # the workers keep their seats with their own state
    assert all("opponents" in worker for worker in a["collector"]["workers"])
    assert_identical(run_state_only(a), run_state_only(b))
    for updates in (2, 4, 6):
        assert_identical(
            load_checkpoint(snapshot_path(tmp_path / "straight", updates))["model"],
            load_checkpoint(snapshot_path(tmp_path / "resumed", updates))["model"],
        )
    logged, expected = scalars(tmp_path / "resumed"), scalars(tmp_path / "straight")
    for tag in ("league/pool_size", "league/score_vs_pool", "train/loss_pi"):
        assert logged[tag] == expected[tag], tag


@pytest.mark.parametrize("policy_lag", [0, 1])
def test_a_rollout_draws_from_the_pool_as_of_its_launch(tiny_overrides, tmp_path, monkeypatch, policy_lag):
    """With a snapshot after every update, lag 0 draws rollout r from snapshots u0..u(r); lag 1 launches
    rollout r before update r - 1 ends, so it draws from u0..u(r-1) (rollout 1 from u0 alone)."""
    plans: list[tuple[int, ...]] = []
    real_plan = League.plan

    def plan(self):
        drawn = real_plan(self)
        plans.append(drawn.snapshots)
        return drawn

    monkeypatch.setattr(League, "plan", plan)
    config = _config(
        tiny_overrides,
        "rollout.vector=workers",
        "rollout.num_workers=2",
        f"rollout.policy_lag={policy_lag}",
        "total_steps=240",  # 5 updates of 4 copies x 12 steps
        "league.snapshot_every=1",
    )
    result = train(config, tmp_path / "run")
    assert result.updates == 5 and result.env_steps == 240
    if policy_lag == 0:
        assert plans == [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]
    else:  # the last update's rollout launches no further one
        assert plans == [(0,), (0,), (0, 1), (0, 1, 2), (0, 1, 2, 3)]
    final = load_checkpoint(tmp_path / "run/checkpoints/final.pt")
    assert final["league"]["pool"]["snapshots"] == [0, 1, 2, 3, 4, 5]
    played = set(final["league"]["sampler"]["games"])
    assert played and played <= set(plans[-1])
