"""Out-of-process vector env: worker processes step contiguous slices of the envs.

`SubprocessVectorEnv` has the interface and the semantics of `SyncVectorEnv`. Every array it
exchanges with its workers (the `TeamArrays`, one action array per group and `episode_over`) is a
numpy view of one shared-memory buffer, so a step costs one tiny command and one acknowledgement
per worker over a pipe; no array data is pickled. Workers build their own adapters with
`make_adapter()`, which must be picklable unless the start method is 'fork'.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import fields
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import numpy as np

from marl_ppo.envs.contract import check_finite
from marl_ppo.envs.pettingzoo import EnvContractError, ParallelEnvAdapter, TeamArrays
from marl_ppo.envs.spec import TeamSpec
from marl_ppo.envs.state import EnvStateError, dump_env_state, load_env_state
from marl_ppo.faults import WorkerError, one_line

_ALIGN = 64
_CLOSE_TIMEOUT_S = 5.0


class RemoteTraceback(Exception):
    """A worker's traceback, chained under the error raised in the parent (shown with --debug)."""


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
) -> tuple[TeamArrays, list[np.ndarray], np.ndarray, int]:
    """Arrays, per-group actions and episode_over laid out in `buffer`, plus the bytes they need."""
    carve = _Carver(buffer)
    template = TeamArrays.allocate(spec, (num_envs,))
    arrays = TeamArrays(
        **{
            f.name: [carve(a) for a in value] if isinstance(value, list) else carve(value)
            for f in fields(TeamArrays)
            for value in [getattr(template, f.name)]
        }
    )
    actions = [
        carve(np.zeros((num_envs, g.num_agents, *g.action_shape), g.action_dtype)) for g in spec.groups
    ]
    episode_over = carve(np.zeros(num_envs, dtype=bool))
    return arrays, actions, episode_over, carve.nbytes


def _worker(
    conn: Connection,
    parent_end: Connection,
    make_adapter: Callable[[], ParallelEnvAdapter],
    spec: TeamSpec,
    num_envs: int,
    envs: range,
    buffer: Any,
) -> None:
    """Step the envs `envs` on command, writing into the shared buffer; acknowledge each command."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so is SIGTERM sent to the whole process group
    parent_end.close()
    arrays, actions, episode_over, _ = _shared_views(spec, num_envs, buffer)
    adapters: list[ParallelEnvAdapter] = []
    rows = [arrays.row(i) for i in envs]
    block, ended = arrays.row(slice(envs.start, envs.stop)), episode_over[envs.start : envs.stop]
    command, argument = "start", None
    while True:
        reply: tuple[str, Any, str | None] = ("ok", None, None)
        try:
            if command == "start":
                adapters = [make_adapter() for _ in envs]
                for i, adapter in zip(envs, adapters, strict=True):
                    adapter.copy_index = i
            elif command == "reset":
                for i, adapter, row in zip(envs, adapters, rows, strict=True):
                    adapter.reset(argument + i, row)
                    episode_over[i] = False
                check_finite(block, adapters, ended, state=spec.state_from_env)
            elif command == "step":
                for i, adapter, row in zip(envs, adapters, rows, strict=True):
                    over = adapter.step([a[i] for a in actions], row)
                    episode_over[i] = over
                    if over:
                        adapter.reset(None, row)
                check_finite(block, adapters, ended, state=spec.state_from_env)
            elif command == "get_state":
                try:
                    reply = ("ok", [dump_env_state(adapter) for adapter in adapters], None)
                except EnvStateError as err:  # not a failure of the worker: the parent falls back
                    reply = ("ok", str(err), None)
            elif command == "set_state":
                for adapter in adapters:
                    adapter.close()
                adapters = [load_env_state(blob) for blob in argument]
                for i, adapter in zip(envs, adapters, strict=True):
                    adapter.copy_index = i
            elif command == "close":
                for adapter in adapters:
                    adapter.close()
            else:
                raise ValueError(f"unknown command {command!r}")
        except EnvContractError as err:  # the parent raises it again, as the sync env would
            reply = ("contract", str(err), traceback.format_exc())
        except Exception as err:  # reported to the parent, which raises it there
            reply = ("error", f"{type(err).__name__}: {one_line(err)}", traceback.format_exc())
        try:
            conn.send(reply)
            if command == "close":
                return
            command, argument = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return


def _shutdown(processes: list[BaseProcess], conns: list[Connection]) -> None:
    """Ask every worker to close, wait a little, then terminate (and kill) any straggler."""
    for conn, process in zip(conns, processes, strict=True):
        if process.is_alive():
            with contextlib.suppress(OSError):  # its pipe is already broken
                conn.send(("close", None))
    deadline = time.monotonic() + _CLOSE_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()


def split_envs(num_envs: int, num_workers: int) -> list[range]:
    """Contiguous, near-equal slices of the env copies, one per worker."""
    bounds = [round(k * num_envs / num_workers) for k in range(num_workers + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(num_workers)]


def start_worker(
    ctx: Any, target: Callable[..., None], args: tuple, name: str
) -> tuple[BaseProcess, Connection]:
    """Start `target(child_conn, parent_conn, *args)` as a daemon process; return it and the parent's end."""
    parent_end, child_end = ctx.Pipe()
    process = ctx.Process(target=target, args=(child_end, parent_end, *args), name=name, daemon=True)
    process.start()
    child_end.close()
    return process, parent_end


