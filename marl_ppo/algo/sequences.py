"""Sequences: a prepared batch cut into chunks of consecutive steps, the one shape the trainer learns on.

A `Sequences` record holds every per-step field as `(L, C, A, ...)` (time first, then chunk) and the
carries at each chunk's first step as `(C, A, S)`. Chunk `c = k * E + e` covers steps `k * L` to
`k * L + L - 1` of env copy `e`, every agent of the group together (the agent-stacked networks
evaluate them at once). A rollout of T steps that `L` does not divide ends in a shorter chunk,
padded with steps that are not alive and do not act (no loss, no carry change). Every group is cut
at the same boundaries, so minibatches stay aligned.

Feed-forward networks learn on chunks of one step (`L = 1`, `C = T * E`): a chunk is then a row of
the flat batch, and shuffling chunks is shuffling rows. Recurrent networks learn on chunks of
`ppo.chunk_length` steps, each unrolled from its stored carry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from marl_ppo.algo.batch import AgentBatch
from marl_ppo.models.distributions import ActionDistribution
from marl_ppo.models.team import GroupActor, GroupCritic


@dataclass(frozen=True)
class Inputs:
    """What the networks read over a sequence: each field `(L, C, ...)`."""

    obs: torch.Tensor
    """(L, C, A, obs_dim)"""
    state: torch.Tensor
    """(L, C, state_dim)"""
    action_mask: torch.Tensor
    """(L, C, A, mask_dim)"""
    is_first: torch.Tensor
    """(L, C, A) bool: the agent's episode starts at the step (its carry resets first)"""
    acted: torch.Tensor
    """(L, C, A) bool: the agent acted at the step (its carry advances only there)"""


@dataclass(frozen=True)
class Sequences:
    """One group's prepared batch in chunks: what the losses read, in the critic's units."""

    inputs: Inputs
    actor_carry: torch.Tensor
    """(C, A, S) the actor's carry into each chunk's first step"""
    critic_carry: torch.Tensor
    """(C, rows, S) the critic's carry into each chunk's first step"""
    actions: torch.Tensor
    """(L, C, A, ...)"""
    alive: torch.Tensor
    """(L, C, A) bool: the sample enters losses and statistics"""
    advantages: torch.Tensor
    """(L, C, A) advantages, normalized as `ppo.normalize_advantages` says"""
    returns: torch.Tensor
    """(L, C, A) value targets in the units the critic learns towards"""
    logp_old: torch.Tensor
    """(L, C, A) log-probabilities of the actions under the acting policy"""
    logp_ref: torch.Tensor
    """(L, C, A) what the ratio and the KL stop are taken against: the acting policy's log-probabilities,
    or under decoupled policy lag those of the policy at the start of the update"""
    value_ref: torch.Tensor
    """(L, C, A) the value clip's centre in the critic's units: the acting-time values, or under
    decoupled lag the critic's outputs at the start of the update"""
    weight: torch.Tensor
    """(L, C, A) each sample's advantage weight: 1, or under decoupled lag start policy / acting policy"""

    @property
    def num_chunks(self) -> int:
        """C, the chunks held."""
        return self.alive.shape[1]

    def select(self, index: torch.Tensor) -> Sequences:
        """The chunks `index` (a 1-D integer tensor).

        `index_select` copies whole rows, where `tensor[index]` runs an element-wise indexing kernel
        that is several times slower on CPU.
        """

        taken: dict[int, torch.Tensor] = {}

        def steps(tensor: torch.Tensor) -> torch.Tensor:
            # a field that is another field (on-policy, `logp_ref` is `logp_old`) is taken once
            if id(tensor) not in taken:
                taken[id(tensor)] = torch.index_select(tensor, 1, index)
            return taken[id(tensor)]

        return Sequences(
            inputs=Inputs(
                **{f.name: steps(getattr(self.inputs, f.name)) for f in dataclasses.fields(Inputs)}
            ),
            actor_carry=torch.index_select(self.actor_carry, 0, index),
            critic_carry=torch.index_select(self.critic_carry, 0, index),
            actions=steps(self.actions),
            alive=steps(self.alive),
            advantages=steps(self.advantages),
            returns=steps(self.returns),
            logp_old=steps(self.logp_old),
            logp_ref=steps(self.logp_ref),
            value_ref=steps(self.value_ref),
            weight=steps(self.weight),
        )


def policy(actor: GroupActor, batch: Sequences) -> ActionDistribution:
    """The actor's distributions over a batch's sequences, each chunk from its stored carry."""
    inputs = batch.inputs
    dist: ActionDistribution
    dist, _ = actor(inputs.obs, inputs.action_mask, batch.actor_carry, inputs.is_first, inputs.acted)
    return dist


def critic_values(critic: GroupCritic, batch: Sequences) -> torch.Tensor:
    """The critic's outputs over a batch's sequences (as in `policy`)."""
    inputs = batch.inputs
    values: torch.Tensor
    values, _ = critic(inputs.state, inputs.obs, batch.critic_carry, inputs.is_first, inputs.acted)
    return values


