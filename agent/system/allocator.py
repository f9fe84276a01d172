"""glibc's allocator, tuned for a long-running process on a small board (ctypes, Linux only).

By default glibc gives each thread that allocates its own arena (up to 8 per core) and keeps
freed memory in them: with ONNX Runtime's threads, paho's and the agent's own, the resident
set grows over a day of announcements and never returns it (measured in docs/memory.md). Two
arenas and a trim after each announcement hold it flat; with `tts.low_memory`, large blocks
also come from mmap and go back when freed. Without glibc (musl) or off Linux these do
nothing.
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
    """Hold glibc to ARENAS arenas; call first thing, before any thread starts. Whether glibc
    took it."""
    libc = _libc()
    took = libc is not None and bool(libc.mallopt(_M_ARENA_MAX, ARENAS))
    if not took:
        _LOGGER.debug("glibc did not take the arena setting")
    return took


def return_large_blocks() -> bool:
    """Large blocks from mmap, returned when freed (`tts.low_memory`: with ONNX Runtime's arena
    off, this holds the resident set flat; it costs CPU time in page faults). Whether glibc
    took it."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def trim() -> None:
    """Give freed heap memory back to the system (after an announcement: ~0.1 ms)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
