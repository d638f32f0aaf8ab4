"""Rollout buffer: preallocated, raises when full, time-major order kept into the batch."""

import dataclasses

import numpy as np
import pytest
import torch
from gymnasium import spaces

from marl_ppo.algo.batch import build_batches
from marl_ppo.algo.sequences import chunk_minibatches, cut_batch
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.rollout.buffer import BufferFull, GroupMemory, GroupStep, GroupStorage, RolloutBuffer


def _no_memory(buffer):
    """A feed-forward step's memory records: no episode start, empty carries."""
    return {
        name: GroupMemory(
            **{f.name: torch.zeros_like(getattr(stored, f.name)[0]) for f in dataclasses.fields(stored)}
        )
        for name, stored in buffer.memory.items()
    }


def _rows(batch):
    """A flat batch as chunks of one step (what feed-forward networks learn on)."""
    return cut_batch(
        batch, length=1, advantages=batch.advantages, returns=batch.returns, value_ref=batch.values_old
    )


def _spec():
    group = GroupSpec("agent", ("a0", "a1"), spaces.Box(-1, 1, (3,)), spaces.Discrete(4), 3)
    return TeamSpec("test", ("a0", "a1"), (group,), state_dim=6, state_from_env=False)


def _add(buffer, t):
    envs = buffer.num_envs
    step = GroupStep(
        obs=np.full((envs, 2, 3), t, np.float32),
        alive=np.ones((envs, 2), bool),
        action_mask=np.ones((envs, 2, 0), bool),
        actions=np.full((envs, 2), t % 4),
        logp=np.zeros((envs, 2), np.float32),
        values=np.full((envs, 2), t, np.float32),
        rewards=np.arange(envs * 2, dtype=np.float32).reshape(envs, 2) + 100 * t,
        terminated=np.zeros((envs, 2), bool),
        truncated=np.zeros((envs, 2), bool),
        final_values=np.zeros((envs, 2), np.float32),
    )
    over = np.zeros(envs, bool)
    buffer.add(np.full((envs, 6), t, np.float32), {"agent": step}, _no_memory(buffer), episode_over=over)


def test_buffer_raises_when_full_and_reset_allows_reuse():
    buffer = RolloutBuffer(_spec(), steps=3, num_envs=2)
    for t in range(3):
        _add(buffer, t)
    assert buffer.full
    with pytest.raises(BufferFull, match="full"):
        _add(buffer, 3)
    buffer.reset()
    _add(buffer, 7)
    assert buffer.pos == 1
    assert buffer.groups["agent"].obs[0, 0, 0, 0].item() == 7


def test_buffer_shapes_are_time_major_and_preallocated():
    buffer = RolloutBuffer(_spec(), steps=5, num_envs=4)
    storage = buffer.groups["agent"]
    assert storage.obs.shape == (5, 4, 2, 3)
    assert storage.actions.shape == (5, 4, 2) and storage.actions.dtype == torch.int64
    assert buffer.state.shape == (5, 4, 6)
    pointer = storage.obs.data_ptr()
    _add(buffer, 0)
    assert storage.obs.data_ptr() == pointer  # written in place, never reallocated


def test_batch_flattening_keeps_time_major_order():
    buffer = RolloutBuffer(_spec(), steps=3, num_envs=2)
    for t in range(3):
        _add(buffer, t)
    storage = buffer.groups["agent"]
    batch = build_batches(buffer, {"agent": storage.rewards * 0 + 1}, {"agent": storage.rewards})["agent"]
    assert batch.obs.shape == (6, 2, 3) and batch.state.shape == (6, 6)
    # row n = t * num_envs + e
    expected = torch.tensor(
        [[100 * t + 2 * e, 100 * t + 2 * e + 1] for t in range(3) for e in range(2)]
    ).float()
    torch.testing.assert_close(batch.returns, expected)
    torch.testing.assert_close(batch.state[:, 0], torch.tensor([0, 0, 1, 1, 2, 2]).float())


def test_minibatches_cover_every_row_once_and_stay_aligned_across_groups():
    buffer = RolloutBuffer(_spec(), steps=4, num_envs=3)
    for t in range(4):
        _add(buffer, t)
    storage = buffer.groups["agent"]
    batch = _rows(build_batches(buffer, {"agent": storage.values}, {"agent": storage.rewards})["agent"])
    assert batch.returns.shape == (1, 12, 2)  # one-step chunks: every row its own chunk
    batches = {"first": batch, "second": batch}  # two aligned "groups"
    seen = []
    for pair in chunk_minibatches(batches, 5, torch.Generator().manual_seed(0)):
        assert list(pair) == ["first", "second"]
        torch.testing.assert_close(pair["first"].returns, pair["second"].returns)
        torch.testing.assert_close(pair["first"].inputs.obs, pair["second"].inputs.obs)
        seen.append(pair["first"].returns[0, :, 0])
    rows = torch.sort(torch.cat(seen)).values
    torch.testing.assert_close(rows, torch.sort(batches["first"].returns[0, :, 0]).values)


