"""What the command line prints for the shell: commands that run as printed, and a quiet end on a closed pipe.

A command printed for the user to run (the resume hint, a `did you mean` pointer, a missing extra's
install) names this program the way it was started, so that it works as printed from the same
directory: `marl-ppo` when PATH finds this very program, else `.venv/bin/marl-ppo` or
`.venv/bin/python -m marl_ppo` (relative to the working directory when below it, else absolute).
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TextIO


def command_words() -> list[str]:
    """The words that start this program again from the working directory."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main_spec is not None and main_spec.name == "marl_ppo.__main__":  # python -m marl_ppo
        return [_python(), "-m", "marl_ppo"]
    script = sys.argv[0] if sys.argv else ""
    if Path(script).stem == "marl-ppo":  # the console script
        return [_reachable(script, same=lambda a, b: os.path.realpath(a) == os.path.realpath(b))]
    # called as a function (a notebook, a test): the installed command, else this interpreter's module
    return ["marl-ppo"] if shutil.which("marl-ppo") else [_python(), "-m", "marl_ppo"]


def shell_command(*args: str) -> str:
    """A command line that runs this program with `args`, quoted for a POSIX shell."""
    return shlex.join([*command_words(), *args])


def as_invoked(message: str) -> str:
    """`message` with the commands it quotes (`` `marl-ppo ...` ``, `pip install`) in forms that run as printed."""
    program = shlex.join(command_words())
    if program != "marl-ppo":
        message = message.replace("`marl-ppo ", f"`{program} ")
    return re.sub(r"\bpip install ", lambda _: f"{_pip()} install ", message)


def _python() -> str:
    # a venv's python is a link to the base interpreter, which lacks the venv's packages: no realpath
    return _reachable(sys.executable, same=lambda a, b: os.path.abspath(a) == os.path.abspath(b))


def _pip() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "pip")
    found = shutil.which("pip")
    if found is not None and os.path.abspath(found) == os.path.abspath(beside):
        return "pip"
    return shlex.join([_python(), "-m", "pip"])


def _reachable(path: str, *, same: Callable[[str, str], bool]) -> str:
    """`path`'s file name when PATH finds the same program under it, else the path itself."""
    found = shutil.which(os.path.basename(path))
    if found is not None and same(found, path):
        return os.path.basename(path)
    return shown_path(path)


def shown_path(path: str) -> str:
    """`path` relative to the working directory when it lies below it, else absolute."""
    absolute = os.path.abspath(path)
    try:
        relative = os.path.relpath(absolute)
    except ValueError:  # another drive (Windows)
        return absolute
    if relative == os.pardir or relative.startswith(os.pardir + os.sep):
        return absolute
    return relative if os.sep in relative else os.path.join(os.curdir, relative)


def quiet_closed_outputs() -> bool:
    """Point stdout and stderr, where their reader has closed the pipe, at /dev/null; True if either was."""
    closed = False
    for stream in (sys.stdout, sys.stderr):
        if _reader_gone(stream):
            closed = True
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())  # the buffered rest goes nowhere, without a second error
            os.close(devnull)
    return closed


def _reader_gone(stream: TextIO) -> bool:
    """Whether `stream` is a pipe or socket whose reading end is closed."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (captured output) or closed
        return False
    if not hasattr(select, "poll"):  # Windows: no way to ask; a BrokenPipeError here is the output's
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
