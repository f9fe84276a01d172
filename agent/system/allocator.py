"""glibc's allocator, tuned for a long-running process on a small board (ctypes, Linux only).

By default glibc gives each thread that allocates its own arena (up to 8 per core) and keeps
freed memory in them: with ONNX Runtime's threads, paho's and the agent's own, the resident
set grows over a day of announcements and never returns it (measured in docs/memory.md). Two
arenas, blocks of 1 MiB or more from mmap (the regions ONNX Runtime's arena gives back after
each run go back to the kernel) and a trim after each announcement hold it flat; with
`tts.low_memory`, every block of 64 KiB or more comes from mmap and goes back when freed.
Without glibc (musl) or off Linux these do nothing.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Final

_LOGGER = logging.getLogger(__name__)
_M_MMAP_THRESHOLD: Final = -3
_M_ARENA_MAX: Final = -8
ARENAS: Final = 2
"""Malloc arenas for the whole process (glibc's default is 8 per core)."""
REGION_THRESHOLD: Final = 1024 * 1024
"""By default, allocations at least this large (bytes) come from mmap and go back to the system
when freed: ONNX Runtime's arena regions, not its tensors (glibc's default starts at 128 KiB and
grows with the largest block freed, up to 32 MiB: a freed region would then stay in the heap,
measured +40 MB at the peak; docs/measurements.md)."""
MMAP_THRESHOLD: Final = 64 * 1024
"""With `tts.low_memory` (the arena off), allocations at least this large come from mmap: every
tensor goes back when freed."""


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library the process runs on (`dlopen(NULL)`: the symbols already loaded), if it
    has glibc's `mallopt` and `malloc_trim`. Not `ctypes.util.find_library`: that imports
    subprocess and runs `ldconfig -p` (~10 ms of the sounder's start, before an alarm)."""
    try:
        libc = ctypes.CDLL(None)
        _ = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return libc


def tune() -> bool:
    """Hold glibc to ARENAS arenas and blocks of REGION_THRESHOLD or more to mmap; call first
    thing, before any thread starts. Whether glibc took it."""
    libc = _libc()
    took = (
        libc is not None
        and bool(libc.mallopt(_M_ARENA_MAX, ARENAS))
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, REGION_THRESHOLD))
    )
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
