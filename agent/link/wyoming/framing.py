"""Wyoming's framing read with its bounds, every error answerable: one event is a JSON header
line, then `data_length` bytes of JSON data, then `payload_length` bytes of payload.

The `wyoming` package frames what the node writes; what it reads is read here, because the
package's reader cannot say why an event is unreadable (it returns None, the end of the stream,
for bad JSON and for a length it was told to refuse) and lets a RecursionError out of a deeply
nested header. Here the header is read by the node's one JSON decoder (`payloads.load_json`:
nesting depth, duplicate keys, lone surrogates), every length is checked from the header before
a byte of what it announces is read, and each problem is an `UnreadableError` with one of the core's
refusal reasons, which the server answers with Wyoming's `error` event. When the header itself
cannot be read, where the next event starts is unknown: the connection then ends after the
answer (`lost`); a bad data part was read whole, so the connection goes on.
"""

from __future__ import annotations

import asyncio
from typing import Final

from wyoming.event import Event

from agent.core.reasons import Reason
from agent.protocol.payloads import JsonProblem, load_json

LINE_LIMIT: Final = 64 * 1024
"""Bytes an event's header line may have (asyncio's reader refuses a longer line)."""
MAX_PART: Final = 1024 * 1024
"""Bytes of an event's extra data, and of its payload, read at most: a larger `data_length` or
`payload_length` is refused from the header, before anything it announces is read."""
MAX_TYPE_CHARS: Final = 64
"""Characters of an event type (Wyoming's are short names: `synthesize-chunk`)."""


class UnreadableError(Exception):
    """An event that cannot be read: the reason and detail of the `error` answering it, and
    whether the framing is lost (the connection must end)."""

    def __init__(self, reason: Reason, detail: str, *, lost: bool) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.lost = lost


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """The next event; None at the end of the stream (also in the middle of an event: the peer
    is gone). Raises UnreadableError."""
    try:
        line = await reader.readline()
    except ValueError:  # asyncio's LimitOverrunError: the line is longer than LINE_LIMIT
        detail = f"an event header over {LINE_LIMIT} bytes"
        raise UnreadableError(Reason.PAYLOAD_TOO_LARGE, detail, lost=True) from None
    if not line.endswith(b"\n"):
        return None  # the stream ended (with part of a header, or nothing)
    header = _json(line, "header", lost=True)
    if not isinstance(header, dict):
        raise UnreadableError(Reason.INVALID_JSON, "an event header is a JSON object", lost=True)
    data_length = _length(header, "data_length")
    payload_length = _length(header, "payload_length")
    try:
        data_bytes = await reader.readexactly(data_length) if data_length else b""
        payload = await reader.readexactly(payload_length) if payload_length else None
    except asyncio.IncompleteReadError:
        return None
    kind = header.get("type")
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_TYPE_CHARS or not kind.isprintable():
        detail = f"`type` is a string of 1-{MAX_TYPE_CHARS} printable characters"
        raise UnreadableError(Reason.INVALID_FIELD, detail, lost=False)
    data = header.get("data", {})
    if data is None or not isinstance(data, dict):
        raise UnreadableError(Reason.INVALID_FIELD, f"{kind}: `data` is a JSON object", lost=False)
    if data_bytes:
        more = _json(data_bytes, f"{kind}: its data", lost=False)
        if not isinstance(more, dict):
            detail = f"{kind}: its data is a JSON object"
            raise UnreadableError(Reason.INVALID_FIELD, detail, lost=False)
        data = {**data, **more}
    return Event(type=kind, data=data, payload=payload)


def _json(raw: bytes, what: str, *, lost: bool) -> object:
    """One JSON text read by the node's decoder, or UnreadableError."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        detail = f"{what}: invalid UTF-8 at byte {err.start}"
        raise UnreadableError(Reason.INVALID_UTF8, detail, lost=lost) from None
    value = load_json(text)
    if isinstance(value, JsonProblem):
        raise UnreadableError(value.reason, f"{what}: {value.detail}", lost=lost)
    return value


def _length(header: dict[str, object], key: str) -> int:
    """A part's length from the header, checked before the part is read (absent or null: 0)."""
    value = header.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UnreadableError(
            Reason.INVALID_FIELD, f"`{key}` is a whole number of bytes", lost=True
        )
    if value > MAX_PART:
        detail = f"`{key}` of {value} bytes, at most {MAX_PART}"
        if len(detail) > 200:
            detail = f"`{key}` of more than {MAX_PART} bytes"
        raise UnreadableError(Reason.PAYLOAD_TOO_LARGE, detail, lost=True)
    return value
