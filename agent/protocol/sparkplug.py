"""The Sparkplug B 3.0 edge node's decisions: its topics, its metrics, the births, data and
deaths it publishes, and what a command asks for. Pure: the edge (`link.sparkplug.session`) owns
the MQTT session, the composition (`sparkplug_node`) carries out what this decides.

One edge node (`sparkplug.edge_node_id`) with one device, the speaker (`sparkplug.device_id`).
Every metric but `bdSeq` and `Node Control/Rebirth` (by name only, as Sparkplug 3.0 asks) has
an alias from its birth on; data messages carry aliases only. `seq` runs 0-255
over every NBIRTH, DBIRTH, DDATA and DDEATH of a session (NBIRTH is 0); `bdSeq` is the session's
number, the same in the NDEATH registered as the Will at CONNECT and in the NBIRTH(s) that
follow it. See docs/sparkplug.md.
"""

from __future__ import annotations

import enum
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agent.protocol.sparkplug_schema import Payload

NAMESPACE: Final = "spBv1.0"
MAX_COMMAND_BYTES: Final = 65536
"""A command payload larger than this is refused unread (a Speak text is bounded far below)."""
MAX_METRICS_PER_COMMAND: Final = 32

Value = bool | int | float | str | None


class DataType(enum.IntEnum):
    """Sparkplug B data types the node uses (specification, 6.4.16)."""

    INT32 = 3
    INT64 = 4
    UINT32 = 7
    UINT64 = 8
    FLOAT = 9
    DOUBLE = 10
    BOOLEAN = 11
    STRING = 12
    DATETIME = 13


_NUMERIC: Final = frozenset(
    {DataType.INT32, DataType.INT64, DataType.UINT32, DataType.UINT64, DataType.DATETIME}
)
_INTEGER_TYPES: Final = frozenset({1, 2, 3, 4, 5, 6, 7, 8, 13})
"""Int8 ... UInt64 and DateTime: carried in int_value or long_value."""


class Write(enum.Enum):
    """What a writable metric does when a host writes it."""

    SPEAK = "speak"
    PRIORITY = "priority"
    STOP = "stop"
    ACKNOWLEDGE = "acknowledge"
    VOLUME = "volume"
    REBIRTH = "rebirth"
    NEXT_SERVER = "next_server"


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric: its name, alias, type, what writing it does (None: read only), its unit, and
    how its value is read from the state JSON (None: the edge keeps it)."""

    name: str
    alias: int | None
    """None: by name only (bdSeq, and `Node Control/Rebirth`, which Sparkplug 3.0 forbids an
    alias so that a host can always ask for a rebirth)."""
    datatype: DataType
    write: Write | None = None
    unit: str | None = None
    read: Callable[[Mapping[str, Any]], Value] | None = None
    description: str = ""


def _number(name: str) -> Callable[[Mapping[str, Any]], Value]:
    def read(state: Mapping[str, Any]) -> Value:
        value = state.get(name)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    return read


def _text(name: str) -> Callable[[Mapping[str, Any]], Value]:
    def read(state: Mapping[str, Any]) -> Value:
        value = state.get(name)
        return value if isinstance(value, str) else None

    return read


BD_SEQ: Final = Metric("bdSeq", None, DataType.INT64)
NODE_METRICS: Final = (
    BD_SEQ,
    Metric("Node Control/Rebirth", None, DataType.BOOLEAN, Write.REBIRTH),
    Metric("Node Control/Next Server", 2, DataType.BOOLEAN, Write.NEXT_SERVER),
)
"""The edge node's own metrics (NBIRTH): bdSeq and the two node controls."""

