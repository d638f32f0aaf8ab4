"""Where a team critic's episode ends, and the turn-based truncation bootstrap, against hand-computed GAE."""

import pytest
import torch
from gymnasium import spaces

from marl_ppo.algo.batch import rollout_batches
from marl_ppo.algo.gae import acts_at_final, copy_episodes, team_steps
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.rollout.buffer import RolloutBuffer


def _t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def _buffer(groups, episode_over):
    """A one-copy rollout buffer filled by hand. `groups`: per group name, per stored field the `(T, A_g)`
    rows (rewards, terminated, truncated, alive, values, final_values; missing fields stay zero)."""
    specs = []
    for name, fields in groups.items():
        agents = tuple(f"{name}_{i}" for i in range(len(fields["alive"][0])))
        specs.append(GroupSpec(name, agents, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), 1))
    agents = tuple(agent for group in specs for agent in group.agents)
    spec = TeamSpec("by-hand", agents, tuple(specs), state_dim=1, state_from_env=False)
    buffer = RolloutBuffer(spec, len(episode_over), 1)
    for name, fields in groups.items():
        storage = buffer.groups[name]
        for field, rows in fields.items():
            target = getattr(storage, field)
            target.copy_(_t(rows, target.dtype).reshape(target.shape))
    buffer.episode_over.copy_(_t(episode_over, torch.bool).unsqueeze(1))
    buffer.pos = len(episode_over)
    return buffer


def _team_advantages(buffer, name, last_values, last_alive, *, gamma, lam):
    """The group's team advantages per step (each agent's row holds the same) and its batch."""
    last = {n: torch.full((1, len(buffer.groups[n].alive[0, 0])), v) for n, v in last_values.items()}
    acting = {n: _t([flags], torch.bool) for n, flags in last_alive.items()}
    batch = rollout_batches(buffer, last, acting, gamma=gamma, lam=lam, team=True)[name]
    return batch.advantages[:, 0], batch


def _three_players_one_eliminated(**changes):
    # a, b, c move in turns (a at t = 0 and 3, b at 1 and 4, c at 2 and 5); a is eliminated on its own
    # move at t = 3 while b and c play on. Every present player earns +1 per step. V = 0.
    fields = {
        "alive": [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0], [0, 1, 0], [0, 0, 1]],
        "rewards": [[1, 1, 1]] * 4 + [[0, 1, 1]] * 2,
        "terminated": [[0, 0, 0]] * 3 + [[1, 0, 0]] + [[0, 0, 0]] * 2,
    }
    return {"player": {**fields, **changes}}


def test_an_eliminated_player_does_not_end_the_teams_episode_while_the_others_wait_their_turn():
    # team reward: 1 while all three are present, then mean(0, 1, 1) = 2/3; gamma = lambda = 1, V = 0,
    # the team's value after the last step 10 (b moves next):
    #   A5 = 2/3 + 10 = 32/3, A4 = 2/3 + A5 = 34/3, A3 = 1 + A4 = 37/3, A2 = 40/3, A1 = 43/3, A0 = 46/3
    # (the group's episode cut at a's elimination gave A0..A3 = 4, 3, 2, 1)
    buffer = _buffer(_three_players_one_eliminated(), [0] * 6)
    advantages, batch = _team_advantages(
        buffer, "player", {"player": 10.0}, {"player": [0, 1, 0]}, gamma=1, lam=1
    )
    torch.testing.assert_close(advantages, _t([46, 43, 40, 37, 34, 32]) / 3)
    assert torch.equal(batch.alive, buffer.groups["player"].alive[:, 0]), "each player's own moves"


def test_the_teams_episode_ends_where_its_last_players_end():
    # the same game, won by c at t = 5: b and c end there with the copy's episode; gamma = lambda = 1:
    #   A5 = 2/3 (no bootstrap), A4 = 4/3, A3 = 7/3, A2 = 10/3, A1 = 13/3, A0 = 16/3
    ended = [[0, 0, 0]] * 3 + [[1, 0, 0], [0, 0, 0], [0, 1, 1]]
    buffer = _buffer(_three_players_one_eliminated(terminated=ended), [0] * 5 + [1])
    advantages, _ = _team_advantages(
        buffer, "player", {"player": 10.0}, {"player": [1, 0, 0]}, gamma=1, lam=1
    )
    torch.testing.assert_close(advantages, _t([16, 13, 10, 7, 4, 2]) / 3)


