"""The journal's outbox: every event kept until the broker acknowledges it, bounded for a long
outage (the lowest-ranked, oldest dropped first; alarms' and criticals' never), read back after
a restart with every row checked."""

from __future__ import annotations

import sqlite3
from typing import Final

from agent.storage.set_aside import SetAside

OUTBOX_MAX: Final = 5000
"""Events kept for a broker that does not acknowledge them (an outage of hours)."""
KEPT: Final = 9
"""The rank of events never dropped from the outbox (alarm and critical announcements')."""
MAX_TOPIC: Final = 1024
"""The longest topic a row read back may name."""


class Outbox:
    """The `outbox` table of the journal's connection."""

    def __init__(self, db: sqlite3.Connection, set_aside: SetAside) -> None:
        self._db = db
        self._set_aside = set_aside

    def add(self, topic: str, payload: bytes, rank: int = KEPT) -> int:
        """Keep an event until the broker acknowledges it; returns its key. Beyond OUTBOX_MAX
        events (a long broker outage) the lowest-ranked, oldest one is dropped first; one of
        rank KEPT never is."""
        cursor = self._db.execute(
            "INSERT INTO outbox (topic, payload, rank) VALUES (?, ?, ?)", (topic, payload, rank)
        )
        (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        if count > OUTBOX_MAX:
            self._db.execute(
                "DELETE FROM outbox WHERE seq IN (SELECT seq FROM outbox WHERE rank < ? "
                "ORDER BY rank, seq LIMIT ?)",
                (KEPT, count - OUTBOX_MAX),
            )
        return int(cursor.lastrowid or 0)

    def done(self, keys: list[int]) -> None:
        """The broker acknowledged these."""
        self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(k,) for k in keys])

    def pending(self) -> list[tuple[int, str, bytes]]:
        """Events published but never acknowledged, oldest first (an unreadable one is removed,
        noted)."""
        rows = self._db.execute("SELECT seq, topic, payload FROM outbox ORDER BY seq").fetchall()
        out = []
        for seq, topic, stored in rows:
            payload = stored.encode() if isinstance(stored, str) else stored
            if (
                isinstance(seq, int)
                and isinstance(topic, str)
                and 0 < len(topic) <= MAX_TOPIC
                and topic.isprintable()
                and not any(c in topic for c in "+#")
                and isinstance(payload, bytes)
            ):
                out.append((seq, topic, payload))
                continue
            self._set_aside.note("an unsent event is unreadable; dropped")
            self._set_aside.keep("outbox", (seq, topic, payload), "unreadable event")
            self._set_aside.quietly("DELETE FROM outbox WHERE seq IS ?", (seq,))
        return out

    def drop_unsent(self, key: int, topic: str) -> None:
        """An unsent event that is not to be published (not this node's): removed, noted."""
        self._set_aside.note(f"an unsent event for {topic!r} is not this node's; dropped")
        self._db.execute("DELETE FROM outbox WHERE seq = ?", (key,))
