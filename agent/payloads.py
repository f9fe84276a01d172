"""MQTT payloads to domain messages and back: parsing speak requests, encoding lifecycle events.

Pure functions: no I/O, no clock (timestamps and fresh ids are passed in). Allowed imports:
stdlib and `messages`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

from .messages import Lifecycle, Reason, Rejection, SpeakRequest

SPEAK_FIELDS: Final = frozenset({"id", "text"})
"""JSON fields of a speak payload that this version understands."""

MAX_ID_CHARS: Final = 128


def parse_speak(
    payload: bytes, max_bytes: int, new_id: Callable[[], str]
) -> SpeakRequest | Rejection:
    """Parse a speak payload: plain UTF-8 text, or a JSON object when it starts with '{'."""
    if len(payload) > max_bytes:
        return Rejection(
            new_id(), Reason.PAYLOAD_TOO_LARGE, f"{len(payload)} bytes, at most {max_bytes} allowed"
        )
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as err:
        return Rejection(new_id(), Reason.INVALID_UTF8, f"invalid UTF-8 at byte {err.start}")
    if not text.lstrip().startswith("{"):
        return _request(new_id(), text, ())
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as err:
        return Rejection(new_id(), Reason.INVALID_JSON, f"not a valid JSON object: {err}"[:200])
    return _from_json(obj, new_id)  # text starting with '{' that parses is an object


def _from_json(obj: dict[str, Any], new_id: Callable[[], str]) -> SpeakRequest | Rejection:
    raw_id = obj.get("id")
    if raw_id is None:
        request_id = new_id()
    elif isinstance(raw_id, int) and not isinstance(raw_id, bool):
        request_id = str(raw_id)
    elif isinstance(raw_id, str) and 0 < len(raw_id) <= MAX_ID_CHARS and raw_id.isprintable():
        request_id = raw_id
    else:
        return Rejection(
            new_id(),
            Reason.INVALID_FIELD,
            f"expected a string of 1-{MAX_ID_CHARS} printable characters or an integer",
            "id",
        )
    if "text" not in obj:
        return Rejection(request_id, Reason.INVALID_FIELD, "missing", "text")
    text = obj["text"]
    if not isinstance(text, str):
        return Rejection(
            request_id, Reason.INVALID_FIELD, f"expected a string, got {_json_kind(text)}", "text"
        )
    return _request(request_id, text, tuple(sorted(set(obj) - SPEAK_FIELDS)))


def _request(request_id: str, text: str, unknown: tuple[str, ...]) -> SpeakRequest | Rejection:
    text = text.strip()
    if not text:
        return Rejection(request_id, Reason.EMPTY_TEXT, "nothing to say")
    return SpeakRequest(request_id, text, unknown)


def _json_kind(value: object) -> str:
    kinds: dict[type, str] = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }
    return kinds.get(type(value), type(value).__name__)


def encode_event(
    node_id: str,
    request_id: str,
    event: Lifecycle,
    details: Mapping[str, object],
    now: float,
) -> bytes:
    """A lifecycle event as the JSON published on `<prefix>/<node_id>/events`."""
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    body: dict[str, object] = {
        "id": request_id,
        "event": str(event),
        "ts": stamp.replace("+00:00", "Z"),
        "node": node_id,
    }
    body.update(details)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