def _late_joiner(other_ends):
    # group "agent": a acts at t = 0..2 and terminates at t = 2; nobody of the group acts at t = 3;
    # b joins at t = 4. Each earns +1 where it acts. Group "other" (c) acts at every step and keeps
    # the copy's episode going; `other_ends` ("terminated"/"truncated") ends it, and the copy's
    # episode, at t = 3 instead.
    steps = 6 if other_ends is None else 4
    agent = {
        "alive": ([[1, 0]] * 3 + [[0, 0]] + [[0, 1]] * 2)[:steps],
        "rewards": ([[1, 0]] * 3 + [[0, 0]] + [[0, 1]] * 2)[:steps],
        "terminated": ([[0, 0]] * 2 + [[1, 0]] + [[0, 0]] * 3)[:steps],
        "final_values": [[0, 0]] * 3 + [[8, 8]] + [[0, 0]] * 2,
    }
    agent["final_values"] = agent["final_values"][:steps]
    other = {"alive": [[1]] * steps}
    over = [0] * steps
    if other_ends is not None:
        other[other_ends] = [[0]] * 3 + [[1]]
        over[3] = 1
    return _buffer({"agent": agent, "other": other}, over)


def test_an_agent_that_ends_before_its_groupmate_joins_does_not_end_the_teams_episode():
    # team reward mean(a, b): 0.5 at t = 0..2, 0 at t = 3 (no one of the group acts), 0.5 at t = 4, 5.
    # gamma = 0.5, lambda = 1, V = 0, the value after the last step 10; the transition from a's last
    # move at t = 2 runs to the group's next acting step t = 4, discounted once:
    #   A5 = .5 + .5*10 = 5.5, A4 = .5 + .5*5.5 = 3.25, A2 = (.5 + 0) + .5*3.25 = 2.125,
    #   A1 = .5 + .5*2.125 = 1.5625, A0 = .5 + .5*1.5625 = 1.28125
    # (the group's episode cut where a ended gave A2, A1, A0 = 0.5, 0.75, 0.875)
    buffer = _late_joiner(None)
    last = {"agent": 10.0, "other": 0.0}
    advantages, batch = _team_advantages(
        buffer, "agent", last, {"agent": [0, 1], "other": [1]}, gamma=0.5, lam=1
    )
    live = _t([1, 1, 1, 0, 1, 1], torch.bool)
    torch.testing.assert_close(advantages[live], _t([1.28125, 1.5625, 2.125, 3.25, 5.5]))
    assert torch.equal(batch.alive, buffer.groups["agent"].alive[:, 0])


@pytest.mark.parametrize(
    ("other_ends", "expected"),
    [("truncated", [1.875, 2.75, 4.5]), ("terminated", [0.875, 0.75, 0.5])],
)
def test_a_copy_episode_ending_before_the_groupmate_joins_ends_the_team_as_the_copy_ended(
    other_ends, expected
):
    # the copy's episode ends at t = 3 (c's flag) while b has not joined: the group's episode ends there,
    # truncated if the copy's was, with V(final state) = 8; gamma = 0.5, lambda = 1, V = 0:
    #   truncated:  A2 = .5 + 0 + .5*8 = 4.5, A1 = .5 + .5*4.5 = 2.75, A0 = .5 + .5*2.75 = 1.875
    #   terminated: A2 = .5, A1 = .75, A0 = .875
    buffer = _late_joiner(other_ends)
    last = {"agent": 10.0, "other": 0.0}
    advantages, _ = _team_advantages(buffer, "agent", last, {"agent": [1, 0], "other": [1]}, gamma=0.5, lam=1)
    torch.testing.assert_close(advantages[:3], _t(expected))


def test_team_steps_end_where_every_agent_is_out_and_an_agent_that_comes_back_is_in_again():
    # two agents, the copy's episode never ends here (another group goes on):
    #   a ends at t = 0, comes back at t = 2; b ends at t = 3: a is in again, so the team goes on;
    #   a ends again at t = 4: both out, the team's episode ends (terminated, b's end was terminal).
    alive = _t([[1, 1], [0, 1], [1, 1], [1, 1], [1, 0]], torch.bool)
    ended = _t([[1, 0], [0, 0], [0, 0], [0, 1], [1, 0]], torch.bool)
    truncated = _t([[0, 0], [0, 0], [0, 0], [0, 0], [1, 0]], torch.bool)
    terminated = ended & ~truncated
    episodes = copy_episodes(torch.zeros(5, dtype=torch.bool), [truncated], [alive])
    team = team_steps(torch.zeros(5, 2), terminated, truncated, alive, episodes)
    assert team.terminated.tolist() == [False] * 5
    assert team.truncated.tolist() == [False] * 4 + [True], "a, the last out, was truncated"


