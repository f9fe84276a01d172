"""MQTT payloads to domain messages and back: speak, stop, ack and volume in; events out.

Pure functions: no I/O, no clock (timestamps and fresh ids are passed in). Every input gets a
result or a `Rejection` with a reason; nothing raises. Allowed imports: stdlib, `messages`,
`ssml`, `text`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from .messages import Lifecycle, Priority, Reason, Rejection, SpeakRequest, is_url
from .ssml import SsmlError, is_ssml, parse_ssml, spoken_text
from .text import clean_text

MAX_ID_CHARS: Final = 128
BOM: Final = "\ufeff"
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_PRIORITIES: Final = {p.label: p for p in Priority}

Check = Callable[[object], tuple[object, str | None]]
"""Validates one JSON value: (converted value, None) or (None, what was expected)."""


def _number(low: float, high: float) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and math.isfinite(value) and low <= value <= high:  # type: ignore[arg-type, operator]
            return float(value), None  # type: ignore[arg-type]
        return None, f"expected a number from {low:g} to {high:g}"

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value, None
        return None, f"expected a whole number from {low} to {high}"

    return check


def _name(max_chars: int) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        if isinstance(value, str) and 0 < len(value) <= max_chars and value.isprintable():
            return value, None
        return None, f"expected a string of 1-{max_chars} printable characters"

    return check


def _instant(value: object) -> tuple[object, str | None]:
    """A wall-clock instant: ISO 8601 with a time zone (UTC), or Unix seconds; as Unix seconds."""
    expected = "expected an ISO 8601 time with its zone (UTC) or Unix seconds"
    if isinstance(value, bool):
        return None, expected
    if isinstance(value, int | float):
        return (float(value), None) if math.isfinite(value) and value > 0 else (None, expected)
    if not isinstance(value, str) or len(value) > 64:
        return None, expected
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None, expected
    if moment.tzinfo is None:
        return None, expected
    return moment.timestamp(), None


def _boolean(value: object) -> tuple[object, str | None]:
    return (value, None) if isinstance(value, bool) else (None, "expected true or false")


def _priority(value: object) -> tuple[object, str | None]:
    if isinstance(value, str) and value in _PRIORITIES:
        return _PRIORITIES[value], None
    return None, f"expected one of {', '.join(_PRIORITIES)}"


def _chime(value: object) -> tuple[object, str | None]:
    if isinstance(value, bool):
        return value, None
    named, problem = _name(64)(value)
    return (named, None) if problem is None else (None, "expected true, false or a chime name")


_MEDIA_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
LANGUAGE: Final = re.compile(r"[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8}){0,2}")
"""A language code: `de`, `de_DE`, `de-DE`, `zh-Hant-TW`."""
MAX_URL_CHARS: Final = 2048


def _sound(value: object) -> tuple[object, str | None]:
    """A name of `audio.media`, or an http(s) URL (no other scheme is ever fetched)."""
    expected = "expected a media name (letters, digits, _ . -) or an http(s) URL"
    if not isinstance(value, str):
        return None, expected
    if is_url(value):
        if len(value) <= MAX_URL_CHARS and value.isprintable() and " " not in value:
            return value, None
        return None, f"expected an http(s) URL of at most {MAX_URL_CHARS} printable characters"
    return (value, None) if _MEDIA_NAME.fullmatch(value) else (None, expected)


def _speaker(value: object) -> tuple[object, str | None]:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 9999:
        return str(value), None
    named, problem = _name(64)(value)
    return (named, None) if problem is None else (None, "expected a speaker name or number")


def _language(value: object) -> tuple[object, str | None]:
    if isinstance(value, str) and LANGUAGE.fullmatch(value):
        return value, None
    return None, "expected a language code such as de, de_DE or de-DE"


def _document(value: object) -> tuple[object, str | None]:
    if isinstance(value, str):
        return value, None
    return None, "expected an SSML document as a string"


SPEAK_FIELDS: Final[Mapping[str, Check]] = {
    "voice": _name(64),
    "rate": _number(0.5, 2.0),
    "volume": _number(0.0, 1.0),
    "priority": _priority,
    "ttl": _number(0.001, 7 * 86400),
    "interrupt": _boolean,
    "chime": _chime,
    "repeat": _integer(0, 1000),
    "repeat_interval": _number(0.0, 86400),
    "dedupe_key": _name(MAX_ID_CHARS),
    "at": _instant,
    "speaker": _speaker,
    "lang": _language,
    "sound": _sound,
    "sound_after": _sound,
}
_BODY_FIELDS: Final = frozenset({"id", "text", "ssml"})
"""The fields that say what to play besides SPEAK_FIELDS."""
"""Optional JSON fields of a speak payload (besides `id` and `text`), with their checks."""


@dataclass(frozen=True, slots=True)
class SpeakLimits:
    """Bounds on what a speak payload may carry."""

    max_bytes: int
    max_text_chars: int


def parse_speak(
    payload: bytes, limits: SpeakLimits, new_id: Callable[[], str]
) -> SpeakRequest | Rejection:
    """Parse a speak payload: plain UTF-8 text, or a JSON object when it starts with '{'."""
    decoded = _decode(payload, limits.max_bytes, new_id)
    if isinstance(decoded, Rejection):
        return decoded
    if not isinstance(decoded, dict):
        return finish_request(SpeakRequest(new_id(), decoded), limits)
    request_id = _request_id(decoded, new_id)
    if isinstance(request_id, Rejection):
        return request_id
    values: dict[str, Any] = {}
    priority, problem = _priority(decoded.get("priority", "info"))
    known = priority if isinstance(priority, Priority) else None
    for name, check in SPEAK_FIELDS.items():
        if name in decoded:
            values[name], problem = check(decoded[name])
            if problem is not None:
                return Rejection(request_id, Reason.INVALID_FIELD, problem, name, known)
    text = _what_to_say(decoded, values)
    if isinstance(text, tuple):
        return Rejection(request_id, Reason.INVALID_FIELD, text[1], text[0], known)
    unknown = tuple(sorted(set(decoded) - set(SPEAK_FIELDS) - _BODY_FIELDS))
    return finish_request(SpeakRequest(request_id, text, unknown, **values), limits)


def _what_to_say(decoded: dict[str, Any], values: dict[str, Any]) -> str | tuple[str, str]:
    """The text or SSML document of a JSON speak payload (marking `values["ssml"]`), or the
    field at fault and why. A request with a sound may have no text."""
    if "ssml" in decoded:  # the document is what is said (a `text` beside it is not used)
        document, problem = _document(decoded["ssml"])
        if problem is not None:
            return "ssml", problem
        values["ssml"] = True
        return str(document)
    with_sound = values.get("sound") or values.get("sound_after")
    text = decoded.get("text", "" if with_sound else None)
    if not isinstance(text, str):
        return (
            "text",
            "missing" if "text" not in decoded else f"expected a string, got {_kind(text)}",
        )
    return text


def parse_stop(payload: bytes, new_id: Callable[[], str]) -> tuple[bool, bool] | Rejection:
    """A stop command, as (clear, current): empty or any text stops what plays; JSON
    `{"clear": true}` also empties the queue; `{"clear": true, "current": false}` only empties
    the queue (what plays goes on)."""
    decoded = _decode(payload, 4096, new_id)
    if isinstance(decoded, Rejection) or not isinstance(decoded, dict):
        return decoded if isinstance(decoded, Rejection) else (False, True)
    values = []
    for name, default in (("clear", False), ("current", True)):
        value, problem = _boolean(decoded.get(name, default))
        if problem is not None:
            return Rejection(new_id(), Reason.INVALID_FIELD, problem, name)
        values.append(bool(value))
    return values[0], values[1]


def parse_say(
    payload: bytes, limits: SpeakLimits, new_id: Callable[[], str]
) -> SpeakRequest | Rejection:
    """What Home Assistant's notify and text entities send: always plain text (a message
    starting with `{` is said, not parsed), class `info`."""
    decoded = _decode(payload, limits.max_bytes, new_id, json_objects=False)
    if isinstance(decoded, Rejection):
        return decoded
    assert isinstance(decoded, str)  # noqa: S101 - json_objects=False gives text
    return finish_request(SpeakRequest(new_id(), decoded), limits)


def parse_ack(payload: bytes, new_id: Callable[[], str]) -> str | Rejection:
    """An acknowledgement: the announcement's id, as plain text or JSON `{"id": ...}`."""
    decoded = _decode(payload, 4096, new_id)
    if isinstance(decoded, Rejection):
        return decoded
    if isinstance(decoded, dict):
        if "id" not in decoded:
            return Rejection(new_id(), Reason.INVALID_FIELD, "missing", "id")
        return _request_id(decoded, new_id)
    text = decoded.strip()
    if not text:
        return Rejection(new_id(), Reason.INVALID_FIELD, "missing", "id")
    return _request_id({"id": text}, new_id)


