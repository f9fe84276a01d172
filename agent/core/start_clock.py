"""Where a timed announcement's first sample goes in a running output stream (pure arithmetic).

While the device plays silence before a timed start, the writer notes, after each period it
writes, the wall-clock time and how many frames the device has taken so far (frames written
minus those ALSA says are still queued). A device takes frames in steps (a period interrupt, a
sound server's read), never before their time: the observation furthest ahead of `rate * t`
is the best estimate of where the stream is. The frame that plays at instant `at` follows."""

from __future__ import annotations

from collections.abc import Iterable


def frame_at(observed: Iterable[tuple[float, int]], rate: int, at: float) -> int:
    """The stream frame (counted as the observations count) that the device takes at `at`.

    `observed`: (wall-clock seconds, frames taken by then) pairs from the running stream."""
    offset = max(taken - rate * when for when, taken in observed)
    return round(rate * at + offset)
