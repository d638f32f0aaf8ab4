"""`marl_ppo.load_policy`: a trained team's policy for inference without a run.

```python
policy = marl_ppo.load_policy("runs/spread")         # a run, a checkpoint file or an export directory
observations, infos = env.reset(seed=0)
state = policy.initial_state()
while env.agents:
    actions, state = policy.act(observations, state)  # by agent, as the env takes them
    observations, rewards, terminated, truncated, infos = env.step(actions)
```

From a run or a checkpoint it acts with the networks as `marl-ppo eval` does (`ActingView`, on the
CPU, in the run's precision), so a deterministic policy plays evaluation's episodes exactly. From an
export directory it runs the exported files (onnxruntime for ONNX, torch for TorchScript), which
compute in float32 (`export.writer`).

`act` takes a PettingZoo parallel env's observations by agent (an agent that is not there does not
act and keeps its carry), each as the env gives it: flattened here as the run's adapter flattens it,
its action mask read from a Dict observation's `action_mask` (or given in `action_masks` for a run
whose masks come in `infos`). It returns each present agent's action as the env takes it (a
Discrete action shifted by its space's start, a Box action clipped to its bounds) and the new state.
Start every episode from `initial_state()`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from marl_ppo.checkpoint import CheckpointError, load_checkpoint
from marl_ppo.config import build_config, merge
from marl_ppo.envs.adapters.pettingzoo import action_converter
from marl_ppo.envs.factory import build_vector_env
from marl_ppo.envs.layout import InputLayout, InputPart, flatten_value, has_mask_in_obs
from marl_ppo.envs.spec import GroupSpec
from marl_ppo.eval.evaluate import eval_config
from marl_ppo.eval.from_checkpoint import load_policy as checkpoint_model
from marl_ppo.eval.from_checkpoint import resolve_checkpoint
from marl_ppo.export.runtime import GroupStep, checkpoint_steps, file_steps, read_sidecar
from marl_ppo.export.writer import SIDECAR, SUFFIX
from marl_ppo.plan.settle import plan_eval


@dataclass(frozen=True)
class PolicyState:
    """Per group the agents' carries `(A_g, carry_size)` and whether each starts an episode."""

    carry: dict[str, np.ndarray]
    episode_start: dict[str, np.ndarray]


@dataclass(frozen=True)
class _GroupIO:
    """How one group's agents' observations enter its step and its actions leave it."""

    agents: tuple[str, ...]
    obs_dim: int
    obs_dtype: np.dtype
    mask_dim: int
    mask_source: str | None
    carry_size: int
    flatten: Callable[[Any], np.ndarray]
    to_env: Callable[[np.ndarray], Any]
    noise: tuple[str, tuple[int, ...]] | None = None
    """A sampling export's noise: `uniform` or `normal`, and one agent's shape; None for the others."""


class Policy:
    """A team's policy acting on observations by agent (see the module)."""

    def __init__(self, groups: dict[str, _GroupIO], steps: dict[str, GroupStep], *, seed: int | None) -> None:
        self._groups, self._steps = groups, steps
        self._rng = np.random.default_rng(seed)
        self.agents = tuple(agent for io in groups.values() for agent in io.agents)
        self._slots = {agent: (name, i) for name, io in groups.items() for i, agent in enumerate(io.agents)}

    def initial_state(self) -> PolicyState:
        """The state an episode starts from: zero carries, every agent starting."""
        return PolicyState(
            {
                name: np.zeros((len(io.agents), io.carry_size), np.float32)
                for name, io in self._groups.items()
            },
            {name: np.ones(len(io.agents), bool) for name, io in self._groups.items()},
        )

    def act(
        self,
        observations: Mapping[str, Any],
        state: PolicyState | None = None,
        *,
        action_masks: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], PolicyState]:
        """The present agents' actions and the state after them (`state` None: an episode's start)."""
        unknown = sorted(set(observations) - set(self._slots))
        if unknown:
            raise CheckpointError(
                f"observations of {unknown}, who are not in this policy's team {list(self.agents)}"
            )
        state = self.initial_state() if state is None else state
        actions: dict[str, Any] = {}
        carry, start = {}, {}
        for name, io in self._groups.items():
            inputs = self._inputs(io, observations, action_masks)
            inputs["carry"] = state.carry[name][None]
            inputs["episode_start"] = state.episode_start[name][None]
            if io.noise is not None:
                kind, shape = io.noise
                lead = (1, len(io.agents))
                noise = (
                    self._rng.random((*lead, *shape))
                    if kind == "uniform"
                    else self._rng.standard_normal((*lead, *shape))
                )
                inputs["noise"] = noise.astype(np.float32)
            outputs = self._steps[name](inputs)
            for i, agent in enumerate(io.agents):
                if inputs["alive"][0, i]:
                    actions[agent] = io.to_env(np.asarray(outputs["actions"][0, i]))
            carry[name] = outputs["next_carry"][0] if "next_carry" in outputs else state.carry[name]
            start[name] = np.zeros(len(io.agents), bool)
        return actions, PolicyState(carry, start)

    @staticmethod
    def _inputs(
        io: _GroupIO, observations: Mapping[str, Any], action_masks: Mapping[str, Any] | None
    ) -> dict[str, np.ndarray]:
        agents = len(io.agents)
        obs = np.zeros((1, agents, io.obs_dim), io.obs_dtype)
        alive = np.zeros((1, agents), bool)
        mask = np.ones((1, agents, io.mask_dim), bool)
        for i, agent in enumerate(io.agents):
            if agent not in observations:
                continue
            raw = observations[agent]
            alive[0, i] = True
            row = io.flatten(raw)
            if row.size != io.obs_dim:
                raise CheckpointError(
                    f"agent '{agent}' observed {row.size} numbers but the policy reads {io.obs_dim}; "
                    "pass the observation as the env gives it"
                )
            obs[0, i] = row
            if io.mask_source is not None:
                mask[0, i] = _mask(agent, raw, io.mask_source, action_masks)
        return {"obs": obs, "alive": alive, "action_mask": mask}