def parse_volume(payload: bytes, new_id: Callable[[], str]) -> float | Rejection:
    """A global volume from 0 to 1, as plain text (`0.6`) or JSON `{"volume": 0.6}`."""
    decoded = _decode(payload, 4096, new_id)
    if isinstance(decoded, Rejection):
        return decoded
    if isinstance(decoded, dict):
        raw: object = decoded.get("volume")
    else:
        try:
            raw = float(decoded.strip())
        except ValueError:
            raw = decoded
    value, problem = _number(0.0, 1.0)(raw)
    if problem is not None:
        return Rejection(new_id(), Reason.INVALID_FIELD, problem, "volume")
    assert isinstance(value, float)  # noqa: S101 - _number converts to float
    return value


def parse_json_object(
    payload: bytes, max_bytes: int, new_id: Callable[[], str]
) -> dict[str, Any] | Rejection:
    """A JSON object, or why the payload is not one."""
    decoded = _decode(payload, max_bytes, new_id)
    if isinstance(decoded, str):
        return Rejection(new_id(), Reason.INVALID_JSON, "expected a JSON object")
    return decoded


def _decode(
    payload: bytes, max_bytes: int, new_id: Callable[[], str], *, json_objects: bool = True
) -> str | dict[str, Any] | Rejection:
    """Text, or a JSON object when the text starts with '{' (unless `json_objects` is false);
    or why it is neither."""
    if len(payload) > max_bytes:
        detail = f"{len(payload)} bytes, at most {max_bytes} allowed"
        return Rejection(new_id(), Reason.PAYLOAD_TOO_LARGE, detail)
    try:
        text = payload.decode("utf-8").removeprefix(BOM)  # a leading BOM says nothing
    except UnicodeDecodeError as err:
        return Rejection(new_id(), Reason.INVALID_UTF8, f"invalid UTF-8 at byte {err.start}")
    if not json_objects or not text.lstrip().startswith("{"):
        return text
    try:
        obj: dict[str, Any] = json.loads(text)  # text starting with '{' that parses is an object
    except (ValueError, RecursionError) as err:
        detail = f"not a valid JSON object: {err}"[:200].encode("ascii", "replace").decode()
        return Rejection(new_id(), Reason.INVALID_JSON, detail)
    where = _surrogate(obj)
    if where is not None:  # a JSON escape of half a UTF-16 pair: no character, no text
        return Rejection(new_id(), Reason.INVALID_UTF8, f"a lone surrogate escape in {where}")
    return obj


