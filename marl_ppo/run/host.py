"""The host a run executes on: learner threads, glibc's allocator, and resident-memory probes."""

from __future__ import annotations

import ctypes
import os
import resource

from marl_ppo.config import ExperimentConfig
from marl_ppo.envs.factory import is_batched, usable_cores

ALLOCATOR_KEEP_BYTES = (2 << 30) - 1
"""Freed heap memory glibc keeps for reuse rather than handing back to the kernel (the largest value
mallopt takes). A 1,024-copy VMAS minibatch step allocates about 400 MB of activations; with 256 MiB
kept, every update faulted in about 140,000 fresh pages."""


def keep_freed_memory() -> bool:
    """Make glibc reuse freed tensor memory instead of returning it to the kernel (Linux only).

    By default glibc maps large blocks fresh from the kernel and gives them back on free, so a
    rollout step's activations, allocated and freed every step, fault in every page again. Here
    every block comes from the heap (glibc maps no block on its own; it cannot raise the size
    above which it does past 32 MiB), and up to ALLOCATOR_KEEP_BYTES of freed heap stays mapped.
    A 8,192-copy VMAS update, whose 64-wide activations are 52 MB each, faulted in 3.3M pages
    (13 GB) per update when blocks over 32 MiB were still mapped on their own; it now runs 1.8x
    faster, for 22-37% more peak memory from a more fragmented heap. Forked workers inherit the
    setting. Returns False where it could not be applied.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, ALLOCATOR_KEEP_BYTES))


def learner_threads(config: ExperimentConfig) -> int:
    """Torch threads of the learner: `torch_threads`, or for `auto` every core with a batched simulator
    (large tensors, nothing else running) and 1 otherwise.

    The networks here are small: a second thread buys nothing on their matrices, and where env
    workers or other processes keep the cores busy, threads that wait for each other made a
    small run 7x slower in our measurements.
    """
    if config.torch_threads != "auto":
        return config.torch_threads
    return usable_cores() if is_batched(config) else 1


def rss_mb(pid: int | str = "self") -> float:
    """Current resident memory of a process (this one by default), in MiB; nan where /proc is missing."""
    try:
        with open(f"/proc/{pid}/statm") as handle:
            resident_pages = int(handle.read().split()[1])
    except (OSError, IndexError, ValueError):
        return float("nan")
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB (Linux reports ru_maxrss in KiB)."""
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return self_kib / 1024
