"""The memory check before a run: the estimate's parts, the refusal, and the figure in summary.json."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from marl_ppo.config import ConfigError, load_config
from marl_ppo.envs.factory import probe_spec
from marl_ppo.plan.copies import settle_copies
from marl_ppo.run import memory
from marl_ppo.run.loop import train
from tests.helpers import ROOT

SIGNAL = ["env.id=envs/pixel_signal_v0", "rollout.vector=sync", "log.progress=false"]


def test_the_buffer_estimate_counts_frames_at_one_byte_per_pixel():
    frames = load_config(None, [*SIGNAL, "rollout.num_envs=4", "rollout.rollout_steps=10"])
    floats = load_config(
        None, [*SIGNAL, "rollout.num_envs=4", "rollout.rollout_steps=10", "model.encoder=mlp"]
    )
    small, large = (memory.estimate_memory(probe_spec(c), c) for c in (frames, floats))
    # per env step: 2 agents' 144-pixel images and the 288-pixel state, 1 byte each against 4; per
    # agent an int64 action (8), four float32 fields (16) and three flags (3)
    per_step_frames = 288 + 2 * (144 + 8 + 16 + 3)
    per_step_floats = 288 * 4 + 2 * (144 * 4 + 8 + 16 + 3)
    assert small.buffer == (40 + 8) * per_step_frames  # 40 buffer steps, 2 x 4 vector-env step arrays
    assert large.buffer == (40 + 8) * per_step_floats


def test_the_network_estimate_is_weights_gradients_and_two_adam_moments():
    config = settle_copies(load_config(None, [*SIGNAL, "model.encoder=mlp", "model.hidden_sizes=[8]"]))
    estimate = memory.estimate_memory(probe_spec(config), config)
    # actors (per agent): LayerNorm 2*144, layers 144*8+8 and 8*4+4; the state critic (shared, with
    # an agent id): LayerNorm 2*288, layers (288+2)*8+8 and 8+1
    params = 2 * (2 * 144 + 144 * 8 + 8 + 8 * 4 + 4) + (2 * 288 + 290 * 8 + 8 + 8 + 1)
    assert estimate.networks == 16 * params


def test_a_run_that_cannot_fit_exits_2_with_one_line_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 100 * 2**20)
    allocated = []
    monkeypatch.setattr("marl_ppo.run.loop.build_collector", lambda *a: allocated.append(a))
    config = load_config(None, [*SIGNAL, "rollout.num_envs=64", "rollout.rollout_steps=5000"])
    with pytest.raises(ConfigError) as caught:
        train(config, tmp_path / "run")
    message = str(caught.value)
    assert "\n" not in message and "0.10 GB of memory is available" in message
    assert "this run would need about" in message and "rollout buffer" in message
    assert "rollout.num_envs, rollout.rollout_steps, env.image_pool or model.encoder" in message
    assert allocated == [] and not (tmp_path / "run").exists()


def test_the_command_line_refuses_it_with_status_2(tmp_path):
    # 1M steps x 64 copies of float32 frames: far past any machine's memory
    args = [
        *SIGNAL,
        "rollout.num_envs=64",
        "rollout.rollout_steps=1000000",
        "model.encoder=mlp",
        "ppo.num_minibatches=1",
    ]
    command = [sys.executable, "-m", "marl_ppo", "train", *args, "--run-dir", str(tmp_path / "run")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: this run would need about")
    assert not (tmp_path / "run").exists()


def test_memory_check_false_runs_anyway_and_the_summary_logs_the_estimate(tmp_path, monkeypatch):
    overrides = [
        *SIGNAL,
        "rollout.num_envs=2",
        "rollout.rollout_steps=4",
        "total_steps=8",
        "ppo.num_minibatches=1",
    ]
    monkeypatch.setattr(memory, "available_memory", lambda: 2**20)
    with pytest.raises(ConfigError):
        train(load_config(None, overrides), tmp_path / "refused")
    train(load_config(None, [*overrides, "host.memory_check=false"]), tmp_path / "run")
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    config = load_config(None, [*overrides, "host.memory_check=false"])
    expected = memory.estimate_memory(probe_spec(config), config).total / 2**20
    assert summary["memory_estimate_mb"] == pytest.approx(expected)
    assert summary["peak_rss_mb"] > 0


def test_pistonball_without_an_experiment_file_is_estimated_under_2_gb():
    pytest.importorskip("pymunk")
    pistons = ["env.id=butterfly/pistonball_v6", "rollout.num_envs=2", "rollout.vector=sync"]
    config = load_config(None, pistons)
    estimate = memory.estimate_memory(probe_spec(config), config)
    assert estimate.total < 2 * 2**30
    # the flat-vector networks of full frames that the CNN and pooling replace: over 10 GB
    flat = load_config(None, [*pistons, "model.encoder=mlp", "env.image_pool=1"])
    assert memory.estimate_memory(probe_spec(flat), flat).total > 10 * 2**30
