"""Helpers shared by the test modules."""

from __future__ import annotations

import torch

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import build_vector_env, probe_layout
from marl_ppo.envs.vector.base import VectorEnv


def vector_env(config: ExperimentConfig, device: torch.device | None = None) -> VectorEnv:
    """The config's vector env, its layout read from one probe copy first (as a plan reads it)."""
    return build_vector_env(config, probe_layout(config), device)
