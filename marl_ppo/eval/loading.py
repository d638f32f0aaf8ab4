"""A run's checkpoint found and its policy rebuilt: what `eval`, `export`, `rate` and partners load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from marl_ppo.checkpoint import CheckpointError
from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.eval.evaluate import EvalError
from marl_ppo.models.team import TeamModel


def resolve_checkpoint(target: Path | str) -> tuple[Path, Path]:
    """(checkpoint file, directory for the results) for a run directory or a checkpoint file."""
    target = Path(target)
    if target.is_dir():
        for name in ("final.pt", "latest.pt"):
            if (target / "checkpoints" / name).is_file():
                return target / "checkpoints" / name, target
        raise CheckpointError(
            f"run directory '{target}' has no checkpoints/final.pt or checkpoints/latest.pt; "
            "pass a run directory that has trained, or a checkpoint file"
        )
    if not target.is_file():
        raise CheckpointError(f"'{target}' is neither a run directory nor a checkpoint file")
    run_dir = target.parent.parent if target.parent.name == "checkpoints" else target.parent
    return target, run_dir


def load_policy(
    payload: dict[str, Any], spec: TeamSpec, config: ExperimentConfig, device: torch.device
) -> TeamModel:
    """The checkpoint's TeamModel for `spec`; a clear error when the env or network no longer fits it."""
    if list(spec.agents) != list(payload["agents"]):
        raise EvalError(
            f"the env now has agents {list(spec.agents)} but the checkpoint was trained with "
            f"{list(payload['agents'])}; evaluate on an env with the same agents"
        )
    model = TeamModel(spec, config).to(device)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError:
        raise EvalError(
            "the checkpoint's weights do not fit the networks for this env and config (an override changed "
            "observation or action sizes, or the model); override only what keeps the spaces"
        ) from None
    model.eval()
    return model
