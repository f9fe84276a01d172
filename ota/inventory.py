"""The fleet as its retained topics describe it: every node that announced itself, online or not.

Built from `<prefix>/<node>/status` (`online`/`offline`, the Last Will) and `<prefix>/<node>/state`
(JSON); a field a node does not publish is None here and `?` in the table. Whatever a node
retains, it is listed: a field the tool cannot use is None, named in the node's `invalid` (`!` in
the table, the node's check `invalid`), and a state that cannot be read at all marks the node
`unreadable` (`ota.node_messages` validates; `ota.safe_text` escapes what is shown).

Pure: the MQTT side (`ota.fleet`) feeds it messages with the wall time they arrived. `feed` (on
paho's network thread) only stores the payload; it is parsed when a record is read, on the
reader's thread.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from ota.node_messages import (
    MAX_STATE_BYTES,
    MAX_TEXT,
    LastUpdate,
    NodeState,
    describe,
    parse_state,
)
from ota.safe_text import escaped, is_clean

MISSING: Final = "?"
"""What the table shows for a field the node does not publish."""
INVALID: Final = "!"
"""What the table shows for a field the node publishes but the tool cannot use."""
DEFAULT_STALE_AFTER: Final = 300.0
"""Seconds after which an `online` node whose newest state is older is shown `stale` (set it
to a few times the nodes' `state.interval`; 0 turns the check off)."""
CLOCK_AHEAD: Final = 600.0
"""A state `ts` further ahead of this machine's clock is not a sign of life (a forged or broken
clock would otherwise keep a node `online` for ever)."""
CELL: Final = 48
"""Characters of a node's text in a table cell (then `…`; JSON has all of it)."""
NODE_CELL: Final = 64
MAX_STATUS_BYTES: Final = 64
_NO_STATE: Final = NodeState()


def parse_time(value: Any) -> float | None:
    """An ISO 8601 time (`Z` or an offset) as a POSIX timestamp; None if absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        return moment.timestamp()
    except (OverflowError, ValueError, OSError):
        return None


def iso(stamp: float | None) -> str | None:
    """A POSIX timestamp as ISO 8601 UTC with seconds, or None (also when out of range)."""
    if stamp is None:
        return None
    try:
        moment = datetime.fromtimestamp(stamp, UTC)
    except (OverflowError, ValueError, OSError):
        return None
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class NodeRecord:
    """What the tool knows of one node (fed by messages)."""

    node: str
    status: str | None = None
    status_at: float | None = None
    """Wall time the tool received the status."""
    status_live: bool = False
    """The status arrived while the tool listened (not as a retained message)."""
    state: NodeState = _NO_STATE
    state_at: float | None = None
    heard_at: float | None = None
    """Wall time of the newest live (not retained) message from the node."""
    watched_since: float | None = None
    """Since when the tool has been listening (a node silent for longer than `stale_after`
    while it listened is stale, even without a `ts` in its state)."""
    status_invalid: str | None = None
    """Why the retained status was not `online` or `offline`."""

    @property
    def last_update(self) -> LastUpdate | None:
        """The node's last final update result (`last_update` in its state), if it says."""
        return self.state.last_update

    @property
    def groups(self) -> list[str] | None:
        """Speak groups, None when the node does not publish them (or not usably)."""
        return None if self.state.groups is None else list(self.state.groups)

    @property
    def ota_groups(self) -> list[str] | None:
        """Groups whose offers reach the node, None when it does not publish them."""
        return None if self.state.ota_groups is None else list(self.state.ota_groups)

    def in_group(self, group: str) -> bool:
        """Whether the node names the group among its speak or update groups."""
        return group in (self.groups or []) or group in (self.ota_groups or [])

    def _state_time(self, now: float) -> float | None:
        stamp = self.state.ts
        return stamp if stamp is not None and stamp <= now + CLOCK_AHEAD else None

    def invalid(self, now: float) -> dict[str, str]:
        """Everything the tool could not use about this node: field -> why."""
        found: dict[str, str] = {}
        if not is_clean(self.node):
            found["node"] = f"control or format characters in the id ({describe(self.node)})"
        elif len(self.node) > MAX_TEXT:
            found["node"] = f"an id longer than {MAX_TEXT} characters ({len(self.node)})"
        if self.status_invalid is not None:
            found["status"] = self.status_invalid
        found.update(self.state.invalid)
        if self.state.ts is not None and self._state_time(now) is None:
            found["ts"] = f"ahead of this machine's clock ({describe(self.state.ts_text)})"
        return found

    def check(self, now: float) -> str:
        """`ok`, `invalid` (some fields unusable) or `unreadable` (the state as a whole)."""
        if self.state.unreadable is not None:
            return "unreadable"
        return "invalid" if self.invalid(now) else "ok"

    def last_seen(self, now: float | None = None) -> float | None:
        """The newest sign of life: the state's own `ts` (unless ahead of this clock), or a live
        message's arrival."""
        now = time.time() if now is None else now
        stamps = [s for s in (self._state_time(now), self.heard_at) if s is not None]
        return max(stamps) if stamps else None

    def presence(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> str:
        """`online`, `offline`, `stale` (says online, but nothing newer than stale_after) or
        `unknown` (a state, but no usable status)."""
        if self.status == "offline":
            return "offline"
        if self.status != "online":
            return "unknown"
        seen = self.last_seen(now) or self.watched_since
        if stale_after > 0 and seen is not None and now - seen > stale_after:
            return "stale"
        return "online"

    def since(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> float | None:
        """When the presence began: for an offline or stale node the last sign of life; for an
        online one its start (`ts` minus `uptime_s`), or when the tool saw it come online."""
        presence = self.presence(now, stale_after)
        if presence in {"offline", "stale"}:
            return self.last_seen(now)
        stamp, uptime = self._state_time(now), self.state.uptime_s
        if stamp is not None and uptime is not None:
            return stamp - uptime
        if self.status_live:
            return self.status_at
        return None

    def view(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> dict[str, Any]:
        """The node as JSON for scripts (None where the node does not say, or not usably: see
        `invalid`)."""
        state = self.state
        last = state.last_update
        return {
            "node": self.node,
            "presence": self.presence(now, stale_after),
            "since": iso(self.since(now, stale_after)),
            "last_seen": iso(self.last_seen(now)),
            "groups": self.groups,
            "ota_groups": self.ota_groups,
            "device_class": state.device_class,
            "model": state.model,
            "model_release": state.model_release,
            "model_version": state.model_version,
            "model_sha256": state.model_sha256,
            "last_update": last.as_json() if last is not None else None,
            "agent_version": state.agent_version,
            "audio": state.audio,
            "uptime_s": state.uptime_s,
            "state_ts": state.ts_text if self._state_time(now) is not None else None,
            "check": self.check(now),
            "invalid": self.invalid(now),
        }


@dataclass
class _Raw:
    """What arrived for one node, unparsed (touched under the inventory's lock)."""

    record: NodeRecord
    payload: bytes | NodeState | None = None
    """The newest state payload, or its verdict when it was refused unread (too large)."""
    parsed: tuple[bytes, NodeState] | None = field(default=None)


class Inventory:
    """Node records keyed by node id, safe to feed from paho's thread and read from another."""

    def __init__(self, prefix: str = "voice") -> None:
        self.prefix = prefix
        self.started = time.time()
        self._nodes: dict[str, _Raw] = {}
        self._bridges: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def feed(self, topic: str, payload: bytes, retained: bool, at: float) -> str | None:
        """Take one message on `<prefix>/<node>/{status,state,events}` or a bridge notification;
        the node it was about, if any. Runs on paho's thread: stores, never parses."""
        if topic.startswith("$SYS/broker/connection/") and topic.endswith("/state"):
            name = topic.removeprefix("$SYS/broker/connection/").removesuffix("/state")
            with self._lock:
                self._bridges[name] = ("up" if payload.strip() == b"1" else "down", at)
            return None
        parts = topic.split("/")
        valid = len(parts) == 3 and parts[0] == self.prefix and parts[1] not in {"all", "group"}
        if not valid or parts[2] not in {"status", "state", "events"}:
            return None
        node, kind = parts[1], parts[2]
        with self._lock:
            raw = self._nodes.get(node)
            if raw is None and kind == "events":  # events alone do not announce a node
                return None
            if raw is None:
                raw = self._nodes[node] = _Raw(NodeRecord(node, watched_since=self.started))
            record = raw.record
            if not retained:
                record.heard_at = at
            if kind == "status":
                record.status, record.status_invalid = _status(payload)
                record.status_at = at
                record.status_live = not retained
            elif kind == "state":
                raw.payload = _state_payload(payload)
                record.state_at = at
        return node

    def forget(self, node: str) -> None:
        """Drop a node (its retained topics were cleared)."""
        with self._lock:
            self._nodes.pop(node, None)

    def get(self, node: str) -> NodeRecord | None:
        """A copy of one node's record, its state parsed."""
        with self._lock:
            raw = self._nodes.get(node)
            taken = _take(raw) if raw is not None else None
        return self._parsed(taken) if taken is not None else None

    def records(self, group: str | None = None) -> list[NodeRecord]:
        """Copies of the records (states parsed), sorted by node id, optionally one group's."""
        with self._lock:
            taken = [_take(raw) for raw in self._nodes.values()]
        found = [self._parsed(item) for item in taken]
        if group is not None:
            found = [r for r in found if r.in_group(group)]
        return sorted(found, key=lambda r: r.node)

    def _parsed(self, taken: tuple[_Raw, NodeRecord, bytes | NodeState | None]) -> NodeRecord:
        """The record with its state: parsed here, on the reader's thread, once per payload."""
        raw, record, payload = taken
        if payload is None:
            return record
        if isinstance(payload, NodeState):
            return replace(record, state=payload)
        cached = raw.parsed
        if cached is not None and cached[0] is payload:
            return replace(record, state=cached[1])
        state = parse_state(payload)
        with self._lock:
            if raw.payload is payload:
                raw.parsed = (payload, state)
        return replace(record, state=state)

    def bridges(self) -> dict[str, tuple[str, float]]:
        """Bridge connections the broker reports (`$SYS/broker/connection/<name>/state`):
        name -> (`up`/`down`, when the tool heard it)."""
        with self._lock:
            return dict(self._bridges)

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)


def _take(raw: _Raw) -> tuple[_Raw, NodeRecord, bytes | NodeState | None]:
    return raw, replace(raw.record), raw.payload


def _status(payload: bytes) -> tuple[str | None, str | None]:
    """(`online`/`offline` or None, why the payload is not one of them)."""
    if not payload:
        return None, None  # the retained status was cleared
    text = payload[:MAX_STATUS_BYTES].decode("utf-8", "replace").strip()
    if len(payload) <= MAX_STATUS_BYTES and text in {"online", "offline"}:
        return text, None
    return None, f"not online or offline ({describe(text)}, {len(payload)} bytes)"


def _state_payload(payload: bytes) -> bytes | NodeState | None:
    """What to keep of a state payload: the bytes, to parse when read; a verdict for one too
    large to keep; None when the retained state was cleared."""
    if not payload:
        return None
    if len(payload) > MAX_STATE_BYTES:
        why = f"too large ({len(payload)} bytes > {MAX_STATE_BYTES})"
        return NodeState(unreadable=why, invalid={"state": why}, present=True)
    return payload


def summary(records: list[NodeRecord], now: float, stale_after: float) -> list[dict[str, Any]]:
    """Nodes per installed release: release, version, counts by presence."""
    groups: dict[tuple[int | None, str | None], Counter[str]] = {}
    for record in records:
        key = (record.state.model_release, record.state.model_version)
        groups.setdefault(key, Counter())[record.presence(now, stale_after)] += 1
    rows = []
    for (release, version), counts in sorted(
        groups.items(), key=lambda item: (_sort_key(item[0][0]), str(item[0][1]))
    ):
        rows.append(
            {
                "release": release,
                "version": version,
                "nodes": sum(counts.values()),
                **{p: counts.get(p, 0) for p in ("online", "offline", "stale", "unknown")},
            }
        )
    return rows


def _sort_key(value: int | None) -> tuple[int, int]:
    return (0, value) if value is not None else (1, 0)


def report(
    records: list[NodeRecord], now: float, stale_after: float, bridges: dict[str, tuple[str, float]]
) -> dict[str, Any]:
    """The inventory as one JSON document (every node; `invalid` says what it could not use)."""
    return {
        "generated": iso(now),
        "nodes": [r.view(now, stale_after) for r in records],
        "summary": summary(records, now, stale_after),
        "invalid_nodes": sum(1 for r in records if r.check(now) != "ok"),
        "bridges": {name: {"state": s, "at": iso(at)} for name, (s, at) in bridges.items()},
    }


def _cell(value: object, invalid: bool = False) -> str:
    """A node's value for the table: `!` when unusable, `?` when absent, escaped and cut."""
    if invalid:
        return INVALID
    if value is None:
        return MISSING
    if isinstance(value, list | tuple):
        return escaped(",".join(str(v) for v in value), CELL) or "-"
    return escaped(str(value), CELL)


def _ago(stamp: float | None, now: float) -> str:
    """`42s ago`, `12m ago`, `3h05m ago`, `2d04h ago`."""
    if stamp is None:
        return MISSING
    seconds = max(0, int(now - stamp))
    if seconds < 120:
        text = f"{seconds}s"
    elif seconds < 7200:
        text = f"{seconds // 60}m"
    elif seconds < 172800:
        text = f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    else:
        text = f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"
    return f"{text} ago"


def _last_update(last: LastUpdate | None, invalid: bool) -> str:
    if invalid:
        return INVALID
    if last is None:
        return MISSING
    text = f"{last.state or MISSING}"
    if last.reason:
        text += f" ({last.reason})"
    if last.release is not None:
        text += f" r{last.release}"
    return escaped(text, CELL)


TABLE_COLUMNS: Final = (
    "NODE",
    "PRESENCE",
    "SINCE",
    "GROUPS",
    "CLASS",
    "RELEASE",
    "VERSION",
    "SHA256",
    "LAST UPDATE",
    "AGENT",
    "AUDIO",
    "CHECK",
)


def _row(r: NodeRecord, now: float, stale_after: float) -> list[str]:
    state, bad = r.state, r.invalid(now)
    groups = r.groups
    if r.ota_groups is not None:
        groups = sorted({*(groups or []), *r.ota_groups})
    sha = state.model_sha256
    return [
        escaped(r.node, NODE_CELL),
        r.presence(now, stale_after),
        _ago(r.since(now, stale_after), now),
        _cell(groups, "groups" in bad or "ota_groups" in bad),
        _cell(state.device_class, "device_class" in bad),
        _cell(state.model_release, "model_release" in bad),
        _cell(state.model_version, "model_version" in bad),
        _cell(sha[:12] if sha is not None else None, "model_sha256" in bad),
        _last_update(state.last_update, any(k.startswith("last_update") for k in bad)),
        _cell(state.agent_version, "agent_version" in bad),
        _cell(state.audio, "audio" in bad),
        r.check(now),
    ]


def table(
    records: list[NodeRecord],
    now: float,
    stale_after: float,
    bridges: dict[str, tuple[str, float]] | None = None,
) -> str:
    """The inventory for people: one line per node, then the nodes per release, then what could
    not be used of each node (every character a node chose is escaped)."""
    rows = [list(TABLE_COLUMNS)]
    rows += [_row(r, now, stale_after) for r in records]
    lines = _aligned(rows)
    lines.append("")
    by_release = [["RELEASE", "VERSION", "NODES", "ONLINE", "OFFLINE", "STALE", "UNKNOWN"]]
    for row in summary(records, now, stale_after):
        by_release.append(
            [
                _cell(row["release"]),
                _cell(row["version"]),
                str(row["nodes"]),
                *(str(row[p]) for p in ("online", "offline", "stale", "unknown")),
            ]
        )
    lines += _aligned(by_release)
    counts = Counter(r.presence(now, stale_after) for r in records)
    lines.append(
        f"{len(records)} nodes: "
        + ", ".join(f"{counts.get(p, 0)} {p}" for p in ("online", "offline", "stale", "unknown"))
    )
    marked = [(r, r.invalid(now)) for r in records]
    marked = [(r, bad) for r, bad in marked if bad]
    if marked:
        lines.append(f"{len(marked)} nodes with fields the tool cannot use (`!` above):")
        for record, bad in marked:
            why = "; ".join(f"{name}: {reason}" for name, reason in bad.items())
            lines.append(f"  {escaped(record.node, NODE_CELL)}: {why}")
    for name, (state, at) in sorted((bridges or {}).items()):
        lines.append(f"bridge {escaped(name, NODE_CELL)}: {state} (heard {_ago(at, now)})")
    return "\n".join(lines)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
