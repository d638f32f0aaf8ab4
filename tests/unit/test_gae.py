"""GAE against hand-computed tables, the truncation bootstrap, and shape checks."""

import pytest
import torch

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.gae import compute_gae, copy_episodes, fold_turns, team_steps


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    terminated = _t(terminated, torch.bool)
    done = terminated | _t(truncated, torch.bool)
    return compute_gae(_t(rewards), _t(values), _t(next_values), terminated, done, gamma=gamma, lam=lam)


# r = [1, 1, 1], V = 0, gamma = 0.5, lambda = 1 (worked by hand):
#   no done:                       A = [1 + .5*1.5, 1 + .5*1, 1]          = [1.75, 1.5, 1]
#   truncated at t=1, V(final)=2:  A1 = 1 + .5*2 = 2 (trace cut), A0 = 1 + .5*2 = 2
#   terminated at t=1:             A1 = 1 (no bootstrap),          A0 = 1 + .5*1 = 1.5
@pytest.mark.parametrize(
    ("next_values", "terminated", "truncated", "expected"),
    [
        ([0, 0, 0], [0, 0, 0], [0, 0, 0], [1.75, 1.5, 1.0]),
        ([0, 2, 0], [0, 0, 0], [0, 1, 0], [2.0, 2.0, 1.0]),
        ([0, 2, 0], [0, 1, 0], [0, 0, 0], [1.5, 1.0, 1.0]),
    ],
    ids=["no-done", "truncated-bootstrap", "terminated"],
)
def test_gae_hand_table(next_values, terminated, truncated, expected):
    adv, ret = _gae([1, 1, 1], [0, 0, 0], next_values, terminated, truncated, gamma=0.5, lam=1.0)
    torch.testing.assert_close(adv, _t(expected))
    torch.testing.assert_close(ret, _t(expected))  # V = 0, so returns equal advantages


def test_gae_hand_table_with_values_and_lambda():
    # gamma = lambda = 0.5, V = [1, 2, 4], value after the last step 8, no done:
    #   deltas: d2 = 2 + .5*8 - 4 = 2, d1 = 0 + .5*4 - 2 = 0, d0 = 1 + .5*2 - 1 = 1
    #   A2 = 2, A1 = 0 + .25*2 = 0.5, A0 = 1 + .25*0.5 = 1.125; returns = A + V
    adv, ret = _gae([1, 0, 2], [1, 2, 4], [2, 4, 8], [0, 0, 0], [0, 0, 0], gamma=0.5, lam=0.5)
    torch.testing.assert_close(adv, _t([1.125, 0.5, 2.0]))
    torch.testing.assert_close(ret, _t([2.125, 2.5, 6.0]))


