"""The journal: what must survive a crash, in SQLite (WAL, synchronous FULL).

- Accepted announcements until they end: a speak message is acknowledged to the broker only
  once it is written here, so a crash after the ack loses nothing; after a restart the waiting
  ones are queued again and the one that was playing is played again (reported `interrupted`).
- The ids (and payload digests) of recent announcements, so a restart does not say one twice.
- Events not yet acknowledged by the broker (the outbox): published again after a restart.

Used from the app thread only. Allowed imports: stdlib, `messages`, `states`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from .messages import Priority, SpeakRequest
from .states import EntryState

_LOGGER = logging.getLogger(__name__)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS announcements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,
    request TEXT NOT NULL,
    received REAL NOT NULL,
    state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL
);
"""


@dataclass(frozen=True, slots=True)
class Pending:
    """An announcement that was accepted and had not ended when the agent stopped."""

    request: SpeakRequest
    received: float
    """Wall-clock time of arrival (seconds since the epoch)."""
    started: bool


class Journal:
    """The agent's durable memory (one SQLite file)."""

    def __init__(self, path: Path, remembered: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._remembered = remembered
        # autocommit: each write is durable; one thread at a time (the app loop), which need not
        # be the one that opened it
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the file."""
        self._db.close()

    # ---- announcements ------------------------------------------------------------------------

    def record(self, request: SpeakRequest, fingerprint: str, received: float) -> None:
        """Write an accepted announcement (before its message is acknowledged)."""
        self._db.execute(
            "INSERT OR IGNORE INTO announcements (id, fingerprint, request, received, state) "
            "VALUES (?, ?, ?, ?, ?)",
            (request.id, fingerprint, _dump(request), received, EntryState.QUEUED),
        )

    def ended(self, request_id: str) -> None:
        """It ended (any terminal event); only its id is still of use, to refuse it again."""
        self._set(request_id, EntryState.ENDED)
        self._db.execute(
            "DELETE FROM announcements WHERE state = ? AND seq <= "
            "(SELECT seq FROM announcements ORDER BY seq DESC LIMIT 1 OFFSET ?)",
            (EntryState.ENDED, self._remembered),
        )

    def pending(self) -> list[Pending]:
        """Announcements that had not ended, oldest first."""
        rows = self._db.execute(
            "SELECT request, received, state FROM announcements WHERE state != ? ORDER BY seq",
            (EntryState.ENDED,),
        ).fetchall()
        out = []
        for text, received, state in rows:
            try:
                out.append(Pending(_load(text), received, state == EntryState.STARTED))
            except (ValueError, TypeError, KeyError) as err:
                _LOGGER.error("Journal entry unreadable, skipped: %s", err)
        return out

    def remembered(self) -> tuple[list[str], list[str]]:
        """Ids and payload digests of recent announcements, oldest first."""
        rows = self._db.execute(
            "SELECT id, fingerprint FROM announcements ORDER BY seq DESC LIMIT ?",
            (self._remembered,),
        ).fetchall()
        rows.reverse()
        return [r[0] for r in rows], [r[1] for r in rows if r[1]]

    def _set(self, request_id: str, state: EntryState) -> None:
        self._db.execute("UPDATE announcements SET state = ? WHERE id = ?", (state, request_id))

    # ---- outbox -------------------------------------------------------------------------------

    def outbox_add(self, topic: str, payload: bytes) -> int:
        """Keep an event until the broker acknowledges it; returns its key."""
        cursor = self._db.execute(
            "INSERT INTO outbox (topic, payload) VALUES (?, ?)", (topic, payload)
        )
        return int(cursor.lastrowid or 0)

    def note_event(
        self, request_id: str, state: EntryState | None, topic: str, payload: bytes
    ) -> int:
        """Move an announcement to `state` (if given) and keep its event in the outbox; inside
        a `transaction`, a crash never leaves one without the other. Returns the outbox key."""
        if state == EntryState.ENDED:
            self.ended(request_id)
        elif state is not None:
            self._set(request_id, state)
        return self.outbox_add(topic, payload)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside is written at once, with one sync at the end (or not at all)."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def outbox_done(self, keys: list[int]) -> None:
        """The broker acknowledged these."""
        self._db.executemany("DELETE FROM outbox WHERE seq = ?", [(k,) for k in keys])

    def outbox_pending(self) -> list[tuple[int, str, bytes]]:
        """Events published but never acknowledged, oldest first."""
        rows = self._db.execute("SELECT seq, topic, payload FROM outbox ORDER BY seq").fetchall()
        return [(int(seq), str(topic), bytes(payload)) for seq, topic, payload in rows]


def _dump(request: SpeakRequest) -> str:
    body: dict[str, Any] = asdict(request)
    body["priority"] = int(request.priority)
    body["unknown_fields"] = list(request.unknown_fields)
    body.pop("audio", None)  # recorded audio is not journaled (see app: Hermes playBytes)
    return json.dumps(body)


def _load(text: str) -> SpeakRequest:
    body = json.loads(text)
    body["priority"] = Priority(body["priority"])
    body["unknown_fields"] = tuple(body["unknown_fields"])
    return SpeakRequest(**body)
