"""Faults that stop a run after it started: one-line messages, the last checkpoint left intact.

The CLI prints them as one line and exits with status 1 (bad input exits with 2 before any work).
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, arguments, files, an env that breaks its contract): the CLI prints its one
    line and exits with status 2. Each kind lives with its layer and derives from this one, so the
    CLI catches them all without importing those layers."""


class RunFault(RuntimeError):
    """The run stopped on a fault that is not bad input; the last checkpoint on disk is untouched."""


class NonFiniteError(RunFault):
    """A loss, gradient, return or weight became NaN or inf; the message names where."""


class WorkerError(RunFault):
    """An env worker process died, hung or failed; the message names the worker."""


class WorkersLost(RunFault):
    """Fewer rollout workers answered than the run needs (`ray.min_workers`): a node or its actors are
    gone. The run writes its checkpoint and stops; `--resume` continues it once the cluster is back."""


class CheckpointWriteError(RunFault):
    """A checkpoint could not be written (full disk, permissions); the previous one is kept."""


def one_line(text: object) -> str:
    """`text` as a single line (newlines of foreign error messages folded into spaces)."""
    return " ".join(str(text).split())
