"""Scores against random opponents: exact win/draw/loss rates and team returns of scripted policies."""

import json

import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv

from marl_ppo.cli import main
from marl_ppo.config import load_config
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.eval.random_policy import random_actions
from marl_ppo.eval.versus import play_vs_random, sides_of
from marl_ppo.run.loop import train
from tests.helpers import vector_env

CPU = torch.device("cpu")


class Duel(ParallelEnv):
    """One step: each agent sees a target in [-1, 1] and hits it when its action is within 1e-4 of it.
    Every agent is paid its own team's hits minus the other teams' hits (a zero-sum game of teams)."""

    metadata = {"name": "duel_v0"}

    def __init__(self, agents=("player_0", "player_1")):
        self.possible_agents = list(agents)
        self.rng = np.random.default_rng(0)

    def observation_space(self, agent):
        return spaces.Box(-1.0, 1.0, (1,), np.float32)

    def action_space(self, agent):
        return spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.target = np.float32(self.rng.uniform(-1, 1))
        return {a: np.array([self.target], np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        team = {a: a.rsplit("_", 1)[0] if a.startswith(("red", "blue")) else a for a in self.agents}
        hits: dict[str, int] = {}
        for agent, action in actions.items():
            hits[team[agent]] = hits.get(team[agent], 0) + int(abs(float(action[0]) - self.target) < 1e-4)
        total = sum(hits.values())
        rewards = {a: float(2 * hits[team[a]] - total) for a in self.agents}
        obs = {a: np.array([self.target], np.float32) for a in self.agents}
        done = {a: True for a in self.agents}
        self.agents = []
        return obs, rewards, done, {a: False for a in obs}, {a: {} for a in obs}


def duel(**kwargs):
    return Duel(**kwargs)


def _venv(agents, copies=4):
    overrides = [
        f"env.id={__file__}:duel",
        "rollout.vector=sync",
        f"rollout.num_envs={copies}",
        "ppo.num_minibatches=1",
    ]
    if agents is not None:
        overrides.append(f"env.kwargs={{agents: {list(agents)}}}")
    return vector_env(load_config(None, overrides))


class Scripted:
    """A stateless scripted policy for the stepping loop (`Acting`)."""

    def __init__(self, choose):
        self.choose = choose

    def act(self, arrays):
        return {
            name: self.choose(torch.as_tensor(group.obs).clone()) for name, group in arrays.groups.items()
        }

    def advance(self, arrays, episode_over):
        pass


hitting = Scripted(lambda obs: obs)
"""Always hits: its action is the target it observes."""
missing = Scripted(lambda obs: obs * 0 + 2.0)


def test_an_always_winning_policy_wins_every_game_against_random_seats():
    venv = _venv(None)
    try:
        result = play_vs_random(venv, hitting, CPU, mode="seats", episodes_per_side=10, seed=3)
        scalars = result.scalars()
        assert scalars["eval/vs_random/win_rate"] == 1.0 and scalars["eval/vs_random/loss_rate"] == 0.0
        assert (
            scalars["eval/vs_random/player_0/win_rate"] == scalars["eval/vs_random/player_1/win_rate"] == 1.0
        )
        assert result.played.tolist() == [0] * 10 + [1] * 10  # each seat played equally often
        # a policy that never hits (clipped to the bound): random never hits either, every game a draw
        never = play_vs_random(venv, missing, CPU, mode="seats", episodes_per_side=7, seed=3).scalars()
        assert (never["eval/vs_random/draw_rate"], never["eval/vs_random/win_rate"]) == (1.0, 0.0)
    finally:
        venv.close()


def test_team_returns_against_random_opponents_are_each_teams_sum():
    venv = _venv(["red_0", "red_1", "blue_0"], copies=3)
    try:
        result = play_vs_random(venv, hitting, CPU, mode="teams", episodes_per_side=5, seed=0)
    finally:
        venv.close()
    assert result.sides == {"red": ("red_0", "red_1"), "blue": ("blue_0",)}
    # red plays: 2 hits, each red agent paid 2 - 0, the blue agent -2; blue plays: 1 hit, reds -1 each
    assert result.scalars() == {
        "eval/vs_random/red/team_return": 4.0,
        "eval/vs_random/red/opponent_return": -2.0,
        "eval/vs_random/blue/team_return": 1.0,
        "eval/vs_random/blue/opponent_return": -2.0,
    }


def test_eval_teams_names_the_sides_where_agents_names_do_not():
    venv = _venv(["red_0", "red_1", "blue_0"], copies=3)
    try:
        # the default sides again, named by stem and by agent
        assert sides_of(venv.spec, "teams", {"r": ["red"], "b": ["blue_0"]}) == {
            "r": ("red_0", "red_1"),
            "b": ("blue_0",),
        }
        mixed = {"x": ["red_0", "blue"], "y": ["red_1"]}
        result = play_vs_random(venv, hitting, CPU, mode="teams", episodes_per_side=4, seed=0, teams=mixed)
        for teams, match in [
            ({"x": ["red", "green"], "y": ["blue"]}, "team 'x' names \\['green'\\]"),
            ({"x": ["red_0"], "y": ["blue"]}, r"on none: \['red_1'\]"),
            ({"x": ["red"], "y": ["red_1", "blue"]}, r"on several: \['red_1'\]"),
            ({"x": ["red", "blue"]}, "teams: 1"),
        ]:
            with pytest.raises(EvalError, match=match):
                sides_of(venv.spec, "teams", teams)
    finally:
        venv.close()
    assert result.sides == {"x": ("red_0", "blue_0"), "y": ("red_1",)}
    # x plays: red_0 and blue_0 hit, one hit each for red and blue, every agent paid 0; y plays: red_1
    # hits, the reds paid 1 each and blue -1
    assert result.scalars() == {
        "eval/vs_random/x/team_return": 0.0,
        "eval/vs_random/x/opponent_return": 0.0,
        "eval/vs_random/y/team_return": 1.0,
        "eval/vs_random/y/opponent_return": 0.0,
    }
    with pytest.raises(ValueError, match="eval.teams names the sides of eval.vs_random: teams"):
        load_config(None, ["eval.vs_random=seats", "eval.teams={a: [x], b: [y]}"])


def test_random_actions_respect_masks_and_bounds():
    pytest.importorskip("pygame")
    venv = vector_env(
        load_config(None, ["env.id=classic/tictactoe_v3", "rollout.vector=sync", "rollout.num_envs=3"])
    )
    try:
        arrays = venv.reset(0)
        for _ in range(30):
            group = arrays.groups["player"]
            chosen = random_actions(venv.spec, arrays, CPU)["player"].numpy()
            for i in range(3):
                for j in np.flatnonzero(group.alive[i]):
                    assert group.action_mask[i, j, chosen[i, j]]
            arrays = venv.step({"player": chosen})
    finally:
        venv.close()
    with pytest.raises(EvalError, match="needs two or more sides"):
        sides_of(venv.spec, "teams")  # player_0 and player_1 are one team: seats is the mode


def test_periodic_evaluation_logs_and_eval_writes_the_scores(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    overrides = [
        f"env.id={__file__}:duel",
        "rollout.vector=sync",
        "rollout.num_envs=4",
        "rollout.rollout_steps=4",
        "total_steps=32",
    ]
    overrides += ["eval.every=16", "eval.episodes=4", "eval.vs_random=seats", "log.progress=false"]
    overrides += ["ppo.num_minibatches=1", "ppo.train_pi_iters=1", "ppo.train_vf_iters=1"]
    train(load_config(None, overrides), tmp_path / "run")
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    rates = [[p.value for p in events.Scalars(f"eval/vs_random/{k}_rate")] for k in ("win", "draw", "loss")]
    assert [p.step for p in events.Scalars("eval/vs_random/win_rate")] == [16, 32]
    np.testing.assert_allclose(np.sum(rates, axis=0), [1.0, 1.0])  # every game won, drawn or lost

    assert main(["eval", str(tmp_path / "run"), "--episodes", "6", "--deterministic"]) == 0
    assert "against random opponents (seats): win_rate " in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "eval.json").read_text())["vs_random"]
    assert saved["mode"] == "seats" and len(saved["per_episode"]["outcome"]) == 12
    assert saved["win_rate"] + saved["draw_rate"] + saved["loss_rate"] == pytest.approx(1.0)


def test_a_recurrent_policy_plays_random_seats_with_its_states_carried():
    pytest.importorskip("pygame")
    from marl_ppo.models.team import TeamModel
    from marl_ppo.rollout.stepper import PolicyActing

    config = load_config(
        None,
        ["env.id=classic/tictactoe_v3", "rollout.vector=sync", "rollout.num_envs=2", "model.recurrent=gru"],
    )
    venv = vector_env(config)
    try:
        torch.manual_seed(0)
        model = TeamModel(venv.spec, config)
        outcomes = []
        for _ in range(2):
            act = PolicyActing(model, venv.num_envs, CPU, deterministic=False)
            result = play_vs_random(venv, act, CPU, mode="seats", episodes_per_side=3, seed=5)
            outcomes.append(result.outcomes().tolist())
            assert act.memory.live["player"].actor_state.abs().sum() > 0  # the states moved
    finally:
        venv.close()
    assert outcomes[0] == outcomes[1] and len(outcomes[0]) == 6  # the same seed plays the same games
