"""Running a policy one step at a time, per group: from exported files or from a checkpoint's networks.

A `GroupStep` takes one group's inputs as `export.graph` names them (NumPy arrays, a leading batch
axis) and returns its outputs by name. `OnnxStep` runs an ONNX file with onnxruntime,
`TorchScriptStep` a TorchScript file, `CheckpointStep` the networks themselves through the
`ActingView` that evaluation acts with (so its numbers are evaluation's). `FileActing` drives exported
files through the stepping loop evaluation uses (`rollout.stepper.Stepper`), carries and episode
flags kept as `rollout.memory.PolicyMemory` keeps them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from marl_ppo.checkpoint import CheckpointError
from marl_ppo.envs.spec import TeamArrays
from marl_ppo.models.acting import ActingView
from marl_ppo.models.team import TeamModel


class GroupStep(Protocol):
    """One step of one group's actor on named inputs, returning named outputs."""

    inputs: tuple[str, ...]
    """The input names it reads, in the exported files' order."""

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


class OnnxStep:
    """An exported group's ONNX file run by onnxruntime on the CPU."""

    def __init__(self, path: Path) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise CheckpointError(
                "running an ONNX policy needs onnxruntime; install it with: pip install 'marl-ppo[export]'"
            ) from None
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # a controller's few rows: one thread, the same sums every call
        self.session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = tuple(i.name for i in self.session.get_inputs())
        self.outputs = tuple(o.name for o in self.session.get_outputs())

    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by name."""
        values = self.session.run(None, {name: inputs[name] for name in self.inputs})
        return dict(zip(self.outputs, values, strict=True))


class TorchScriptStep:
    """An exported group's TorchScript file."""

    def __init__(self, path: Path, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        self.module = torch.jit.load(str(path), map_location="cpu")
        self.inputs, self.outputs = inputs, outputs

    @torch.no_grad()
    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs by name."""
        values = self.module(*(torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in self.inputs))
        return {name: value.numpy() for name, value in zip(self.outputs, values, strict=True)}


class CheckpointStep:
    """A group's actor of a checkpoint's networks, stepped as evaluation steps it (`ActingView`):
    the distribution's mode, or a sample from torch's generator `generator`."""

    def __init__(
        self,
        view: ActingView,
        name: str,
        *,
        recurrent: bool,
        deterministic: bool,
        generator: torch.Generator | None = None,
    ) -> None:
        self.view, self.name = view, name
        self.deterministic, self.generator = deterministic, generator
        self.inputs = ("obs", "action_mask") + (("carry", "episode_start", "alive") if recurrent else ())

    @torch.no_grad()
    def __call__(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`actions` and (recurrent) `next_carry`."""
        obs = torch.from_numpy(inputs["obs"])
        rows, agents = obs.shape[:2]
        carry = torch.from_numpy(inputs["carry"]) if "carry" in inputs else torch.zeros(rows, agents, 0)
        start = inputs.get("episode_start", np.ones((rows, agents), bool))
        alive = inputs.get("alive", np.ones((rows, agents), bool))
        dist, carry = self.view.actor(
            self.name,
            obs.unsqueeze(0),
            torch.from_numpy(inputs["action_mask"]).unsqueeze(0),
            carry,
            torch.from_numpy(start).unsqueeze(0),
            torch.from_numpy(alive).unsqueeze(0),
        )
        if self.deterministic:
            actions = dist.mode()[0]
        else:
            with torch.random.fork_rng(devices=[]):
                if self.generator is not None:
                    torch.set_rng_state(self.generator.get_state())
                actions = dist.sample()[0]
                if self.generator is not None:
                    self.generator.set_state(torch.get_rng_state())
        return {"actions": actions.numpy(), "next_carry": carry.numpy()}


def checkpoint_steps(model: TeamModel, *, deterministic: bool, seed: int | None) -> dict[str, GroupStep]:
    """A `CheckpointStep` per group of `model` (its weights read once, now)."""
    view = ActingView(model)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return {
        name: CheckpointStep(
            view,
            name,
            recurrent=model.group(name).actor.carry_size > 0,
            deterministic=deterministic,
            generator=generator,
        )
        for name in model.group_names()
    }


def read_sidecar(directory: Path) -> dict[str, Any]:
    """An export directory's `policy.json`, checked to be one this marl_ppo writes."""
    from marl_ppo.export.writer import FORMAT, SIDECAR

    path = directory / SIDECAR
    if not path.is_file():
        raise CheckpointError(f"'{directory}' has no {SIDECAR}; pass a directory `marl-ppo export` wrote")
    sidecar: dict[str, Any] = json.loads(path.read_text())
    if sidecar.get("format") != FORMAT:
        raise CheckpointError(
            f"'{path}' has format {sidecar.get('format')!r}, not '{FORMAT}'; export the run again"
        )
    return sidecar


def file_steps(directory: Path, sidecar: Mapping[str, Any]) -> dict[str, GroupStep]:
    """A `GroupStep` per group of an export directory, for the files its `policy.json` names."""
    steps: dict[str, GroupStep] = {}
    for name, record in sidecar["groups"].items():
        path = directory / record["file"]
        if sidecar["files"] == "onnx":
            steps[name] = OnnxStep(path)
        else:
            steps[name] = TorchScriptStep(path, tuple(record["inputs"]), tuple(record["outputs"]))
    return steps


class FileActing:
    """Exported files as the stepping loop's `Acting` over E env copies: carries fresh per copy,
    `episode_start` flagged as `PolicyMemory.advance` flags `is_first`; a sampling export draws its
    noise from a NumPy generator seeded with `seed`."""

    def __init__(
        self, steps: Mapping[str, GroupStep], sidecar: Mapping[str, Any], copies: int, *, seed: int = 0
    ) -> None:
        self.steps, self.groups = steps, sidecar["groups"]
        self.rng = np.random.default_rng(seed)
        self.carry = {
            name: np.zeros((copies, len(g["agents"]), g["carry_size"]), np.float32)
            for name, g in self.groups.items()
        }
        self.first = {name: np.ones((copies, len(g["agents"])), bool) for name, g in self.groups.items()}
        self.out = {name: np.zeros((copies, len(g["agents"])), bool) for name, g in self.groups.items()}
        self.inputs: dict[str, dict[str, np.ndarray]] = {}
        self.outputs: dict[str, dict[str, np.ndarray]] = {}
        """The last step's inputs and outputs per group."""
        self._alive: dict[str, np.ndarray] = {}

    def act(self, arrays: TeamArrays) -> dict[str, torch.Tensor]:
        """Per group, the exported files' actions for the arrays' observations."""
        actions = {}
        for name, group in arrays.groups.items():
            alive = _numpy(group.alive).copy()
            inputs = {
                "obs": _numpy(group.obs),
                "action_mask": _numpy(group.action_mask),
                "carry": self.carry[name],
                "episode_start": self.first[name],
                "alive": alive,
            }
            step = self.steps[name]
            if "noise" in step.inputs:
                inputs["noise"] = self._noise(name, alive.shape)
            self.inputs[name] = inputs
            self.outputs[name] = outputs = step(inputs)
            self._alive[name] = alive
            actions[name] = torch.from_numpy(np.asarray(outputs["actions"]))
        return actions

    def _noise(self, name: str, lead: tuple[int, ...]) -> np.ndarray:
        shape = tuple(self.groups[name]["inputs"]["noise"]["shape"][2:])
        if self.groups[name]["action_space"]["kind"] == "Box":
            return self.rng.standard_normal((*lead, *shape), dtype=np.float32)
        return self.rng.random((*lead, *shape), dtype=np.float32)

    def advance(self, arrays: TeamArrays, episode_over: np.ndarray | torch.Tensor) -> None:
        """Keep the stepped carries; flag the agents whose episode starts next."""
        over = _numpy(episode_over).reshape(-1, 1)
        for name, group in arrays.groups.items():
            if "next_carry" in self.outputs[name]:
                self.carry[name] = self.outputs[name]["next_carry"]
            done = _numpy(group.terminated) | _numpy(group.truncated)
            out = done | (self.out[name] & ~self._alive[name])
            group_over = out.all(-1, keepdims=True) & done.any(-1, keepdims=True)
            self.first[name] = done | over | group_over
            self.out[name] = out & ~over


def _numpy(value: np.ndarray | torch.Tensor) -> np.ndarray:
    return value.cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
