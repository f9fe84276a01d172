"""The player's two ways in: a normal lane (announcements) and an urgent lane (alarms), each a
buffer of at most two chunks, with the cuts and preemptions of its jobs, under one lock.

The writer takes from the urgent lane whenever it holds a chunk or an urgent utterance is open
(its first chunk taken, its end not yet), and from the normal lane only otherwise, and not while
the normal lane is held. Job numbers are per lane: each lane's owner counts its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from agent.core.messages import Event
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk

BUFFER_CHUNKS: Final = 2
"""Chunks each lane's double buffer holds between its producer and the ALSA writer."""
_POLL_SECONDS: Final = 0.05


@dataclass(slots=True)
class Utterance:
    """What the writer knows about an announcement it plays."""

    id: str
    job: int = 0
    frames: int = 0
    error: tuple[Reason, str] | None = None
    cut: bool = False
    last_sample: int = 0
    """The last sample written: a cut between chunks ramps from it to silence."""
    start_at: float | None = None
    """A timed utterance's instant (Unix seconds): its first sample plays then."""
    late_ms: float | None = None
    """How late its first sample played, for a timed utterance (0: on time)."""


@dataclass(slots=True)
class Lane:
    """One way into the writer: its buffer, its cuts, its open utterance (guarded by the lock
    of `Lanes`), and who hears its reports."""

    report: Callable[[Event], object]
    buffer: deque[Chunk] = field(default_factory=deque)
    """At most BUFFER_CHUNKS chunks, oldest first."""
    cuts: set[int] = field(default_factory=set)
    """Jobs to fade out and drop."""
    preempted: set[int] = field(default_factory=set)
    """Jobs reported preempted: dropped to their end chunk, which is not reported."""
    current: Utterance | None = None
    """The utterance open on this lane: its first chunk taken, its end chunk not yet."""


Taken = tuple[Lane, Utterance, Chunk]
"""A chunk the writer took, with its lane and the utterance it belongs to."""


class Lanes:
    """Both lanes and the hold on the normal one; any thread puts, cuts, preempts and holds,
    the writer takes."""

    def __init__(
        self, report: Callable[[Event], object], report_urgent: Callable[[Event], object]
    ) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        """Notified when a buffer gains or loses a chunk, the hold changes, or a stop."""
        self.normal = Lane(report)
        self.urgent = Lane(report_urgent)
        self._held = False
        self.reporting = threading.Lock()
        """Held while a start is reported and while a preemption is decided and reported: a
        listener never hears a start after the preemption of the same job."""

    def put(self, lane: Lane, chunk: Chunk, stopping: threading.Event) -> bool:
        """Queue a chunk, blocking while the lane's buffer is full; False once `stopping`."""
        with self._changed:
            while not stopping.is_set():
                if len(lane.buffer) < BUFFER_CHUNKS:
                    lane.buffer.append(chunk)
                    self._changed.notify_all()
                    return True
                self._changed.wait(_POLL_SECONDS)
        return False

    def take(self) -> Taken | None:
        """The next chunk to play (None: nothing could be taken for a poll interval). Its
        utterance is open from its first chunk until its end chunk is taken."""
        with self._changed:
            lane = self._next()
            if lane is None:
                self._changed.wait(_POLL_SECONDS)
                lane = self._next()
                if lane is None:
                    return None
            chunk = lane.buffer.popleft()
            current = lane.current
            if current is None or current.job != chunk.job:
                current = Utterance(chunk.id, chunk.job, start_at=chunk.start_at)
                lane.cuts = {job for job in lane.cuts if job >= chunk.job}  # earlier: over
                lane.preempted = {job for job in lane.preempted if job >= chunk.job}
            lane.current = None if chunk.end else current
            self._changed.notify_all()  # room in its buffer
            return lane, current, chunk

    def cut(self, lane: Lane, job: int) -> None:
        """Fade out this job at the next period and drop the rest of it."""
        with self._lock:
            lane.cuts.add(job)

    def is_cut(self, lane: Lane, job: int) -> bool:
        with self._lock:
            return job in lane.cuts

    def preempt_normal(self) -> tuple[str, int] | None:
        """Cut the normal lane's current utterance (open, else the first one waiting in its
        buffer) and mark it preempted: its id and job, or None if there is none or it was
        preempted already."""
        with self._lock:
            lane = self.normal
            current = lane.current or (lane.buffer[0] if lane.buffer else None)
            if current is None or current.job in lane.preempted:
                return None
            lane.cuts.add(current.job)
            lane.preempted.add(current.job)
            return current.id, current.job

    def is_preempted(self, lane: Lane, job: int) -> bool:
        with self._lock:
            return job in lane.preempted

    def hold_normal(self, on: bool) -> None:
        with self._changed:
            self._held = on
            self._changed.notify_all()

    def ended(self, lane: Lane, job: int) -> bool:
        """Forget this job's cut; True if it was preempted (then its end is not reported)."""
        with self._lock:
            lane.cuts.discard(job)
            preempted = job in lane.preempted
            lane.preempted.discard(job)
            return preempted

    def wake(self) -> None:
        """Wake every wait (a stop)."""
        with self._changed:
            self._changed.notify_all()

    def _next(self) -> Lane | None:
        """The urgent lane when it holds a chunk or its utterance is open; else the normal one
        if it holds a chunk and is not held. Called with the lock held."""
        if self.urgent.buffer:
            return self.urgent
        if self.urgent.current is not None:
            return None  # the alarm's next chunk is coming: nothing else plays meanwhile
        if self.normal.buffer and not self._held:
            return self.normal
        return None
