"""Matches between players on real games: scripted rock-paper-scissors policies give the hand-computed
cross-play, random against random scores 1/2, a recurrent policy on a masked game plays as it does
against random in `eval`, matches are reproducible, and the training hook rates what it played."""

from math import comb, factorial

import numpy as np
import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.eval.players import Player, policy_player, random_player
from marl_ppo.eval.versus import play_vs_random, sides_of
from marl_ppo.league.ladder import crossplay
from marl_ppo.league.match import pair_schedule, play_games, play_pair
from marl_ppo.league.rate import rate_new
from marl_ppo.league.ratings import Ratings
from marl_ppo.models.team import TeamModel
from marl_ppo.rollout.stepper import PolicyActing
from tests.helpers import ROOT, vector_env

CPU = torch.device("cpu")
CYCLES = 15
"""rps_v2's rounds per game: +1 to the round's winner, -1 to its loser."""
ROCK, PAPER, SCISSORS = 0, 1, 2


class Scripted:
    """Every agent plays `actions[k]` with probability `weights[k]`, drawn from torch's generator."""

    def __init__(self, actions, weights=None):
        self.actions = torch.tensor(actions)
        self.weights = torch.tensor(
            weights if weights is not None else [1.0] * len(actions), dtype=torch.float32
        )

    def act(self, arrays):
        out = {}
        for name, group in arrays.groups.items():
            shape = tuple(group.obs.shape[:2])
            drawn = torch.multinomial(self.weights, int(np.prod(shape)), replacement=True).reshape(shape)
            out[name] = self.actions[drawn]
        return out

    def advance(self, arrays, episode_over):
        pass


def scripted(name, actions, weights=None):
    return Player(name, lambda spec, copies, device: Scripted(actions, weights))


@pytest.fixture(scope="module")
def rps():
    venv = vector_env(load_config(ROOT / "experiments/classic/rps_v2.yaml", ["rollout.num_envs=8"]))
    yield venv
    venv.close()


def _round_robin(venv, players, episodes, seed=0):
    sides = sides_of(venv.spec, "seats")
    games = []
    for i, first in enumerate(players):
        for second in players[i + 1 :]:
            games += play_pair(venv, CPU, first, second, sides=sides, episodes_per_side=episodes, seed=seed)
    return games


def test_pure_rock_paper_and_scissors_beat_each_other_in_a_cycle(rps):
    players = [scripted("rock", [ROCK]), scripted("paper", [PAPER]), scripted("scissors", [SCISSORS])]
    games = _round_robin(rps, players, episodes=3)
    assert len(games) == 3 * 2 * 2 * 3  # pairs x who is alone x sides x episodes
    matrix = crossplay(games, ["rock", "paper", "scissors"])
    expected = np.array([[np.nan, 0, 1], [1, np.nan, 0], [0, 1, np.nan]])
    np.testing.assert_array_equal(matrix.score(), expected)
    np.testing.assert_array_equal(matrix.mean_return(), (2 * expected - 1) * CYCLES)
    assert (matrix.games + np.eye(3) * 12 == 12).all()


def test_a_mixed_policy_against_rock_wins_by_the_binomial_law(rps):
    """Paper 3/4, scissors 1/4 against rock: each round +1 or -1, a game won with 8 or more papers of 15."""
    p = 0.75
    win = sum(comb(CYCLES, k) * p**k * (1 - p) ** (CYCLES - k) for k in range(8, CYCLES + 1))  # 0.9824
    games = _round_robin(rps, [scripted("mixed", [PAPER, SCISSORS], [3, 1]), scripted("rock", [ROCK])], 300)
    matrix = crossplay(games, ["mixed", "rock"])
    n = matrix.games[0, 1]
    assert n == 1200 and matrix.draws[0, 1] == 0  # an odd number of +-1 rounds never ties
    half_width = 4 * np.sqrt(win * (1 - win) / n)
    assert abs(matrix.score()[0, 1] - win) < half_width
    assert abs(matrix.mean_return()[0, 1] - CYCLES * (2 * p - 1)) < 4 * np.sqrt(CYCLES * 4 * p * (1 - p) / n)


