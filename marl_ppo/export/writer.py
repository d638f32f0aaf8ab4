"""`marl-ppo export`: a run's policy as one ONNX or TorchScript file per agent group, and `policy.json`.

The files hold the actors only (no critic, no optimizer), in float32 whatever the run trained in
(`model.precision: bf16` acts in bfloat16 arithmetic; the export computes the same weights in float32,
and `policy.json` records both). `policy.json` says, per group, the file, the agents in the order of
the agent axis, the observation row (its size, dtype, where images lie), the action space, the
inputs and outputs with their shapes (`export.graph`), and what the graph normalizes itself.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from marl_ppo.checkpoint import load_checkpoint
from marl_ppo.config import ExperimentConfig, build_config, config_to_dict, merge, parse_overrides
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.spec import GroupSpec, TeamSpec
from marl_ppo.eval.evaluate import EvalError, eval_config
from marl_ppo.eval.from_checkpoint import load_policy as checkpoint_model
from marl_ppo.eval.from_checkpoint import resolve_checkpoint
from marl_ppo.export.graph import ActorStep, example_inputs, noise_size
from marl_ppo.models.team import TeamModel
from marl_ppo.plan.settle import plan_eval

FORMAT = "marl_ppo.export.v1"
"""The layout of `policy.json` (and of the files it names) that this marl_ppo writes and reads."""

SIDECAR = "policy.json"

Format = Literal["onnx", "torchscript"]
SUFFIX: dict[str, str] = {"onnx": ".onnx", "torchscript": ".pt"}

ONNX_OPSET = 18
"""The ONNX operator set of exported files: onnxruntime 1.14 and later run it."""


@dataclass(frozen=True)
class ExportResult:
    """Where `export_policy` wrote the files."""

    directory: Path
    sidecar: Path
    files: dict[str, Path]
    """Per group name, its model file."""


def export_policy(
    target: Path | str,
    *,
    fmt: Format = "onnx",
    out: Path | str | None = None,
    sample: bool = False,
    overrides: Sequence[str] = (),
) -> ExportResult:
    """Export the actors of a run (its final or latest checkpoint) or of a checkpoint file into `out`
    (default `RUN_DIR/export/<fmt>`): one file per group and `policy.json`. `sample`: the files take
    a `noise` input and sample; otherwise they return the most likely action (the mean, for Box)."""
    if fmt not in SUFFIX:
        raise EvalError(f"--format {fmt} is not a format marl-ppo exports; use onnx or torchscript")
    checkpoint, run_dir = resolve_checkpoint(target)
    payload = load_checkpoint(checkpoint)
    trained_precision = str(payload["config"]["model"]["precision"])
    config, spec, model = float32_policy(payload, overrides)
    directory = Path(out) if out is not None else run_dir / "export" / fmt
    directory.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for group in spec.groups:
        step = ActorStep(model.group(group.name).actor, group, sample=sample).eval()
        path = directory / f"{group.name}{SUFFIX[fmt]}"
        (_write_onnx if fmt == "onnx" else _write_torchscript)(step, group, path)
        files[group.name] = path
    sidecar = directory / SIDECAR
    description = describe(
        spec, model, config, fmt=fmt, sample=sample, files=files, trained_precision=trained_precision
    )
    description["checkpoint"] = {"path": str(checkpoint), "env_steps": payload.get("env_steps")}
    sidecar.write_text(json.dumps(description, indent=2) + "\n")
    return ExportResult(directory, sidecar, files)


def float32_policy(
    payload: dict[str, Any], overrides: Sequence[str] = ()
) -> tuple[ExperimentConfig, TeamSpec, TeamModel]:
    """A checkpoint's config, team layout and networks on the CPU in float32 arithmetic."""
    data = merge(payload["config"], parse_overrides(overrides))
    data = merge(data, {"model": {"precision": "fp32"}, "host": {"device": "cpu"}})
    plan = plan_eval(build_config(data))
    config = plan.config
    venv = build_vector_env(eval_config(config, 1), plan.layout, plan.device)
    try:
        spec = venv.spec
    finally:
        venv.close()
    return config, spec, checkpoint_model(payload, spec, config, plan.device)


def _write_onnx(step: ActorStep, group: GroupSpec, path: Path) -> None:
    """`step` through torch's ONNX exporter (the batch axis dynamic), checked by `onnx.checker`."""
    try:
        import onnx
    except ImportError:
        raise EvalError("ONNX export needs onnx; install it with: pip install 'marl-ppo[export]'") from None
    inputs = example_inputs(step, group)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # the exporter's notes on its own internals
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _onnx_export(step, inputs, path)
    finally:
        exporter_log.setLevel(level)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def _onnx_export(step: ActorStep, inputs: tuple[torch.Tensor, ...], path: Path) -> None:
    batch = torch.export.Dim("batch")
    torch.onnx.export(
        step,
        inputs,
        str(path),
        input_names=list(step.signature.inputs),
        output_names=list(step.signature.outputs),
        dynamic_shapes=(tuple({0: batch} for _ in inputs),),
        opset_version=ONNX_OPSET,
        dynamo=True,
        external_data=False,
        verbose=False,
    )