def death_message(process: BaseProcess, k: int, command: str) -> str:
    """Describe worker `k`'s death (waiting briefly so that its exit code is known)."""
    process.join(1.0)
    return f"worker {k} ({process.name}, pid {process.pid}) died during '{command}' (exit code {process.exitcode})"


def hang_message(processes: Sequence[BaseProcess], pending: Sequence[int], command: str, limit: str) -> str:
    """Kill the workers `pending` that did not answer (a hung one would not obey 'close'); say so."""
    names = ", ".join(f"worker {k} (pid {processes[k].pid})" for k in pending)
    for k in pending:
        processes[k].kill()
    return f"{names} did not answer '{command}' within {limit}; an env hung, every worker was stopped"


def raise_failure(owner: str, k: int, status: str, message: str, trace: str | None, command: str) -> None:
    """Raise worker `k`'s reported failure: the env's contract error as is, anything else as WorkerError."""
    if status == "contract":
        raise EnvContractError(message) from RemoteTraceback(trace)
    raise WorkerError(f"{owner}: worker {k} failed during '{command}': {message}") from RemoteTraceback(trace)


class SubprocessVectorEnv:
    """Steps `num_envs` copies in `num_workers` processes; same interface and results as `SyncVectorEnv`."""

    def __init__(
        self,
        make_adapter: Callable[[], ParallelEnvAdapter],
        num_envs: int,
        num_workers: int,
        start_method: str | None = None,
        timeout_s: float | None = None,
    ) -> None:
        if num_envs < 1 or num_workers < 1:
            raise ValueError(f"num_envs ({num_envs}) and num_workers ({num_workers}) must be at least 1")
        probe = make_adapter()
        self.spec: TeamSpec = probe.spec
        probe.close()
        self.num_envs = num_envs
        self.timeout_s = timeout_s
        """Seconds a worker may take to answer a command before it counts as hung; None waits forever."""
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else None
        ctx = mp.get_context(start_method)
        nbytes = _shared_views(self.spec, num_envs, None)[3]
        self._buffer = ctx.RawArray("b", max(nbytes, 1))
        self.arrays, self._actions, self.episode_over, _ = _shared_views(self.spec, num_envs, self._buffer)
        num_workers = min(num_workers, num_envs)
        self._slices = split_envs(num_envs, num_workers)
        self._processes: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._closer = weakref.finalize(self, _shutdown, self._processes, self._conns)
        for k, envs in enumerate(self._slices):
            args = (make_adapter, self.spec, num_envs, envs, self._buffer)
            process, conn = start_worker(ctx, _worker, args, f"marl_ppo-env-worker-{k}")
            self._processes.append(process)
            self._conns.append(conn)
        self._gather("start")

    def reset(self, seed: int) -> TeamArrays:
        """Reset env i with `seed + i`; later auto-resets continue each env's own RNG."""
        self._command("reset", seed)
        return self.arrays

    def step(self, actions: Sequence[np.ndarray]) -> TeamArrays:
        """Step every env with `actions[g]` of shape `(E, A_g, ...)`; reset the envs whose episode ended."""
        for shared, action in zip(self._actions, actions, strict=True):
            shared[...] = action
        self._command("step", None)
        return self.arrays

    def close(self) -> None:
        """Close every env and stop the workers (also done on garbage collection and at exit)."""
        self._closer()

    def env_states(self) -> list[bytes]:
        """Each env copy's complete state, pickled; raises EnvStateError when the env cannot be pickled."""
        replies = self._ask("get_state", [None] * len(self._conns))
        reasons = [reply for reply in replies if isinstance(reply, str)]
        if reasons:
            raise EnvStateError(reasons[0])
        return [blob for reply in replies for blob in reply]

    def load_env_states(self, states: Sequence[bytes]) -> None:
        """Replace the env copies by the ones `env_states` saved (trusted bytes only: unpickling runs code)."""
        if len(states) != self.num_envs:
            raise ValueError(f"got {len(states)} env states for {self.num_envs} env copies")
        self._ask("set_state", [list(states[envs.start : envs.stop]) for envs in self._slices])

    def _command(self, command: str, seed: int | None) -> None:
        self._ask(command, [seed] * len(self._conns))

    def _ask(self, command: str, arguments: Sequence[Any]) -> list[Any]:
        """Send worker k `(command, arguments[k])`; return the workers' replies in order."""
        if not self._closer.alive:
            raise RuntimeError("SubprocessVectorEnv is closed")
        for k, (conn, argument) in enumerate(zip(self._conns, arguments, strict=True)):
            try:
                conn.send((command, argument))
            except OSError:
                self._fail(self._died(k, command))
        return self._gather(command)

    def _gather(self, command: str) -> list[Any]:
        """Wait for every worker's reply; raise (after stopping all workers) on error, death or a hang."""
        replies: list[Any] = [None] * len(self._conns)
        pending = set(range(len(self._conns)))
        failures: list[tuple[str, int, str | None, str | None]] = []
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while pending:
            waiting = [self._conns[k] for k in pending] + [self._processes[k].sentinel for k in pending]
            ready = wait(waiting, None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not ready:
                self._hung(sorted(pending), command)
            for k in sorted(pending):
                conn, process = self._conns[k], self._processes[k]
                if conn not in ready and process.sentinel not in ready:
                    continue
                status, message, trace = self._receive(conn)
                if status == "dead":
                    self._fail(self._died(k, command))
                if status != "ok":
                    failures.append((status, k, message, trace))
                replies[k] = message
                pending.discard(k)
        if failures:
            status, k, message, trace = min(failures, key=lambda f: f[1])  # lowest worker; all are stopped
            self._closer()
            raise_failure("SubprocessVectorEnv", k, status, message, trace, command)
        return replies

    def _hung(self, pending: list[int], command: str) -> None:
        """Stop every worker after `pending` did not answer within the timeout, and raise."""
        limit = f"{self.timeout_s:g} s (worker_timeout_s)"
        self._fail(hang_message(self._processes, pending, command, limit))

    def _died(self, k: int, command: str) -> str:
        return death_message(self._processes[k], k, command)

    @staticmethod
    def _receive(conn: Connection) -> tuple[str, Any, str | None]:
        """The worker's reply, or ('dead', None, None) when its end of the pipe is closed without one."""
        try:
            return conn.recv() if conn.poll() else ("dead", None, None)
        except (EOFError, OSError):
            return "dead", None, None

    def _fail(self, message: str) -> None:
        self._closer()
        raise WorkerError(f"SubprocessVectorEnv: {message}")