def _request_id(obj: dict[str, Any], new_id: Callable[[], str]) -> str | Rejection:
    raw_id = obj.get("id")
    if raw_id is None:
        return new_id()
    if valid_id(raw_id):
        assert isinstance(raw_id, str)  # noqa: S101 - valid_id says so
        return raw_id
    expected = f"expected a string of 1-{MAX_ID_CHARS} printable characters"
    if isinstance(raw_id, int | float) and not isinstance(raw_id, bool):
        expected += " (a number is not an id: quote it)"
    return Rejection(new_id(), Reason.INVALID_FIELD, expected, "id")


def valid_id(value: object) -> bool:
    """Whether a value may be an id: a string of 1-MAX_ID_CHARS printable characters (any kind
    of message: speak, ack, Hermes, OTA). Numbers are not ids: `5` and `"5"` would collide."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable()


def _surrogate(value: object, where: str = "the payload") -> str | None:
    """Where a lone surrogate is in a parsed JSON value (a key or a string), if anywhere."""
    if isinstance(value, str):
        return where if _LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            name = key if not _LONE_SURROGATE.search(key) else None
            if name is None:
                return f"a field name of {where}"
            found = _surrogate(item, f"field {name!r}" if where == "the payload" else where)
            if found is not None:
                return found
    if isinstance(value, list):
        for item in value:
            found = _surrogate(item, where)
            if found is not None:
                return found
    return None


def finish_request(request: SpeakRequest, limits: SpeakLimits) -> SpeakRequest | Rejection:
    """Clean the text (or check the SSML document) and check it is neither empty nor too
    long; a request with a sound may have no text."""
    if request.ssml or is_ssml(request.text):
        field = "ssml" if request.ssml else "text"  # where the document came in
        return _finish_ssml(replace(request, ssml=True), limits, field)
    text = clean_text(request.text)
    if not text and not (request.sound or request.sound_after):
        return Rejection(request.id, Reason.EMPTY_TEXT, "nothing to say", None, request.priority)
    if len(text) > limits.max_text_chars:
        detail = f"{len(text)} characters, at most {limits.max_text_chars} allowed"
        return Rejection(request.id, Reason.TEXT_TOO_LONG, detail, None, request.priority)
    return replace(request, text=text)


def _finish_ssml(
    request: SpeakRequest, limits: SpeakLimits, field: str
) -> SpeakRequest | Rejection:
    """An SSML request: a document that parses (the synthesizer parses it again, for the
    voice's language), whose words are within the text limit."""
    try:
        segments = parse_ssml(request.text)
    except SsmlError as err:
        return Rejection(request.id, Reason.INVALID_SSML, str(err), field, request.priority)
    words = spoken_text(segments)
    if not segments and not (request.sound or request.sound_after):
        return Rejection(request.id, Reason.EMPTY_TEXT, "nothing to say", None, request.priority)
    if len(words) > limits.max_text_chars:
        detail = f"{len(words)} characters of speech, at most {limits.max_text_chars} allowed"
        return Rejection(request.id, Reason.TEXT_TOO_LONG, detail, None, request.priority)
    return request


def _kind(value: object) -> str:
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
    return json.dumps(body, ensure_ascii=True, separators=(",", ":")).encode("ascii")
