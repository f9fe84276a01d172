"""The system clock's synchronisation, as the kernel tells it (adjtimex, read-only).

Timed announcements (`at`) start together on several nodes only if their clocks agree; keeping
them in step is NTP's or chrony's job. The state reports what the kernel knows of it, so an
operator sees a node whose clock is not synchronised."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

_STA_UNSYNC: Final = 0x0040
_TIME_ERROR: Final = 5


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    """Linux `struct timex` (the padding fields are the kernel's reserved ints)."""

    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("reserved", ctypes.c_int * 11),
    ]


@dataclass(frozen=True, slots=True)
class ClockSync:
    """Whether the kernel considers the clock synchronised, and its error bounds."""

    synchronized: bool
    max_error_ms: float
    """The kernel's worst-case error bound (grows while no time server corrects it)."""
    estimated_error_ms: float

    def as_json(self) -> dict[str, object]:
        """The state's `clock` member."""
        return {
            "synchronized": self.synchronized,
            "max_error_ms": round(self.max_error_ms, 3),
            "estimated_error_ms": round(self.estimated_error_ms, 3),
        }


@functools.cache
def _adjtimex() -> Callable[..., int] | None:
    path = ctypes.util.find_library("c")  # runs ldconfig: once
    if path is None:
        return None
    try:
        function: Callable[..., int] = ctypes.CDLL(path, use_errno=True).adjtimex
    except (OSError, AttributeError):
        return None
    return function


def clock_sync() -> ClockSync | None:
    """The clock's synchronisation, or None where the system does not tell (not Linux)."""
    adjtimex = _adjtimex()
    if adjtimex is None:
        return None
    timex = _Timex()  # modes 0: read only, no privilege needed
    state = adjtimex(ctypes.byref(timex))
    if state < 0:
        return None
    synchronized = state != _TIME_ERROR and not timex.status & _STA_UNSYNC
    return ClockSync(synchronized, timex.maxerror / 1000, timex.esterror / 1000)