def test_gae_matches_scalar_loop_on_random_batches():
    generator = torch.Generator().manual_seed(0)
    steps, envs, agents, gamma, lam = 17, 4, 3, 0.97, 0.9
    rewards = torch.randn(steps, envs, agents, generator=generator)
    values = torch.randn(steps, envs, agents, generator=generator)
    next_values = torch.randn(steps, envs, agents, generator=generator)
    terminated = torch.rand(steps, envs, agents, generator=generator) < 0.1
    done = terminated | (torch.rand(steps, envs, agents, generator=generator) < 0.1)
    adv, ret = compute_gae(rewards, values, next_values, terminated, done, gamma=gamma, lam=lam)
    for e in range(envs):
        for a in range(agents):
            running = 0.0
            for t in reversed(range(steps)):
                bootstrap = 0.0 if terminated[t, e, a] else float(next_values[t, e, a])
                delta = float(rewards[t, e, a]) + gamma * bootstrap - float(values[t, e, a])
                running = delta + (0.0 if done[t, e, a] else gamma * lam * running)
                assert adv[t, e, a].item() == pytest.approx(running, abs=1e-5)
    torch.testing.assert_close(ret, adv + values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("with_alive", [False, True])
def test_the_numpy_trace_on_cpu_is_bitwise_the_torch_one(dtype, with_alive):
    # compute_gae runs the lambda-trace's loop in NumPy on the CPU (cheaper per step); torch's loop
    # (other devices, tensors that need gradients) gives the same bits
    import numpy as np

    from marl_ppo.algo.gae import _trace

    generator = torch.Generator().manual_seed(1)
    deltas = torch.randn(128, 16, 3, generator=generator, dtype=dtype) * 10
    decay = 0.99 * 0.95 * (torch.rand(128, 16, 3, generator=generator) > 0.04).to(dtype)
    alive = torch.rand(128, 16, 3, generator=generator) > 0.2 if with_alive else None
    expected = _trace(torch, deltas, decay, alive)
    got = torch.from_numpy(
        _trace(np, deltas.numpy(), decay.numpy(), None if alive is None else alive.numpy())
    )
    assert got.dtype == expected.dtype and torch.equal(got, expected)
    rewards = torch.randn(128, 16, 3, generator=generator, dtype=dtype, requires_grad=True)
    done = torch.zeros(128, 16, 3, dtype=torch.bool)
    traced, _ = compute_gae(rewards, rewards.detach(), rewards.detach(), done, done, gamma=0.9, lam=0.8)
    assert traced.requires_grad  # the torch loop, gradients kept


def test_fold_turns_is_the_one_step_transition_when_everyone_always_acts():
    generator = torch.Generator().manual_seed(3)
    steps, width = 9, 5
    rewards, values, finals = (torch.randn(steps, width, generator=generator) for _ in range(3))
    last = torch.randn(width, generator=generator)
    terminated = torch.rand(steps, width, generator=generator) < 0.15
    truncated = ~terminated & (torch.rand(steps, width, generator=generator) < 0.15)
    alive = torch.ones(steps, width, dtype=torch.bool)
    folded = fold_turns(
        rewards,
        values,
        last,
        finals,
        terminated,
        truncated,
        alive,
        last_alive=torch.ones(width, dtype=torch.bool),
    )
    following = torch.cat([values[1:], last[None]])
    expected_next = torch.where(truncated, finals, torch.where(terminated, 0.0, following))
    torch.testing.assert_close(folded.rewards, rewards)
    torch.testing.assert_close(folded.next_values, expected_next)
    assert torch.equal(folded.terminated, terminated) and torch.equal(folded.done, terminated | truncated)
    assert torch.equal(folded.alive, alive)


def test_fold_turns_whole_tensor_path_is_bitwise_the_walk_back():
    # fold_turns takes whole-tensor operations when everyone acts everywhere; the step-by-step walk on
    # the same inputs gives the same bits, signed zero rewards included
    generator = torch.Generator().manual_seed(11)
    steps, copies, agents = 33, 6, 3
    shape = (steps, copies, agents)
    rewards, values, finals = (torch.randn(shape, generator=generator) for _ in range(3))
    rewards[0, 0] = -0.0
    last = torch.randn(shape[1:], generator=generator)
    terminated = torch.rand(shape, generator=generator) < 0.1
    truncated = ~terminated & (torch.rand(shape, generator=generator) < 0.1)
    alive, last_alive = torch.ones(shape, dtype=torch.bool), torch.ones(shape[1:], dtype=torch.bool)
    inputs = (rewards, values, last, finals, terminated, truncated, alive)
    fast = fold_turns(*inputs, last_alive=last_alive, final_alive=torch.ones(shape, dtype=torch.bool))
    walked = fold_turns(*inputs, last_alive=last_alive, whole_tensors=False)
    for field in ("rewards", "next_values", "terminated", "done", "alive"):
        a, b = getattr(fast, field), getattr(walked, field)
        assert a.dtype == b.dtype and torch.equal(a, b), field
        if a.is_floating_point():
            assert torch.equal(torch.signbit(a), torch.signbit(b)), field
    assert bool(torch.signbit(fast.rewards[0, 0]).logical_not().all())  # -0.0 + 0.0 as the walk adds


def test_turn_based_game_by_hand():
    # agent a acts at t = 0, 2 and b at t = 1, 3; b's move at t = 3 wins: b +1, a -1, both terminated.
    # gamma = 0.5, lambda = 1, V_a(t=0) = 0.5, V_a(2) = 0.2, V_b(1) = 0.4, V_b(3) = 0.6.
    #   a at t=2: r = 0 + (-1 at t=3, its opponent's move), terminated: A = -1 - 0.2 = -1.2
    #   a at t=0: r = 0 + 0, next acting step t=2: delta = 0.5*0.2 - 0.5 = -0.4, A = -0.4 + 0.5*(-1.2) = -1.0
    #   b at t=3: A = 1 - 0.6 = 0.4; b at t=1: delta = 0.5*0.6 - 0.4 = -0.1, A = -0.1 + 0.5*0.4 = 0.1
    alive = _t([[1, 0], [0, 1], [1, 0], [0, 1]], torch.bool)
    rewards = _t([[0, 0], [0, 0], [0, 0], [-1, 1]])
    values = _t([[0.5, 9], [9, 0.4], [0.2, 9], [9, 0.6]])  # 9: values of waiting steps, never used
    terminated = _t([[0, 0], [0, 0], [0, 0], [1, 1]], torch.bool)
    folded = fold_turns(
        rewards,
        values,
        _t([7, 7]),
        torch.zeros(4, 2),
        terminated,
        torch.zeros_like(alive),
        alive,
        last_alive=_t([1, 0], torch.bool),  # the next game's first move; both moves of b ended the game
    )
    adv, _ = compute_gae(
        folded.rewards,
        values,
        folded.next_values,
        folded.terminated,
        folded.done,
        gamma=0.5,
        lam=1.0,
        alive=alive,
    )
    torch.testing.assert_close(adv[alive], _t([-1.0, 0.1, -1.2, 0.4]))


def _turns_ending_while_b_waits(last_alive, terminated_at_end=False):
    # a acts at t = 0, 2 and b at t = 1, 3; b is paid 0.3 on a's move at t = 2, a 0.2 on b's at t = 3.
    # The rollout ends after b's move at t = 3: a moves next (last_alive [1, 0]).
    # gamma = 0.5, lambda = 1; V_a(0) = 0.5, V_a(2) = 0.2, V_b(1) = 0.4, V_b(3) = 0.6; after the last
    # step V_a = 0.1 and V_b = 7 (b waits there: a position its critic never trains on).
    alive = _t([[1, 0], [0, 1], [1, 0], [0, 1]], torch.bool)
    rewards = _t([[0, 0], [0, 0], [0, 0.3], [0.2, 0]])
    values = _t([[0.5, 9], [9, 0.4], [0.2, 9], [9, 0.6]])  # 9: values of waiting steps, never used
    terminated = torch.zeros_like(alive)
    terminated[3] = terminated_at_end
    folded = fold_turns(
        rewards,
        values,
        _t([0.1, 7]),
        torch.zeros(4, 2),
        terminated,
        torch.zeros_like(alive),
        alive,
        last_alive=_t(last_alive, torch.bool),
    )
    adv, ret = compute_gae(
        folded.rewards,
        values,
        folded.next_values,
        folded.terminated,
        folded.done,
        gamma=0.5,
        lam=1.0,
        alive=folded.alive,
    )
    return folded, adv, ret


def test_a_rollout_ending_while_a_player_waits_drops_its_unfinished_move():
    #   a at t=2: r = 0 + 0.2, bootstrap V_a after the last step 0.1: A = 0.2 + 0.05 - 0.2 = 0.05
    #   a at t=0: r = 0, next V_a(2) = 0.2: A = (0.1 - 0.5) + 0.5 * 0.05 = -0.375
    #   b at t=3: unfinished and b waits after the last step: dropped (today: 0 + 0.5*7 - 0.6 = 2.9)
    #   b at t=1: r = 0 + 0.3, next V_b(3) = 0.6, trace cut there: A = 0.3 + 0.3 - 0.4 = 0.2
    #             (today: 0.2 + 0.5 * 2.9 = 1.65)
    folded, adv, ret = _turns_ending_while_b_waits([1, 0])
    assert torch.equal(folded.alive, _t([[1, 0], [0, 1], [1, 0], [0, 0]], torch.bool))
    assert torch.equal(folded.done, _t([[0, 0], [0, 1], [0, 0], [0, 0]], torch.bool))
    assert not folded.terminated.any() and folded.next_values[1, 1].item() == pytest.approx(0.6)
    live = folded.alive
    torch.testing.assert_close(adv[live], _t([-0.375, 0.2, 0.05]))
    torch.testing.assert_close(ret[live], _t([0.125, 0.6, 0.25]))


def test_a_waiting_player_keeps_a_finished_last_move_and_one_acting_next_its_bootstrap():
    # b's last move ended the game: a complete transition, kept though b waits after the last step
    folded, adv, _ = _turns_ending_while_b_waits([1, 0], terminated_at_end=True)
    assert torch.equal(folded.alive[3], _t([0, 1], torch.bool))
    assert adv[3, 1].item() == pytest.approx(0 - 0.6) and adv[1, 1].item() == pytest.approx(0.2 + 0.5 * -0.6)
    # every player acting after the last step: today's bootstrap from V after the last step
    folded, adv, _ = _turns_ending_while_b_waits([1, 1])
    assert torch.equal(folded.alive, _t([[1, 0], [0, 1], [1, 0], [0, 1]], torch.bool))
    assert adv[3, 1].item() == pytest.approx(2.9) and adv[1, 1].item() == pytest.approx(1.65)


def test_truncation_while_waiting_bootstraps_from_the_final_value():
    # one agent acts at t = 0 only; the episode is truncated at t = 2 with V(final) = 4; gamma = 0.5
    alive = _t([[1], [0], [0]], torch.bool)
    truncated = _t([[0], [0], [1]], torch.bool)
    folded = fold_turns(
        _t([[1.0], [2.0], [3.0]]),
        _t([[0.0], [9], [9]]),
        _t([9.0]),
        _t([[0.0], [0.0], [4.0]]),
        torch.zeros_like(alive),
        truncated,
        alive,
        last_alive=_t([0], torch.bool),
    )
    assert folded.rewards[0].item() == 6.0 and folded.next_values[0].item() == 4.0
    assert folded.done[0] and not folded.terminated[0]


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="values has shape"):
        compute_gae(
            torch.zeros(3, 2),
            torch.zeros(3, 1),
            torch.zeros(3, 2),
            torch.zeros(3, 2, dtype=torch.bool),
            torch.zeros(3, 2, dtype=torch.bool),
            gamma=0.9,
            lam=0.9,
        )
    with pytest.raises(ValueError, match="alive has shape"):
        zeros, flags = torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool)
        compute_gae(
            zeros, zeros, zeros, flags, flags, gamma=0.9, lam=0.9, alive=torch.ones(3, 1, dtype=torch.bool)
        )


