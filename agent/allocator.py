"""glibc's allocator, tuned for a long-running process on a small board (ctypes, Linux only).

By default glibc gives each thread that allocates its own arena (up to 8 per core) and keeps
freed memory in them: with ONNX Runtime's threads, paho's and the agent's own, the resident
set grows by a hundred megabytes and more over a day of announcements and never returns it
(measured in docs/memory.md). Two arenas, large blocks from mmap (returned when freed), and a
trim after each announcement hold it flat at no measurable speed cost. Without glibc (musl) or
off Linux these do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from typing import Final

_LOGGER = logging.getLogger(__name__)
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
ARENAS: Final = 2
"""Malloc arenas for the whole process (glibc's default is 8 per core)."""
MMAP_THRESHOLD: Final = 64 * 1024
"""Allocations at least this large (bytes) come from mmap and go back to the system when freed
(glibc's default starts at 128 KiB and grows with the largest block freed, up to 32 MiB)."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    path = ctypes.util.find_library("c")
    if path is None:
        return None
    try:
        libc = ctypes.CDLL(path)
        _ = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def tune() -> bool:
    """Set the arenas and the mmap threshold; call first thing, before any thread starts.
    Whether glibc took them."""
    libc = _libc()
    if libc is None:
        return False
    took = bool(libc.mallopt(_M_ARENA_MAX, ARENAS)) and bool(
        libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    )
    if not took:
        _LOGGER.debug("glibc did not take the allocator settings")
    return took


def trim() -> None:
    """Give freed heap memory back to the system (after an announcement: ~0.1 ms)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
