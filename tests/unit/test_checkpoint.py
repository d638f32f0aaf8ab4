"""Checkpoint files: atomic replacement, weights_only loading, one-line errors for bad files."""

import errno

import pytest
import torch

import marl_ppo.checkpoint as checkpoint_module
from marl_ppo.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from marl_ppo.faults import CheckpointWriteError, NonFiniteError


def test_round_trip_with_weights_only(tmp_path):
    path = tmp_path / "ckpt" / "latest.pt"
    save_checkpoint(path, {"format": FORMAT, "model": {"w": torch.arange(3.0)}, "updates": 4})
    payload = load_checkpoint(path)
    assert payload["updates"] == 4 and torch.equal(payload["model"]["w"], torch.arange(3.0))
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_failed_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"format": FORMAT, "updates": 1})
    before = path.read_bytes()

    def full_disk(fd):  # where a full disk shows itself: the data is written, fsync fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.os, "fsync", full_disk)
    with pytest.raises(CheckpointWriteError) as info:
        save_checkpoint(path, {"format": FORMAT, "updates": 2})
    monkeypatch.undo()
    assert str(info.value) == (
        f"could not write checkpoint '{path}' (No space left on device); the previous checkpoint is kept, "
        "free space or fix permissions and resume from it"
    )
    assert path.read_bytes() == before and load_checkpoint(path)["updates"] == 1
    assert list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_never_written(tmp_path, bad):
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"format": FORMAT, "model": {"w": torch.ones(3)}})
    before = path.read_bytes()
    weights = torch.ones(3)
    weights[1] = bad
    with pytest.raises(
        NonFiniteError, match=r"'model\.w' holds NaN or inf values; the previous checkpoint is kept"
    ):
        save_checkpoint(path, {"format": FORMAT, "model": {"w": weights}, "steps": torch.tensor([1, 2])})
    assert path.read_bytes() == before and list(tmp_path.iterdir()) == [path]


@pytest.mark.parametrize("damage", ["truncate", "foreign", "missing"])
def test_bad_files_give_one_line_errors(tmp_path, damage):
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"format": FORMAT, "model": {"w": torch.zeros(100)}})
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-1])
    elif damage == "foreign":
        torch.save({"state_dict": {}}, path)
    else:
        path.unlink()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_checkpoint_of_another_format_version_is_refused_naming_the_file_the_format_and_the_fix(tmp_path):
    assert FORMAT == "marl_ppo.checkpoint.v2"
    path = tmp_path / "latest.pt"
    save_checkpoint(path, {"format": "marl_ppo.checkpoint.v1", "model": {"w": torch.zeros(3)}, "updates": 4})
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value) == (
        f"checkpoint '{path}' has format 'marl_ppo.checkpoint.v1' but this marl_ppo reads only "
        "'marl_ppo.checkpoint.v2'; train the run again, or use the marl_ppo version that wrote it"
    )
