"""Worker processes driven over pipes: the plumbing `SubprocessVectorEnv` and `RolloutWorkers` share.

Each worker runs `serve`, which builds the pool's handler and answers commands with it. The parent
sends `(command, argument)`; the worker replies `(status, payload)`: 'ok' with what the handler
returned, 'contract' (an EnvContractError) or 'error' (any other exception) with `(message,
traceback)`. The first command, 'start', is implied; 'close' is the last. The parent's side is a
`WorkerPool`: it gathers the replies within a time limit, notices a worker that died or hung, and
on any failure stops every worker before it raises, so no pool runs on with some of its envs gone.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import sys
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias, cast

from marl_ppo.envs.adapters.contract import EnvContractError
from marl_ppo.faults import WorkerError, one_line

if TYPE_CHECKING:
    from multiprocessing.context import DefaultContext, ForkContext, ForkServerContext, SpawnContext

    ProcessContext: TypeAlias = DefaultContext | SpawnContext | ForkContext | ForkServerContext
    """A concrete multiprocessing context: the base class has no `Process`."""

_CLOSE_TIMEOUT_S = 5.0

Handler = Callable[[str, Any], Any]
"""Runs one command in a worker: `handler(command, argument)` returns the reply payload, raises on failure."""


class RemoteTraceback(Exception):
    """A worker's traceback, chained under the error raised in the parent (shown with --debug)."""


