"""What nodes publish, read as untrusted input and validated into typed records: the one place
the operator's tool reads a node's JSON (its retained state, its update events).

Anyone who may publish on the broker can retain any bytes on `<prefix>/<node>/state` or
`<prefix>/<node>/events`, so a payload may be too large, not UTF-8, not JSON, nested thousands
deep, or hold numbers of any size, NaN or infinities, any JSON type in any field, control
characters or lone surrogates in its strings. Nothing here raises on such input:

- `load_json` bounds the size before parsing, decodes strict UTF-8, keeps an integer literal of
  more than `MAX_DIGITS` digits as `Unusable` (never converted: no `int` of 5,000 digits), and
  treats nesting deeper than the interpreter's recursion limit (`RecursionError`) as unreadable.
- `parse_state` turns a state payload into a `NodeState`: each field the tool uses, typed, or
  None (absent), with the fields it could not use in `invalid` (field -> why, the node's text
  escaped); an unusable payload as a whole gives `unreadable`.
- `parse_update_event` gives an `UpdateEvent`, or None for a payload that is not a usable update
  event; its node-supplied text (`reason`, `detail`) is escaped and bounded.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from agent.core.states import FINAL_PHASES
from ota.safe_text import escaped, is_clean

MAX_STATE_BYTES: Final = 65536
"""A retained state larger than this is not read (an agent's is about 2 KB)."""
MAX_EVENT_BYTES: Final = 16384
"""An update event larger than this is not read."""
MAX_DIGITS: Final = 30
"""An integer literal with more digits is unusable (kept as text, never converted)."""
MAX_TEXT: Final = 128
"""Characters of a short text field (ids, versions, names)."""
MAX_DETAIL: Final = 300
"""Characters of an event's `detail` kept."""
MAX_GROUPS: Final = 256
MAX_RELEASE: Final = 2**53
"""Releases are whole numbers 0 .. 2**53 (what any JSON reader keeps exact)."""
MAX_UPTIME: Final = 100 * 366 * 86400.0
"""Seconds; more is not an uptime."""
EXCERPT: Final = 40
"""Characters of a node's text quoted in a reason."""
_SHA256: Final = re.compile(r"[0-9a-fA-F]{64}")
_EPOCH_YEAR: Final = 1970


@dataclass(frozen=True)
class Unusable:
    """A JSON value the reader refused to convert (an integer literal of too many digits)."""

    what: str


class FieldError(ValueError):
    """A field's value is not usable; the message says why (node text escaped)."""


def _big_int(text: str) -> int | Unusable:
    digits = len(text.lstrip("-"))
    if digits > MAX_DIGITS:
        return Unusable(f"a number of {digits} digits")
    return int(text)


def load_json(payload: bytes, limit: int) -> tuple[Any, str | None]:
    """(value, None), or (None, why the payload is unreadable)."""
    if len(payload) > limit:
        return None, f"too large ({len(payload)} bytes > {limit})"
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        return json.loads(text, parse_int=_big_int), None
    except RecursionError:
        return None, "nested too deep"
    except ValueError:
        return None, "not JSON"


def describe(value: Any) -> str:
    """A short, safe description of a JSON value for a reason (never the whole of it)."""
    if isinstance(value, str):
        return '"' + escaped(value, EXCERPT) + '"'
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= EXCERPT else f"a number of {len(text)} digits"
    what: dict[type, Callable[[Any], str]] = {
        Unusable: lambda v: str(v.what),
        float: repr,
        list: lambda v: f"a list of {len(v)}",
        dict: lambda v: f"an object of {len(v)} keys",
    }
    return what.get(type(value), lambda v: type(v).__name__)(value)


def text_value(value: Any, limit: int = MAX_TEXT) -> str:
    """A string of printable characters, at most `limit` of them."""
    if not isinstance(value, str):
        raise FieldError(f"not a string ({describe(value)})")
    if len(value) > limit:
        raise FieldError(f"longer than {limit} characters ({len(value)})")
    if not is_clean(value):
        raise FieldError(f"control or format characters ({describe(value)})")
    return value


def whole_number(value: Any, top: int = MAX_RELEASE) -> int:
    """An integer 0 .. top (a JSON `true` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"not a whole number ({describe(value)})")
    if not 0 <= value <= top:
        raise FieldError(f"out of range 0-{top} ({describe(value)})")
    return value


def seconds(value: Any, top: float = MAX_UPTIME) -> float:
    """A finite number of seconds 0 .. top (an integer stays one)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"not a number ({describe(value)})")
    if isinstance(value, float) and not math.isfinite(value):
        raise FieldError(f"not a finite number ({describe(value)})")
    if not 0 <= value <= top:
        raise FieldError(f"out of range 0-{top:.0f} ({describe(value)})")
    return value


def timestamp(value: Any) -> float:
    """An ISO 8601 time (`Z` or an offset; UTC without one) from 1970 on, as POSIX seconds."""
    text = text_value(value, 64)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise FieldError(f"not an ISO 8601 time ({describe(value)})") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        stamp = moment.timestamp()
    except (OverflowError, ValueError, OSError):
        raise FieldError(f"out of range ({describe(value)})") from None
    if moment.year < _EPOCH_YEAR or stamp < 0:
        raise FieldError(f"before 1970 ({describe(value)})")
    return stamp


def sha256_text(value: Any) -> str:
    """64 hex digits."""
    text = text_value(value)
    if not _SHA256.fullmatch(text):
        raise FieldError(f"not a sha256 ({describe(value)})")
    return text