DEVICE_METRICS: Final = (
    Metric("Speak", 10, DataType.STRING, Write.SPEAK, description="text spoken at Priority"),
    Metric("Priority", 11, DataType.STRING, Write.PRIORITY, description="class of Speak"),
    Metric("Stop", 12, DataType.BOOLEAN, Write.STOP, description="true: stop what plays"),
    Metric("Acknowledge", 13, DataType.BOOLEAN, Write.ACKNOWLEDGE, description="true: end repeats"),
    Metric("Volume", 14, DataType.FLOAT, Write.VOLUME, "ratio", _number("volume"), "0 to 1"),
    Metric("Speaking", 15, DataType.BOOLEAN, read=lambda s: s.get("speaking") is True),
    Metric("Queue depth", 16, DataType.INT32, None, "announcements", _number("queue_depth")),
    Metric("Last error", 17, DataType.STRING),
    Metric("Audio available", 18, DataType.BOOLEAN, read=lambda s: s.get("audio") == "available"),
    Metric("Underruns", 19, DataType.INT64, None, "count", _number("underruns")),
    Metric("Model version", 20, DataType.STRING, read=_text("model_version")),
    Metric(
        "Alarm repeating",
        21,
        DataType.BOOLEAN,
        read=lambda s: bool(s.get("repeating")),
        description="an announcement will play again until acknowledged or its count ends",
    ),
    Metric(
        "Alarms repeating",
        22,
        DataType.INT32,
        None,
        "announcements",
        lambda s: len(r) if isinstance(r := s.get("repeating"), list) else 0,
    ),
    Metric("Voice", 23, DataType.STRING, read=_text("voice")),
)
"""The speaker's metrics (DBIRTH): the writable controls first, then what the state shows."""

BY_NAME: Final = {m.name: m for m in (*NODE_METRICS, *DEVICE_METRICS)}
BY_ALIAS: Final = {m.alias: m for m in (*NODE_METRICS, *DEVICE_METRICS) if m.alias is not None}


@dataclass(frozen=True, slots=True)
class SparkplugTopics:
    """The node's Sparkplug topics (specification, 4.1)."""

    group: str
    edge: str
    device: str

    def _node(self, kind: str) -> str:
        return f"{NAMESPACE}/{self.group}/{kind}/{self.edge}"

    @property
    def nbirth(self) -> str:
        return self._node("NBIRTH")

    @property
    def ndeath(self) -> str:
        return self._node("NDEATH")

    @property
    def ncmd(self) -> str:
        return self._node("NCMD")

    @property
    def dbirth(self) -> str:
        return f"{self._node('DBIRTH')}/{self.device}"

    @property
    def ddata(self) -> str:
        return f"{self._node('DDATA')}/{self.device}"

    @property
    def ddeath(self) -> str:
        return f"{self._node('DDEATH')}/{self.device}"

    @property
    def dcmd(self) -> str:
        return f"{self._node('DCMD')}/{self.device}"


def state_topic(host_id: str) -> str:
    """A host application's STATE topic (Sparkplug 3.0)."""
    return f"{NAMESPACE}/STATE/{host_id}"


def host_state(payload: bytes) -> tuple[bool, int] | None:
    """A STATE payload (`{"online": bool, "timestamp": ms}`): (online, timestamp), or None when
    it is not one (then it is ignored)."""
    if len(payload) > 1024:
        return None
    try:
        decoded = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(decoded, dict):
        return None
    online, stamp = decoded.get("online"), decoded.get("timestamp", 0)
    if not isinstance(online, bool) or not isinstance(stamp, int) or isinstance(stamp, bool):
        return None
    return online, stamp


STATE_AHEAD_MS: Final = 300_000
"""How far a STATE timestamp may be ahead of the node's clock (while that clock is known to be
synchronised): the clocks of a host and a node may differ by this much. A timestamp further
ahead is a forgery or a broken clock: it is ignored."""
STATE_CEILING_MS: Final = 4_102_444_800_000
"""2100-01-01 in Unix milliseconds: no genuine STATE is stamped later, whatever the clocks."""
STATE_HOLD_MS: Final = 300_000
"""How long an offline that counted keeps out an online stamped before it (node's monotonic
time): long enough for Sparkplug's rule (a retained online older than the host's offline is not
believed), short enough that a forged offline stamped ahead cannot keep the node unborn."""


