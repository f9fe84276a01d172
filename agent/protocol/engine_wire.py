"""The wire between the node's two processes: the sounder (the speaker and the alarm lane) and
the engine (synthesis and every other edge), over one Unix socket pair.

A frame is an 8-byte prefix (the header's length, the body's length: unsigned, big-endian), a
header (a JSON object whose `k` names the message) and a body (16-bit PCM, or nothing). Both
lengths are bounded before anything is read into memory, and every field a side reads is
checked: whatever the other process sends (it may be broken, or busy with hostile input), a
frame is used as it is meant or refused as a whole (`WireError`), never half-believed.

Messages, engine → sounder: `hello`; `connected` (the server the engine's MQTT session is
subscribed on: the broker acknowledged its subscriptions there) and `disconnected` (that
connection ended); `ready` (voice readiness and the catalog); `chunk` (audio of the engine's own
lane) and `words` (audio for an alarm the sounder asked to be said), each with its PCM; `cut`;
`volume`; `alarm` (an alarm-class request another edge received); `pong`.
Sounder → engine: `server` (the server the sounder's session is on: the engine's follows it);
`credit` (room for one more chunk of a lane); `started`, `ended`, `audio`, `preempted` (what the
speaker did with the engine's lane); `underruns` (the device's count since the sounder started,
told before the event that follows one, so the engine's state counts every underrun); `say`
and `cancel` (an alarm's words); `notified` (the lifecycle of an alarm the engine handed over);
`ping`.

Pure: no I/O, no clock, no threads.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from agent.core.messages import AudioStatus, Priority, UtteranceEnded, UtteranceStarted
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk

PREFIX: Final = struct.Struct(">II")
MAX_HEADER: Final = 1 << 20
"""A header's most bytes (a request's text, SSML, a catalog)."""
MAX_BODY: Final = 8 << 20
"""A body's most bytes (a chunk of PCM; a phrase is sent chunk by chunk)."""
_MAX_TEXT: Final = 4096
"""The most characters of a short text field (a detail, an id, a name)."""
MAX_ADDRESS: Final = 300
"""The most characters of a server's address (`host:port`: a DNS name is at most 253)."""

Header = dict[str, object]


class WireError(ValueError):
    """A frame that breaks the wire's rules: the other process is no longer trusted."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One message: its kind, its header's fields, its body."""

    kind: str
    header: Mapping[str, object]
    body: bytes = b""

    def text(self, name: str, default: str | None = None, *, limit: int = _MAX_TEXT) -> str:
        """A string field of at most `limit` characters."""
        value = self.header.get(name, default)
        if not isinstance(value, str) or len(value) > limit:
            raise WireError(f"{self.kind}.{name}: expected text of at most {limit} characters")
        return value

    def integer(self, name: str, low: int = 0, high: int = 2**62) -> int:
        value = self.header.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise WireError(f"{self.kind}.{name}: expected a whole number {low}..{high}")
        return value

    def number(self, name: str, default: float | None = None) -> float | None:
        """A finite number, or None when absent or null."""
        value = self.header.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(f"{self.kind}.{name}: expected a number")
        if not math.isfinite(value):
            raise WireError(f"{self.kind}.{name}: expected a finite number")
        return float(value)

    def flag(self, name: str) -> bool:
        value = self.header.get(name, False)
        if not isinstance(value, bool):
            raise WireError(f"{self.kind}.{name}: expected true or false")
        return value

    def mapping(self, name: str) -> Mapping[str, object]:
        value = self.header.get(name, {})
        if not isinstance(value, dict):
            raise WireError(f"{self.kind}.{name}: expected an object")
        return value


