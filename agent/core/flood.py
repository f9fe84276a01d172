"""Floods stay cheap: per interval, the first few of a kind of report go out one by one and the
rest are counted for one summary. Pure: time is given.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

BURST: Final = 20
"""Reports of one kind let through per interval (a person or a program sending bad messages by
hand never gets past it; a flood does)."""
INTERVAL: Final = 5.0
"""Seconds per interval: one summary at most this often."""


class FloodGate:
    """Lets `burst` reports per kind through per `interval`; counts the rest for a summary."""

    def __init__(self, burst: int = BURST, interval: float = INTERVAL) -> None:
        self._burst = burst
        self._interval = interval
        self._passed: Counter[str] = Counter()
        self._held: Counter[str] = Counter()
        self._until: float | None = None

    def allow(self, kind: str, now: float) -> bool:
        """Whether this report goes out one by one (else it is counted)."""
        if self._until is None or now >= self._until:
            if self._held:
                return self._count(kind)  # the summary of the last interval is still due
            self._until, self._passed = now + self._interval, Counter()
        if self._passed[kind] < self._burst:
            self._passed[kind] += 1
            return True
        return self._count(kind)

    def summary(self, now: float) -> dict[str, int] | None:
        """Once the interval is over: how many of each kind were held back (None if none);
        counting starts again."""
        if not self._held or (self._until is not None and now < self._until):
            return None
        held = dict(self._held)
        self._held.clear()
        self._until = None
        return held

    def _count(self, kind: str) -> bool:
        self._held[kind] += 1
        return False
