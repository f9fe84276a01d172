"""What the retained state reports: counters and the latest measurements. Pure (times are given).

Fed with every lifecycle event the core decides; read into the state JSON that Home Assistant's
sensors use.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Final

from agent.core.messages import Lifecycle, Notify

_TRACKED: Final = 256
"""Announcements whose arrival time is kept to measure time to first audio."""


class Telemetry:
    """Counts events and keeps the last time to first audio, synthesis speed and error."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.last_ttfa_ms: float | None = None
        self.synthesis_speed: float | None = None
        self.last_error: str | None = None
        self._accepted_at: OrderedDict[str, float] = OrderedDict()

    def record(self, notify: Notify, now: float) -> None:
        """Account for one event published at `now` (seconds, monotonic)."""
        self.counts[str(notify.event)] += 1
        details = notify.details
        match notify.event:
            case Lifecycle.ACCEPTED:
                self._accepted_at[notify.id] = now
                while len(self._accepted_at) > _TRACKED:
                    self._accepted_at.popitem(last=False)
            case Lifecycle.STARTED:
                accepted = self._accepted_at.pop(notify.id, None)
                if accepted is not None:
                    self.last_ttfa_ms = round((now - accepted) * 1000, 1)
            case Lifecycle.FINISHED:
                audio, compute = details.get("audio_seconds"), details.get("synthesis_seconds")
                if isinstance(audio, float | int) and isinstance(compute, float | int) and compute:
                    self.synthesis_speed = round(audio / compute, 1)
            case Lifecycle.FAILED | Lifecycle.REJECTED:
                self.last_error = f"{notify.event} {notify.id}: {details.get('reason')}"
            case _:
                pass
