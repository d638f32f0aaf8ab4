"""Graceful stop: Ctrl-C or SIGTERM lets the current update finish, then the run checkpoints and exits.

An update that is not done `StopSignals.GRACE_S` after the signal (a batched simulator's rollout of
100,000 steps, a CNN update over many frames) is dropped instead, so that a stop is answered within
seconds whatever the update's size: the run keeps the last complete one.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; `exit_status` is 128 + the signal number."""

    def __init__(
        self, signum: int, *, run_dir: Path, checkpoint: Path, env_steps: int, dropped: bool = False
    ) -> None:
        """`dropped`: the update under way was given up (see `StopSignals.droppable`)."""
        self.signum = signum
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.env_steps = env_steps
        how = (
            " (the update under way was dropped to stop at once; on resume the env copies start fresh episodes)"
            if dropped
            else ""
        )
        super().__init__(
            f"stopped by {signal.Signals(signum).name} at env step {env_steps}{how}, checkpoint {checkpoint}; "
            f"continue with: marl-ppo train --resume {run_dir}"
        )

    @property
    def exit_status(self) -> int:
        """The shell convention for a process ended by a signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


class UpdateDropped(BaseException):
    """The update under way outlasted a stop signal by `StopSignals.GRACE_S`: it is given up.

    Like KeyboardInterrupt it is no Exception, since it may be raised inside an env's or a library's
    code, whose `except Exception` must not take it for their own failure."""


class StopSignals:
    """While active, the first SIGINT/SIGTERM sets `received`; a second one raises KeyboardInterrupt at once.

    The same signal again within `REPEAT_S` of the first is the same request, not a second one:
    `timeout -s INT` sends its signal to the process and then to its whole process group, so the
    process receives it twice, and on a busy machine the handler can run between the two.

    Signal handlers can only be installed from the main thread; elsewhere this does nothing.
    """

    REPEAT_S = 1.0
    GRACE_S = 2.0
    """How long an update inside `droppable()` may go on after a stop signal before it is dropped."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._received_at = 0.0
        self._previous: dict[int, Any] = {}
        self._droppable = False

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in (*STOP_SIGNALS, signal.SIGALRM):
                handler = self._grace_over if signum == signal.SIGALRM else self._handle
                self._previous[signum] = signal.signal(signum, handler)
        return self

    @contextlib.contextmanager
    def droppable(self) -> Iterator[None]:
        """Inside, a stop signal that the block outlasts by GRACE_S raises UpdateDropped in it (at the
        next Python step: between env steps, minibatches or a worker's replies)."""
        if not self._previous:  # no handlers (not the main thread): nothing can arrive
            yield
            return
        self._droppable = True
        try:
            yield
        finally:
            self._droppable = False
            signal.setitimer(signal.ITIMER_REAL, 0.0)

    def _grace_over(self, signum: int, frame: FrameType | None) -> None:
        if self._droppable:
            self._droppable = False
            raise UpdateDropped

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self.received is not None and self._previous:  # a repeat still on its way is the same request
            time.sleep(max(0.0, self._received_at + self.REPEAT_S - time.monotonic()))
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            if signum == self.received and time.monotonic() - self._received_at < self.REPEAT_S:
                return  # the same request delivered twice (to the process, then to its group)
            raise KeyboardInterrupt  # asked twice: stop now, without a checkpoint
        self.received, self._received_at = signum, time.monotonic()
        if self._droppable:
            signal.setitimer(signal.ITIMER_REAL, self.GRACE_S)
        print(
            f"\n{signal.Signals(signum).name}: finishing this update (or dropping it if it takes over "
            f"{self.GRACE_S:g} s), then writing a checkpoint (send it again to abort without one)",
            file=sys.stderr,
            flush=True,
        )
