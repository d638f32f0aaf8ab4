"""Kuhn and Leduc poker (OpenSpiel through Shimmy): information states observed, masks, zero-sum rewards at the end."""

import numpy as np
import pytest

pyspiel = pytest.importorskip("pyspiel")
pytest.importorskip("shimmy")

from marl_ppo.envs.adapters.aec import TurnBasedAdapter  # noqa: E402
from marl_ppo.envs.grouping import build_team_spec  # noqa: E402
from marl_ppo.envs.registry import make_env  # noqa: E402
from marl_ppo.envs.spec import TeamArrays  # noqa: E402

GAMES = {"classic/kuhn_poker": "kuhn_poker", "classic/leduc_poker": "leduc_poker"}


def _information_states_per_observation(game, tensor):
    """For every (player, tensor of that player at a decision) the information states that give it."""
    seen: dict[tuple, set[str]] = {}

    def walk(state):
        if state.is_terminal():
            return
        if state.is_chance_node():
            for action, _ in state.chance_outcomes():
                walk(state.child(action))
            return
        player = state.current_player()
        key = (player, tuple(getattr(state, tensor)(player)))
        seen.setdefault(key, set()).add(state.information_state_string(player))
        for action in state.legal_actions():
            walk(state.child(action))

    walk(game.new_initial_state())
    return seen


def test_leduc_observation_tensor_merges_information_states_and_the_information_state_tensor_does_not():
    """Why the envs observe information state tensors: Shimmy's default, the observation tensor, stands
    for several of Leduc's information states at once; Kuhn's does not."""
    leduc, kuhn = pyspiel.load_game("leduc_poker"), pyspiel.load_game("kuhn_poker")
    merged = _information_states_per_observation(leduc, "observation_tensor")
    assert len(merged) == 516 and sum(len(infos) > 1 for infos in merged.values()) == 360
    for game in (leduc, kuhn):
        exact = _information_states_per_observation(game, "information_state_tensor")
        assert all(len(infos) == 1 for infos in exact.values())
    assert len(_information_states_per_observation(leduc, "information_state_tensor")) == 936
    assert len(_information_states_per_observation(kuhn, "observation_tensor")) == 12


@pytest.mark.parametrize("env_id", sorted(GAMES))
def test_episodes_match_openspiel_move_by_move(env_id):
    """Random games through our adapter, replayed in OpenSpiel: at every step the mover's observation is
    its information state tensor (float32), its mask the legal actions, no reward before the end, and
    at the end the game's returns (zero-sum), terminated and never truncated."""
    env = make_env(env_id)
    spec = build_team_spec(env, env_id)
    (group,) = spec.groups
    game = pyspiel.load_game(GAMES[env_id])
    assert group.agents == ("player_0", "player_1") and group.mask_source == "info"
    assert group.obs_dim == game.information_state_tensor_size()
    adapter, out = TurnBasedAdapter(env, spec), TeamArrays.allocate(spec)
    rng = np.random.default_rng(0)
    lengths, paid = [], []
    for episode in range(40):
        adapter.reset(episode, out)
        arrays = out.groups[group.name]
        replay = game.new_initial_state()
        for action in env.game_state.history():  # the cards dealt
            if not replay.is_chance_node():
                break
            replay.apply_action(action)
        moves, over = 0, False
        while not over:
            player = replay.current_player()
            assert list(np.flatnonzero(arrays.alive)) == [player]
            np.testing.assert_array_equal(
                arrays.obs[player], np.asarray(replay.information_state_tensor(player), dtype=np.float32)
            )
            legal = np.zeros(game.num_distinct_actions(), dtype=bool)
            legal[replay.legal_actions()] = True
            np.testing.assert_array_equal(arrays.action_mask[player], legal)
            action = int(rng.choice(np.flatnonzero(legal)))
            over = adapter.step({group.name: np.array([action, action])}, out)
            replay.apply_action(action)
            while replay.is_chance_node():  # Leduc's public card
                replay.apply_action(env.game_state.history()[len(replay.history())])
            moves += 1
            if not over:
                assert not arrays.reward.any() and not arrays.terminated.any()
        assert replay.is_terminal()
        np.testing.assert_array_equal(arrays.reward, np.asarray(replay.returns(), dtype=np.float32))
        assert arrays.reward.sum() == 0.0  # zero-sum (a Leduc game may be split: both 0)
        paid.append(bool(arrays.reward.any()))
        assert arrays.terminated.all() and not arrays.truncated.any()
        lengths.append(moves)
    assert min(lengths) == 2 and max(lengths) >= 3 and sum(paid) >= 30  # Kuhn: 2 or 3 moves; Leduc: 2 to 8


def test_unseeded_resets_continue_the_seeded_stream():
    """Reset once with a seed and then without: the same deals in two envs, and different deals from game to game."""

    def deals(seed):
        env = make_env("classic/kuhn_poker")
        env.reset(seed=seed)
        hands = [tuple(env.game_state.history())]
        for _ in range(30):
            env.reset()
            hands.append(tuple(env.game_state.history()))
        return hands

    first, again, other = deals(7), deals(7), deals(8)
    assert first == again and first != other
    assert len(set(first)) == 6  # every deal of 3 cards to 2 players appears in 31 games


def test_a_game_that_is_not_sequential_is_refused_in_one_line():
    from marl_ppo.envs.catalog import openspiel_game
    from marl_ppo.envs.registry import EnvError

    with pytest.raises(EnvError, match="not a sequential game") as err:
        openspiel_game("matrix_rps")
    assert "\n" not in str(err.value)
    with pytest.raises(EnvError, match="kuhn_poker"):
        openspiel_game("kuhn_poker", players=1)


@pytest.mark.parametrize("env_id", sorted(GAMES))
@pytest.mark.filterwarnings("ignore:Agent's m.* observation space value is")  # OpenSpiel gives no bounds
def test_the_poker_envs_pass_pettingzoo_api_test(env_id):
    from pettingzoo.test import api_test

    api_test(make_env(env_id), num_cycles=200)


def test_hanabi_deals_every_game_of_a_seeded_run_again():
    """PettingZoo's Hanabi deals an unseeded reset from the operating system's entropy; ours continues
    the seeded stream: more games than env copies repeat exactly, and another seed deals others."""
    import torch

    from marl_ppo.config import load_config
    from marl_ppo.eval.evaluate import run_episodes
    from tests.helpers import ROOT, vector_env

    config = load_config(
        ROOT / "experiments/classic/hanabi_v5.yaml", ["rollout.num_envs=2", "rollout.vector=sync"]
    )
    venv = vector_env(config)
    try:
        cpu = torch.device("cpu")
        played = [
            run_episodes(venv, None, cpu, episodes=8, seed=seed, deterministic=False) for seed in (5, 5, 6)
        ]
    finally:
        venv.close()
    np.testing.assert_array_equal(played[0].agent_returns, played[1].agent_returns)
    np.testing.assert_array_equal(played[0].lengths, played[1].lengths)
    assert not np.array_equal(played[0].lengths, played[2].lengths)