def names(value: Any) -> tuple[str, ...]:
    """A list of short printable strings (group names)."""
    if not isinstance(value, list):
        raise FieldError(f"not a list ({describe(value)})")
    if len(value) > MAX_GROUPS:
        raise FieldError(f"more than {MAX_GROUPS} names ({len(value)})")
    found = []
    for index, item in enumerate(value):
        try:
            found.append(text_value(item))
        except FieldError as err:
            raise FieldError(f"item {index}: {err}") from None
    return tuple(found)


@dataclass(frozen=True)
class LastUpdate:
    """A node's last final update result (`last_update` in its state)."""

    id: str | None = None
    state: str | None = None
    reason: str | None = None
    release: int | None = None
    ts: str | None = None

    def as_json(self) -> dict[str, Any]:
        """As the node publishes it."""
        return {
            "id": self.id,
            "state": self.state,
            "reason": self.reason,
            "release": self.release,
            "ts": self.ts,
        }


_LAST_UPDATE_FIELDS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "id": lambda v: text_value(v, 256),
    "state": lambda v: text_value(v, 64),
    "reason": text_value,
    "release": whole_number,
    "ts": lambda v: text_value(v, 64),
}


@dataclass(frozen=True)
class NodeState:
    """The fields of a node's retained state the tool uses, typed (None: absent or invalid)."""

    ts: float | None = None
    """The state's own time, POSIX seconds."""
    ts_text: str | None = None
    uptime_s: float | None = None
    groups: tuple[str, ...] | None = None
    ota_groups: tuple[str, ...] | None = None
    device_class: str | None = None
    model: str | None = None
    model_version: str | None = None
    model_sha256: str | None = None
    model_release: int | None = None
    agent_version: str | None = None
    audio: str | None = None
    last_update: LastUpdate | None = None
    invalid: Mapping[str, str] = field(default_factory=dict)
    """Field -> why it could not be used (the node's text escaped)."""
    unreadable: str | None = None
    """Why the payload as a whole could not be read (None: it was a JSON object)."""
    present: bool = False
    """Whether the node published a state at all."""


_STATE_FIELDS: Final[Mapping[str, Callable[[Any], Any]]] = {
    "uptime_s": seconds,
    "groups": names,
    "ota_groups": names,
    "device_class": text_value,
    "model": text_value,
    "model_version": text_value,
    "model_sha256": sha256_text,
    "model_release": whole_number,
    "agent_version": text_value,
    "audio": text_value,
}


def parse_state(payload: bytes) -> NodeState:
    """A node's retained state payload, validated field by field."""
    body, why = load_json(payload, MAX_STATE_BYTES)
    if why is None and not isinstance(body, dict):
        why = f"not a JSON object ({describe(body)})"
    if why is not None:
        return NodeState(unreadable=why, invalid={"state": why}, present=True)
    values: dict[str, Any] = {}
    invalid: dict[str, str] = {}
    for name, check in _STATE_FIELDS.items():
        raw = body.get(name)
        if raw is None:
            continue
        try:
            values[name] = check(raw)
        except FieldError as err:
            invalid[name] = str(err)
    if body.get("ts") is not None:
        try:
            values["ts"] = timestamp(body["ts"])
            values["ts_text"] = body["ts"]
        except FieldError as err:
            invalid["ts"] = str(err)
    last = body.get("last_update")
    if isinstance(last, dict):
        sub: dict[str, Any] = {}
        for name, check in _LAST_UPDATE_FIELDS.items():
            if last.get(name) is None:
                continue
            try:
                sub[name] = check(last[name])
            except FieldError as err:
                invalid[f"last_update.{name}"] = str(err)
        values["last_update"] = LastUpdate(**sub)
    elif last is not None:
        invalid["last_update"] = f"not an object ({describe(last)})"
    return NodeState(**values, invalid=invalid, present=True)


@dataclass(frozen=True)
class UpdateEvent:
    """One `update` event of a node (progress or result of an offer or command)."""

    node: str
    offer: str
    state: str
    at: float
    """Wall time the tool received it."""
    reason: str | None = None
    detail: str | None = None
    release: int | None = None
    progress: int | None = None
    ts: str | None = None

    @property
    def final(self) -> bool:
        """Whether the node is done with the offer."""
        return self.state in FINAL_PHASES


def _optional(check: Callable[[Any], Any], value: Any) -> Any:
    if value is None:
        return None
    try:
        return check(value)
    except FieldError:
        return None


def _free_text(limit: int) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise FieldError("not a string")
        return escaped(value, limit)

    return check


def parse_update_event(node: str, payload: bytes, at: float) -> UpdateEvent | None:
    """An update event, or None when the payload is not one the tool can use (no string `id`
    and `state`, or unreadable). `reason` and `detail` are escaped and bounded; other optional
    fields that are not usable are left out."""
    body, why = load_json(payload, MAX_EVENT_BYTES)
    if why is not None or not isinstance(body, dict) or body.get("event") != "update":
        return None
    try:
        offer = text_value(body.get("id"), 256)
        state = text_value(body.get("state"), 64)
    except FieldError:
        return None
    return UpdateEvent(
        node=node,
        offer=offer,
        state=state,
        at=at,
        reason=_optional(_free_text(MAX_TEXT), body.get("reason")),
        detail=_optional(_free_text(MAX_DETAIL), body.get("detail")),
        release=_optional(whole_number, body.get("release")),
        progress=_optional(lambda v: whole_number(v, 100), body.get("progress")),
        ts=_optional(lambda v: text_value(v, 64), body.get("ts")),
    )