def _write_torchscript(step: ActorStep, group: GroupSpec, path: Path) -> None:
    """`step` traced to TorchScript (its shapes follow the inputs: any batch)."""
    with torch.no_grad(), warnings.catch_warnings():
        # the tracer's notes on shape branches fixed at tracing time, and torch's notice that
        # TorchScript is deprecated (the files load in the torch versions that still read it)
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(step, example_inputs(step, group), check_trace=False)
        torch.jit.save(traced, str(path))


def describe(
    spec: TeamSpec,
    model: TeamModel,
    config: ExperimentConfig,
    *,
    fmt: str,
    sample: bool,
    files: dict[str, Path],
    trained_precision: str,
) -> dict[str, Any]:
    """`policy.json`'s content (see the module)."""
    groups = {}
    for group in spec.groups:
        actor = model.group(group.name).actor
        step = ActorStep(actor, group, sample=sample)
        groups[group.name] = {
            "file": files[group.name].name,
            "agents": list(group.agents),
            "observation": _observation(group),
            "action_space": space_record(group.action_space),
            "action_mask": group.mask_source,
            "carry_size": actor.carry_size,
            "inputs": {name: _input_shape(name, group, actor.carry_size) for name in step.signature.inputs},
            "outputs": {
                name: _output_shape(name, group, actor.carry_size) for name in step.signature.outputs
            },
            "log_std": None if actor.log_std is None else actor.log_std.detach().tolist(),
        }
    return {
        "format": FORMAT,
        "files": fmt,
        "actions": "sample" if sample else "mode",
        "precision": "float32",
        "trained_precision": trained_precision,
        "env": {"id": config.env.id, "kwargs": config.env.kwargs},
        "agents": list(spec.agents),
        "normalization": {
            "input_layer_norm": config.model.input_layer_norm,
            "note": "inside the graph: each input row's LayerNorm (when input_layer_norm) and uint8 "
            "frames' scaling to [0, 1]; feed observations as the env gives them, flattened",
        },
        "groups": groups,
        "config": config_to_dict(config),
    }


def _observation(group: GroupSpec) -> dict[str, Any]:
    layout = group.obs_layout
    parts = [] if layout is None else [_part(p) for p in layout.parts]
    return {"dim": group.obs_dim, "dtype": str(group.obs_dtype), "layout": parts}


def _part(part: Any) -> dict[str, Any]:
    record = dataclasses.asdict(part)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in record.items()}


def space_record(space: gym.Space) -> dict[str, Any]:
    """An action space as JSON: its kind and what defines it."""
    if isinstance(space, gym.spaces.Discrete):
        return {"kind": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"kind": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    assert isinstance(space, gym.spaces.Box)
    return {
        "kind": "Box",
        "shape": list(space.shape),
        "low": np.asarray(space.low, np.float64).tolist(),
        "high": np.asarray(space.high, np.float64).tolist(),
    }


def _input_shape(name: str, group: GroupSpec, carry_size: int) -> dict[str, Any]:
    agents = group.num_agents
    shapes: dict[str, tuple[list[Any], str]] = {
        "obs": (["B", agents, group.obs_dim], str(group.obs_dtype)),
        "action_mask": (["B", agents, group.mask_dim], "bool"),
        "carry": (["B", agents, carry_size], "float32"),
        "episode_start": (["B", agents], "bool"),
        "alive": (["B", agents], "bool"),
        "noise": (["B", agents, noise_size(group.action_space)], "float32"),
    }
    shape, dtype = shapes[name]
    return {"shape": shape, "dtype": dtype}


def _output_shape(name: str, group: GroupSpec, carry_size: int) -> dict[str, Any]:
    agents = group.num_agents
    action_shape = ["B", agents, *group.action_shape]
    shapes: dict[str, tuple[list[Any], str]] = {
        "actions": (action_shape, str(group.action_dtype)),
        "logits": (["B", agents, noise_size(group.action_space)], "float32"),
        "mean": (["B", agents, noise_size(group.action_space)], "float32"),
        "next_carry": (["B", agents, carry_size], "float32"),
    }
    shape, dtype = shapes[name]
    return {"shape": shape, "dtype": dtype}
