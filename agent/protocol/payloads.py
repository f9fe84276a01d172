"""MQTT payloads to domain messages and back: speak, stop, ack and volume in; events out.

Pure functions: no I/O, no clock (timestamps and fresh ids are passed in). Every input gets a
result or a `Rejection` with a reason; nothing raises.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from agent.core.messages import Lifecycle, Priority, Rejection, SpeakRequest, is_url
from agent.core.reasons import Reason
from agent.formats.markup import is_ssml
from agent.formats.text import clean_text

MAX_ID_CHARS: Final = 128
BOM: Final = "\ufeff"
_LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_PRIORITIES: Final = {p.label: p for p in Priority}
MAX_JSON_DEPTH: Final = 32
"""Nesting a JSON payload may have (arrays and objects): no message needs more than a few levels;
deeper is `invalid_json` (Python's decoder would otherwise recurse into the thousands)."""
MAX_NUMBER_DIGITS: Final = 1000
"""Digits of a JSON integer read exactly; a longer one is out of every range (it is read as
infinity, never converted: no field's range comes near, and Python's int conversion is
quadratic)."""
LAST_INSTANT: Final = 253402300799.0
"""9999-12-31T23:59:59Z in Unix seconds: the last instant ISO 8601 (and `datetime`) can name."""

Check = Callable[[object], tuple[object, str | None]]
"""Validates one JSON value: (converted value, None) or (None, what was expected)."""


def number_in(value: object, low: float, high: float) -> float | None:
    """The one conversion of a number read from a payload: a JSON number from `low` to `high`
    as a float, else None. An integer of any size is compared exactly before anything converts
    it (no OverflowError); NaN and infinities are out of range; a boolean or a string of digits
    is no number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return float(value) + 0.0 if low <= value <= high else None  # + 0.0: -0 is 0


def whole_number_in(value: object, low: int, high: int) -> int | None:
    """A JSON integer from `low` to `high` (any size compared exactly; no boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if low <= value <= high else None


def got(value: object) -> str:
    """What a payload held instead of what was expected, in a few words (never the value of a
    string, nor the digits of a huge number)."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if isinstance(value, float) and math.isfinite(value) and abs(value) < 1e15:
            return f"{value:g}"
        if isinstance(value, int) and abs(value) < 10**15:
            return str(value)
        return "a number out of range"
    return _kind(value)


def _number(low: float, high: float) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        number = number_in(value, low, high)
        if number is not None:
            return number, None
        return None, f"expected a number from {low:g} to {high:g}, got {got(value)}"

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        number = whole_number_in(value, low, high)
        if number is not None:
            return number, None
        return None, f"expected a whole number from {low} to {high}, got {got(value)}"

    return check


def _name(max_chars: int) -> Check:
    def check(value: object) -> tuple[object, str | None]:
        if isinstance(value, str) and 0 < len(value) <= max_chars and value.isprintable():
            return value, None
        return None, f"expected a string of 1-{max_chars} printable characters"

    return check


def _instant(value: object) -> tuple[object, str | None]:
    """A wall-clock instant: ISO 8601 with a time zone (UTC), or Unix seconds (more than 0, at
    most LAST_INSTANT); as Unix seconds."""
    expected = "expected an ISO 8601 time with its zone (UTC) or Unix seconds"
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = number_in(value, 0.0, LAST_INSTANT)
        if seconds is not None and seconds > 0:
            return seconds, None
        return None, f"{expected} up to the year 9999, got {got(value)}"
    if not isinstance(value, str) or len(value) > 64:
        return None, expected
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None, expected
    if moment.tzinfo is None:
        return None, expected
    return moment.timestamp(), None  # years 1 to 9999, any offset: no overflow


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
    number = whole_number_in(value, 0, 9999)
    if number is not None:
        return str(number), None
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
        text = decoded.strip()
        if not _DECIMAL.fullmatch(text):
            expected = "expected a number from 0 to 1 as text (digits and a point, such as 0.6)"
            return Rejection(new_id(), Reason.INVALID_FIELD, expected, "volume")
        raw = float(text)
    value, problem = _number(0.0, 1.0)(raw)
    if problem is not None:
        return Rejection(new_id(), Reason.INVALID_FIELD, problem, "volume")
    assert isinstance(value, float)  # noqa: S101 - _number converts to float
    return value


_DECIMAL: Final = re.compile(r"[+-]?(?:\d{1,64}(?:\.\d{0,64})?|\.\d{1,64})", re.ASCII)
"""A number as plain text: ASCII digits, a point; no exponent, `nan`, `inf` or `1_0` (which
Python's `float` would all read)."""
MAX_VOICE_CHARS: Final = 256


def parse_voice(payload: bytes, new_id: Callable[[], str]) -> str | Rejection:
    """A voice to select: its id (`id#speaker` for a speaker), or the name Home Assistant's
    select shows: plain UTF-8 text of 1-MAX_VOICE_CHARS printable characters."""
    decoded = _decode(payload, 4096, new_id, json_objects=False)
    if isinstance(decoded, Rejection):
        return replace(decoded, id="select-voice")
    assert isinstance(decoded, str)  # noqa: S101 - json_objects=False gives text
    chosen = decoded.strip()
    if 0 < len(chosen) <= MAX_VOICE_CHARS and chosen.isprintable():
        return chosen
    expected = f"expected a voice id or name of 1-{MAX_VOICE_CHARS} printable characters"
    return Rejection("select-voice", Reason.INVALID_FIELD, expected, "voice")


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
    obj = load_json(text)
    if isinstance(obj, JsonProblem):
        return Rejection(new_id(), obj.reason, obj.detail)
    assert isinstance(obj, dict)  # noqa: S101 - text starting with '{' that parses is an object
    return obj


@dataclass(frozen=True, slots=True)
class JsonProblem:
    """Why a text is no JSON the agent reads: `invalid_json` (syntax, duplicate keys, too deep)
    or `invalid_utf8` (a lone surrogate escape)."""

    reason: Reason
    detail: str


def load_json(text: str) -> object:
    """The one JSON decoder of every topic: Python's `json`, with what it lets through closed.
    A key twice in one object (readers would disagree on which counts), nesting deeper than
    MAX_JSON_DEPTH (also where the decoder itself would run out of stack), and an escape of
    half a UTF-16 pair (`\\ud800`: no character) are problems; an integer of more than
    MAX_NUMBER_DIGITS digits reads as infinity. NaN and infinities come through as floats:
    `number_in` refuses them."""
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_int=_integer_literal)
    except RecursionError:
        return JsonProblem(Reason.INVALID_JSON, f"nested deeper than {MAX_JSON_DEPTH} levels")
    except ValueError as err:  # JSONDecodeError, or a duplicate key
        detail = f"not valid JSON: {err}"[:200].encode("ascii", "backslashreplace").decode()
        return JsonProblem(Reason.INVALID_JSON, detail)
    return _inspected(value)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"the key {key[:40]!a} is given twice")
        obj[key] = value
    return obj


def _integer_literal(digits: str) -> int | float:
    if len(digits.lstrip("-")) > MAX_NUMBER_DIGITS:
        return -math.inf if digits.startswith("-") else math.inf
    return int(digits)


def too_deep(value: object) -> bool:
    """Whether a decoded value nests deeper than MAX_JSON_DEPTH (found without recursion).
    Whether Python's decoder itself got that deep depends on the caller's stack: a reader must
    not let that decide (the hostile flood in CI: a Hermes say read as another site's in the
    agent, as ours in the test's oracle)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list):
            continue
        if depth >= MAX_JSON_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack += [(child, depth + 1) for child in children]
    return False


def has_lone_surrogate(text: str) -> bool:
    """Whether a decoded text holds a lone surrogate (JSON allows its escape; UTF-8 has none)."""
    return bool(_LONE_SURROGATE.search(text))


def _inspected(value: object) -> object:
    """The decoded value, or the problem with it: too deep (`too_deep`), or a lone surrogate
    (in a key or a string, named by the top-level field it is under), found without recursion."""
    if too_deep(value):
        return JsonProblem(Reason.INVALID_JSON, f"nested deeper than {MAX_JSON_DEPTH} levels")
    stack: list[tuple[object, str]] = [(value, "the payload")]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if has_lone_surrogate(item):
                return JsonProblem(Reason.INVALID_UTF8, f"a lone surrogate escape in {where}")
        elif isinstance(item, list):
            stack += [(child, where) for child in reversed(item)]
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                if has_lone_surrogate(key):
                    problem = f"a lone surrogate escape in a key of {where}"
                    return JsonProblem(Reason.INVALID_UTF8, problem)
                stack.append((child, f"field {key[:40]!r}" if item is value else where))
    return value


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
    """An SSML request: a document that parses (kept parsed in the request, `document`), whose
    words are within the text limit."""
    # the parser (XML, number words) loads with the first document, not with every process
    from agent.formats.ssml import SsmlError, parse_ssml, spoken_text  # noqa: PLC0415

    try:
        segments = parse_ssml(request.text)
    except SsmlError as err:
        return Rejection(request.id, err.reason, err.detail, field, request.priority)
    words = spoken_text(segments)
    if not segments and not (request.sound or request.sound_after):
        return Rejection(request.id, Reason.EMPTY_TEXT, "nothing to say", None, request.priority)
    if len(words) > limits.max_text_chars:
        detail = f"{len(words)} characters of speech, at most {limits.max_text_chars} allowed"
        return Rejection(request.id, Reason.TEXT_TOO_LONG, detail, None, request.priority)
    return replace(request, document=segments)


def _kind(value: object) -> str:
    kinds: dict[type, str] = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
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