def _team_buffer(rewards, terminated, truncated, alive, values, final_values, episode_over):
    """A one-copy rollout buffer of the two agents of `tests/broken_envs.py`, filled by hand."""
    from marl_ppo.envs.grouping import build_team_spec
    from marl_ppo.rollout.buffer import RolloutBuffer
    from tests.broken_envs import BrokenEnv

    steps = len(rewards)
    buffer = RolloutBuffer(build_team_spec(BrokenEnv(), "test"), steps, 1)
    storage = buffer.groups["agent"]
    storage.rewards.copy_(_t(rewards).unsqueeze(1))
    storage.terminated.copy_(_t(terminated, torch.bool).unsqueeze(1))
    storage.truncated.copy_(_t(truncated, torch.bool).unsqueeze(1))
    storage.alive.copy_(_t(alive, torch.bool).unsqueeze(1))
    storage.values.copy_(_t(values).reshape(steps, 1, 1).expand(steps, 1, 2))
    storage.final_values.copy_(_t(final_values).reshape(steps, 1, 1).expand(steps, 1, 2))
    buffer.episode_over.copy_(torch.as_tensor(episode_over, dtype=torch.bool).unsqueeze(1))
    buffer.pos = steps
    return buffer


def test_team_critic_gae_runs_on_the_groups_mean_reward_by_hand():
    # agents a, b; b terminates at t=1 (leaves early), a is truncated at t=3 with V(final state) = 4.
    # Team rewards: t=0 mean(1, -1) = 0; t=1 shared 0.5; t=2 mean(1, absent b's 0) = 0.5; t=3 mean(2, 0) = 1.
    # b's exit does not end the group's episode; a's truncation (every agent out, the copy's end) does.
    # V = [1, 2, 3, 5] for both; gamma = lambda = 0.5:
    #   deltas: d3 = 1 + .5*4 - 5 = -2, d2 = .5 + .5*5 - 3 = 0, d1 = .5 + .5*3 - 2 = 0, d0 = 0 + .5*2 - 1 = 0
    #   A3 = -2, A2 = .25*-2 = -.5, A1 = -.125, A0 = -.03125; returns A + V = [.96875, 1.875, 2.5, 3]
    rewards = [[1, -1], [0.5, 0.5], [1, 0], [2, 0]]
    terminated = [[0, 0], [0, 1], [0, 0], [0, 0]]
    truncated = [[0, 0], [0, 0], [0, 0], [1, 0]]
    alive = [[1, 1], [1, 1], [1, 0], [1, 0]]
    over = _t([0, 0, 0, 1], torch.bool)
    flags = {
        name: _t(rows, torch.bool) for name, rows in [("terminated", terminated), ("truncated", truncated)]
    }
    live = _t(alive, torch.bool)
    episodes = copy_episodes(over, [flags["truncated"]], [live])
    team = team_steps(_t(rewards), flags["terminated"], flags["truncated"], live, episodes)
    torch.testing.assert_close(team.rewards, _t([0, 0.5, 0.5, 1]))
    assert team.truncated.tolist() == [False, False, False, True] and not team.terminated.any()
    assert team.alive.all()
    buffer = _team_buffer(rewards, terminated, truncated, alive, [1, 2, 3, 5], [0, 0, 0, 4], over)
    last = {"agent": torch.full((1, 2), 9.0)}  # after the group's episode ended: unused
    batch = rollout_batches(buffer, last, gamma=0.5, lam=0.5, team=True)["agent"]
    advantages = _t([-0.03125, -0.125, -0.5, -2.0])
    torch.testing.assert_close(batch.advantages, advantages[:, None].expand(4, 2))
    torch.testing.assert_close(batch.returns, (advantages + _t([1, 2, 3, 5]))[:, None].expand(4, 2))
    assert torch.equal(batch.alive, _t(alive, torch.bool)), "each agent's samples where it acted"
    # the per-agent GAE of the same rollout: b's return stops at its exit (0.5 - 2 at t=1)
    per_agent = rollout_batches(buffer, last, gamma=0.5, lam=0.5)["agent"]
    assert per_agent.advantages[1, 1].item() == pytest.approx(0.5 - 2)


