"""Turn-based (AEC) games: one mover per step, masks for legal moves, the loser credited on its last move."""

import dataclasses
from typing import Any

import numpy as np
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.gae import fold_turns
from marl_ppo.config import load_config
from marl_ppo.envs.adapters.aec import TurnBasedAdapter, is_aec
from marl_ppo.envs.grouping import build_team_spec
from marl_ppo.envs.registry import make_env
from marl_ppo.envs.spec import TeamArrays
from marl_ppo.run.loop import train
from tests.helpers import ROOT, collect_rollout

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
    config = load_config(
        None,
        [f"env.id={TICTACTOE}", "model.share_actor=true", "rollout.num_envs=4", "rollout.rollout_steps=40"],
    )
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
        last_alive=rollout.last_alive["player"],
    )
    decisive = [e for e in rollout.episodes if e.agent_returns.min() < 0]
    assert decisive, "40 random moves in 4 games of tic-tac-toe end some games with a winner"
    # every -1 paid on the winner's move reaches the loser's own last move as a terminal transition
    losses = (storage.rewards == -1) & ~storage.alive
    assert int(losses.sum()) == int(((folded.rewards == -1) & storage.alive & folded.terminated).sum())


def _tictactoe_rollout():
    config = load_config(
        None,
        [f"env.id={TICTACTOE}", "model.share_actor=true", "rollout.num_envs=8", "rollout.rollout_steps=25"],
    )
    _, buffer, rollout = collect_rollout(config, seed=1)
    return buffer, rollout


def test_no_return_target_of_a_tictactoe_rollout_uses_a_value_where_the_player_waits():
    buffer, rollout = _tictactoe_rollout()
    storage, last_alive = buffer.groups["player"], rollout.last_alive["player"]
    assert (last_alive.sum(-1) == 1).all(), "after the last step one player moves, the other waits"
    batch = rollout_batches(buffer, rollout.last_values, rollout.last_alive, gamma=0.99, lam=0.95)["player"]
    steps, envs, agents = storage.alive.shape
    live = batch.alive.reshape(steps, envs, agents)
    ended = storage.terminated | storage.truncated
    dropped = 0
    for e in range(envs):
        for i in range(agents):
            acting = torch.nonzero(storage.alive[:, e, i]).flatten().tolist()
            for k, t in enumerate(acting):
                following = acting[k + 1] if k + 1 < len(acting) else steps
                # the transition ends at the player's next move, at an episode end, or after the
                # rollout's last step where the player moves next; else it is left out
                complete = following < steps or bool(ended[t:, e, i].any()) or bool(last_alive[e, i])
                assert bool(live[t, e, i]) == complete, (t, e, i)
                dropped += not complete
    assert dropped > 0, "some player waits after the last step with its last move unfinished"
    # the values at waiting positions (in the buffer and after the last step) change no live target
    waiting_values = {"player": torch.where(last_alive, rollout.last_values["player"], 1e6)}
    poisoned = dataclasses.replace(storage, values=torch.where(storage.alive, storage.values, -1e6))
    buffer.groups["player"] = poisoned
    other = rollout_batches(buffer, waiting_values, rollout.last_alive, gamma=0.99, lam=0.95)["player"]
    assert torch.equal(other.alive, batch.alive)
    torch.testing.assert_close(other.returns[batch.alive], batch.returns[batch.alive], rtol=0, atol=0)
    torch.testing.assert_close(other.advantages[batch.alive], batch.advantages[batch.alive], rtol=0, atol=0)


def test_connect_four_trains_one_update(tmp_path):
    config = load_config(
        None,
        [
            "env.id=classic/connect_four_v3",
            "model.share_actor=true",
            "rollout.num_envs=2",
            "rollout.rollout_steps=32",
            "total_steps=64",
            "log.progress=false",
        ],
    )
    result = train(config, tmp_path)
    assert result.updates == 1


def test_simultaneous_moves_keep_the_bootstrap_after_the_last_step_bit_for_bit():
    """Every simple_spread agent acts after the last step: the batch is the one of the bootstrap from
    V(next obs) for everyone, bit for bit."""
    config = load_config(
        str(ROOT / "experiments/mpe/simple_spread.yaml"), ["rollout.num_envs=4", "rollout.rollout_steps=30"]
    )
    _, buffer, rollout = collect_rollout(config)
    assert all(alive.all() for alive in rollout.last_alive.values())
    assert any(g.truncated.any() for g in buffer.groups.values()), "an episode ends inside the rollout"
    gae: dict[str, Any] = {"gamma": config.ppo.gamma, "lam": config.ppo.gae_lambda}
    got = rollout_batches(buffer, rollout.last_values, rollout.last_alive, **gae)
    everyone_acts = rollout_batches(buffer, rollout.last_values, None, **gae)
    for name, batch in got.items():
        for field in ("advantages", "returns", "alive"):
            assert torch.equal(getattr(batch, field), getattr(everyone_acts[name], field)), (name, field)
