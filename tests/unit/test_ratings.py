"""Ratings from game records: equal to openskill's own `rate` calls in the same order, draws as ties,
ranks of a three-side game, a player on several sides, and an exact state round-trip."""

import copy

import pytest
from openskill.models import PlackettLuce

from marl_ppo.league.ladder import crossplay, ladder_markdown
from marl_ppo.league.match import Game
from marl_ppo.league.ratings import Ratings, RatingsError


def _game(**sides):
    """A game from side=(player, return) keywords."""
    return Game({s: p for s, (p, _) in sides.items()}, {s: float(r) for s, (_, r) in sides.items()})


RECORD = [
    _game(player_1=("a", 1), player_2=("b", -1)),  # a wins
    _game(player_1=("b", 0), player_2=("a", 0)),  # a draw
    _game(player_1=("c", 1), player_2=("a", -1)),  # c wins
    _game(player_1=("b", -1), player_2=("c", 1)),  # c wins
    _game(player_1=("a", 0.5), player_2=("c", 0.5)),  # a draw
]


def _by_openskill(record):
    """The same record rated with openskill's PlackettLuce directly, game by game."""
    model = PlackettLuce()
    beliefs: dict = {}
    for players, ranks in record:
        teams = [[beliefs.get(name, model.rating(name=name))] for name in players]
        for name, (rating,) in zip(players, model.rate(teams, ranks=ranks), strict=True):
            beliefs[name] = rating
    return beliefs


def test_ratings_equal_openskills_own_rate_calls_in_the_same_order():
    ratings = Ratings()
    ratings.update_all(RECORD)
    # by hand: each game's winner ranked 1, the loser 2, a draw 1 and 1
    expected = _by_openskill(
        [
            (["a", "b"], [1, 2]),
            (["b", "a"], [1, 1]),
            (["c", "a"], [1, 2]),
            (["b", "c"], [2, 1]),
            (["a", "c"], [1, 1]),
        ]
    )
    for name in "abc":
        assert ratings[name].mu == expected[name].mu and ratings[name].sigma == expected[name].sigma
        assert ratings[name].ordinal == pytest.approx(expected[name].ordinal(), abs=1e-12)
    assert [ratings[n].games for n in "abc"] == [4, 3, 3]
    # c won both its decisive games and drew the other: first on the ladder
    assert [r.player for r in ratings.table()][0] == "c"


def test_a_draw_moves_equal_players_not_at_all_and_shrinks_their_sigma():
    ratings = Ratings()
    ratings.update(_game(player_1=("a", 0), player_2=("b", 0)))
    prior = PlackettLuce().rating()
    assert ratings["a"].mu == ratings["b"].mu == pytest.approx(prior.mu)
    assert ratings["a"].sigma == ratings["b"].sigma < prior.sigma
    expected = _by_openskill([(["a", "b"], [1, 1])])
    assert ratings["a"].sigma == expected["a"].sigma


def test_a_three_side_game_ranks_each_side_by_its_return():
    game = _game(player_0=("a", -2), player_1=("b", 5), player_2=("c", -2))
    assert game.side_ranks() == {"player_0": 2, "player_1": 1, "player_2": 2}
    ratings = Ratings()
    ratings.update(game)
    expected = _by_openskill([(["a", "b", "c"], [2, 1, 2])])
    for name in "abc":
        assert (ratings[name].mu, ratings[name].sigma) == (expected[name].mu, expected[name].sigma)
    assert ratings["b"].mu > ratings["a"].mu == ratings["c"].mu


def test_a_player_on_several_sides_places_by_its_best_and_a_player_alone_is_not_rated():
    game = _game(player_0=("a", 3), player_1=("b", 1), player_2=("b", 4))
    assert game.player_ranks() == {"a": 2, "b": 1}
    ratings = Ratings()
    ratings.update(game)
    expected = _by_openskill([(["a", "b"], [2, 1])])
    assert ratings["b"].mu == expected["b"].mu and ratings["a"].mu == expected["a"].mu
    ratings.update(_game(player_0=("a", 1), player_1=("a", -1)))  # a policy against itself
    assert ratings["a"].games == 1 and ratings["a"].mu == expected["a"].mu


def test_state_dict_round_trips_exactly_and_the_restored_ratings_go_on_alike():
    ratings = Ratings()
    ratings.update_all(RECORD[:3])
    state = copy.deepcopy(ratings.state_dict())
    assert all(type(v["mu"]) is float and type(v["games"]) is int for v in state["players"].values())
    restored = Ratings()
    restored.add("stale")
    restored.load_state_dict(state)
    assert restored.state_dict() == state and "stale" not in restored
    for rated in (ratings, restored):
        rated.update_all(RECORD[3:])
    assert restored.state_dict() == ratings.state_dict()


def test_a_state_of_another_model_is_refused_in_one_line():
    with pytest.raises(RatingsError, match="cannot be loaded"):
        Ratings().load_state_dict({"model": "trueskill", "players": {}})


def test_the_cross_play_counts_and_scores_are_the_records_by_hand():
    matrix = crossplay(RECORD, ["a", "b", "c"])
    # a against b: a win and a draw; a against c: a loss and a draw
    assert matrix.games[0].tolist() == [0, 2, 2]
    assert matrix.wins[0].tolist() == [0, 1, 0] and matrix.draws[0].tolist() == [0, 1, 1]
    score = matrix.score()
    assert score[0, 1] == 0.75 and score[1, 0] == 0.25 and score[0, 2] == 0.25 and score[2, 1] == 1.0
    assert matrix.mean_return()[0, 2] == pytest.approx((-1 + 0.5) / 2)
    assert "| 1 | c |" in ladder_markdown(_rated(RECORD))


def _rated(record):
    ratings = Ratings()
    ratings.update_all(record)
    return ratings
