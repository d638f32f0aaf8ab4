"""AgentBatch: one group's rollout flattened over (time, env), with its advantages and carries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from marl_ppo.algo.gae import CopyEpisodes, acts_at_final, compute_gae, copy_episodes, fold_turns, team_steps
from marl_ppo.config import ConfigError
from marl_ppo.rollout.buffer import GroupStorage, RolloutBuffer


@dataclass(frozen=True)
class AgentBatch:
    """One agent group's samples of a rollout with their advantages: what the trainer consumes.

    Every per-step field is `(N, A, ...)` with `N = T * E`, time-major (step t of env copy e at row
    `t * E + e`); the agent axis is kept intact. Every field is always present: a feed-forward
    network's carries are empty (size 0)."""

    steps: int
    """T, the rollout's steps per env copy (the trainer cuts sequences along them)."""
    obs: torch.Tensor
    """(N, A, obs_dim)"""
    state: torch.Tensor
    """(N, state_dim) global state, shared by all groups' batches"""
    action_mask: torch.Tensor
    """(N, A, mask_dim) allowed actions when acting (mask_dim 0 when the group has no masks)"""
    actions: torch.Tensor
    """(N, A, ...)"""
    logp_old: torch.Tensor
    """(N, A) log-probability of the action under the acting policy"""
    values_old: torch.Tensor
    """(N, A) critic values at acting time, in return units"""
    advantages: torch.Tensor
    """(N, A) GAE advantages (not normalized)"""
    returns: torch.Tensor
    """(N, A) value targets: advantages + values_old"""
    alive: torch.Tensor
    """(N, A) bool: the sample enters losses and statistics"""
    is_first: torch.Tensor
    """(N, A) bool: the agent's episode starts at this step (its carry resets)"""
    acted: torch.Tensor
    """(N, A) bool: the agent acted at this step as collected (where its carry advances); `alive`
    may leave some of these steps out of the losses"""
    actor_carry: torch.Tensor
    """(N, A, S) the actor's carry into each step"""
    critic_carry: torch.Tensor
    """(N, rows, S) the critic's carry into each step (rows: A, or 1 for a team critic)"""


