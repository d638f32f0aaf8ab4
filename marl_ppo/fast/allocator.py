"""glibc's allocator tuned to keep freed memory for reuse (Linux), instead of its defaults."""

from __future__ import annotations

import ctypes

ALLOCATOR_KEEP_BYTES = (2 << 30) - 1
"""Freed heap memory glibc keeps for reuse rather than handing back to the kernel (the largest value
mallopt takes): more than a large minibatch step's activations, so they are not faulted in again."""


def keep_freed_memory() -> bool:
    """Make glibc reuse freed tensor memory instead of returning it to the kernel (Linux only).

    By default glibc maps large blocks fresh from the kernel and gives them back on free, so a
    rollout step's activations, allocated and freed every step, fault in every page again. Here
    every block comes from the heap (glibc maps no block on its own; it cannot raise the size
    above which it does past 32 MiB), and up to ALLOCATOR_KEEP_BYTES of freed heap stays mapped.
    Large batched updates then reuse their pages, at the price of a higher peak from a more
    fragmented heap. Forked workers inherit the setting. Returns False where it could not be applied
    (`fast.allocator: false` leaves glibc's defaults).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, ALLOCATOR_KEEP_BYTES))
