"""A VMAS simulator's per-copy state: every tensor whose first dim is its copies.

Found by walking the simulator's objects (`per_copy_tensor_paths`), it is copied between copies and
simulators (`copy_copies`), saved and loaded for an exact resume (`save_copies`, `load_copies`),
and gives finished copies their next initial state from a spare simulator's batched reset
(`FreshCopies`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

Path = tuple[tuple[str, Any], ...]
"""Steps from a simulator to one of its tensors: `("attr", name)`, `("item", i)` of a list or tuple,
`("value", i)`, the i-th value of a dict (dicts keyed by entity objects differ between simulators)."""


def _is_simulator_object(obj: Any) -> bool:
    """VMAS's own objects and users' subclasses of them (scenarios, entities, sensors)."""
    return hasattr(obj, "__dict__") and any(
        (cls.__module__ or "").startswith("vmas.") for cls in type(obj).__mro__
    )


def per_copy_tensor_paths(env: Any, num_envs: int) -> list[Path]:
    """Where `env` keeps a tensor whose first dim is its copies: positions, velocities, goals, the
    scenario's per-copy fields, the step counter. Each tensor is listed once, at its first path."""
    paths: list[Path] = []
    seen: set[int] = set()

    def walk(obj: Any, path: Path) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.ndim and obj.shape[0] == num_envs and obj.stride(0) != 0:  # stride 0: one value, expanded
                paths.append(path)
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                walk(item, (*path, ("item", i)))
        elif isinstance(obj, dict):
            for i, item in enumerate(obj.values()):
                walk(item, (*path, ("value", i)))
        elif _is_simulator_object(obj):
            for name, item in vars(obj).items():
                walk(item, (*path, ("attr", name)))

    walk(env, ())
    return paths


def _resolve(obj: Any, path: Path) -> Any:
    for kind, key in path:
        if kind == "attr":
            obj = getattr(obj, key)
        elif kind == "item":
            obj = obj[key]
        else:
            obj = list(obj.values())[key]
    return obj


def _tensor_at(obj: Any, path: Path) -> torch.Tensor:
    """The tensor at `path` in a simulator; LookupError naming the path where there is none."""
    try:
        value = _resolve(obj, path)
    except (AttributeError, LookupError) as err:
        raise LookupError(f"the simulator has no {_describe(path)} ({err!r})") from err
    if not isinstance(value, torch.Tensor):
        raise LookupError(f"the simulator's {_describe(path)} is a {type(value).__name__}, not a tensor")
    return value


def copy_copies(
    source: Any, source_index: torch.Tensor, target: Any, target_index: torch.Tensor, paths: Sequence[Path]
) -> None:
    """Give the copies `target_index` of simulator `target` the state of the copies `source_index` of
    `source` (the same scenario; they may be the same simulator). Raises LookupError, before writing
    anything, where a path is missing or its tensors differ in shape."""
    pairs = [(_tensor_at(target, path), _tensor_at(source, path)) for path in paths]
    for path, (to, frm) in zip(paths, pairs, strict=True):
        if to.shape[1:] != frm.shape[1:]:
            raise LookupError(f"the simulators' {_describe(path)} differ in shape")
    for to, frm in pairs:
        to.index_copy_(0, target_index, frm.index_select(0, source_index))


def save_copies(env: Any, paths: Sequence[Path]) -> dict[str, Any]:
    """Every copy's state in `env` (the tensors at `paths`), on the CPU, for `load_copies`."""
    return {"paths": list(paths), "tensors": [_tensor_at(env, path).detach().cpu().clone() for path in paths]}


def load_copies(env: Any, saved: dict[str, Any]) -> None:
    """Write `save_copies`' tensors back into `env`, a simulator of the same scenario and settings.
    Raises LookupError, before writing anything, where a path is missing or its tensor differs."""
    targets = [_tensor_at(env, path) for path in saved["paths"]]
    for path, to, tensor in zip(saved["paths"], targets, saved["tensors"], strict=True):
        if to.shape != tensor.shape or to.dtype != tensor.dtype:
            raise LookupError(
                f"the saved {_describe(path)} is {tuple(tensor.shape)} {tensor.dtype}, "
                f"this simulator's {tuple(to.shape)} {to.dtype}"
            )
    with torch.no_grad():
        for to, tensor in zip(targets, saved["tensors"], strict=True):
            to.copy_(tensor.to(to.device))


def _describe(path: Path) -> str:
    return "".join(f".{key}" if kind == "attr" else f"[{key}]" for kind, key in path).lstrip(".")


@contextlib.contextmanager
def random_streams_kept(env: Any) -> Iterator[None]:
    """Leave torch's global streams and VMAS's own (one set shared by all its simulators) as they were."""
    found = getattr(env, "vmas_random_state", None)
    vmas_streams: list[Any] = found if isinstance(found, list) else []  # none to keep: an empty list
    saved = list(vmas_streams)
    devices = [env.device] if torch.device(env.device).type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        vmas_streams[:] = saved


