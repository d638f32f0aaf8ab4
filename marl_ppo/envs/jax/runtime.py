"""JAX imported on first use, with its persistent compilation cache on, so a second run of an env skips
most of the compile (SMAX's batched step takes tens of seconds to compile on a CPU); and the marks by
which the compiled paths tell that torch tensors they mirror in JAX are untouched."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from marl_ppo.envs.registry import EnvError

CACHE_ENV_VAR = "MARL_PPO_JAX_CACHE"
"""Where compiled JAX functions are kept between runs; default `~/.cache/marl_ppo/jax`; `off` disables it."""

_CONFIGURED = False


def cache_dir() -> Path | None:
    """The persistent compilation cache's folder, or None when `MARL_PPO_JAX_CACHE=off`."""
    value = os.environ.get(CACHE_ENV_VAR, "")
    if value.lower() == "off":
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "marl_ppo" / "jax"


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """Discard what is written to file descriptor 1 meanwhile (an import in JaxMARL's chain puts back
    `sys.stdout`, so `contextlib.redirect_stdout` misses its prints)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            try:
                yield
            finally:
                sys.stdout.flush()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def jax_modules() -> tuple[Any, Any]:
    """`(jax, jax.numpy)`, the compilation cache configured on first call; an EnvError names the
    install when JAX is missing."""
    global _CONFIGURED
    try:
        import jax
        import jax.numpy as jnp

        with _stdout_silenced():  # it prints which optional envs it skipped
            importlib.import_module("jaxmarl.environments")
    except ModuleNotFoundError as err:
        raise EnvError(
            f"JAX envs need the optional package '{err.name}'; install it with: pip install 'marl-ppo[jax]'"
        ) from None
    if not _CONFIGURED:
        _CONFIGURED = True
        folder = cache_dir()
        if folder is not None:
            jax.config.update("jax_compilation_cache_dir", str(folder))
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return jax, jnp


TensorMarks = list[tuple[torch.Tensor, int]]
"""Tensors, each with its version counter (which every in-place write moves on) when marked."""


def tensor_marks(tensors: Iterable[torch.Tensor]) -> TensorMarks:
    """Mark `tensors` as they are now."""
    return [(tensor, tensor._version) for tensor in tensors]


def marks_hold(marks: Sequence[tuple[torch.Tensor, int]], tensors: Sequence[torch.Tensor]) -> bool:
    """`tensors` are the marked ones (the same objects, in order) with nothing written into them since."""
    return len(marks) == len(tensors) and all(
        marked is tensor and version == tensor._version
        for (marked, version), tensor in zip(marks, tensors, strict=True)
    )