class Verdict(enum.Enum):
    """What a STATE of the primary host does."""

    ONLINE = "online: the node may be born"
    OFFLINE = "offline: the node leaves for the next server"
    STALE = "older than a STATE that counted: ignored"
    IMPLAUSIBLE = "stamped too far ahead (or negative): ignored"


@dataclass(slots=True)
class HostMarks:
    """What counted of the primary host's STATEs on one server (a host has a session, and STATE
    timestamps, of its own on each)."""

    online_at: int = -1
    """The timestamp of the last online that counted."""
    offline_at: int = -1
    """The timestamp of the last offline that counted: an online older than it (a retained
    message from before) does not count, for `STATE_HOLD_MS`."""
    offline_seen_ms: float | None = None
    """When (the node's monotonic clock, ms) that offline counted."""
    online: bool = False
    """The last STATE that counted said online."""

    def judge(
        self, online: bool, stamp: int, wall_ms: int, mono_ms: float, *, clock_known: bool
    ) -> Verdict:
        """A STATE (online, timestamp) judged, and counted when it does count. Sparkplug 3.0:
        an online no older than the last offline and online; an offline no older than the last
        online. Once plausible: not negative, not past `STATE_CEILING_MS`, and at most
        `STATE_AHEAD_MS` ahead of the node's clock when `clock_known`. And an offline keeps
        older onlines out for `STATE_HOLD_MS` only: after that the host's online counts
        whatever the offline's timestamp said (it overrules it)."""
        ceiling = min(
            STATE_CEILING_MS, wall_ms + STATE_AHEAD_MS if clock_known else STATE_CEILING_MS
        )
        if stamp < 0 or stamp > ceiling:
            return Verdict.IMPLAUSIBLE
        if online:
            held = (
                self.offline_seen_ms is not None and mono_ms - self.offline_seen_ms < STATE_HOLD_MS
            )
            if stamp >= self.offline_at and stamp >= self.online_at:
                self.online_at = stamp
            elif not held and self.offline_seen_ms is not None:
                self.online_at, self.offline_at = stamp, -1  # the offline is overruled
            else:
                return Verdict.STALE
            self.online = True
            return Verdict.ONLINE
        if stamp < self.online_at:
            return Verdict.STALE
        self.offline_at, self.offline_seen_ms, self.online = (
            max(self.offline_at, stamp),
            mono_ms,
            False,
        )
        return Verdict.OFFLINE


# ---- payloads -----------------------------------------------------------------------------------


def _set(target: Any, datatype: DataType, value: Value) -> None:
    """A metric's or property's value in the member its type uses; None: is_null."""
    if value is None:
        target.is_null = True
    elif datatype == DataType.BOOLEAN:
        target.boolean_value = bool(value)
    elif datatype == DataType.STRING:
        target.string_value = str(value)
    elif datatype == DataType.FLOAT:
        target.float_value = float(value)
    elif datatype == DataType.DOUBLE:
        target.double_value = float(value)
    elif datatype in (DataType.INT32, DataType.UINT32):
        target.int_value = int(value) & 0xFFFFFFFF  # two's complement, as the spec says
    else:
        target.long_value = int(value) & 0xFFFFFFFFFFFFFFFF


def _metric(payload: Any, metric: Metric, value: Value, at_ms: int, *, birth: bool) -> None:
    """Births name every metric with its type (and alias); data messages give the alias alone
    (Sparkplug 3.0: the datatype SHOULD NOT be repeated after the birth)."""
    entry = payload.metrics.add(timestamp=at_ms)
    if metric.alias is not None:
        entry.alias = metric.alias
    if birth or metric.alias is None:
        entry.name = metric.name
        entry.datatype = metric.datatype
    if birth:
        if metric.unit is not None:
            entry.properties.keys.append("engUnit")
            entry.properties.values.add(type=DataType.STRING, string_value=metric.unit)
        if metric.write is not None:
            entry.properties.keys.append("writable")
            entry.properties.values.add(type=DataType.BOOLEAN, boolean_value=True)
        if metric.description:
            entry.properties.keys.append("description")
            entry.properties.values.add(type=DataType.STRING, string_value=metric.description)
    _set(entry, metric.datatype, value)


