"""The scripted players the project ships, on their real envs: connect four's board read from the
observation as a stepped PettingZoo env lays it out, its wins, blocks and win rate against random;
Hanabi's observation decoded as OpenSpiel's state says, its rules on hand-made views, whole games
with the masks respected and no life lost, scores far above random; SMAX's heuristic driving the
allies from their own observations."""

import re

import numpy as np
import pytest
import torch

from marl_ppo.config import load_config
from marl_ppo.eval.evaluate import EvalError, play_episodes, run_episodes
from marl_ppo.eval.partners import play_seating
from marl_ppo.eval.players import SCRIPTED, load_callable, partner_player, random_player
from marl_ppo.eval.scripted import connect_four as c4
from marl_ppo.eval.scripted.hanabi import HanabiLayout, HanabiRules, decode
from marl_ppo.eval.versus import sides_of
from marl_ppo.league.match import play_pair
from tests.helpers import ROOT, vector_env

CPU = torch.device("cpu")


def test_every_shipped_player_loads():
    assert sorted(SCRIPTED) == ["connect_four", "hanabi", "smax"]
    for key, target in SCRIPTED.items():
        assert callable(load_callable(target, f"scripted/{key}"))


# connect four


def test_the_board_is_decoded_as_a_stepped_env_lays_it_out():
    from pettingzoo.classic import connect_four_v3

    env = connect_four_v3.env()
    env.reset(seed=0)
    moves = [3, 3, 4, 0, 6]  # player_0: 3, 4, 6; player_1: 3 (on top of 3), 0
    for column in moves:
        env.step(column)
    # player_1 is to move: its own pieces are 1, player_0's -1; row 5 is the bottom
    board = c4.decode(env.observe("player_1")["observation"].astype(np.float32).reshape(-1))
    expected = np.zeros((6, 7), int)
    expected[5, [3, 4, 6]] = -1
    expected[4, 3] = 1
    expected[5, 0] = 1
    np.testing.assert_array_equal(board, expected)
    np.testing.assert_array_equal(c4.decode(c4.encode(board)), board)  # encode is decode's inverse
    assert c4.encode(board).shape == (84,)


def _board(rows):
    """A board from six strings of seven cells: 'x' own, 'o' the opponent's, '.' empty; top row first."""
    return np.array([[{"x": 1, "o": -1, ".": 0}[cell] for cell in row] for row in rows])


def _play(board):
    legal = np.array([board[0, c] == 0 for c in range(7)])
    return c4.connect_four(c4.encode(board), legal, "player_0")


def test_connect_four_takes_a_win_blocks_a_loss_and_prefers_the_centre():
    empty = ["......."] * 6
    assert _play(_board(empty)) == 3
    assert _play(_board(["...x..."] + ["...o..."] + ["...x..."] + ["...o..."] * 3)) == 2  # centre full
    horizontal_win = _board(empty[:5] + ["xxx.oo."])
    assert _play(horizontal_win) == 3
    vertical_block = _board(empty[:3] + ["o......", "o.....x", "o....xx"])
    assert _play(vertical_block) == 0
    both = _board(empty[:3] + ["o......", "o......", "o.xxx.."])  # a win (1 or 5) beats a block (0)
    assert _play(both) == 1  # of two wins, the first in CENTRE_FIRST
    with pytest.raises(EvalError, match="reads classic/connect_four_v3's 6 x 7 x 2 board .84 values.; this"):
        c4.connect_four(np.zeros(18), np.ones(9, bool), "player_1")  # a tic-tac-toe board
    diagonal_win = _board(empty[:2] + ["......o", "....xo.", "...xoo.", "..xooxx"])
    assert _play(diagonal_win) == 5  # x at (5,2),(4,3),(3,4): (2,5) lands on o at (3,5)
    assert c4.landing_row(_board(empty[:2] + ["......o", "....xo.", "...xoo.", "..xooxx"]), 5) == 2


@pytest.fixture(scope="module")
def connect_four_env():
    config = load_config(ROOT / "experiments/classic/connect_four_v3.yaml", ["rollout.num_envs=16"])
    venv = vector_env(config)
    yield venv
    venv.close()


def test_connect_four_beats_random_on_both_seats(connect_four_env):
    venv = connect_four_env
    greedy = partner_player("scripted/connect_four", venv.spec, CPU)
    games = play_pair(
        venv, CPU, greedy, random_player(), sides=sides_of(venv.spec, "seats"), episodes_per_side=50, seed=3
    )
    assert len(games) == 200  # each on each of the two seats, 50 games
    wins: dict[str, list[bool]] = {side: [] for side in ("player_0", "player_1")}
    for game in games:
        side = next(s for s, name in game.players.items() if name == "scripted/connect_four")
        wins[side].append(game.player_ranks()["scripted/connect_four"] < game.player_ranks()["random"])
    assert all(len(won) == 100 for won in wins.values())
    assert np.mean(wins["player_0"]) > 0.9 and np.mean(wins["player_1"]) > 0.9