def test_minibatches_gather_with_an_index_on_the_batches_device(monkeypatch):
    """The shuffle is drawn on the CPU generator, and the index moves to the batch's device: CUDA's
    `index_select` refuses a CPU index. The meta device stands in for a GPU here."""
    buffer = RolloutBuffer(_spec(), steps=2, num_envs=3)
    for t in range(2):
        _add(buffer, t)
    storage = buffer.groups["agent"]
    batch = _rows(build_batches(buffer, {"agent": storage.values}, {"agent": storage.rewards})["agent"])
    on_meta = dataclasses.replace(
        batch,
        inputs=type(batch.inputs)(**{n: v.to("meta") for n, v in vars(batch.inputs).items()}),
        **{n: v.to("meta") for n, v in vars(batch).items() if n != "inputs"},
    )
    gather = torch.index_select
    seen = []

    def recording(tensor, dim, index):
        seen.append((tensor.device, index.device))
        return gather(tensor, dim, index)

    monkeypatch.setattr(torch, "index_select", recording)
    pairs = list(chunk_minibatches({"agent": on_meta}, 2, torch.Generator().manual_seed(0)))
    assert len(pairs) == 2 and seen
    assert all(index == tensor == torch.device("meta") for tensor, index in seen)


def test_add_stores_every_group_step_field_in_the_storage_field_of_its_name():
    """A new per-agent field flows by name: `add` walks GroupStep's fields, so a field declared in
    GroupStep and GroupStorage (and allocated) reaches the buffer with no list to extend. Every field
    gets its own values, so a field written into another one's storage, or into another group's, fails."""
    step_fields = {f.name for f in dataclasses.fields(GroupStep)}
    assert step_fields == {f.name for f in dataclasses.fields(GroupStorage)}
    spread = GroupSpec("agent", ("a0", "a1"), spaces.Box(-1, 1, (3,)), spaces.Discrete(4), 3, "info")
    scout = GroupSpec("scout", ("s0",), spaces.Box(-1, 1, (5,)), spaces.MultiDiscrete([2, 3]), 5, "info")
    spec = TeamSpec("test", ("a0", "a1", "s0"), (spread, scout), state_dim=11, state_from_env=False)
    buffer = RolloutBuffer(spec, steps=3, num_envs=4)
    numbers, flags = 1, 1
    sent = {}
    for name in reversed(list(buffer.groups)):  # the records are found by name, not by position
        storage = buffer.groups[name]
        fields = {}
        for field in dataclasses.fields(GroupStep):
            target = getattr(storage, field.name)[1]
            assert target.numel() >= 4, f"{name}.{field.name} too small to tell the fields apart"
            index = torch.arange(target.numel()).reshape(target.shape)
            if target.dtype == torch.bool:  # the bits of a number no other bool field uses
                fields[field.name] = (flags >> index) % 2 == 1
                flags += 1
            else:  # numbers no other field or group uses
                fields[field.name] = (index + numbers).to(target.dtype)
                numbers += target.numel()
        sent[name] = GroupStep(**fields)

    zeros = {
        name: GroupStep(**{n: torch.zeros_like(v) for n, v in vars(step).items()})
        for name, step in sent.items()
    }
    over = torch.zeros(4, dtype=torch.bool)
    buffer.add(torch.zeros(4, 11), zeros, _no_memory(buffer), episode_over=over)
    buffer.add(torch.full((4, 11), 7.0), sent, _no_memory(buffer), episode_over=~over)
    assert buffer.pos == 2
    for name, step in sent.items():
        storage = buffer.groups[name]
        for field in dataclasses.fields(GroupStep):
            stored = getattr(storage, field.name)
            assert torch.equal(stored[1], getattr(step, field.name)), f"{name}.{field.name}"
            assert not stored[0].any() and not stored[2].any(), f"{name}.{field.name} beyond its step"
    assert torch.equal(buffer.state[1], torch.full((4, 11), 7.0))
    assert (
        buffer.episode_over[1].all() and not buffer.episode_over[0].any() and not buffer.episode_over[2].any()
    )