def node_death(bd_seq: int, at_ms: int) -> bytes:
    """The NDEATH (the session's Will): bdSeq only, no seq."""
    payload = Payload(timestamp=at_ms)
    _metric(payload, BD_SEQ, bd_seq, at_ms, birth=True)
    return bytes(payload.SerializeToString())


def node_birth(bd_seq: int, at_ms: int) -> bytes:
    """The NBIRTH: seq 0, bdSeq and the node controls."""
    payload = Payload(timestamp=at_ms, seq=0)
    values: dict[str, Value] = {BD_SEQ.name: bd_seq}
    for metric in NODE_METRICS:
        _metric(payload, metric, values.get(metric.name, False), at_ms, birth=True)
    return bytes(payload.SerializeToString())


def device_message(
    values: Mapping[str, tuple[Value, int]], seq: int, at_ms: int, *, birth: bool
) -> bytes:
    """A DBIRTH (every device metric, by name and alias) or a DDATA (the ones given, by alias),
    each metric with the time of its change."""
    payload = Payload(timestamp=at_ms, seq=seq)
    for metric in DEVICE_METRICS:
        if metric.name in values:
            value, changed_ms = values[metric.name]
            _metric(payload, metric, value, changed_ms, birth=birth)
    return bytes(payload.SerializeToString())


def device_death(seq: int, at_ms: int) -> bytes:
    """A DDEATH: the speaker is gone (no metrics)."""
    return bytes(Payload(timestamp=at_ms, seq=seq).SerializeToString())


# ---- commands -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Written:
    """A metric a command writes, with its value (checked against the metric's type)."""

    metric: Metric
    value: Value


@dataclass(frozen=True, slots=True)
class Refused:
    """A metric of a command that is not carried out, and why (for `Last error`)."""

    label: str
    reason: str


def read_command(payload: bytes, allowed: frozenset[Write]) -> list[Written | Refused]:
    """The writes of an NCMD or DCMD payload, each resolved by alias or name and checked: an
    unknown metric, one that is read only or not of this message, a wrong type or an unreadable
    payload is refused (never raised)."""
    if len(payload) > MAX_COMMAND_BYTES:
        return [Refused("payload", f"larger than {MAX_COMMAND_BYTES} bytes")]
    message = Payload()
    try:
        message.ParseFromString(payload)
    except Exception:  # noqa: BLE001 - the library's DecodeError (and any other refusal of bytes)
        return [Refused("payload", "not a Sparkplug B payload")]
    if len(message.metrics) > MAX_METRICS_PER_COMMAND:
        return [Refused("payload", f"more than {MAX_METRICS_PER_COMMAND} metrics")]
    return [_written(entry, allowed) for entry in message.metrics]


def _written(entry: Any, allowed: frozenset[Write]) -> Written | Refused:
    has_name, has_alias = entry.HasField("name"), entry.HasField("alias")
    if has_name and not isinstance(entry.name, str):  # the library gives bytes: not UTF-8
        return Refused("metric", "its name is not UTF-8")
    metric = BY_NAME.get(entry.name) if has_name else BY_ALIAS.get(entry.alias)
    label = _label(entry.name if has_name else f"alias {entry.alias}" if has_alias else "metric")
    if metric is None:
        return Refused(label, "unknown metric")
    if has_name and has_alias and entry.alias != metric.alias:
        return Refused(label, f"alias {entry.alias} is not this metric's ({metric.alias})")
    if metric.write is None or metric.write not in allowed:
        return Refused(metric.name, "not writable here")
    value = _value(entry, metric.datatype)
    if isinstance(value, Refused):
        return Refused(metric.name, value.reason)
    return Written(metric, value)