# Hanabi


def _parse_state(text):
    """Fireworks, life and info tokens, hands and discards from OpenSpiel's Hanabi state string."""
    colours = "RYGWB"
    life_match = re.search(r"Life tokens: (\d+)", text)
    info_match = re.search(r"Info tokens: (\d+)", text)
    assert life_match is not None and info_match is not None
    life, info = int(life_match.group(1)), int(info_match.group(1))
    fireworks = [int(n) for n in re.findall(r"[RYGWB](\d)", text.split("Fireworks:")[1].split("\n")[0])]
    hands_text = text.split("Hands:")[1].split("Deck size:")[0]
    hands = [
        [
            colours.index(card[0]) * 5 + int(card[1]) - 1
            for card in re.findall(r"^([RYGWB]\d) \|\|", part, re.M)
        ]
        for part in hands_text.split("-----")
    ]
    discards = [colours.index(c[0]) * 5 + int(c[1]) - 1 for c in text.split("Discards:")[1].split()]
    return life, info, fireworks, hands, discards


def test_the_hanabi_view_is_what_openspiels_state_says_over_whole_games():
    from pettingzoo.classic import hanabi_v5

    layout = HanabiLayout()
    assert layout.size == 658 and layout.num_actions() == 20
    env = hanabi_v5.env()
    rng = np.random.default_rng(0)
    rules = HanabiRules()
    checked = 0
    for seed in range(4):
        env.reset(seed=seed)
        for agent in env.agent_iter():
            observation, _, terminated, truncated, _ = env.last()
            if terminated or truncated:
                env.step(None)
                continue
            obs = np.asarray(observation["observation"], np.float32)
            view = decode(obs, layout)
            life, info, fireworks, hands, discards = _parse_state(str(env.unwrapped.hanabi_env.game_state))
            partner = hands[1 - int(agent[-1])]
            assert view.partner_hand[: len(partner)].tolist() == partner
            assert (view.partner_hand[len(partner) :] == -1).all()
            assert view.fireworks.tolist() == fireworks
            assert (view.life_tokens, view.information_tokens) == (life, info)
            assert view.discarded.reshape(-1).tolist() == np.bincount(discards, minlength=25).tolist()
            own = hands[int(agent[-1])]
            for position, identity in enumerate(own):  # knowledge is sound: the true card stays possible
                assert view.mine[position, identity]
            assert not view.mine[len(own) :].any()
            checked += 1
            mask = observation["action_mask"].astype(bool)
            # random moves in the first games (lives lost, short games); the rules alone in the last
            # (every card drawn)
            move = rules(obs, mask, agent) if seed >= 2 else rng.choice(np.flatnonzero(mask))
            env.step(int(move))
    assert checked > 150


def _observation(*, fireworks=(0,) * 5, info=8, life=3, partner=(0, 1, 2, 3, 4), mine=None, hinted=()):
    """A hand-made Hanabi observation: `mine` maps own positions to their possible identities (every
    identity elsewhere); `hinted` the own positions some hint revealed a colour of."""
    layout = HanabiLayout()
    parts = layout.offsets()
    obs = np.zeros(layout.size, np.float32)
    for position, identity in enumerate(partner):
        obs[parts["partner_hand"].start + 25 * position + identity] = 1
    for colour, played in enumerate(fireworks):
        if played:
            obs[parts["fireworks"].start + 5 * colour + played - 1] = 1
    obs[parts["information"].start : parts["information"].start + info] = 1
    obs[parts["life"].start : parts["life"].start + life] = 1
    knowledge = parts["knowledge"].start
    for player in range(2):
        for position in range(5):
            card = knowledge + 35 * (5 * player + position)
            possible = (mine or {}).get(position) if player == 0 else None
            obs[card : card + 25] = 1 if possible is None else 0
            for identity in possible or ():
                obs[card + identity] = 1
            if player == 0 and position in hinted:
                obs[card + 25] = 1
    return obs


