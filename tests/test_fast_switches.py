"""Every hand-written piece of `marl_ppo/fast/` against the library piece its `fast.*` switch selects."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import ROOT
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn

from marl_ppo.algo.optim import clip_grad_norms, make_optimizer
from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ConfigError, load_config
from marl_ppo.config.records import REMOVED_FAST_KEYS
from marl_ppo.fast.adam import FlatAdam
from marl_ppo.fast.events import EventWriter, LibraryEventWriter
from marl_ppo.run.loop import train

SPREAD = ROOT / "experiments/mpe/simple_spread.yaml"
LIBRARY_EXCEPT_SAMPLING = [
    "fast.optimizer=adam",
    "fast.event_writer=false",
    "fast.screen_copy=false",
    "fast.allocator=false",
]
"""Every switch whose library piece computes the same numbers (torch's single-tensor Adam, TensorBoard's
writer, glibc's defaults)."""


def _scalars(run_dir):
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {  # perf/ holds wall-clock timings, which differ between any two runs
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if not tag.startswith("perf/")
    }


def test_a_run_on_the_library_pieces_learns_the_very_same_weights_and_logs_the_same_scalars(
    tiny_overrides, tmp_path
):
    runs = {}
    for name, switches in (("ours", []), ("library", LIBRARY_EXCEPT_SAMPLING)):
        config = load_config(SPREAD, [*tiny_overrides, "vector=sync", "total_steps=150", *switches])
        train(config, tmp_path / name)
        runs[name] = load_checkpoint(tmp_path / name / "checkpoints/final.pt")
    for key, ours in runs["ours"]["model"].items():
        assert torch.equal(ours, runs["library"]["model"][key]), key
    actor = runs["ours"]["trainer"]["actor_optimizer"]["state"]
    for index, state in actor.items():
        library = runs["library"]["trainer"]["actor_optimizer"]["state"][index]
        assert torch.equal(state["exp_avg_sq"], library["exp_avg_sq"])
    ours, library = _scalars(tmp_path / "ours"), _scalars(tmp_path / "library")
    assert ours.keys() == library.keys() and len(ours) > 15
    for tag in ours:
        assert ours[tag] == library[tag], tag


def _network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


@pytest.mark.parametrize("clip", [None, 0.05])
@pytest.mark.parametrize("kind", ["adam", "adam_foreach", "adam_fused"])
def test_torch_adam_behind_the_switch_steps_as_flat_adam(kind, clip):
    """Unclipped, single-tensor Adam is FlatAdam's arithmetic bit for bit; foreach and fused, and clipping
    (torch takes the norm of the per-tensor norms, FlatAdam one norm of the flat buffer), agree to rounding."""
    nets = {"flat_adam": _network(), kind: _network()}
    optimizers = {name: make_optimizer(net.parameters(), lr=3e-3, kind=name) for name, net in nets.items()}
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(32, 6, generator=generator) for _ in range(25)]
    norms = {name: [] for name in nets}
    for x in inputs:
        for name, net in nets.items():
            optimizer = optimizers[name]
            optimizer.zero_grad()
            (net(x) ** 2).mean().backward()
            norms[name].append(float(clip_grad_norms(optimizer, clip)))
            optimizer.step()
    assert type(optimizers[kind]) is torch.optim.Adam and isinstance(optimizers["flat_adam"], FlatAdam)
    for ours, library in zip(nets["flat_adam"].parameters(), nets[kind].parameters(), strict=True):
        if kind == "adam" and clip is None:
            assert torch.equal(ours, library)
        else:
            torch.testing.assert_close(ours, library, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norms[kind], norms["flat_adam"], rtol=1e-5)
    assert clip is None or max(norms[kind]) > clip  # the clip was active


def test_optimizer_states_move_between_ours_and_torchs():
    ours, library = _network(), _network()
    flat = make_optimizer(ours.parameters(), lr=1e-3, kind="flat_adam")
    flat.zero_grad()
    (ours(torch.ones(4, 6)) ** 2).sum().backward()
    flat.step()
    adam = make_optimizer(library.parameters(), lr=1e-3, kind="adam_foreach")
    adam.load_state_dict(flat.state_dict())
    assert adam.param_groups[0]["foreach"] is True  # the switch's implementation, not the saver's
    for key, value in flat.state_dict()["state"].items():
        assert torch.equal(adam.state_dict()["state"][key]["exp_avg"], value["exp_avg"])
    flat.load_state_dict(adam.state_dict())
    assert flat.param_groups[0]["foreach"] is False
    for key, value in adam.state_dict()["state"].items():
        assert torch.equal(flat.state_dict()["state"][key]["exp_avg_sq"], value["exp_avg_sq"])


def test_tensorboards_writer_behind_the_switch_logs_what_ours_logs(tmp_path):
    for name, writer_class in (("ours", EventWriter), ("library", LibraryEventWriter)):
        writer = writer_class(tmp_path / name)
        writer.scalars(10, {"train/kl": 0.5, "train/loss_pi": -1.25})
        writer.rows([12, 15], {"rollout/team_return": np.array([-3.0, 4.5]), "rollout/length": [25, 25]})
        writer.scalars(20, {"train/kl": 0.25})
        writer.close()
    logged = {}
    for name in ("ours", "library"):
        events = EventAccumulator(str(tmp_path / name), size_guidance={"scalars": 0})
        events.Reload()
        logged[name] = {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"]}
    assert logged["ours"] == logged["library"]
    assert logged["ours"]["rollout/team_return"] == [(12, -3.0), (15, 4.5)]


@pytest.mark.parametrize("key", sorted(REMOVED_FAST_KEYS))
def test_a_removed_switch_is_refused_in_one_line_naming_the_library_piece_and_the_fix(key):
    with pytest.raises(ConfigError) as error:
        load_config(None, [f"fast.{key}=false"])
    assert str(error.value) == (
        f"config key 'fast.{key}' was removed: {REMOVED_FAST_KEYS[key]} is always used now; "
        "delete the key from the experiment file or the overrides"
    )
