"""Rollout buffer: preallocated, raises when full, time-major order kept into the batch."""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from marl_ppo.algo.batch import build_batches, minibatches
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.rollout.buffer import BufferFull, RolloutBuffer


def _spec():
    group = GroupSpec("agent", ("a0", "a1"), spaces.Box(-1, 1, (3,)), spaces.Discrete(4), 3)
    return TeamSpec("test", ("a0", "a1"), (group,), state_dim=6, state_from_env=False)


def _add(buffer, t):
    envs = buffer.num_envs
    buffer.add(
        state=np.full((envs, 6), t, np.float32),
        obs=[np.full((envs, 2, 3), t, np.float32)],
        alive=[np.ones((envs, 2), bool)],
        action_mask=[np.ones((envs, 2, 0), bool)],
        actions=[np.full((envs, 2), t % 4)],
        logp=[np.zeros((envs, 2), np.float32)],
        values=[np.full((envs, 2), t, np.float32)],
        rewards=[np.arange(envs * 2, dtype=np.float32).reshape(envs, 2) + 100 * t],
        terminated=[np.zeros((envs, 2), bool)],
        truncated=[np.zeros((envs, 2), bool)],
        final_values=[np.zeros((envs, 2), np.float32)],
    )


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
    assert buffer.groups[0].obs[0, 0, 0, 0].item() == 7


def test_buffer_shapes_are_time_major_and_preallocated():
    buffer = RolloutBuffer(_spec(), steps=5, num_envs=4)
    storage = buffer.groups[0]
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
    storage = buffer.groups[0]
    (batch,) = build_batches(buffer, [storage.rewards * 0 + 1], [storage.rewards])
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
    storage = buffer.groups[0]
    batches = build_batches(buffer, [storage.values] * 1, [storage.rewards]) * 2  # two aligned "groups"
    seen = []
    for pair in minibatches(batches, 5, torch.Generator().manual_seed(0)):
        torch.testing.assert_close(pair[0].returns, pair[1].returns)
        seen.append(pair[0].returns[:, 0])
    rows = torch.sort(torch.cat(seen)).values
    torch.testing.assert_close(rows, torch.sort(batches[0].returns[:, 0]).values)


def test_minibatches_gather_with_an_index_on_the_batches_device(monkeypatch):
    """The shuffle is drawn on the CPU generator, and the index moves to the batch's device: CUDA's
    `index_select` refuses a CPU index. The meta device stands in for a GPU here."""
    buffer = RolloutBuffer(_spec(), steps=2, num_envs=3)
    for t in range(2):
        _add(buffer, t)
    storage = buffer.groups[0]
    (batch,) = build_batches(buffer, [storage.values], [storage.rewards])
    on_meta = type(batch)(**{n: None if v is None else v.to("meta") for n, v in vars(batch).items()})
    gather = torch.index_select
    seen = []

    def recording(tensor, dim, index):
        seen.append((tensor.device, index.device))
        return gather(tensor, dim, index)

    monkeypatch.setattr(torch, "index_select", recording)
    pairs = list(minibatches([on_meta], 2, torch.Generator().manual_seed(0)))
    assert len(pairs) == 2 and seen
    assert all(index == tensor == torch.device("meta") for tensor, index in seen)
