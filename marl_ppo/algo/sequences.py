"""Sequence chunks for recurrent networks: a rollout's batch cut into runs of consecutive steps.

A chunked `AgentBatch` holds every per-step field as `(L, C, A, ...)` (time first, then chunk) and
the recurrent states as `(C, A, S)`, the states stored at each chunk's first step. Chunk
`c = k * E + e` covers steps `k * L` to `k * L + L - 1` of env copy `e`, every agent of the group
together (the agent-stacked networks evaluate them at once). A rollout of T steps that `L` does not
divide ends in a shorter chunk, padded with steps that are not alive and do not act (no loss, no
state change). Every group is cut at the same boundaries, so minibatches stay aligned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

import torch

from marl_ppo.algo.batch import AgentBatch

CHUNK_FIELDS = ("actor_state", "critic_state")
"""Fields with one value per chunk (its first step's); every other field has one per step."""


def chunk_count(steps: int, length: int | None) -> int:
    """Chunks per env copy for a rollout of `steps` cut into `length` (None: the whole rollout)."""
    length = min(length or steps, steps)
    return -(-steps // length)


def chunk_batch(batch: AgentBatch, *, steps: int, length: int | None) -> AgentBatch:
    """A flat time-major batch `(T * E, A, ...)` of a rollout of `steps` cut into chunks of `length`
    steps (None, or more than `steps`: one chunk per env copy)."""
    length = min(length or steps, steps)
    rows = batch.alive.shape[0]
    if rows % steps:
        raise ValueError(f"chunk_batch: {rows} rows are not a whole number of {steps}-step rollouts")
    envs, chunks = rows // steps, chunk_count(steps, length)
    pad = chunks * length - steps

    def per_step(tensor: torch.Tensor) -> torch.Tensor:
        tail = tensor.shape[1:]
        timed = tensor.reshape(steps, envs, *tail)
        if pad:  # zeros: not alive, not acting, no episode start
            timed = torch.cat([timed, timed.new_zeros((pad, envs, *tail))])
        return (
            timed.reshape(chunks, length, envs, *tail).transpose(0, 1).reshape(length, chunks * envs, *tail)
        )

    def per_chunk(tensor: torch.Tensor) -> torch.Tensor:
        tail = tensor.shape[1:]
        return tensor.reshape(steps, envs, *tail)[::length].reshape(chunks * envs, *tail)

    fields = {}
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if value is not None:
            value = per_chunk(value) if field.name in CHUNK_FIELDS else per_step(value)
        fields[field.name] = value
    return AgentBatch(**fields)


def unchunk(values: torch.Tensor, *, steps: int) -> torch.Tensor:
    """Per-step values of a chunked batch `(L, C, ...)` back to the rollout's `(T, E, ...)` (padding dropped)."""
    length, count = values.shape[:2]
    tail = values.shape[2:]
    chunks = chunk_count(steps, length)
    envs = count // chunks
    timed = values.reshape(length, chunks, envs, *tail).transpose(0, 1).reshape(chunks * length, envs, *tail)
    return timed[:steps]


def select_chunks(batch: AgentBatch, index: torch.Tensor) -> AgentBatch:
    """The chunks `index` (a 1-D integer tensor) of a chunked batch."""
    fields = {}
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        if value is not None:
            value = torch.index_select(value, 0 if field.name in CHUNK_FIELDS else 1, index)
        fields[field.name] = value
    return AgentBatch(**fields)


def num_chunks(batch: AgentBatch) -> int:
    """Chunks in a chunked batch."""
    return batch.alive.shape[1]


def chunk_minibatches(
    batches: Mapping[str, AgentBatch], num_minibatches: int, generator: torch.Generator
) -> Iterator[dict[str, AgentBatch]]:
    """Shuffle the chunks once and yield `num_minibatches` aligned sets of them from every group's batch."""
    first = next(iter(batches.values()))
    size = num_chunks(first)
    if not 1 <= num_minibatches <= size:
        raise ValueError(
            f"num_minibatches={num_minibatches} must be between 1 and the {size} sequence chunks"
        )
    order = torch.randperm(size, generator=generator).to(first.alive.device)
    for part in torch.tensor_split(order, num_minibatches):
        yield {name: select_chunks(batch, part) for name, batch in batches.items()}


def diagnostic_chunks(batches: Mapping[str, AgentBatch], max_rows: int) -> Mapping[str, AgentBatch]:
    """The chunked batches, or an even stride of as many chunks as hold `max_rows` steps."""
    first = next(iter(batches.values()))
    length, size = first.alive.shape[:2]
    keep = max(1, max_rows // length)
    if size <= keep:
        return batches
    index = torch.linspace(0, size - 1, keep, device=first.alive.device).long()
    return {name: select_chunks(batch, index) for name, batch in batches.items()}
