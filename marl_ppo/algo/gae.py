"""Generalized advantage estimation as pure functions over time-major tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    alive: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and return targets for time-major `(T, ...)` tensors of identical shape.

    `next_values[t]` is the value of the state after step t (at a truncation: of the final
    observation, read before any reset). `terminated` zeroes that bootstrap; `done`
    (terminated or truncated) stops the lambda-trace from flowing back across an episode end.
    With `alive`, steps where an agent did not act are transparent: the trace passes them
    unchanged to the agent's previous acting step (see `fold_turns` for the matching inputs).
    """
    shape = rewards.shape
    checked = {"values": values, "next_values": next_values, "terminated": terminated, "done": done}
    if alive is not None:
        checked["alive"] = alive
    for name, tensor in checked.items():
        if tensor.shape != shape:
            raise ValueError(f"compute_gae: {name} has shape {tuple(tensor.shape)}, rewards {tuple(shape)}")
    if len(shape) == 0:
        raise ValueError("compute_gae: inputs need a leading time dimension")
    if not (0.0 < gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"compute_gae: need 0 < gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    not_terminated = 1.0 - terminated.to(rewards.dtype)
    not_done = 1.0 - done.to(rewards.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    decay = gamma * lam * not_done
    if rewards.device.type == "cpu" and not rewards.requires_grad:
        # the same float32 operations in the same order as torch's, so the same bits, at a fraction
        # of a torch call's cost per step (the trace is a Python loop over the rollout's steps)
        advantages = torch.from_numpy(
            _trace(np, deltas.numpy(), decay.numpy(), None if alive is None else alive.numpy())
        )
    else:
        advantages = _trace(torch, deltas, decay, alive)
    return advantages, advantages + values


def _trace(xp: Any, deltas: Any, decay: Any, alive: Any | None) -> Any:
    """The lambda-trace backwards over time, `A[t] = deltas[t] + decay[t] * A[t+1]`, passing the steps
    where not `alive`; `xp` is `numpy` (CPU arrays) or `torch` (tensors on any device)."""
    advantages = xp.empty_like(deltas)
    running = xp.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        step = deltas[t] + decay[t] * running
        running = step if alive is None else xp.where(alive[t], step, running)
        advantages[t] = running
    return advantages


@dataclass(frozen=True)
class Transitions:
    """Per-step GAE inputs where each acting step's transition runs to the agent's next acting step."""

    rewards: torch.Tensor
    next_values: torch.Tensor
    terminated: torch.Tensor
    done: torch.Tensor
    alive: torch.Tensor
    """The acting steps that enter the losses and statistics: the input `alive` without the transitions
    that would bootstrap from a waiting position (an unfinished last one, or one truncated there)."""


def fold_turns(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_values: torch.Tensor,
    final_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    alive: torch.Tensor,
    *,
    last_alive: torch.Tensor,
    final_alive: torch.Tensor | None = None,
    whole_tensors: bool = True,
) -> Transitions:
    """Transitions for agents that act at some steps only (turn-based games, agents that leave or join).

    For an agent acting at step t whose next acting step is t', the transition t -> t' collects the
    rewards of steps t..t'-1 and bootstraps from `values[t']`. If the episode ends at some step s in
    between (the agent's `terminated`/`truncated` flag at s), the transition ends there: rewards up to
    s, no bootstrap on termination, `final_values[s]` (V of the final observation) on truncation.
    After the last acting step of the rollout the bootstrap is `last_values`, where the agent acts
    after the last step (`last_alive`). Where it waits there, the critic never trained on that
    position: the unfinished last transition is dropped from `alive`, and the agent's previous
    transition, which bootstraps from the last acting step's value, is cut there (`done`) so that no
    advantage depends on it. A truncation is treated alike: `final_alive[s]` says whether the agent
    acts at its final observation of step s (None: every agent does, as with simultaneous moves). A
    transition truncated where the agent waits (a turn-based mover, whose final observation follows
    its own move) would bootstrap from a position the critic never trains on, so it is dropped and
    the one before it cut, exactly as the unfinished last one: its targets stay on positions where the
    agent acts, at the cost of one sample per truncated episode, where training the critic on waiting
    positions too would change every turn-based game's value loss. When every agent acts at every step
    this reduces to the usual one-step transitions, computed with whole-tensor operations unless
    `whole_tensors` is False (the walk back, with the same numbers). All inputs are `(T, ...)` except
    `last_values` and `last_alive` `(...)`.
    """
    every_step = bool(alive.all()) and bool(last_alive.all())
    if whole_tensors and every_step and (final_alive is None or bool(final_alive.all())):
        return _every_step(rewards, values, last_values, final_values, terminated, truncated, alive)
    steps = rewards.shape[0]
    out_rewards, out_next = torch.empty_like(rewards), torch.empty_like(rewards)
    out_terminated, out_done = torch.empty_like(alive), torch.empty_like(alive)
    out_alive = torch.empty_like(alive)
    # what follows the current step up to the agent's next acting step
    pending_reward = torch.zeros_like(rewards[0])
    pending_terminated = torch.zeros_like(alive[0])
    pending_truncated = torch.zeros_like(alive[0])
    pending_final = torch.zeros_like(rewards[0])
    pending_final_alive = torch.ones_like(alive[0])
    acts_at_final = torch.ones_like(alive) if final_alive is None else final_alive
    following_value = last_values
    before_last = torch.ones_like(alive[0])  # no acting step seen yet, walking back from the end
    cut = torch.zeros_like(alive[0])  # the last acting step was dropped; the next one back ends there
    for t in range(steps - 1, -1, -1):
        ended = terminated[t] | truncated[t]
        # the step's own reward, plus what followed it unless its own flags end the transition here
        step_reward = rewards[t] + torch.where(ended, 0.0, pending_reward)
        step_terminated = torch.where(ended, terminated[t], pending_terminated)
        step_truncated = torch.where(ended, truncated[t], pending_truncated)
        step_final = torch.where(ended, final_values[t], pending_final)
        step_final_alive = torch.where(ended, acts_at_final[t], pending_final_alive)
        step_done = step_terminated | step_truncated
        unfinished = before_last & ~step_done & ~last_alive
        dropped = alive[t] & (unfinished | (step_truncated & ~step_final_alive))
        out_rewards[t] = step_reward
        out_terminated[t] = step_terminated
        out_done[t] = step_done | (alive[t] & cut)
        out_alive[t] = alive[t] & ~dropped
        out_next[t] = torch.where(
            step_truncated, step_final, torch.where(step_terminated, 0.0, following_value)
        )
        # seen from the step before t: an acting step starts a fresh stretch, a waiting step extends it
        pending_reward = torch.where(alive[t], torch.zeros_like(step_reward), step_reward)
        pending_terminated = ~alive[t] & step_terminated
        pending_truncated = ~alive[t] & step_truncated
        pending_final = step_final
        pending_final_alive = step_final_alive
        following_value = torch.where(alive[t], values[t], following_value)
        cut = torch.where(alive[t], dropped, cut)
        before_last = before_last & ~alive[t]
    return Transitions(out_rewards, out_next, out_terminated, out_done, out_alive)


def _every_step(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_values: torch.Tensor,
    final_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    alive: torch.Tensor,
) -> Transitions:
    """`fold_turns` where every agent acts at every step, at the end of the rollout and at its final
    observations: each transition is one step long, so the walk back reduces to whole-tensor
    operations with the same numbers (`rewards + 0.0` as the walk adds its empty pending reward)."""
    following = torch.cat([values[1:], last_values.unsqueeze(0)])
    next_values = torch.where(truncated, final_values, torch.where(terminated, 0.0, following))
    return Transitions(rewards + 0.0, next_values, terminated.clone(), terminated | truncated, alive.clone())


@dataclass(frozen=True)
class CopyEpisodes:
    """Where each env copy's episode ends, `(T, ...)` without the agent axis, read from every group."""

    over: torch.Tensor
    """The copy's episode ended at this step."""
    truncated: torch.Tensor
    """It ended there by truncation: some agent of the copy was truncated at the step."""
    turn_truncated: torch.Tensor
    """Some agent was truncated at this step without acting at it. Turn-based games flag every present
    agent, simultaneous-move envs only those that acted: the step is a turn, and its mover waits at its
    final observation."""


def copy_episodes(
    episode_over: torch.Tensor, truncated: Sequence[torch.Tensor], alive: Sequence[torch.Tensor]
) -> CopyEpisodes:
    """The copy's episode ends from its `episode_over` `(T, ...)` and each group's `(T, ..., A_g)` flags."""
    any_truncated = torch.stack([flags.any(-1) for flags in truncated]).any(0)
    waiting = torch.stack([(flags & ~acted).any(-1) for flags, acted in zip(truncated, alive, strict=True)])
    return CopyEpisodes(episode_over, episode_over & any_truncated, waiting.any(0))


def acts_at_final(alive: torch.Tensor, episodes: CopyEpisodes) -> torch.Tensor:
    """`(T, ..., A)` bool: whether the agent acts at its final observation of each step (`fold_turns`'s
    `final_alive`): every agent, except the mover of a turn-based truncation. The flags do not say who
    moves next, so in a game of three or more players every waiting player counts as acting there."""
    return ~(alive & episodes.turn_truncated.unsqueeze(-1))


@dataclass(frozen=True)
class TeamSteps:
    """A group's agents as one learner, for a team critic: per-step inputs without the agent axis."""

    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    alive: torch.Tensor
    final_alive: torch.Tensor
    """The group acts at its final observation of the step (`fold_turns`): one of the agents that the
    step truncated does, or none was truncated."""


def team_steps(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    alive: torch.Tensor,
    episodes: CopyEpisodes,
) -> TeamSteps:
    """The group of `(T, ..., A)` agents as one learner with `(T, ...)` inputs, for a critic whose value
    V(state) is the whole group's.

    Its reward is the mean of the agents' rewards (an absent agent's counts as 0), exactly the shared
    reward where all are equal; it acts where any agent acts. Its episode ends where the copy's episode
    ends, or at a step after which every agent of the group is out (`agents_out`). An agent that waits
    for its turn, has not joined yet or is away without a flag is still in, so one agent's end while
    the others only do not act at that step does not end it. The end is a truncation, which
    bootstraps, if the group could have gone on: where every agent is out, one that ended at the step
    was truncated; where some agent is still in, the copy's episode ended by truncation.
    """
    shared = (rewards == rewards[..., :1]).all(-1)
    team_reward = torch.where(shared, rewards[..., 0], rewards.mean(-1))
    ended = terminated | truncated
    all_out = agents_out(ended, alive, episodes.over).all(-1)
    team_ended = (all_out & ended.any(-1)) | episodes.over
    team_truncated = team_ended & torch.where(all_out, truncated.any(-1), episodes.truncated)
    final_alive = (truncated & acts_at_final(alive, episodes)).any(-1) | ~truncated.any(-1)
    return TeamSteps(team_reward, team_ended & ~team_truncated, team_truncated, alive.any(-1), final_alive)


def agents_out(ended: torch.Tensor, alive: torch.Tensor, episode_over: torch.Tensor) -> torch.Tensor:
    """`(T, ..., A)` bool: the agent is out after step t, having ended (`terminated | truncated`) at or
    before t in the copy's episode without acting since. `episode_over` `(T, ...)` starts a new episode
    after its step. The steps before the rollout are unknown, so an agent that ended there counts as in:
    a group whose other agents ended before the rollout then ends where the copy's episode ends instead
    of at its last agent's end (if the rollout ends first, that transition is dropped as unfinished)."""
    out = torch.empty_like(ended)
    carried = torch.zeros_like(ended[0])
    for t in range(ended.shape[0]):
        carried = ended[t] | (carried & ~alive[t])
        out[t] = carried
        carried = carried & ~episode_over[t].unsqueeze(-1)
    return out
