"""The `host` section: the machine the learner runs on (torch device and threads, the memory check)."""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from marl_ppo.config.base import STRICT, PositiveInt


@dataclass(frozen=True, config=STRICT)
class HostConfig:
    """The learner's torch device and threads, and the check that the run fits in memory."""

    device: Literal["cpu", "cuda", "auto"] = "cpu"
    """Torch device for the networks."""
    torch_threads: PositiveInt | Literal["auto"] = "auto"
    """torch.set_num_threads for the learner; `auto`: with a batched simulator (VMAS) or a CNN encoder, the
    cores the run's env or rollout worker processes leave (at least 1) while it acts, and every core
    while it updates unless the workers collect meanwhile (rollout.policy_lag 1); else 1 (the small MLPs gain
    nothing from more, and threads contending with busy cores slow them down)."""
    memory_check: bool = True
    """Before allocating, estimate the memory the run holds (rollout buffer, networks and optimizer
    state, the update's copies) and stop (exit 2) when it exceeds the memory available; false runs anyway."""