def serve(conn: Connection, parent_end: Connection, make_handler: Callable[..., Handler], *args: Any) -> None:
    """A worker's main: answer commands with `make_handler(*args)` until 'close' or the parent is gone.

    The handler is built here, in the worker, because what it holds (numpy views of shared memory,
    envs, a model) must not be pickled across.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # so is SIGTERM sent to the whole process group
    parent_end.close()
    handler = make_handler(*args)
    command, argument = "start", None
    while True:
        try:
            reply = ("ok", handler(command, argument))
        except EnvContractError as err:  # the parent raises it again, as one process would
            reply = ("contract", (str(err), traceback.format_exc()))
        except Exception as err:  # reported to the parent, which raises it there
            reply = ("error", (f"{type(err).__name__}: {one_line(err)}", traceback.format_exc()))
        try:
            conn.send(reply)
            if command == "close":
                return
            command, argument = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            return


FORK_UNSAFE_MODULES = ("jax", "jaxlib", "tensorflow")
"""Libraries whose thread pools do not survive a fork: a forked child that uses them can hang on a
lock that a parent's thread held at the fork (JAX's XLA runtime does)."""


def fork_unsafe_reason() -> str | None:
    """Why forking this process now would leave its children unsafe, or None where a fork is safe."""
    loaded = [name for name in FORK_UNSAFE_MODULES if name in sys.modules]
    if loaded:
        return f"{loaded[0]} is loaded (its threads do not survive a fork)"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised (a forked child cannot use it)"
    return None


def default_start_method() -> str | None:
    """'fork' where there is one and it is safe (fast: children inherit the parent's modules), else
    'spawn' (children start a fresh interpreter, so threaded libraries start clean there); None:
    the platform's default."""
    if "fork" not in mp.get_all_start_methods():
        return None
    return "spawn" if fork_unsafe_reason() else "fork"


def context(start_method: str | None) -> ProcessContext:
    """The multiprocessing context for `start_method`; None: `default_start_method()`.

    Forked workers inherit the parent's modules and need nothing pickled but their commands; spawned
    ones are sent their factories pickled and import what those need.
    """
    if start_method is None:
        start_method = default_start_method()
    # get_context returns a concrete context; typeshed types a `str` method's as the base class
    return cast("ProcessContext", mp.get_context(start_method))


def split_envs(num_envs: int, num_workers: int) -> list[range]:
    """Contiguous, near-equal slices of the env copies, one per worker."""
    bounds = [round(k * num_envs / num_workers) for k in range(num_workers + 1)]
    return [range(bounds[k], bounds[k + 1]) for k in range(num_workers)]


def start_worker(
    ctx: ProcessContext, target: Callable[..., None], args: tuple, name: str
) -> tuple[BaseProcess, Connection]:
    """Start `target(child_conn, parent_conn, *args)` as a daemon process; return it and the parent's end."""
    parent_end, child_end = ctx.Pipe()
    process = ctx.Process(target=target, args=(child_end, parent_end, *args), name=name, daemon=True)
    process.start()
    child_end.close()
    return process, parent_end


def shutdown(processes: list[BaseProcess], conns: list[Connection]) -> None:
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


def raise_failure(owner: str, k: int, status: str, message: str, trace: str | None, command: str) -> NoReturn:
    """Raise worker `k`'s reported failure: the env's contract error as is, anything else as WorkerError."""
    if status == "contract":
        raise EnvContractError(message) from RemoteTraceback(trace)
    raise WorkerError(f"{owner}: worker {k} failed during '{command}': {message}") from RemoteTraceback(trace)


def _receive(conn: Connection) -> tuple[str, Any]:
    """The worker's reply, or ('dead', None) when its end of the pipe is closed without one."""
    try:
        return conn.recv() if conn.poll() else ("dead", None)
    except (EOFError, OSError):
        return "dead", None


class WorkerPool:
    """The parent's side of one worker per handler: commands out, replies gathered within a time limit."""

    def __init__(
        self,
        owner: str,
        ctx: ProcessContext,
        make_handler: Callable[..., Handler],
        handler_args: Sequence[tuple],
        name: str,
        timeout_s: float | None,
        timeout_name: str = "rollout.worker_timeout_s",
    ) -> None:
        """Start worker k (process `f"{name}-{k}"`) serving `make_handler(*handler_args[k])`; wait for 'start'.

        `owner` begins every error message; `timeout_name` names the limit in a hang's message.
        """
        self.owner = owner
        self.timeout_s = timeout_s
        """Seconds (per step, see `gather`) a worker may take to answer before it counts as hung; None: forever."""
        self.timeout_name = timeout_name
        self.processes: list[BaseProcess] = []
        self.conns: list[Connection] = []
        self._closer = weakref.finalize(self, shutdown, self.processes, self.conns)
        for k, args in enumerate(handler_args):
            process, conn = start_worker(ctx, serve, (make_handler, *args), f"{name}-{k}")
            self.processes.append(process)
            self.conns.append(conn)
        self.gather("start")

    @property
    def alive(self) -> bool:
        """False once the workers were stopped (closed, garbage-collected or after a failure)."""
        return self._closer.alive

    def close(self) -> None:
        """Stop the workers (idempotent; also done on garbage collection and at exit)."""
        self._closer()

    def ask(self, command: str, arguments: Sequence[Any]) -> list[Any]:
        """Send worker k `(command, arguments[k])`; the workers' reply payloads in worker order."""
        self.send(command, arguments)
        return self.gather(command)

    def send(self, command: str, arguments: Sequence[Any]) -> None:
        """Send worker k `(command, arguments[k])` without waiting for the replies."""
        if not self.alive:
            raise RuntimeError(f"{self.owner} is closed")
        for k, (conn, argument) in enumerate(zip(self.conns, arguments, strict=True)):
            try:
                conn.send((command, argument))
            except OSError:
                self._fail(death_message(self.processes[k], k, command))

    def gather(self, command: str, steps: int = 1) -> list[Any]:
        """Every worker's reply payload, in worker order; raise (after stopping all) on error, death or a hang.

        A worker may take `timeout_s` per step: `steps` for a command that runs many env steps.
        """
        replies: dict[int, Any] = {}
        failures = []
        limit = None if self.timeout_s is None else self.timeout_s * steps
        deadline = None if limit is None else time.monotonic() + limit
        while len(replies) < len(self.conns):
            pending = [k for k in range(len(self.conns)) if k not in replies]
            waiting = [self.conns[k] for k in pending] + [self.processes[k].sentinel for k in pending]
            ready = wait(waiting, None if deadline is None else max(0.0, deadline - time.monotonic()))
            if not ready:
                described = f"{limit:g} s ({self.timeout_name})"
                self._fail(hang_message(self.processes, pending, command, described))
            for k in pending:
                if self.conns[k] not in ready and self.processes[k].sentinel not in ready:
                    continue
                status, payload = _receive(self.conns[k])
                if status == "dead":
                    self._fail(death_message(self.processes[k], k, command))
                if status != "ok":
                    failures.append((k, status, *payload))
                replies[k] = payload
        if failures:
            k, status, message, trace = min(failures)  # the lowest worker's failure; every worker is stopped
            self.close()
            raise_failure(self.owner, k, status, message, trace, command)
        return [replies[k] for k in range(len(self.conns))]

    def _fail(self, message: str) -> NoReturn:
        self.close()
        raise WorkerError(f"{self.owner}: {message}")
