"""Out-of-process vector env: worker processes step contiguous slices of the envs.

`SubprocessVectorEnv` has the interface and the semantics of `SyncVectorEnv`. Every array it
exchanges with its workers (the `TeamArrays`, one action array per group and `episode_over`) is a
numpy view of one shared-memory buffer, so a step costs one tiny command and one acknowledgement
per worker over a pipe; no array data is pickled. Workers build their own adapters with
`make_adapter()`, which must be picklable unless the start method is 'fork'. Starting, commanding
and stopping the workers (and noticing one that fails, dies or hangs) is `marl_ppo.envs.vector.pool`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from marl_ppo.envs.adapters.contract import check_finite
from marl_ppo.envs.adapters.pettingzoo import ParallelEnvAdapter
from marl_ppo.envs.spec import TeamArrays, TeamSpec
from marl_ppo.envs.vector.pool import WorkerPool, context, split_envs
from marl_ppo.envs.vector.state import dump_env_state, gathered_states, load_env_state, states_or_reason

_ALIGN = 64


class _Carver:
    """Hands out consecutive aligned numpy views of a buffer (or, without one, just counts bytes)."""

    def __init__(self, buffer: Any | None) -> None:
        self.buffer = buffer
        self.nbytes = 0

    def __call__(self, template: np.ndarray) -> np.ndarray:
        start = -(-self.nbytes // _ALIGN) * _ALIGN
        self.nbytes = start + template.nbytes
        if self.buffer is None:
            return template
        view = np.frombuffer(self.buffer, template.dtype, template.size, start)
        return view.reshape(template.shape)


def _shared_views(
    spec: TeamSpec, num_envs: int, buffer: Any | None
) -> tuple[TeamArrays[np.ndarray], dict[str, np.ndarray], np.ndarray, int]:
    """Arrays, per-group actions and episode_over laid out in `buffer`, plus the bytes they need."""
    carve = _Carver(buffer)
    arrays = TeamArrays.allocate(spec, (num_envs,)).map(carve)
    actions = {
        g.name: carve(np.zeros((num_envs, g.num_agents, *g.action_shape), g.action_dtype))
        for g in spec.groups
    }
    episode_over = carve(np.zeros(num_envs, dtype=bool))
    return arrays, actions, episode_over, carve.nbytes


class _EnvSlice:
    """A worker's env copies `envs`, stepped on command in the shared buffer (built in the worker)."""

    def __init__(
        self,
        make_adapter: Callable[[], ParallelEnvAdapter],
        spec: TeamSpec,
        num_envs: int,
        envs: range,
        buffer: Any,
    ) -> None:
        self.make_adapter = make_adapter
        self.spec = spec
        self.envs = envs
        arrays, self.actions, self.episode_over, _ = _shared_views(spec, num_envs, buffer)
        self.adapters: list[ParallelEnvAdapter] = []
        self.rows = [arrays.row(i) for i in envs]
        self.block = arrays.row(slice(envs.start, envs.stop))
        self.ended = self.episode_over[envs.start : envs.stop]

    def __call__(self, command: str, argument: Any) -> Any:
        """Run `command`; the reply payload is None except for 'get_state'."""
        envs, adapters, rows, episode_over = self.envs, self.adapters, self.rows, self.episode_over
        if command == "start":
            self._replace([self.make_adapter() for _ in envs])
        elif command == "reset":
            for i, adapter, row in zip(envs, adapters, rows, strict=True):
                adapter.reset(argument + i, row)
                episode_over[i] = False
            check_finite(self.block, adapters, self.ended, state=self.spec.state_from_env)
        elif command == "step":
            for i, adapter, row in zip(envs, adapters, rows, strict=True):
                over = adapter.step({name: a[i] for name, a in self.actions.items()}, row)
                episode_over[i] = over
                if over:
                    adapter.reset(None, row)
            check_finite(self.block, adapters, self.ended, state=self.spec.state_from_env)
        elif command == "get_state":
            return states_or_reason(lambda: [dump_env_state(adapter) for adapter in adapters])
        elif command == "set_state":
            for adapter in adapters:
                adapter.close()
            self._replace([load_env_state(blob) for blob in argument])
        elif command == "close":
            for adapter in adapters:
                adapter.close()
        else:
            raise ValueError(f"unknown command {command!r}")
        return None

    def _replace(self, adapters: list[ParallelEnvAdapter]) -> None:
        """Step `adapters` from now on, each told its copy index in the run (named in contract errors)."""
        for i, adapter in zip(self.envs, adapters, strict=True):
            adapter.copy_index = i
        self.adapters = adapters


class SubprocessVectorEnv:
    """Steps `num_envs` copies in `rollout.num_workers` processes; same results as `SyncVectorEnv`, in shared memory."""

    tensor_io = False
    """Actions go in and results come out as NumPy arrays."""

    def __init__(
        self,
        make_adapter: Callable[[], ParallelEnvAdapter],
        num_envs: int,
        num_workers: int,
        start_method: str | None = None,
        timeout_s: float | None = None,
        spec: TeamSpec | None = None,
    ) -> None:
        """`spec`: the copies' team layout where the caller has it (a run's plan); None builds a copy
        here to read it."""
        if num_envs < 1 or num_workers < 1:
            raise ValueError(f"num_envs ({num_envs}) and num_workers ({num_workers}) must be at least 1")
        if spec is None:
            probe = make_adapter()
            spec = probe.spec
            probe.close()
        self.spec: TeamSpec = spec
        self.num_envs = num_envs
        self.timeout_s = timeout_s
        """Seconds a worker may take to answer a command before it counts as hung; None waits forever."""
        ctx = context(start_method)
        nbytes = _shared_views(self.spec, num_envs, None)[3]
        self._buffer = ctx.RawArray("b", max(nbytes, 1))
        self.arrays, self._actions, self.episode_over, _ = _shared_views(self.spec, num_envs, self._buffer)
        self._slices = split_envs(num_envs, min(num_workers, num_envs))
        args = [(make_adapter, self.spec, num_envs, envs, self._buffer) for envs in self._slices]
        self._pool = WorkerPool("SubprocessVectorEnv", ctx, _EnvSlice, args, "marl_ppo-env-worker", timeout_s)
        self._processes = self._pool.processes  # in worker order (tests watch and kill them)

    def reset(self, seed: int) -> TeamArrays[np.ndarray]:
        """Reset env i with `seed + i`; later auto-resets continue each env's own RNG."""
        self._command("reset", seed)
        return self.arrays

    def step(self, actions: Mapping[str, np.ndarray]) -> TeamArrays[np.ndarray]:
        """Step every env with `actions[group]` of shape `(E, A_g, ...)`; reset the envs whose episode ended."""
        for name, shared in self._actions.items():
            shared[...] = actions[name]
        self._command("step", None)
        return self.arrays

    def close(self) -> None:
        """Close every env and stop the workers (also done on garbage collection and at exit)."""
        self._pool.close()

    def env_states(self) -> list[bytes]:
        """Each env copy's complete state, pickled; raises EnvStateError when the env cannot be pickled."""
        return gathered_states(self._command("get_state", None))

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Replace the env copies by the ones `env_states` saved (trusted bytes only: unpickling runs code)."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} env copies")
        self._pool.ask("set_state", [list(states[envs.start : envs.stop]) for envs in self._slices])

    def _command(self, command: str, argument: Any) -> list[Any]:
        """Send every worker the same command; their replies in worker order."""
        return self._pool.ask(command, [argument] * len(self._slices))
