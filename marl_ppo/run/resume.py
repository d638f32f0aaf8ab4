"""Resuming a run: what a checkpoint must hold for the next update to be the one the run would have made.

A run's state at an update boundary is the model (weights and value normalizers), the trainer
(optimizers and its shuffling generator), the collector (step counter, unfinished episodes, the
observations the next step acts on), the logger (episode counter, return window), every global
RNG, and the env copies themselves. The envs are saved as pickled bytes inside the checkpoint
(inert uint8 tensors, so the file still loads with `weights_only=True`); they are unpickled only
by `--resume`, which must therefore only be given one's own run directories. Envs that cannot be
pickled are reset with seeds derived from (seed, update) instead, and the resume is not exact.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from marl_ppo.algo.trainer import Trainer
from marl_ppo.checkpoint import CheckpointError, load_checkpoint
from marl_ppo.config import (
    ConfigError,
    ExperimentConfig,
    build_config,
    config_to_dict,
    merge,
    parse_overrides,
    refuse_moved,
)
from marl_ppo.envs.registry import env_file, moved
from marl_ppo.envs.vector.state import EnvStateError
from marl_ppo.rollout.source import RolloutSource
from marl_ppo.run.seeding import restore_rng_state, resume_seed, rng_state

RESUMABLE_KEYS = (  # and env.id, where it points to the run's env file at another path
    "total_steps",
    "rollout.vector",
    "rollout.num_workers",
    "host.torch_threads",
    "fast.learner",
    "log.progress",
    "log.checkpoint_every",
    "log.keep_last",
    "log.backends",
    "log.wandb.mode",
    "log.wandb.init_timeout_s",
    "eval.absolute",
    "ray.address",
    "ray.num_cpus_per_worker",
    "ray.max_worker_restarts",
    "ray.min_workers",
    "ray.placement",
)
"""Config keys that `--resume` may change: none of them changes what the run computes up to the
resume point (`total_steps` shortens or extends the run; with `ppo.lr_schedule: linear` the learning
rate goes on from the value it had reached, decaying linearly to zero at the new total; `fast.learner`
learns on from the same weights and optimizer state, computed by the other implementation)."""


class Stateful(Protocol):
    """A component whose state a checkpoint carries (the run logger, the trainer)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class NotExactResumeWarning(UserWarning):
    """The env copies could not be saved, so the resumed run starts fresh episodes."""


def latest_checkpoint(run_dir: Path) -> Path:
    """`run_dir/checkpoints/latest.pt`, or a one-line CheckpointError when the run has none."""
    path = Path(run_dir) / "checkpoints" / "latest.pt"
    if not Path(run_dir).is_dir():
        raise CheckpointError(f"--resume: run directory '{run_dir}' does not exist")
    if not path.is_file():
        raise CheckpointError(
            f"--resume: run directory '{run_dir}' has no checkpoints/latest.pt; start it without --resume"
        )
    return path