def test_hanabi_rules_on_hand_made_views():
    rules = HanabiRules()
    every = np.ones(20, bool)
    # own card 2 can only be R1, and R1 is playable: play it (play actions are 5..9)
    assert rules(_observation(mine={2: [0]}), every, "player_0") == 7
    # nothing to play; the partner's card 1 is Y1 (identity 5), playable: a rank-1 hint proves it
    # playable (every 1 is playable on empty fireworks), a yellow hint does not
    assert rules(_observation(partner=(22, 5, 13, 18, 24)), every, "player_0") == 15
    # Y1 is on the fireworks now, so the partner's Y2 is playable: 'rank 2' leaves R2..B2 (not all
    # playable), 'yellow' leaves Y1..Y5; neither proves it, and the hint that leaves fewest wins: the colour
    # (5 left either way: the first of the two)
    assert (
        rules(_observation(fireworks=(0, 1, 0, 0, 0), partner=(22, 6, 13, 18, 24)), every, "player_0") == 11
    )
    # no hint tokens, nothing playable: discard the oldest card no hint touched (card 0 was hinted)
    no_hints = every.copy()
    no_hints[10:] = False
    assert rules(_observation(info=0, hinted=(0,)), no_hints, "player_0") == 1
    # a card proven useless goes first: card 3 can only be R1 or R2, both already on the fireworks
    assert rules(_observation(info=0, fireworks=(2, 0, 0, 0, 0), mine={3: [0, 1]}), no_hints, "player_0") == 3
    # nothing playable on either side, and the partner would discard its B5 next (the only copy): a
    # rank hint saves it
    assert rules(_observation(partner=(24, 23, 19, 18, 14)), every, "player_0") == 19
    # all hint tokens (no discard allowed), nothing to play or save: the hint that removes the most
    # possibilities from the partner's hand (B4 B3 W4 W3 G4): 'rank 4' removes 3 x 20 + 2 x 5 = 70,
    # 'blue', 'white' and 'rank 3' 2 x 20 + 3 x 5 = 55
    no_discard = every.copy()
    no_discard[:5] = False
    assert rules(_observation(partner=(23, 22, 18, 17, 13)), no_discard, "player_0") == 18
    with pytest.raises(EvalError, match="canonical observation of 658 values"):
        rules(np.zeros(100), every, "player_0")
    with pytest.raises(EvalError, match="plays classic/hanabi_v5's 20 actions .* this env has 21"):
        rules(_observation(), np.ones(21, bool), "agent_0")  # JaxMARL's Hanabi: same length, a no-op more


@pytest.fixture(scope="module")
def hanabi_env():
    config = load_config(ROOT / "experiments/classic/hanabi_v5.yaml", ["rollout.num_envs=10"])
    venv = vector_env(config)
    yield venv
    venv.close()


def _hanabi_returns(venv, first, second, episodes):
    sides = {agent: (agent,) for agent in venv.spec.agents}
    result = play_seating(
        venv, CPU, [first, second], sides, [0, 1], episodes=episodes, seed=11, deterministic=False
    )
    return result.team_returns / 2  # each player is paid the game's score


def test_hanabi_rules_score_far_above_random_and_never_lose_a_life(hanabi_env):
    venv = hanabi_env
    rules = partner_player("scripted/hanabi", venv.spec, CPU)
    scores = _hanabi_returns(venv, rules, rules, 30)  # the masks are checked at every move by ScriptedActing
    assert scores.min() > 0  # a lost game (three lives gone) scores 0: the rules never play a card blind
    assert scores.mean() > 15
    random_scores = _hanabi_returns(venv, random_player(), random_player(), 30)
    assert random_scores.mean() < 1


# SMAX


@pytest.mark.jax
def test_smax_heuristic_plays_the_allies_from_their_observations():
    pytest.importorskip("jaxmarl")
    from marl_ppo.eval.scripted.smax import battle_size

    config = load_config(ROOT / "experiments/jaxmarl/smax_2s3z.yaml", ["rollout.num_envs=4"])
    venv = vector_env(config)
    try:
        group = venv.spec.groups[0]
        assert battle_size(group.obs_dim, group.mask_dim) == (5, 5)
        with pytest.raises(EvalError, match="not one: play it on jaxmarl/smax"):
            battle_size(group.obs_dim + 1, group.mask_dim)
        heuristic = partner_player("scripted/smax", venv.spec, CPU)
        played = play_episodes(  # every action is checked against the mask as it is sent
            venv, lambda: heuristic.build(venv.spec, 4, CPU), CPU, episodes=4, seed=0, deterministic=False
        )
        randomly = run_episodes(venv, None, CPU, episodes=4, seed=0, deterministic=False)
    finally:
        venv.close()
    # the heuristic fights (damage dealt is paid), random allies wander
    assert played.team_returns.min() > randomly.team_returns.max()