def test_team_steps_end_a_turn_based_group_where_every_player_ends():
    # one player moves per step; flags at a step where no agent of the group acts end it too, when
    # every agent is out after them (the copy's episode goes on here: another group moved)
    rewards = _t([[0.0, 0.0], [0.0, 0.0], [1.0, -1.0]])
    alive = _t([[1, 0], [0, 1], [0, 0]], torch.bool)
    ended = _t([[0, 0], [0, 0], [1, 1]], torch.bool)
    not_truncated = torch.zeros_like(ended)
    episodes = copy_episodes(torch.zeros(3, dtype=torch.bool), [not_truncated], [alive])
    team = team_steps(rewards, ended, not_truncated, alive, episodes)
    assert team.terminated.tolist() == [False, False, True] and team.alive.tolist() == [True, True, False]
    torch.testing.assert_close(team.rewards, _t([0.0, 0.0, 0.0]))


def test_team_gae_with_a_shared_reward_is_the_per_agent_gae_bit_for_bit():
    generator = torch.Generator().manual_seed(5)
    steps = 12
    shared = torch.randn(steps, 1, generator=generator).expand(steps, 2).tolist()
    truncated = [[k % 5 == 4] * 2 for k in range(steps)]
    terminated = [[k == 7] * 2 for k in range(steps)]
    values = torch.randn(steps, generator=generator).tolist()
    finals = torch.randn(steps, generator=generator).tolist()
    over = [k % 5 == 4 or k == 7 for k in range(steps)]
    buffer = _team_buffer(shared, terminated, truncated, [[1, 1]] * steps, values, finals, over)
    last = {"agent": torch.full((1, 2), 0.7)}
    team = rollout_batches(buffer, last, gamma=0.9, lam=0.8, team=True)["agent"]
    per_agent = rollout_batches(buffer, last, gamma=0.9, lam=0.8)["agent"]
    for field in ("advantages", "returns", "alive"):
        assert torch.equal(getattr(team, field), getattr(per_agent, field)), field