def _value(entry: Any, expected: DataType) -> Value | Refused:  # noqa: PLR0911 - per type
    """The value of a written metric, read as the metric's type; its own datatype, where given,
    must agree (Float and Double are one for a write, and so are the integer types)."""
    if entry.is_null:
        return Refused("", "null")
    member = entry.WhichOneof("value")
    given = entry.datatype if entry.HasField("datatype") else None
    if expected == DataType.BOOLEAN and member == "boolean_value" and given in (None, 11):
        return bool(entry.boolean_value)
    if expected == DataType.STRING and member == "string_value" and given in (None, 12, 14):
        text = entry.string_value  # bytes when they are not UTF-8 (proto2 does not check)
        return text if isinstance(text, str) else Refused("", "not UTF-8")
    if expected in (DataType.FLOAT, DataType.DOUBLE):
        if member in ("float_value", "double_value") and given in (None, 9, 10):
            return float(getattr(entry, member))
        if member in ("int_value", "long_value") and given in _INTEGER_TYPES:
            return int(getattr(entry, member))
    if expected in _NUMERIC and member in ("int_value", "long_value") and given in _INTEGER_TYPES:
        return int(getattr(entry, member))
    shown = f"datatype {given}" if given is not None else (member or "no value")
    return Refused("", f"expected {expected.name.title()}, got {shown}")


def _label(text: str) -> str:
    """A metric name from a command, safe to repeat in an error (printable, bounded)."""
    cleaned = "".join(c if c.isprintable() else "?" for c in text[:64])
    return cleaned + ("..." if len(text) > 64 else "")


def too_large(size: int, *, device: bool) -> Command:
    """A command whose packet (`size` bytes) was over the session's bound: not read at all."""
    return Command(device, {}, (Refused("payload", f"{size} bytes, larger than allowed: unread"),))


NODE_WRITES: Final = frozenset({Write.REBIRTH, Write.NEXT_SERVER})
"""What an NCMD may write."""
DEVICE_WRITES: Final = frozenset(
    {Write.SPEAK, Write.PRIORITY, Write.STOP, Write.ACKNOWLEDGE, Write.VOLUME}
)
"""What a DCMD may write."""
MAX_REFUSAL_CHARS: Final = 255
"""The longest refusal text (`Last error` is a Sparkplug String the host shows)."""


@dataclass(frozen=True, slots=True)
class Command:
    """What one NCMD or DCMD does, however many metrics it writes: each metric's first write
    (a later one of the same metric is refused), checked; its refusals gathered for one
    answer. So a command is at most one Speak, one Stop, one Acknowledge, one Volume, one
    Priority (for its own Speak and the ones after), one Rebirth and one Next Server."""

    device: bool
    values: Mapping[Write, Value]
    refused: tuple[Refused, ...]

    def speaks_at(self, priority: str) -> str | None:
        """The class its Speak is said at (its own Priority, else `priority`); None: no Speak."""
        if Write.SPEAK not in self.values:
            return None
        written = self.values.get(Write.PRIORITY)
        return written if isinstance(written, str) else priority

    def asks(self, write: Write) -> bool:
        """Whether it writes `true` to a control (Stop, Acknowledge, Rebirth, Next Server)."""
        return self.values.get(write) is True

    @property
    def stops(self) -> bool:
        """It writes Stop: handled before any alarm that arrives after it (a barrier)."""
        return self.asks(Write.STOP)


def command_of(payload: bytes, *, device: bool, classes: Sequence[str]) -> Command:
    """An NCMD (`device` False) or DCMD payload read into what it does (`read_command`), each
    metric's first write counting; a Priority must be one of `classes`."""
    values: dict[Write, Value] = {}
    refused: list[Refused] = []
    again: Counter[str] = Counter()
    for write in read_command(payload, DEVICE_WRITES if device else NODE_WRITES):
        if isinstance(write, Refused):
            refused.append(write)
            continue
        kind = write.metric.write
        assert kind is not None  # noqa: S101 - read_command lets writable metrics through only
        if kind in values:
            again[write.metric.name] += 1
        elif kind == Write.PRIORITY and write.value not in classes:
            refused.append(Refused(write.metric.name, f"expected one of {', '.join(classes)}"))
        else:
            values[kind] = write.value
    refused += [
        Refused(name, f"written {count} more times in one command (the first write counts)")
        for name, count in again.items()
    ]
    return Command(device, values, tuple(refused))


