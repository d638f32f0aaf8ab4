"""Turn-based (AEC) games: one mover per step, masks for legal moves, the loser credited on its last move."""

import numpy as np
from conftest import collect_rollout

from marl_ppo.algo.gae import fold_turns
from marl_ppo.config import load_config
from marl_ppo.envs.adapters.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.envs.spec import TeamArrays
from marl_ppo.run.loop import train

TICTACTOE = "classic/tictactoe_v3"


def test_tictactoe_moves_alternate_with_masks_and_the_winner_is_paid():
    env = make_env(TICTACTOE)
    assert is_aec(env)
    spec = build_team_spec(env, TICTACTOE)
    (group,) = spec.groups
    assert group.agents == ("player_1", "player_2") and group.mask_source == "obs" and group.obs_dim == 18
    adapter, out = TurnBasedAdapter(env, spec), TeamArrays.allocate(spec)
    adapter.reset(0, out)
    players = out.groups["player"]
    np.testing.assert_array_equal(players.alive, [True, False])
    assert players.action_mask[0].all()
    moves = [0, 3, 1, 4, 2]  # player_1 takes the top row
    for k, cell in enumerate(moves):
        mover = k % 2
        assert players.alive[mover] and not players.alive[1 - mover]
        assert not players.action_mask[mover][moves[:k]].any()  # occupied cells are masked
        over = adapter.step({"player": np.array([cell, cell])}, out)
        assert over == (k == len(moves) - 1)
    np.testing.assert_array_equal(players.reward, [1.0, -1.0])
    np.testing.assert_array_equal(players.terminated, [True, True])
    np.testing.assert_array_equal(players.alive, [False, False])


def test_self_play_rollout_keeps_masks_and_credits_the_loser(tmp_path):
    config = load_config(None, [f"env.id={TICTACTOE}", "share_actor=true", "num_envs=4", "rollout_steps=40"])
    model, buffer, rollout = collect_rollout(config)
    storage = buffer.groups["player"]
    assert (storage.alive.sum(-1) == 1).all(), "exactly one player moves at every step"
    chosen_allowed = storage.action_mask.gather(-1, storage.actions.unsqueeze(-1)).squeeze(-1)
    assert chosen_allowed[storage.alive].all(), "a masked (occupied) cell was played"
    folded = fold_turns(
        storage.rewards,
        storage.values,
        rollout.last_values["player"],
        storage.final_values,
        storage.terminated,
        storage.truncated,
        storage.alive,
    )
    decisive = [e for e in rollout.episodes if e.agent_returns.min() < 0]
    assert decisive, "40 random moves in 4 games of tic-tac-toe end some games with a winner"
    # every -1 paid on the winner's move reaches the loser's own last move as a terminal transition
    losses = (storage.rewards == -1) & ~storage.alive
    assert int(losses.sum()) == int(((folded.rewards == -1) & storage.alive & folded.terminated).sum())


def test_connect_four_trains_one_update(tmp_path):
    config = load_config(
        None,
        [
            "env.id=classic/connect_four_v3",
            "share_actor=true",
            "num_envs=2",
            "rollout_steps=32",
            "total_steps=64",
            "log.progress=false",
        ],
    )
    result = train(config, tmp_path)
    assert result.updates == 1