def encode(kind: str, header: Mapping[str, object] | None = None, body: bytes = b"") -> bytes:
    """One frame of `kind`."""
    text = json.dumps({"k": kind, **(header or {})}, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER or len(body) > MAX_BODY:
        raise WireError(f"{kind}: a frame over the wire's bounds")
    return PREFIX.pack(len(text), len(body)) + text + body


class FrameReader:
    """Frames out of a byte stream, as it arrives (bounded before anything is kept)."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The whole frames `data` completes; WireError for one that breaks the rules."""
        self._data += data
        frames: list[Frame] = []
        while len(self._data) >= PREFIX.size:
            head, body = PREFIX.unpack_from(self._data)
            if head > MAX_HEADER or body > MAX_BODY:
                raise WireError(f"a frame of {head} + {body} bytes, over the wire's bounds")
            end = PREFIX.size + head + body
            if len(self._data) < end:
                break
            frames.append(_frame(bytes(self._data[PREFIX.size : PREFIX.size + head]),
                                 bytes(self._data[PREFIX.size + head : end])))  # fmt: skip
            del self._data[:end]
        return frames


def _frame(head: bytes, body: bytes) -> Frame:
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        raise WireError("a header that is no JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("k"), str):
        raise WireError("a header that is no object with a kind")
    return Frame(str(header.pop("k")), header, body)


# ---- chunks -----------------------------------------------------------------------------------


def chunk_frame(kind: str, chunk: Chunk) -> bytes:
    """A chunk of PCM (`chunk` for the engine's lane, `words` for an alarm's) as a frame."""
    header: Header = {"id": chunk.id, "job": chunk.job, "priority": int(chunk.priority)}
    if chunk.end:
        header["end"] = True
    if chunk.error is not None:
        header["error"] = str(chunk.error)
        header["detail"] = chunk.detail[:_MAX_TEXT]
    if chunk.info:
        header["info"] = dict(chunk.info)
    if chunk.volume != 1.0:
        header["volume"] = chunk.volume
    if chunk.start_at is not None:
        header["start_at"] = chunk.start_at
    return encode(kind, header, chunk.pcm or b"")


def chunk_of(frame: Frame) -> Chunk:
    """The chunk a `chunk` or `words` frame carries, every field checked."""
    if len(frame.body) % 2:
        raise WireError(f"{frame.kind}: PCM of an odd number of bytes")
    volume = frame.number("volume", 1.0)
    if volume is None or not 0.0 <= volume <= 1.0:
        raise WireError(f"{frame.kind}.volume: expected 0 to 1")
    start_at = frame.number("start_at")
    return Chunk(
        frame.text("id"),
        frame.body or None,
        end=frame.flag("end"),
        error=_reason(frame),
        detail=frame.text("detail", ""),
        info=frame.mapping("info"),
        volume=volume,
        priority=Priority(frame.integer("priority", 0, max(Priority))),
        job=frame.integer("job"),
        start_at=start_at,
    )


def _reason(frame: Frame) -> Reason | None:
    value = frame.header.get("error")
    if value is None:
        return None
    try:
        return Reason(str(value))
    except ValueError:
        raise WireError(f"{frame.kind}.error: no reason the node knows") from None


# ---- what the speaker did with the engine's lane ----------------------------------------------


def started_frame(event: UtteranceStarted) -> bytes:
    return encode(
        "started",
        {"id": event.id, "job": event.job, "wall": event.wall, "late_ms": event.late_ms},
    )


def started_of(frame: Frame) -> UtteranceStarted:
    return UtteranceStarted(
        frame.text("id"),
        frame.integer("job"),
        frame.number("wall", 0.0) or 0.0,
        frame.number("late_ms"),
    )


def ended_frame(event: UtteranceEnded) -> bytes:
    header: Header = {
        "id": event.id,
        "job": event.job,
        "seconds": event.audio_seconds,
        "detail": event.detail[:_MAX_TEXT],
        "info": dict(event.info),
        "wall": event.wall,
    }
    if event.error is not None:
        header["error"] = str(event.error)
    return encode("ended", header)


def ended_of(frame: Frame) -> UtteranceEnded:
    return UtteranceEnded(
        frame.text("id"),
        frame.number("seconds", 0.0) or 0.0,
        _reason(frame),
        frame.text("detail", ""),
        frame.mapping("info"),
        frame.integer("job"),
        frame.number("wall", 0.0) or 0.0,
    )


def audio_frame(event: AudioStatus) -> bytes:
    return encode("audio", {"available": event.available, "detail": event.detail[:_MAX_TEXT]})


def audio_of(frame: Frame) -> AudioStatus:
    return AudioStatus(frame.flag("available"), frame.text("detail", ""))
