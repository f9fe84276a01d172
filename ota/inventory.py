"""The fleet as its retained topics describe it: every node that announced itself, online or not.

Built from `<prefix>/<node>/status` (`online`/`offline`, the Last Will) and `<prefix>/<node>/state`
(JSON); a field a node does not publish is None here and `?` in the table. Pure: the MQTT side
(`ota.fleet`) feeds it messages with the wall time they arrived.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

MISSING: Final = "?"
"""What the table shows for a field the node does not publish."""
DEFAULT_STALE_AFTER: Final = 300.0
"""Seconds after which an `online` node whose newest state is older is shown `stale` (set it
to a few times the nodes' `state.interval`; 0 turns the check off)."""


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
    return moment.timestamp()


def iso(stamp: float | None) -> str | None:
    """A POSIX timestamp as ISO 8601 UTC with seconds, or None."""
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _json_object(payload: bytes) -> dict[str, Any] | None:
    try:
        loaded = json.loads(payload)
    except ValueError:
        return None
    return loaded if isinstance(loaded, dict) else None


def _strings(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    return None


@dataclass
class NodeRecord:
    """What the tool knows of one node (fed by messages)."""

    node: str
    status: str | None = None
    status_at: float | None = None
    """Wall time the tool received the status."""
    status_live: bool = False
    """The status arrived while the tool listened (not as a retained message)."""
    state: dict[str, Any] = field(default_factory=dict)
    state_at: float | None = None
    heard_at: float | None = None
    """Wall time of the newest live (not retained) message from the node."""
    watched_since: float | None = None
    """Since when the tool has been listening (a node silent for longer than `stale_after`
    while it listened is stale, even without a `ts` in its state)."""

    def field(self, name: str) -> Any:
        """A state field, None when absent."""
        return self.state.get(name)

    @property
    def last_update(self) -> dict[str, Any] | None:
        """The node's last final update result (`last_update` in its state), if it says."""
        value = self.state.get("last_update")
        return value if isinstance(value, dict) else None

    @property
    def groups(self) -> list[str] | None:
        """Speak groups, None when the node does not publish them."""
        return _strings(self.state.get("groups"))

    @property
    def ota_groups(self) -> list[str] | None:
        """Groups whose offers reach the node, None when it does not publish them."""
        return _strings(self.state.get("ota_groups"))

    def in_group(self, group: str) -> bool:
        """Whether the node names the group among its speak or update groups."""
        return group in (self.groups or []) or group in (self.ota_groups or [])

    def last_seen(self) -> float | None:
        """The newest sign of life: the state's own `ts`, or a live message's arrival."""
        stamps = [s for s in (parse_time(self.state.get("ts")), self.heard_at) if s is not None]
        return max(stamps) if stamps else None

    def presence(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> str:
        """`online`, `offline`, `stale` (says online, but nothing newer than stale_after) or
        `unknown` (a state, but no status)."""
        if self.status == "offline":
            return "offline"
        if self.status != "online":
            return "unknown"
        seen = self.last_seen() or self.watched_since
        if stale_after > 0 and seen is not None and now - seen > stale_after:
            return "stale"
        return "online"

    def since(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> float | None:
        """When the presence began: for an offline or stale node the last sign of life; for an
        online one its start (`ts` minus `uptime_s`), or when the tool saw it come online."""
        presence = self.presence(now, stale_after)
        if presence in {"offline", "stale"}:
            return self.last_seen()
        stamp = parse_time(self.state.get("ts"))
        uptime = self.state.get("uptime_s")
        if stamp is not None and isinstance(uptime, int | float):
            return stamp - float(uptime)
        if self.status_live:
            return self.status_at
        return None

    def view(self, now: float, stale_after: float = DEFAULT_STALE_AFTER) -> dict[str, Any]:
        """The node as JSON for scripts (None where the node does not say)."""
        last = self.last_update
        return {
            "node": self.node,
            "presence": self.presence(now, stale_after),
            "since": iso(self.since(now, stale_after)),
            "last_seen": iso(self.last_seen()),
            "groups": self.groups,
            "ota_groups": self.ota_groups,
            "device_class": self.field("device_class"),
            "model": self.field("model"),
            "model_release": self.field("model_release"),
            "model_version": self.field("model_version"),
            "model_sha256": self.field("model_sha256"),
            "last_update": last,
            "agent_version": self.field("agent_version"),
            "audio": self.field("audio"),
            "uptime_s": self.field("uptime_s"),
            "state_ts": self.field("ts"),
        }


class Inventory:
    """Node records keyed by node id, safe to feed from paho's thread and read from another."""

    def __init__(self, prefix: str = "voice") -> None:
        self.prefix = prefix
        self.started = time.time()
        self._nodes: dict[str, NodeRecord] = {}
        self._bridges: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def feed(self, topic: str, payload: bytes, retained: bool, at: float) -> str | None:
        """Take one message on `<prefix>/<node>/{status,state,events}` or a bridge notification;
        the node it was about, if any."""
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
        state = _json_object(payload) if kind == "state" else None
        if kind == "state" and state is None:
            return None
        with self._lock:
            record = self._nodes.get(node)
            if record is None and kind == "events":  # events alone do not announce a node
                return None
            if record is None:
                record = self._nodes[node] = NodeRecord(node, watched_since=self.started)
            if not retained:
                record.heard_at = at
            if kind == "status":
                text = payload.decode("utf-8", "replace").strip()
                record.status = text if text in {"online", "offline"} else None
                record.status_at = at
                record.status_live = not retained
            elif state is not None:
                record.state = state
                record.state_at = at
        return node

    def forget(self, node: str) -> None:
        """Drop a node (its retained topics were cleared)."""
        with self._lock:
            self._nodes.pop(node, None)

    def get(self, node: str) -> NodeRecord | None:
        """A copy of one node's record."""
        with self._lock:
            record = self._nodes.get(node)
            return _copy(record) if record else None

    def records(self, group: str | None = None) -> list[NodeRecord]:
        """Copies of the records, sorted by node id, optionally only one group's."""
        with self._lock:
            found = [_copy(r) for r in self._nodes.values()]
        if group is not None:
            found = [r for r in found if r.in_group(group)]
        return sorted(found, key=lambda r: r.node)

    def bridges(self) -> dict[str, tuple[str, float]]:
        """Bridge connections the broker reports (`$SYS/broker/connection/<name>/state`):
        name -> (`up`/`down`, when the tool heard it)."""
        with self._lock:
            return dict(self._bridges)

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)


def _copy(record: NodeRecord) -> NodeRecord:
    return NodeRecord(
        record.node,
        record.status,
        record.status_at,
        record.status_live,
        dict(record.state),
        record.state_at,
        record.heard_at,
        record.watched_since,
    )


def summary(records: list[NodeRecord], now: float, stale_after: float) -> list[dict[str, Any]]:
    """Nodes per installed release: release, version, counts by presence."""
    groups: dict[tuple[Any, Any], Counter[str]] = {}
    for record in records:
        key = (record.field("model_release"), record.field("model_version"))
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


def _sort_key(value: Any) -> tuple[int, int]:
    return (0, value) if isinstance(value, int) and not isinstance(value, bool) else (1, 0)


def report(
    records: list[NodeRecord], now: float, stale_after: float, bridges: dict[str, tuple[str, float]]
) -> dict[str, Any]:
    """The inventory as one JSON document."""
    return {
        "generated": iso(now),
        "nodes": [r.view(now, stale_after) for r in records],
        "summary": summary(records, now, stale_after),
        "bridges": {name: {"state": s, "at": iso(at)} for name, (s, at) in bridges.items()},
    }


def _cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


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


def _last_update(last: dict[str, Any] | None) -> str:
    if last is None:
        return MISSING
    text = f"{last.get('state', MISSING)}"
    if last.get("reason"):
        text += f" ({last['reason']})"
    if last.get("release") is not None:
        text += f" r{last['release']}"
    return text


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
)


def table(
    records: list[NodeRecord],
    now: float,
    stale_after: float,
    bridges: dict[str, tuple[str, float]] | None = None,
) -> str:
    """The inventory for people: one line per node, then the nodes per release."""
    rows = [list(TABLE_COLUMNS)]
    for r in records:
        sha = r.field("model_sha256")
        groups = r.groups
        if r.ota_groups is not None:
            groups = sorted({*(groups or []), *r.ota_groups})
        rows.append(
            [
                r.node,
                r.presence(now, stale_after),
                _ago(r.since(now, stale_after), now),
                _cell(groups),
                _cell(r.field("device_class")),
                _cell(r.field("model_release")),
                _cell(r.field("model_version")),
                sha[:12] if isinstance(sha, str) else MISSING,
                _last_update(r.last_update),
                _cell(r.field("agent_version")),
                _cell(r.field("audio")),
            ]
        )
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
    for name, (state, at) in sorted((bridges or {}).items()):
        lines.append(f"bridge {name}: {state} (heard {_ago(at, now)})")
    return "\n".join(lines)


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