def chunk_count(steps: int, length: int | None) -> int:
    """Chunks per env copy for a rollout of `steps` cut into `length` (None: the whole rollout)."""
    length = min(length or steps, steps)
    return -(-steps // length)


class Cut:
    """Cuts flat time-major `(T * E, ...)` tensors of a rollout of `steps` into chunks of `length`
    steps (None, or more than `steps`: one chunk per env copy)."""

    def __init__(self, rows: int, *, steps: int, length: int | None) -> None:
        if rows % steps:
            raise ValueError(f"sequences: {rows} rows are not a whole number of {steps}-step rollouts")
        self.steps, self.length = steps, min(length or steps, steps)
        self.envs, self.chunks = rows // steps, chunk_count(steps, length)
        self.pad = self.chunks * self.length - steps

    def per_step(self, tensor: torch.Tensor) -> torch.Tensor:
        """`(T * E, ...) -> (L, C, ...)`, padded with zeros (not alive, not acting, no episode start)."""
        tail = tensor.shape[1:]
        timed = tensor.reshape(self.steps, self.envs, *tail)
        if self.pad:
            timed = torch.cat([timed, timed.new_zeros((self.pad, self.envs, *tail))])
        chunked = timed.reshape(self.chunks, self.length, self.envs, *tail).transpose(0, 1)
        return chunked.reshape(self.length, self.chunks * self.envs, *tail)

    def first(self, tensor: torch.Tensor) -> torch.Tensor:
        """`(T * E, ...) -> (C, ...)`: the value at each chunk's first step."""
        tail = tensor.shape[1:]
        return tensor.reshape(self.steps, self.envs, *tail)[:: self.length].reshape(
            self.chunks * self.envs, *tail
        )


def cut_batch(
    batch: AgentBatch,
    *,
    length: int | None,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    value_ref: torch.Tensor,
) -> Sequences:
    """A group's flat batch cut into chunks of `length` steps, with the given `(N, A)` advantages,
    returns and value clip centre (in the units the losses read). The ratio's reference is the acting
    policy and every weight is 1, as on-policy (decoupled lag replaces them, see `Trainer.prepare`)."""
    cut = Cut(batch.alive.shape[0], steps=batch.steps, length=length)
    logp_old = cut.per_step(batch.logp_old)
    return Sequences(
        inputs=Inputs(
            obs=cut.per_step(batch.obs),
            state=cut.per_step(batch.state),
            action_mask=cut.per_step(batch.action_mask),
            is_first=cut.per_step(batch.is_first),
            acted=cut.per_step(batch.acted),
        ),
        actor_carry=cut.first(batch.actor_carry),
        critic_carry=cut.first(batch.critic_carry),
        actions=cut.per_step(batch.actions),
        alive=cut.per_step(batch.alive),
        advantages=cut.per_step(advantages),
        returns=cut.per_step(returns),
        logp_old=logp_old,
        logp_ref=logp_old,
        value_ref=cut.per_step(value_ref),
        weight=torch.ones_like(logp_old),
    )


def unchunk(values: torch.Tensor, *, steps: int) -> torch.Tensor:
    """Per-step values of chunks `(L, C, ...)` back to the rollout's `(T, E, ...)` (padding dropped)."""
    length, count = values.shape[:2]
    tail = values.shape[2:]
    chunks = chunk_count(steps, length)
    envs = count // chunks
    timed = values.reshape(length, chunks, envs, *tail).transpose(0, 1).reshape(chunks * length, envs, *tail)
    return timed[:steps]


def chunk_minibatches(
    batches: Mapping[str, Sequences], num_minibatches: int, generator: torch.Generator
) -> Iterator[dict[str, Sequences]]:
    """Shuffle the chunks once and yield `num_minibatches` aligned sets of them from every group."""
    first = next(iter(batches.values()))
    size = first.num_chunks
    if not 1 <= num_minibatches <= size:
        raise ValueError(
            f"num_minibatches={num_minibatches} must be between 1 and the {size} sequence chunks"
        )
    # drawn on the generator's device (the CPU), so the order is the same on every device
    order = torch.randperm(size, generator=generator).to(first.alive.device)
    for part in torch.tensor_split(order, num_minibatches):
        yield {name: batch.select(part) for name, batch in batches.items()}


def diagnostic_chunks(batches: Mapping[str, Sequences], max_rows: int) -> Mapping[str, Sequences]:
    """The sequences, or an even stride of as many chunks as hold `max_rows` agent-steps (a chunk holds
    its steps times every group's agents: a large team's chunks count for what they cost to evaluate)."""
    first = next(iter(batches.values()))
    length, size = first.alive.shape[:2]
    agents = sum(batch.alive.shape[-1] for batch in batches.values())
    keep = max(1, max_rows // (length * agents))
    if size <= keep:
        return batches
    index = torch.linspace(0, size - 1, keep, device=first.alive.device).long()
    return {name: batch.select(index) for name, batch in batches.items()}
