"""MQTT payloads to domain messages and back: parsing speak requests, encoding lifecycle events.

Pure functions: no I/O, no clock (timestamps and fresh ids are passed in). Allowed imports:
stdlib, `messages` and `text`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from .messages import Lifecycle, Reason, Rejection, SpeakRequest
from .text import clean_text

SPEAK_FIELDS: Final = frozenset({"id", "text", "voice", "rate", "volume"})
"""JSON fields of a speak payload that this version understands."""

MAX_ID_CHARS: Final = 128
RATE_RANGE: Final = (0.5, 2.0)
VOLUME_RANGE: Final = (0.0, 1.0)


@dataclass(frozen=True, slots=True)
class SpeakLimits:
    """Bounds on what a speak payload may carry."""

    max_bytes: int
    max_text_chars: int


def parse_speak(
    payload: bytes, limits: SpeakLimits, new_id: Callable[[], str]
) -> SpeakRequest | Rejection:
    """Parse a speak payload: plain UTF-8 text, or a JSON object when it starts with '{'."""
    if len(payload) > limits.max_bytes:
        detail = f"{len(payload)} bytes, at most {limits.max_bytes} allowed"
        return Rejection(new_id(), Reason.PAYLOAD_TOO_LARGE, detail)
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError as err:
        return Rejection(new_id(), Reason.INVALID_UTF8, f"invalid UTF-8 at byte {err.start}")
    if not text.lstrip().startswith("{"):
        return _request(SpeakRequest(new_id(), text), limits)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as err:
        return Rejection(new_id(), Reason.INVALID_JSON, f"not a valid JSON object: {err}"[:200])
    return _from_json(obj, limits, new_id)  # text starting with '{' that parses is an object


def _from_json(
    obj: dict[str, Any], limits: SpeakLimits, new_id: Callable[[], str]
) -> SpeakRequest | Rejection:
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
        return _invalid(request_id, "text", f"expected a string, got {_json_kind(text)}")
    voice = obj.get("voice", "default")
    if not isinstance(voice, str) or not voice:
        return _invalid(request_id, "voice", "expected a voice id (a non-empty string)")
    numbers: dict[str, float] = {}
    for name, (low, high) in (("rate", RATE_RANGE), ("volume", VOLUME_RANGE)):
        value = obj.get(name, 1.0)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not low <= value <= high
        ):
            return _invalid(request_id, name, f"expected a number from {low:g} to {high:g}")
        numbers[name] = float(value)
    unknown = tuple(sorted(set(obj) - SPEAK_FIELDS))
    request = SpeakRequest(request_id, text, unknown, voice, numbers["rate"], numbers["volume"])
    return _request(request, limits)


def _invalid(request_id: str, field: str, detail: str) -> Rejection:
    return Rejection(request_id, Reason.INVALID_FIELD, detail, field)


def _request(request: SpeakRequest, limits: SpeakLimits) -> SpeakRequest | Rejection:
    text = clean_text(request.text)
    if not text:
        return Rejection(request.id, Reason.EMPTY_TEXT, "nothing to say")
    if len(text) > limits.max_text_chars:
        detail = f"{len(text)} characters, at most {limits.max_text_chars} allowed"
        return Rejection(request.id, Reason.TEXT_TOO_LONG, detail)
    return replace(request, text=text)


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
