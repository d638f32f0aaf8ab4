"""AgentBatch: one group's rollout flattened over (time, env), with its advantages; and minibatching."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from marl_ppo.algo.gae import compute_gae, fold_turns, team_steps
from marl_ppo.config import ConfigError
from marl_ppo.rollout.buffer import GroupStorage, RolloutBuffer


@dataclass(frozen=True)
class AgentBatch:
    """One agent group's samples; the leading dim N = T*E (env steps), the agent axis is kept intact."""

    obs: torch.Tensor
    """(N, A, obs_dim); zero-width in `Trainer.prepare`'s batches, which carry `actor_input` instead"""
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
    """(N, A) bool: the agent acted at this step; only these samples enter losses and statistics"""
    state: torch.Tensor
    """(N, state_dim) global state, shared by all groups' batches; zero-width in `Trainer.prepare`'s
    batches, which carry `critic_input` instead"""
    action_mask: torch.Tensor
    """(N, A, mask_dim) allowed actions when acting (mask_dim 0 when the group has no masks)"""
    actor_input: torch.Tensor | None = None
    """The actor's encoded input (`GroupActor.encode(obs)`), set by `Trainer.prepare`"""
    critic_input: torch.Tensor | None = None
    """The critic's encoded input (`GroupCritic.encode(state, obs)`), set by `Trainer.prepare`"""
    logp_prox: torch.Tensor | None = None
    """(N, A) log-probability of the action under the policy at the start of the update, set by
    `Trainer.prepare` for a lagged batch under `ppo.lagged_ratio: decoupled`: what the ratio is taken against"""
    behaviour_weight: torch.Tensor | None = None
    """(N, A) exp(logp_prox - logp_old) truncated at `ppo.behaviour_weight_max` (1 where not alive), set
    with logp_prox: the weight of each sample's advantage"""
    values_start: torch.Tensor | None = None
    """(N, A) the critic's output at the start of the update (the critic's units), set with logp_prox:
    the value clip's centre"""
    is_first: torch.Tensor | None = None
    """(N, A) bool, recurrent networks only: the agent's episode starts at this step (its state resets)"""
    acted: torch.Tensor | None = None
    """(N, A) bool, recurrent networks only: the agent acted at this step as collected (where its
    state advances); `alive` may leave some of these steps out of the losses"""
    actor_state: torch.Tensor | None = None
    """(N, A, S) recurrent networks only: the actor's state carried into each step"""
    critic_state: torch.Tensor | None = None
    """(N, rows, S) recurrent networks only: the critic's state carried into each step"""

    def __len__(self) -> int:
        return self.obs.shape[0]

    def select(self, index: torch.Tensor) -> AgentBatch:
        """The rows `index` (a 1-D integer tensor) of every field.

        `index_select` copies whole rows, where `tensor[index]` runs an element-wise indexing kernel
        that is several times slower on CPU.
        """
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return AgentBatch(
            **{name: None if v is None else torch.index_select(v, 0, index) for name, v in fields.items()}
        )


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

    def memory(name: str) -> dict[str, torch.Tensor]:
        record = buffer.memory.get(name)
        if record is None:
            return {}
        return {
            "is_first": flat(record.is_first),
            "acted": flat(buffer.groups[name].alive),
            "actor_state": flat(record.actor_state),
            "critic_state": flat(record.critic_state),
        }

    return {
        name: AgentBatch(
            **memory(name),
            obs=flat(storage.obs),
            actions=flat(storage.actions),
            logp_old=flat(storage.logp),
            values_old=flat(storage.values),
            advantages=flat(advantages[name]),
            returns=flat(returns[name]),
            alive=flat(alive.get(name, storage.alive)),
            state=state,
            action_mask=flat(storage.action_mask),
        )
        for name, storage in buffer.groups.items()
    }


def minibatches(
    batches: Mapping[str, AgentBatch], num_minibatches: int, generator: torch.Generator
) -> Iterator[dict[str, AgentBatch]]:
    """Shuffle env steps once and yield `num_minibatches` aligned slices of every group's batch."""
    first = next(iter(batches.values()))
    size = len(first)
    if not 1 <= num_minibatches <= size:
        raise ValueError(f"num_minibatches={num_minibatches} must be between 1 and the batch size {size}")
    # drawn on the generator's device (the CPU), so the order is the same on every device
    order = torch.randperm(size, generator=generator).to(first.advantages.device)
    for chunk in torch.tensor_split(order, num_minibatches):
        yield {name: batch.select(chunk) for name, batch in batches.items()}


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
    None: every agent acts after the last step. `team`: the groups have a team critic (one value per
    env step for all their agents); each group's GAE runs on the group as one learner (`team_steps`:
    the mean of its agents' rewards) and every agent that acted at a step gets that step's advantage.
    """
    if not buffer.full:
        raise ValueError(f"rollout_batches: buffer holds {buffer.pos} of {buffer.steps} steps; fill it first")
    gae = _team_gae if team else _agent_gae
    advantages, returns, alive = {}, {}, {}
    for name, storage in buffer.groups.items():
        acting_next = (
            torch.ones_like(storage.alive[0]) if last_alive is None else last_alive[name].to(storage.alive)
        )
        advantages[name], returns[name], alive[name] = gae(
            storage, last_values[name], acting_next, gamma=gamma, lam=lam
        )
    return build_batches(buffer, advantages, returns, alive)


def _agent_gae(
    storage: GroupStorage, last_values: torch.Tensor, last_alive: torch.Tensor, *, gamma: float, lam: float
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
    *,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fold_turns`, then `compute_gae` on the folded transitions: advantages, returns and the alive
    flags of the samples that enter the losses."""
    steps = fold_turns(
        rewards, values, last_values, final_values, terminated, truncated, alive, last_alive=last_alive
    )
    adv, ret = compute_gae(
        steps.rewards,
        values,
        steps.next_values,
        steps.terminated,
        steps.done,
        gamma=gamma,
        lam=lam,
        alive=steps.alive,
    )
    return adv, ret, steps.alive


def _team_gae(
    storage: GroupStorage, last_values: torch.Tensor, last_alive: torch.Tensor, *, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The group's advantages and returns as one learner (`team_steps`), given to each agent that acted."""
    values = storage.values[..., 0]
    if not torch.equal(storage.values, values.unsqueeze(-1).expand_as(storage.values)):
        raise ValueError("rollout_batches: team=True needs one value per env step, equal for every agent")
    team = team_steps(storage.rewards, storage.terminated, storage.truncated, storage.alive)
    adv, ret, team_alive = _folded_gae(
        team.rewards,
        values,
        last_values[..., 0],
        storage.final_values[..., 0],
        team.terminated,
        team.truncated,
        team.alive,
        last_alive.any(-1),
        gamma=gamma,
        lam=lam,
    )
    shape = storage.values.shape
    alive = storage.alive & team_alive.unsqueeze(-1)
    return adv.unsqueeze(-1).expand(shape).contiguous(), ret.unsqueeze(-1).expand(shape).contiguous(), alive


def refuse_unshared_rewards(buffer: RolloutBuffer, *, env_steps_before: int) -> None:
    """Raise ConfigError at the rollout's first step where a group's agents got different rewards
    (`team_reward: refuse`); `env_steps_before`: the run's env steps before this rollout."""
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
            f"critic: team with team_reward: refuse: the agents of group '{name}' got different rewards "
            f"at step {t + 1} of the rollout after env step {env_steps_before} (copy {e}): {shown}{more}; set "
            "team_reward: mean to train the team critic on their mean, or use critic: state for a value "
            "per agent"
        )