# ---- the edge node ------------------------------------------------------------------------------


@dataclass(slots=True)
class EdgeNode:
    """The session state of the edge node: seq, what the host was last told, the values the
    node keeps (Speak, Priority, Last error). Every method returns (topic, payload) pairs to
    publish, in order."""

    topics: SparkplugTopics
    priority: str
    """The Priority a Speak is spoken at."""
    bd_seq: int = 0
    seq: int = 0
    born: bool = False
    device_alive: bool = False
    last_error: str = ""
    spoken: str = ""
    _state_error: str | None = None
    refused_ids: tuple[str, ...] = ()
    """The ids of the last refusals' events."""
    """The state's last error as last seen (a new one becomes Last error)."""
    sent: dict[str, tuple[Value, int]] = field(default_factory=dict)
    """Device metric -> (value, time of its change) as the host last heard it."""

    def _next(self) -> int:
        self.seq = (self.seq + 1) % 256
        return self.seq

    def values(self, state: Mapping[str, Any], at_ms: int) -> dict[str, tuple[Value, int]]:
        """Every device metric's value now, with the time it last changed."""
        kept: dict[str, Value] = {
            "Speak": self.spoken,
            "Priority": self.priority,
            "Stop": False,
            "Acknowledge": False,
            "Last error": self.last_error,
        }
        out = {}
        for metric in DEVICE_METRICS:
            value = metric.read(state) if metric.read is not None else kept.get(metric.name)
            before = self.sent.get(metric.name)
            out[metric.name] = (
                before if before is not None and before[0] == value else (value, at_ms)
            )
        return out

    def birth(self, state: Mapping[str, Any], at_ms: int) -> list[tuple[str, bytes]]:
        """NBIRTH (seq 0) and, with the audio device there, DBIRTH: after CONNECT (and the
        primary host's STATE online) and for a rebirth."""
        self.seq, self.born = 0, True
        messages = [(self.topics.nbirth, node_birth(self.bd_seq, at_ms))]
        self.device_alive = state.get("audio") == "available"
        if self.device_alive:
            self.sent = self.values(state, at_ms)
            messages.append(
                (self.topics.dbirth, device_message(self.sent, self._next(), at_ms, birth=True))
            )
        return messages

    def changed(self, state: Mapping[str, Any], at_ms: int) -> list[tuple[str, bytes]]:
        """What the host must hear of a new state: DDATA by exception, a DDEATH when the audio
        device went, a DBIRTH when it came back."""
        if not self.born:
            return []
        self._adopt_error(state)
        alive = state.get("audio") == "available"
        if alive != self.device_alive:
            self.device_alive = alive
            if not alive:
                return [(self.topics.ddeath, device_death(self._next(), at_ms))]
            self.sent = self.values(state, at_ms)
            return [
                (self.topics.dbirth, device_message(self.sent, self._next(), at_ms, birth=True))
            ]
        if not alive:
            return []
        now = self.values(state, at_ms)
        changes = {k: v for k, v in now.items() if self.sent.get(k) != v}
        if not changes:
            return []
        self.sent = now
        return [(self.topics.ddata, device_message(changes, self._next(), at_ms, birth=False))]

    def _adopt_error(self, state: Mapping[str, Any]) -> None:
        """The state's last error becomes Last error when it is new (a DCMD refusal set since
        stays until the state reports another)."""
        error = state.get("last_error")
        own = isinstance(error, str) and any(f" {i}:" in error for i in self.refused_ids)
        if isinstance(error, str) and error != self._state_error and not own:
            self.last_error = error[:255]
        self._state_error = error if isinstance(error, str) else None

    def refuse(self, text: str, request_id: str = "") -> None:
        """A command (or part of one) was not carried out: `text` (each metric's label and
        reason) is Last error (sent with the next `changed`); the state's own line for its
        event (`rejected <id>: ...`, less precise) does not replace it."""
        self.last_error = text[:MAX_REFUSAL_CHARS]
        if request_id:
            self.refused_ids = (*self.refused_ids[-15:], request_id)