def test_random_against_random_scores_one_half_and_draws_by_the_trinomial_law(rps):
    """Each round +1, 0 or -1 with 1/3 each: a draw when as many rounds are won as lost."""
    draw = (
        sum(
            factorial(CYCLES) / (factorial(k) ** 2 * factorial(CYCLES - 2 * k))
            for k in range(CYCLES // 2 + 1)
        )
        / 3**CYCLES
    )  # 0.1456
    games = _round_robin(rps, [random_player("random_a"), random_player("random_b")], 400)
    matrix = crossplay(games, ["random_a", "random_b"])
    n = matrix.games[0, 1]
    score = (np.array([g.player_ranks()["random_b"] for g in games]) - 1).astype(float)  # 1 a win of a
    score[[g.player_ranks()["random_a"] == g.player_ranks()["random_b"] for g in games]] = 0.5
    low, high = (
        score.mean() - 1.96 * score.std(ddof=1) / np.sqrt(n),
        score.mean() + 1.96 * score.std(ddof=1) / np.sqrt(n),
    )
    assert matrix.score()[0, 1] == pytest.approx(score.mean()) and low < 0.5 < high
    assert abs(matrix.draws[0, 1] / n - draw) < 4 * np.sqrt(draw * (1 - draw) / n)


@pytest.fixture(scope="module")
def tictactoe():
    overrides = [
        "rollout.num_envs=3",
        "model.recurrent=gru",
        "model.recurrent_size=8",
        "model.hidden_sizes=[16]",
    ]
    config = load_config(ROOT / "experiments/classic/tictactoe_v3.yaml", overrides)
    venv = vector_env(config)
    models = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        models.append(TeamModel(venv.spec, config))
    yield venv, models
    venv.close()


def test_a_recurrent_policy_on_a_masked_game_plays_as_it_does_against_random_in_eval(tictactoe):
    venv, (model, _) = tictactoe
    sides = sides_of(venv.spec, "seats")
    versus = play_vs_random(
        venv, PolicyActing(model, 3, CPU, deterministic=False), CPU, mode="seats", episodes_per_side=5, seed=7
    )
    schedule = pair_schedule(2, 5)[:10]  # the policy alone on each side: versus's schedule
    games = play_games(
        venv, CPU, [policy_player("gru", model), random_player()], schedule, sides=sides, seed=7
    )
    returns = np.array([[g.returns[s] for s in sides] for g in games])
    for i in range(2):  # per side, the same games (versus lists them in the order they ended)
        mine = sorted(map(tuple, returns[5 * i : 5 * i + 5]))
        theirs = sorted(map(tuple, versus.side_returns()[versus.played == i]))
        assert mine == theirs
    assert all(g.players[list(sides)[k // 5]] == "gru" for k, g in enumerate(games))


def test_a_match_of_two_recurrent_policies_is_reproducible_and_its_seed_matters(tictactoe):
    venv, models = tictactoe
    sides = sides_of(venv.spec, "seats")
    players = [policy_player("one", models[0]), policy_player("two", models[1])]

    def returns(seed):
        games = play_pair(venv, CPU, *players, sides=sides, episodes_per_side=3, seed=seed)
        assert [g.players["player_1"] for g in games] == ["one"] * 3 + ["two"] * 6 + ["one"] * 3
        return [g.returns for g in games]

    first = returns(3)
    assert returns(3) == first and returns(4) != first


def test_the_training_hook_plays_each_opponent_on_each_side_and_rates_in_order(tictactoe):
    venv, models = tictactoe
    ratings = Ratings()
    games = rate_new(
        venv,
        CPU,
        new=("u2", models[1]),
        opponents=[("u1", models[0]), ("random", None)],
        ratings=ratings,
        episodes=2,
        seed=0,
        mode="seats",
    )
    assert len(games) == 2 * (2 * 2 * 2)  # opponents x who is alone x sides x episodes
    assert {g.players["player_1"] for g in games} == {"u2", "u1", "random"}
    replayed = Ratings()
    replayed.update_all(games)
    assert ratings.state_dict() == replayed.state_dict()
    assert ratings["u2"].games == 16 and ratings["u1"].games == ratings["random"].games == 8


def test_a_pair_on_three_seats_plays_each_seat_alone_and_places_by_its_best_seat():
    assert pair_schedule(3, 1) == [(0, 1, 1), (1, 0, 1), (1, 1, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)]
    config = load_config(
        ROOT / "experiments/mpe/simple_spread.yaml", ["rollout.num_envs=2", "env.kwargs.max_cycles=5"]
    )
    venv = vector_env(config)
    try:
        sides = sides_of(venv.spec, "seats")
        games = play_pair(
            venv, CPU, random_player("a"), random_player("b"), sides=sides, episodes_per_side=1, seed=0
        )
    finally:
        venv.close()
    assert [[g.players[s] for s in sides] for g in games] == [
        [("a", "b")[p] for p in seats] for seats in pair_schedule(3, 1)
    ]
    for game in games:
        best = {name: max(r for s, r in game.returns.items() if game.players[s] == name) for name in "ab"}
        ranks = game.player_ranks()
        assert (ranks["a"] < ranks["b"]) == (best["a"] > best["b"]) and (ranks["a"] == ranks["b"]) == (
            best["a"] == best["b"]
        )


def test_duplicate_games_compare_the_two_players_on_one_side_game_by_game():
    from marl_ppo.league.match import Game, duplicate_games

    first = [Game({"hunter": "A", "prey": "B"}, {"hunter": 30.0, "prey": -40.0})] * 2
    second = [
        Game({"hunter": "B", "prey": "A"}, {"hunter": 10.0, "prey": -12.0}),
        Game({"hunter": "B", "prey": "A"}, {"hunter": 30.0, "prey": -40.0}),
    ]
    games = duplicate_games(first, second, "hunter")
    assert [g.players for g in games] == [{"hunter@1": "A", "hunter@2": "B"}] * 2
    assert [g.player_ranks() for g in games] == [{"A": 1, "B": 2}, {"A": 1, "B": 1}]  # a win, then a draw
    with pytest.raises(ValueError, match="pairs games one to one"):
        duplicate_games(first, second[:1], "hunter")


@pytest.fixture(scope="module")
def simple_tag():
    config = load_config(
        ROOT / "experiments/mpe/simple_tag.yaml", ["rollout.num_envs=4", "rollout.vector=sync"]
    )
    venv = vector_env(config)
    torch.manual_seed(3)
    model = TeamModel(venv.spec, config)
    yield venv, model
    venv.close()


def test_a_duplicate_match_plays_both_players_from_the_same_starts(simple_tag):
    """The same deterministic policy under two names: every duplicate comparison is a draw (the two
    games of a pair start alike and play alike), while raw returns crown the adversaries' side."""
    from marl_ppo.league.match import play_duplicate

    venv, model = simple_tag
    sides = sides_of(venv.spec, "teams")
    assert list(sides) == ["adversary", "agent"]
    a = policy_player("a", model, deterministic=True)
    b = policy_player("b", model, deterministic=True)
    games = play_duplicate(venv, CPU, a, b, sides=sides, episodes_per_side=3, seed=11)
    assert len(games) == 2 * 3
    assert [list(g.players) for g in games] == [["adversary@1", "adversary@2"]] * 3 + [
        ["agent@1", "agent@2"]
    ] * 3
    assert all(g.player_ranks() == {"a": 1, "b": 1} for g in games)
    assert any(g.returns["agent@1"] != 0.0 for g in games[3:])  # the runner was caught or strayed: real play
    raw = play_pair(venv, CPU, a, b, sides=sides, episodes_per_side=3, seed=11)
    adversary_first = [g.side_ranks()["adversary"] for g in raw]
    assert adversary_first.count(1) > adversary_first.count(2)