def resume_config(run_dir: Path, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """The config of the run in `run_dir` with `key=value` overrides of RESUMABLE_KEYS only."""
    payload = load_resumable(run_dir)
    changes = parse_overrides(overrides)
    refuse_moved(changes)
    for key in _dotted_keys(changes):
        if key == "env.id" and moved(payload["config"]["env"]["id"], str(changes["env"]["id"])):
            continue  # the run's env file, where it went
        if key not in RESUMABLE_KEYS:
            raise ConfigError(
                f"--resume: config key '{key}' cannot change when resuming (only {', '.join(RESUMABLE_KEYS)}); "
                "start a new run to change it"
            )
    config = build_config(merge(payload["config"], changes))
    _check_unfinished(payload, config, run_dir)
    return config


def load_resumable(run_dir: Path, config: ExperimentConfig | None = None) -> dict[str, Any]:
    """The run's latest checkpoint (of this version's format), checked to match `config` where it must."""
    path = latest_checkpoint(run_dir)
    payload = load_checkpoint(path)
    if config is not None:
        used = payload["config"]["rollout"]["vector"]
        acting = ("workers", "ray")  # rollout workers, local or on Ray, save their state alike
        if (used in acting) != (config.rollout.vector in acting):  # the collectors' states differ in kind
            raise ConfigError(
                f"--resume: the run in '{run_dir}' used rollout.vector={used} and cannot continue with "
                f"rollout.vector={config.rollout.vector}; resume it with rollout.vector={used}"
            )
        # the stored config with today's defaults for keys added since the run was written
        saved = _flat(config_to_dict(build_config(payload["config"])))
        wanted = _flat(config_to_dict(config))
        for key in sorted(saved.keys() | wanted.keys()):
            if key == "env.id" and moved(saved[key], wanted[key]):
                payload = _env_states_if_same_file(payload, config.env.id)
                continue
            if key not in RESUMABLE_KEYS and saved.get(key) != wanted.get(key):
                raise ConfigError(
                    f"--resume: config key '{key}' is {wanted.get(key)!r} but the run in '{run_dir}' used "
                    f"{saved.get(key)!r}; only {', '.join(RESUMABLE_KEYS)} may change"
                )
        _check_unfinished(payload, config, run_dir)
    return payload


def _env_states_if_same_file(payload: dict[str, Any], env_id: str) -> dict[str, Any]:
    """`payload`, without its env copies' states where the run's env file is now another file: they
    were pickled as the classes of the file at its old path, so the copies restart fresh episodes."""
    recorded = payload["config"]["env"]["id"]
    before, now = env_file(recorded), env_file(env_id)
    if before is None or now is None or before.resolve() == now.resolve():
        return payload
    reason = f"the env file moved from '{before}' to '{now}'"
    return {**payload, "envs": {"unavailable": reason}}


def _check_unfinished(payload: Mapping[str, Any], config: ExperimentConfig, run_dir: Path) -> None:
    if payload["env_steps"] >= config.total_steps:
        raise ConfigError(
            f"--resume: run '{run_dir}' already finished (env step {payload['env_steps']} of total_steps="
            f"{config.total_steps}); extend it with total_steps=N, N > {payload['env_steps']}"
        )


def run_state(
    *, model: nn.Module, trainer: Trainer, collector: RolloutSource, logger: Stateful
) -> dict[str, Any]:
    """Everything the next update depends on, as tensors and primitives (env copies as uint8 tensors)."""
    try:
        states = [_to_tensor(blob) for blob in collector.env_states()]
        envs: dict[str, Any] = {"states": states}
    except EnvStateError as err:
        envs = {"unavailable": str(err)}
    return {
        "model": model.state_dict(),
        "trainer": trainer.state_dict(),
        "collector": collector.state_dict(),
        "logger": logger.state_dict(),
        "rng": rng_state(),
        "envs": envs,
    }


def restore_run_state(
    payload: Mapping[str, Any],
    *,
    model: nn.Module,
    trainer: Trainer,
    collector: RolloutSource,
    logger: Stateful,
    seed: int,
) -> None:
    """Put back `run_state`; envs that could not be saved are reset with a seed from (seed, update)."""
    model.load_state_dict(payload["model"])
    trainer.load_state_dict(payload["trainer"])
    logger.load_state_dict(payload["logger"])
    envs = payload["envs"]
    if "states" in envs:
        collector.load_env_states([blob.numpy().tobytes() for blob in envs["states"]])
        collector.load_state_dict(payload["collector"])
    else:
        warnings.warn(
            f"resume is not exact: the env copies' states are not restored ({envs['unavailable']}), so they restart "
            f"with fresh episodes (reset seed derived from seed={seed}, update={payload['updates']})",
            NotExactResumeWarning,
            stacklevel=2,
        )
        collector.load_state_dict(payload["collector"], episodes=False)
        collector.start(resume_seed(seed, payload["updates"]))
    restore_rng_state(payload["rng"])  # last: resets above may draw from (or reseed) the global RNGs


def _to_tensor(blob: bytes) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy())


def _dotted_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        if isinstance(value, Mapping) and prefix + key != "env.kwargs":
            keys += _dotted_keys(value, f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def _flat(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _lookup(tree, key) for key in _dotted_keys(tree)}


def _lookup(tree: Mapping[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node
