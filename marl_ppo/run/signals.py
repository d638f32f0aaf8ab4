"""Graceful stop: Ctrl-C or SIGTERM lets the current update finish, then the run checkpoints and exits."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """Training stopped on a signal after writing a checkpoint; `exit_status` is 128 + the signal number."""

    def __init__(self, signum: int, *, run_dir: Path, checkpoint: Path, env_steps: int) -> None:
        self.signum = signum
        self.run_dir = run_dir
        self.checkpoint = checkpoint
        self.env_steps = env_steps
        super().__init__(
            f"stopped by {signal.Signals(signum).name} at env step {env_steps}, checkpoint {checkpoint}; "
            f"continue with: marl-ppo train --resume {run_dir}"
        )

    @property
    def exit_status(self) -> int:
        """The shell convention for a process ended by a signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


class StopSignals:
    """While active, the first SIGINT/SIGTERM sets `received`; a second one raises KeyboardInterrupt at once.

    Signal handlers can only be installed from the main thread; elsewhere this does nothing.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:
            raise KeyboardInterrupt  # asked twice: stop now, without a checkpoint
        self.received = signum
        print(
            f"\n{signal.Signals(signum).name}: finishing this update, then writing a checkpoint "
            "(send it again to abort without one)",
            file=sys.stderr,
            flush=True,
        )