def build_batches(
    buffer: RolloutBuffer,
    advantages: Mapping[str, torch.Tensor],
    returns: Mapping[str, torch.Tensor],
    alive: Mapping[str, torch.Tensor] | None = None,
) -> dict[str, AgentBatch]:
    """Flatten each group's `(T, E, A, ...)` storage to `(T*E, A, ...)`, preserving time-major order.

    `alive` (per group, `(T, E, A)`) replaces the stored alive flags where given."""
    state = buffer.state.reshape(-1, buffer.state.shape[-1])
    alive = alive or {}

    def flat(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.flatten(0, 1)

    batches = {}
    for name, storage in buffer.groups.items():
        memory = buffer.memory[name]
        batches[name] = AgentBatch(
            steps=buffer.steps,
            obs=flat(storage.obs),
            state=state,
            action_mask=flat(storage.action_mask),
            actions=flat(storage.actions),
            logp_old=flat(storage.logp),
            values_old=flat(storage.values),
            advantages=flat(advantages[name]),
            returns=flat(returns[name]),
            alive=flat(alive.get(name, storage.alive)),
            is_first=flat(memory.is_first),
            acted=flat(storage.alive),
            actor_carry=flat(memory.actor_state),
            critic_carry=flat(memory.critic_state),
        )
    return batches


def rollout_batches(
    buffer: RolloutBuffer,
    last_values: Mapping[str, torch.Tensor],
    last_alive: Mapping[str, torch.Tensor] | None = None,
    *,
    gamma: float,
    lam: float,
    team: bool = False,
) -> dict[str, AgentBatch]:
    """GAE per group over a full buffer, then flatten.

    Each acting step's transition runs to the agent's next acting step (`fold_turns`), truncations
    bootstrap from V(final obs) and terminations from nothing. `last_alive` (per group, `(E, A_g)`):
    the agents that act after the last step; an agent that waits there has its unfinished last
    transition left out of the batch (`alive` False) instead of bootstrapping from a waiting position.
    None: every agent acts after the last step. The mover of a turn-based truncation waits at its
    final observation, so its truncated move is left out alike (`acts_at_final`). `team`: the groups
    have a team critic (one value per env step for all their agents); each group's GAE runs on the
    group as one learner (`team_steps`: the mean of its agents' rewards, an episode that ends where
    the copy's ends or every agent is out) and every agent that acted at a step gets that step's
    advantage.
    """
    if not buffer.full:
        raise ValueError(f"rollout_batches: buffer holds {buffer.pos} of {buffer.steps} steps; fill it first")
    gae = _team_gae if team else _agent_gae
    groups = buffer.groups.values()
    episodes = copy_episodes(buffer.episode_over, [g.truncated for g in groups], [g.alive for g in groups])
    advantages, returns, alive = {}, {}, {}
    for name, storage in buffer.groups.items():
        acting_next = (
            torch.ones_like(storage.alive[0]) if last_alive is None else last_alive[name].to(storage.alive)
        )
        advantages[name], returns[name], alive[name] = gae(
            storage, last_values[name], acting_next, episodes, gamma=gamma, lam=lam
        )
    return build_batches(buffer, advantages, returns, alive)


def _agent_gae(
    storage: GroupStorage,
    last_values: torch.Tensor,
    last_alive: torch.Tensor,
    episodes: CopyEpisodes,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each agent's advantages, returns and alive flags from its own rewards and values."""
    return _folded_gae(
        storage.rewards,
        storage.values,
        last_values,
        storage.final_values,
        storage.terminated,
        storage.truncated,
        storage.alive,
        last_alive,
        acts_at_final(storage.alive, episodes),
        gamma=gamma,
        lam=lam,
    )


def _folded_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    last_values: torch.Tensor,
    final_values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    alive: torch.Tensor,
    last_alive: torch.Tensor,
    final_alive: torch.Tensor,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fold_turns`, then `compute_gae` on the folded transitions: advantages, returns and the alive
    flags of the samples that enter the losses."""
    steps = fold_turns(
        rewards,
        values,
        last_values,
        final_values,
        terminated,
        truncated,
        alive,
        last_alive=last_alive,
        final_alive=final_alive,
    )
    adv, ret = compute_gae(
        steps.rewards,
        values,
        steps.next_values,
        steps.terminated,
        steps.done,
        gamma=gamma,
        lam=lam,
        alive=None if bool(steps.alive.all()) else steps.alive,  # None: no step to pass over
    )
    return adv, ret, steps.alive


def _team_gae(
    storage: GroupStorage,
    last_values: torch.Tensor,
    last_alive: torch.Tensor,
    episodes: CopyEpisodes,
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The group's advantages and returns as one learner (`team_steps`), given to each agent that acted."""
    values = storage.values[..., 0]
    if not torch.equal(storage.values, values.unsqueeze(-1).expand_as(storage.values)):
        raise ValueError("rollout_batches: team=True needs one value per env step, equal for every agent")
    team = team_steps(storage.rewards, storage.terminated, storage.truncated, storage.alive, episodes)
    adv, ret, team_alive = _folded_gae(
        team.rewards,
        values,
        last_values[..., 0],
        storage.final_values[..., 0],
        team.terminated,
        team.truncated,
        team.alive,
        last_alive.any(-1),
        team.final_alive,
        gamma=gamma,
        lam=lam,
    )
    shape = storage.values.shape
    alive = storage.alive & team_alive.unsqueeze(-1)
    return adv.unsqueeze(-1).expand(shape).contiguous(), ret.unsqueeze(-1).expand(shape).contiguous(), alive


def refuse_unshared_rewards(buffer: RolloutBuffer, *, env_steps_before: int) -> None:
    """Raise ConfigError at the rollout's first step where a group's agents got different rewards
    (`ppo.team_reward: refuse`); `env_steps_before`: the run's env steps before this rollout."""
    for name, storage in buffer.groups.items():
        rewards = storage.rewards
        differs = (rewards != rewards[..., :1]).any(-1)
        if not bool(differs.any()):
            continue
        t, e = (int(i) for i in torch.nonzero(differs)[0])  # time-major: the earliest step, then copy
        agents = buffer.spec.group(name).agents
        shown = ", ".join(
            f"{a} {float(r):g}" for a, r in zip(agents[:4], rewards[t, e, :4].tolist(), strict=False)
        )
        more = ", ..." if len(agents) > 4 else ""
        raise ConfigError(
            f"ppo.critic: team with ppo.team_reward: refuse: the agents of group '{name}' got different rewards "
            f"at step {t + 1} of the rollout after env step {env_steps_before} (copy {e}): {shown}{more}; set "
            "ppo.team_reward: mean to train the team critic on their mean, or use ppo.critic: state for a value "
            "per agent"
        )