class FreshCopies:
    """Initial states for copies whose episode ended, taken from a spare simulator of the same
    scenario that resets all its copies at once: one batched reset, and one observation pass, per
    `num_envs` episodes.

    A copy's state is taken to be every tensor of the simulator whose first dim is its copies
    (`per_copy_tensor_paths`), and its observations to depend on that state alone, so a copied
    copy's first observations are the spare's. `check` tests both for the scenario: copies given
    other copies' state must then observe what those observe, and under the same actions produce
    their observations, rewards and ends. A scenario that keeps per-copy state elsewhere (a Python
    list, a tensor laid out another way) fails it.
    """

    def __init__(self, spare: Any) -> None:
        self.spare = spare
        self.num_envs = int(spare.num_envs)
        self.paths = per_copy_tensor_paths(spare, self.num_envs)
        self.next = self.num_envs
        """The spare's next unused copy; `num_envs` when none is left (the next `copy_into` resets it)."""
        self.observations: dict[str, torch.Tensor] = {}
        """Every agent's observations of the spare's copies right after its last reset."""

    def copy_into(self, env: Any, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Start new episodes in the copies `index` of `env` (fewer than `num_envs`); return their
        first observations, `(len(index), ...)` per agent."""
        count = len(index)
        if self.next + count > self.num_envs:
            self.observations = self.spare.reset()
            self.next = 0
        fresh = torch.arange(self.next, self.next + count, device=index.device)
        copy_copies(self.spare, fresh, env, index, self.paths)
        self.next += count
        return {agent: obs[self.next - count : self.next] for agent, obs in self.observations.items()}

    def discard(self) -> None:
        """Drop the unused fresh copies: the next `copy_into` resets the spare first."""
        self.next = self.num_envs

    def state_dict(self) -> dict[str, Any]:
        """The spare's copies, which of them are still unused, and their first observations (CPU)."""
        return {
            "spare": save_copies(self.spare, self.paths),
            "next": self.next,
            "observations": {agent: obs.cpu().clone() for agent, obs in self.observations.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` into this spare (the same scenario and settings)."""
        load_copies(self.spare, state["spare"])
        self.next = int(state["next"])
        device = self.spare.device
        self.observations = {agent: obs.to(device) for agent, obs in state["observations"].items()}

    def check(self, steps: int = 4) -> str | None:
        """None when copying reproduces the scenario's dynamics, else what differed.

        After 3 random steps (the copies' states part ways, and tensors that only stepping creates
        exist), the first half of the spare's copies is copied onto the second half. The halves must
        then observe the same, and under the same random actions for `steps` steps give the same
        observations, rewards and ends. Every random stream is left as it was."""
        half = self.num_envs // 2
        if half == 0:
            return "it needs 2 copies or more"
        source = torch.arange(half, device=self.spare.device)
        with random_streams_kept(self.spare):
            torch.manual_seed(0)
            return self._check(source, source + half, steps)

    def _check(self, source: torch.Tensor, target: torch.Tensor, steps: int) -> str | None:
        for _ in range(3):
            self.spare.step(self.spare.get_random_actions())
        self.paths = per_copy_tensor_paths(self.spare, self.num_envs)  # with what stepping creates
        try:
            copy_copies(self.spare, source, self.spare, target, self.paths)
        except (LookupError, RuntimeError) as err:
            return str(err)
        (observations,) = self.spare.get_from_scenario(
            get_observations=True, get_rewards=False, get_infos=False, get_dones=False
        )
        if not all(_halves_agree(t, source, target) for t in _tensors(observations)):
            return "the copied copies' observations differed right after the copy"
        for step in range(1, steps + 1):
            actions = [a.index_copy(0, target, a[source]) for a in self.spare.get_random_actions()]
            observations, rewards, terminated, truncated, _ = self.spare.step(actions)
            results = {"observations": observations, "rewards": rewards, "ends": (terminated, truncated)}
            for what, result in results.items():
                if not all(_halves_agree(t, source, target) for t in _tensors(result)):
                    return f"the copied copies' {what} differed {step} step(s) later"
        return None


def _tensors(result: Any) -> Iterator[torch.Tensor]:
    values = result.values() if isinstance(result, dict) else result
    for value in values:
        if isinstance(value, (dict, list, tuple)):
            yield from _tensors(value)
        else:
            yield value


def _halves_agree(tensor: torch.Tensor, source: torch.Tensor, target: torch.Tensor) -> bool:
    a, b = tensor[source], tensor[target]
    if a.is_floating_point():
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    return torch.equal(a, b)


def vmas_streams(env: Any) -> list[Any] | None:
    """A copy of VMAS's own random streams (torch, NumPy, Python; shared by all its simulators)."""
    streams = getattr(env, "vmas_random_state", None)
    return list(streams) if isinstance(streams, list) else None