def _truncated_turns(final_values):
    # players a (t = 0, 2) and b (t = 1, 3); the game is truncated at b's move t = 3: both players are
    # flagged, as turn-based games flag every present player. b is paid 0.3 on a's move at t = 2, a 0.2
    # on b's at t = 3. V_a(0) = 0.5, V_a(2) = 0.2, V_b(1) = 0.4, V_b(3) = 0.6 (9: waiting, unused).
    return {
        "alive": [[1, 0], [0, 1], [1, 0], [0, 1]],
        "rewards": [[0, 0], [0, 0], [0, 0.3], [0.2, 0]],
        "truncated": [[0, 0], [0, 0], [0, 0], [1, 1]],
        "values": [[0.5, 9], [9, 0.4], [0.2, 9], [9, 0.6]],
        "final_values": [[0, 0], [0, 0], [0, 0], final_values],
    }


def test_a_turn_based_truncation_drops_the_movers_move_and_keeps_the_waiting_players_bootstrap():
    # V(final obs): a 0.7 (a moves next there), b 5 (b waits there: a position its critic never trains on).
    # gamma = 0.5, lambda = 1:
    #   a at t=2: r = 0 + 0.2, truncated at t=3, bootstrap V_a(final) 0.7: A = 0.2 + 0.35 - 0.2 = 0.35
    #   a at t=0: r = 0, next V_a(2) = 0.2: A = (0.1 - 0.5) + 0.5*0.35 = -0.225
    #   b at t=3: the mover's truncated move: dropped (bootstrapped from its waiting position: 0.5*5 - 0.6 = 1.9)
    #   b at t=1: r = 0.3, next V_b(3) = 0.6, trace cut there: A = 0.3 + 0.3 - 0.4 = 0.2 (else 0.2 + 0.5*1.9)
    last = {"player": torch.full((1, 2), 7.0)}  # the next game's first position: not read
    acting = {"player": _t([[1, 0]], torch.bool)}
    batch = rollout_batches(
        _buffer({"player": _truncated_turns([0.7, 5])}, [0, 0, 0, 1]), last, acting, gamma=0.5, lam=1
    )
    live = _t([[1, 0], [0, 1], [1, 0], [0, 0]], torch.bool)
    assert torch.equal(batch["player"].alive, live)
    torch.testing.assert_close(batch["player"].advantages[live], _t([-0.225, 0.2, 0.35]))
    torch.testing.assert_close(batch["player"].returns[live], _t([0.275, 0.6, 0.55]))
    # the mover's final value changes no live target; the waiting player's is its bootstrap
    poisoned = rollout_batches(
        _buffer({"player": _truncated_turns([0.7, 1e6])}, [0, 0, 0, 1]), last, acting, gamma=0.5, lam=1
    )
    assert torch.equal(poisoned["player"].advantages, batch["player"].advantages)
    moved = rollout_batches(
        _buffer({"player": _truncated_turns([1.7, 5])}, [0, 0, 0, 1]), last, acting, gamma=0.5, lam=1
    )
    assert moved["player"].advantages[2, 0].item() == pytest.approx(0.35 + 0.5)


def test_a_turn_based_truncation_across_groups_drops_the_movers_move_alike():
    # the same game with each player in its own group, per-agent and team critics alike
    fields = _truncated_turns([0.7, 5])
    groups = {
        name: {field: [[row[i]] for row in rows] for field, rows in fields.items()}
        for i, name in enumerate("ab")
    }
    last = {name: torch.full((1, 1), 7.0) for name in "ab"}
    acting = {"a": _t([[1]], torch.bool), "b": _t([[0]], torch.bool)}
    for team in (False, True):
        batch = rollout_batches(_buffer(groups, [0, 0, 0, 1]), last, acting, gamma=0.5, lam=1, team=team)
        assert batch["b"].alive[:, 0].tolist() == [False, True, False, False], team
        torch.testing.assert_close(batch["a"].advantages[[0, 2], 0], _t([-0.225, 0.35]))
        assert batch["b"].advantages[1, 0].item() == pytest.approx(0.2)


def test_simultaneous_truncations_and_a_turn_based_team_keep_their_bootstrap():
    # every truncated agent acted at the step: each acts at its final observation
    alive = torch.ones(3, 2, dtype=torch.bool)
    truncated = _t([[0, 0], [1, 1], [0, 0]], torch.bool)
    episodes = copy_episodes(truncated.all(-1), [truncated], [alive])
    assert not episodes.turn_truncated.any() and acts_at_final(alive, episodes).all()
    # a team of both turn-based players: the group moves at its final observation (b is to move)
    fields = _truncated_turns([0.7, 0.7])
    alive, truncated = _t(fields["alive"], torch.bool), _t(fields["truncated"], torch.bool)
    episodes = copy_episodes(_t([0, 0, 0, 1], torch.bool), [truncated], [alive])
    assert acts_at_final(alive, episodes)[3].tolist() == [True, False]
    team = team_steps(_t(fields["rewards"]), torch.zeros_like(alive), truncated, alive, episodes)
    assert team.final_alive.all() and team.truncated.tolist() == [False, False, False, True]
