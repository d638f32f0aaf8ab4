"""The memory check before a run: what the run will hold, against what the machine has free.

The estimate adds up what a run allocates and keeps: the rollout buffer (`T x E` steps of every
field, frames at their stored width), the vector env's arrays, the networks with their gradients and
Adam's two moments (and a copy per rollout worker), the update's batch copies (the encoded inputs,
one minibatch gathered), the activations a minibatch keeps for the backward pass (the CNNs' feature
maps dominate with images), and a fixed share per process for Python, torch and the env. It is an
estimate, logged beside the measured peak in `summary.json` so it can be checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from marl_ppo.config import ConfigError, ExperimentConfig
from marl_ppo.envs.layout import InputLayout
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.models.encoders import NO_GRAD_CHUNK, CnnShape, conv_activation_floats
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import RunPlan

PROCESS_BYTES = 300 * 2**20
"""Resident memory of one process before the run allocates (Python, torch, NumPy, an env copy)."""

SHRINK_KEYS = "rollout.num_envs, rollout.rollout_steps, env.image_pool or model.encoder"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a run will hold, by part."""

    buffer: int
    """The rollout buffer and the vector env's step arrays."""
    networks: int
    """Weights, gradients and Adam's moments (and the rollout workers' copies of the weights)."""
    update: int
    """The update's batch copies and one minibatch's activations."""
    processes: int
    """The fixed share of the learner and of every worker process."""

    @property
    def total(self) -> int:
        """Bytes in all."""
        return self.buffer + self.networks + self.update + self.processes

    def describe(self) -> str:
        """The estimate by part, in GB."""
        return (
            f"{_gb(self.total)} (rollout buffer {_gb(self.buffer)}, networks and optimizer {_gb(self.networks)}, "
            f"update {_gb(self.update)}, processes {_gb(self.processes)})"
        )


def estimate_memory(spec: TeamSpec, config: ExperimentConfig) -> MemoryEstimate:
    """What a run of `config` on a team `spec` will hold; the networks are sized on the meta device
    (nothing allocated)."""
    steps = config.rollout.rollout_steps * config.rollout.copies
    state_bytes = spec.state_dim * spec.state_dtype.itemsize
    per_step = state_bytes + sum(_group_step_bytes(g) for g in spec.groups)
    vector_arrays = config.rollout.copies * 2 * per_step  # the step arrays, and their final_* halves
    buffer = steps * per_step + vector_arrays
    with torch.device("meta"):
        model = TeamModel(spec, config)
    weights = sum(p.numel() for p in model.parameters()) * 4
    workers = config.rollout.num_workers if config.rollout.vector == "workers" else 0
    networks = (
        4 * weights + workers * 2 * weights
    )  # weights, gradients, two moments; each worker's copy and its share
    update = _update_bytes(spec, config, model, steps)
    processes = PROCESS_BYTES * (1 + (config.rollout.num_workers if config.rollout.vector != "sync" else 0))
    return MemoryEstimate(buffer, networks, update, processes)


def _group_step_bytes(group: GroupSpec) -> int:
    """One env step of one group in the buffer: observations at their stored width, actions, mask,
    four float32 fields (log-prob, value, final value, reward) and three flags per agent."""
    action = int(np.prod(group.action_shape, dtype=np.int64)) * group.action_dtype.itemsize
    per_agent = group.obs_dim * group.obs_dtype.itemsize + action + group.mask_dim + 4 * 4 + 3
    return group.num_agents * per_agent


def _update_bytes(spec: TeamSpec, config: ExperimentConfig, model: TeamModel, steps: int) -> int:
    """The update's copies: encoded MLP inputs (float32, the whole batch), a gathered minibatch of
    them, and the activations one minibatch keeps for its backward pass (doubled for the gradients)."""
    rows = math.ceil(steps / config.ppo.num_minibatches)
    cnn = CnnShape.of(config.model)
    width = max(config.model.hidden_sizes, default=0)
    total = 0
    for group in spec.groups:
        actor, critic, _ = model.group(group.name)
        obs_bytes = (
            group.num_agents * group.obs_dim * (4 if actor.features is None else group.obs_dtype.itemsize)
        )
        critic_in = spec.state_dim * (4 if critic.images is None else spec.state_dtype.itemsize)
        batch = steps * (obs_bytes + critic_in)
        maps = group.num_agents * _maps(group.obs_layout, cnn)
        maps += _maps(spec.state_layout, cnn)
        mlp = 2 * group.num_agents * width * len(config.model.hidden_sizes)
        activations = 2 * 4 * rows * (maps + mlp)
        acting = 4 * min(steps, NO_GRAD_CHUNK) * maps  # a no-gradient forward, chunked
        total += batch + batch // config.ppo.num_minibatches + activations + acting
    return total


def _maps(layout: InputLayout | None, cnn: CnnShape) -> int:
    return 0 if layout is None else conv_activation_floats(layout, cnn)


def available_memory() -> int | None:
    """Bytes the machine can give a new run now: psutil's `available` where psutil is installed, else
    /proc/meminfo's MemAvailable; None where neither can tell."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(plan: RunPlan) -> MemoryEstimate | None:
    """The planned run's estimate, after refusing (ConfigError, exit 2) a run that would need more than
    is available; None for a batched simulator (VMAS), whose layout is known only once it is built."""
    if not isinstance(plan.layout, TeamSpec):
        return None
    config = plan.config
    estimate = estimate_memory(plan.layout, config)
    available = available_memory()
    if config.host.memory_check and available is not None and estimate.total > available:
        raise ConfigError(
            f"this run would need about {estimate.describe()} but {_gb(available)} of memory is available; "
            f"shrink it with {SHRINK_KEYS}, or set host.memory_check=false to run anyway"
        )
    return estimate


def _gb(size: int) -> str:
    return f"{size / 2**30:.2f} GB"