def _mask(agent: str, raw: Any, source: str, action_masks: Mapping[str, Any] | None) -> np.ndarray:
    """An agent's flat action mask, from its Dict observation or from `action_masks`."""
    found = raw["action_mask"] if source == "obs" else (action_masks or {}).get(agent)
    if found is None:
        raise CheckpointError(
            f"agent '{agent}' acts with an action mask from the env's infos; pass it as action_masks={{'{agent}': ...}}"
        )
    parts = found if isinstance(found, tuple | list) and len(found) and np.ndim(found[0]) == 1 else [found]
    return np.concatenate([np.asarray(p).reshape(-1) for p in parts]).astype(bool)


def load_policy(source: Path | str, *, deterministic: bool = True, seed: int | None = None) -> Policy:
    """The policy of a run directory, a checkpoint file, or an export directory (or a file in one).

    A run's or checkpoint's policy takes its distributions' modes (`deterministic`) or samples from a
    torch generator seeded with `seed`; an export's files act as they were exported (`--sample` or
    not), their noise drawn from a NumPy generator seeded with `seed`."""
    path = Path(source)
    exported = path.name == SIDECAR or path.suffix in SUFFIX.values()
    if path.is_file() and exported and (path.parent / SIDECAR).is_file():
        path = path.parent
    if path.is_dir() and (path / SIDECAR).is_file():
        return _exported(path, seed)
    return _from_checkpoint(path, deterministic=deterministic, seed=seed)


def _from_checkpoint(source: Path, *, deterministic: bool, seed: int | None) -> Policy:
    checkpoint, _ = resolve_checkpoint(source)
    payload = load_checkpoint(checkpoint)
    plan = plan_eval(build_config(merge(payload["config"], {"host": {"device": "cpu"}})))
    venv = build_vector_env(eval_config(plan.config, 1), plan.layout, plan.device)
    try:
        spec = venv.spec
    finally:
        venv.close()
    model = checkpoint_model(payload, spec, plan.config, plan.device)
    groups = {
        group.name: _GroupIO(
            agents=group.agents,
            obs_dim=group.obs_dim,
            obs_dtype=group.obs_dtype,
            mask_dim=group.mask_dim,
            mask_source=group.mask_source,
            carry_size=model.group(group.name).actor.carry_size,
            flatten=_flattener(group),
            to_env=action_converter(group.action_space),
        )
        for group in spec.groups
    }
    return Policy(groups, checkpoint_steps(model, deterministic=deterministic, seed=seed), seed=None)


def _flattener(group: GroupSpec) -> Callable[[Any], np.ndarray]:
    """An observation as the run's adapter stores it (`envs.layout.flatten_value`)."""
    space = group.observation_space
    layout = group.obs_layout or InputLayout((InputPart(0, group.obs_dim),))
    if has_mask_in_obs(space):
        inner = space["observation"]
        return lambda raw: flatten_value(layout, inner, raw["observation"])
    return lambda raw: flatten_value(layout, space, raw)


def _exported(directory: Path, seed: int | None) -> Policy:
    sidecar = read_sidecar(directory)
    groups = {name: _exported_io(name, record) for name, record in sidecar["groups"].items()}
    return Policy(groups, file_steps(directory, sidecar), seed=seed)


def _exported_io(name: str, record: Mapping[str, Any]) -> _GroupIO:
    observation = record["observation"]
    if any(part["pool"] > 1 for part in observation["layout"]):
        raise CheckpointError(
            f"group '{name}' of this export reads pooled images; load the run directory instead, whose "
            "env flattens them"
        )
    space = _action_space(record["action_space"])
    noise = None
    if "noise" in record["inputs"]:
        kind = "normal" if isinstance(space, gym.spaces.Box) else "uniform"
        noise = (kind, tuple(record["inputs"]["noise"]["shape"][2:]))
    return _GroupIO(
        agents=tuple(record["agents"]),
        obs_dim=int(observation["dim"]),
        obs_dtype=np.dtype(observation["dtype"]),
        mask_dim=int(record["inputs"].get("action_mask", {"shape": [0, 0, 0]})["shape"][2]),
        mask_source=record["action_mask"],
        carry_size=int(record["carry_size"]),
        flatten=_row_of(observation),
        to_env=action_converter(space),
        noise=noise,
    )


def _row_of(observation: Mapping[str, Any]) -> Callable[[Any], np.ndarray]:
    """An observation flattened as an export's layout says: each part (by key in a Dict) in order."""
    keys = [part["key"] for part in observation["layout"]]
    dtype = np.dtype(observation["dtype"])

    def row(raw: Any) -> np.ndarray:
        if isinstance(raw, Mapping) and "observation" in raw and "action_mask" in raw:
            raw = raw["observation"]
        if not keys or keys == [None]:
            return np.asarray(raw).astype(dtype, copy=False).reshape(-1)
        return np.concatenate([np.asarray(raw[key]).reshape(-1) for key in keys]).astype(dtype, copy=False)

    return row


def _action_space(record: Mapping[str, Any]) -> gym.Space:
    """An action space from `policy.json`."""
    if record["kind"] == "Discrete":
        return gym.spaces.Discrete(record["n"], start=record["start"])
    if record["kind"] == "MultiDiscrete":
        return gym.spaces.MultiDiscrete(record["nvec"], start=record["start"])
    return gym.spaces.Box(np.array(record["low"], np.float32), np.array(record["high"], np.float32))
