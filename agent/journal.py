"""The journal: what must survive a crash, in SQLite (WAL, synchronous FULL).

- Accepted announcements until they end: a speak message is acknowledged to the broker only
  once it is written here, so a crash after the ack loses nothing; after a restart the waiting
  ones are queued again and the one that was playing is played again (reported `interrupted`).
- The ids (and payload digests) of recent announcements, so a restart does not say one twice.
- Events not yet acknowledged by the broker (the outbox): published again after a restart.
- Settings made at run time (the volume, the selected voice), kept across restarts.

Used from the app thread only. Allowed imports: stdlib, `messages`, `states`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
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
    state TEXT NOT NULL,
    begun INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS settings (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    rank INTEGER NOT NULL DEFAULT 9
);
"""


OUTBOX_MAX: Final = 5000
"""Events kept for a broker that does not acknowledge them (an outage of hours)."""
KEPT: Final = 9
"""The rank of events never dropped from the outbox (alarm and critical announcements')."""


@dataclass(frozen=True, slots=True)
class Pending:
    """An announcement that was accepted and had not ended when the agent stopped."""

    request: SpeakRequest
    received: float
    """Wall-clock time of arrival (seconds since the epoch)."""
    started: bool
    begun: int = 0
    """Activations (synthesis begun) since its last play that ended normally: 2 or more means
    the agent died during its replay too."""


class JournalDamagedError(Exception):
    """The journal file cannot be used (the message says why)."""


class Journal:
    """The agent's durable memory (one SQLite file)."""

    def __init__(self, path: Path, remembered: int) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not path.exists():  # private from the start: SQLite's -wal and -shm take its mode
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.path = path
        self._remembered = remembered
        # autocommit: each write is durable; one thread at a time (the app loop), which need not
        # be the one that opened it
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(announcements)")}
            if "begun" not in columns:  # a journal written before the crash-loop breaker
                self._db.execute(
                    "ALTER TABLE announcements ADD COLUMN begun INTEGER NOT NULL DEFAULT 0"
                )
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
            if "rank" not in columns:  # a journal written before the outbox was bounded
                self._db.execute("ALTER TABLE outbox ADD COLUMN rank INTEGER NOT NULL DEFAULT 9")
            checked = self._db.execute("PRAGMA quick_check").fetchone()
        except sqlite3.DatabaseError as err:
            self._db.close()
            raise JournalDamagedError(str(err)) from err
        if not checked or checked[0] != "ok":
            self._db.close()
            raise JournalDamagedError(f"integrity check: {checked[0] if checked else 'no answer'}")

    @classmethod
    def open_or_renew(cls, path: Path, remembered: int) -> tuple[Journal, str | None]:
        """Open the journal; one that cannot be used is moved aside (kept for inspection, with
        its -wal and -shm) and a fresh one started. Returns it and what went wrong, if
        anything."""
        try:
            return cls(path, remembered), None
        except JournalDamagedError as err:
            aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(f"{path}{suffix}", f"{aside}{suffix}")
            problem = f"journal {path.name} unreadable ({err}); moved to {aside.name}"
            _LOGGER.error("%s; starting a new one", problem)
            return cls(path, remembered), problem

    def probe(self) -> None:
        """One small durable write (raises sqlite3.Error while the disk cannot take one)."""
        with self.transaction():
            self._db.execute("PRAGMA user_version = 1")

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
            "SELECT request, received, state, begun FROM announcements WHERE state != ? "
            "ORDER BY seq",
            (EntryState.ENDED,),
        ).fetchall()
        out = []
        for text, received, state, begun in rows:
            try:
                out.append(Pending(_load(text), received, state == EntryState.STARTED, begun))
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

    def activated(self, request_id: str) -> None:
        """Its synthesis begins (again): counted, so that a crash loop is seen at restart."""
        self._db.execute("UPDATE announcements SET begun = begun + 1 WHERE id = ?", (request_id,))

    def played_through(self, request_id: str) -> None:
        """A play of it ended normally (a repeat finished, a preemption): the count of
        activations starts again."""
        self._db.execute("UPDATE announcements SET begun = 0 WHERE id = ?", (request_id,))

    def _set(self, request_id: str, state: EntryState) -> None:
        self._db.execute("UPDATE announcements SET state = ? WHERE id = ?", (state, request_id))

    # ---- settings -----------------------------------------------------------------------------

    def remember(self, name: str, value: str) -> None:
        """Keep a setting (the volume, the selected voice) across restarts."""
        self._db.execute(
            "INSERT INTO settings (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    def settings(self) -> dict[str, str]:
        """The settings kept."""
        return dict(self._db.execute("SELECT name, value FROM settings").fetchall())

    # ---- outbox -------------------------------------------------------------------------------

    def outbox_add(self, topic: str, payload: bytes, rank: int = KEPT) -> int:
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

    def note_event(
        self,
        request_id: str,
        state: EntryState | None,
        topic: str,
        payload: bytes,
        rank: int = KEPT,
    ) -> int:
        """Move an announcement to `state` (if given) and keep its event in the outbox; inside
        a `transaction`, a crash never leaves one without the other. Returns the outbox key."""
        if state == EntryState.ENDED:
            self.ended(request_id)
        elif state is not None:
            self._set(request_id, state)
        return self.outbox_add(topic, payload, rank)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside is written at once, with one sync at the end (or not at all)."""
        self.begin()
        try:
            yield
        except BaseException:
            self.rollback()
            raise
        self.commit()

    def begin(self) -> None:
        """Start a transaction (see `transaction`)."""
        self._db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        """Write the transaction, with one sync."""
        self._db.execute("COMMIT")

    def rollback(self) -> None:
        """Forget the transaction's writes (quietly if SQLite already did)."""
        if self._db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                self._db.execute("ROLLBACK")

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
