"""The journal: what must survive a crash, in SQLite (WAL, synchronous FULL).

- Accepted announcements until they end: a speak message is acknowledged to the broker only
  once it is written here, so a crash after the ack loses nothing; after a restart the waiting
  ones are queued again and the one that was playing is played again (reported `interrupted`).
- The ids (and payload digests) of recent announcements, so a restart does not say one twice.
- Events not yet acknowledged by the broker (the outbox): published again after a restart.
- Settings made at run time (the volume, the selected voice), kept across restarts.
- Per announcement, the deaths of the agent inside one step of its work (see `ledger`).

Its parts: the file (`journal_file`: its place checked, its schema and migrations), the outbox
(`outbox`), the kept settings (`run_settings`) and the deaths counted per announcement
(`death_counts`); here the announcements' records and the transactions.

Every row is checked when it is read back (types, finite numbers in range, known classes and
states, valid UTF-8): whatever a damaged card or a hand edit left in the file, a row that cannot
be used is set aside (copied into the `damaged` table, for inspection) and reported, never a
failed start. The directory is opened without following symbolic links, and the file and its
companions (-wal, -shm, -journal) are checked to be regular files of a sane size through it
(`nofollow`) before SQLite opens them: a link, a FIFO, a directory, a device or a huge file in
the place of any of them is moved aside like a damaged file.

Used from the app thread only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final

from agent.core.messages import FALLBACKS, Priority, SpeakRequest
from agent.core.states import EntryState
from agent.storage.death_counts import DeathCounts
from agent.storage.journal_file import (
    MAX_NAME,
    JournalDamagedError,
    StorageRefusedError,
    is_utf8,
    move_aside,
    open_database,
    shown,
    value_kind,
)
from agent.storage.outbox import KEPT, Outbox
from agent.storage.run_settings import RunSettings
from agent.storage.set_aside import SetAside

_LOGGER = logging.getLogger(__name__)

BOOT_SETTING: Final = "boot"
"""The setting that holds the boot id of the machine at the agent's last start."""


@dataclass(frozen=True, slots=True)
class Pending:
    """An announcement that was accepted and had not ended when the agent stopped."""

    request: SpeakRequest
    received: float
    """Wall-clock time of arrival (seconds since the epoch)."""
    started: bool
    begun: int = 0
    """Activations (synthesis begun) since its last play that ended normally (or the last
    restart of the machine): each but the running one ended in a death of the agent."""
    crash_step: str | None = None
    """The step of its work the agent died in last (see `ledger`)."""
    crashes: int = 0
    """Deaths in a row inside that same step."""


@dataclass(frozen=True, slots=True)
class Damaged:
    """A row that cannot be used as it is: set aside, and reported."""

    table: str
    id: str | None
    """The announcement's id, when that much is readable (its event can then say so)."""
    problem: str
    """What is wrong, for the event and the log (no row content beyond the field's name)."""
    priority: Priority | None = None
    text: str | None = None
    """Its text, when readable (reported in its event, so that nothing is silently lost)."""


class Journal:
    """The agent's durable memory (one SQLite file)."""

    def __init__(self, path: Path | None, remembered: int) -> None:
        """Open (or create) the journal at `path`; None keeps it in memory (nothing survives a
        restart: the storage directory was refused). Raises StorageRefusedError when the
        directory cannot be used, JournalDamagedError when the file cannot."""
        self.path = path
        self._remembered = remembered
        self._db = open_database(path)
        self._set_aside = SetAside(self._db)
        self.notes = self._set_aside.notes
        """Problems met while reading rows back (rows set aside): for the log and the state."""
        self.outbox = Outbox(self._db, self._set_aside)
        """Events kept until the broker acknowledges them."""
        self.run_settings = RunSettings(self._db, self._set_aside)
        """Settings made at run time (the volume, the selected voice)."""
        self.deaths = DeathCounts(self._db)
        """Per announcement, its activations and the agent's deaths in a step of its work."""

    @classmethod
    def open_or_renew(cls, path: Path, remembered: int) -> tuple[Journal, str | None]:
        """Open the journal; one that cannot be used is moved aside (kept for inspection, with
        its companions; a link, a FIFO, a directory or a file over MAX_FILE_BYTES in the place
        of any of them is moved, never followed or read) and a fresh one started. A directory
        that cannot be used (a symbolic link, read-only) gives a journal in memory. Returns it
        and what went wrong, if anything."""
        try:
            return cls(path, remembered), None
        except StorageRefusedError as err:
            return cls._in_memory(remembered, str(err))
        except JournalDamagedError as err:
            damage = str(err)
        try:
            aside = move_aside(path)
            renewed = cls(path, remembered)
        except (OSError, StorageRefusedError, JournalDamagedError) as err:
            return cls._in_memory(remembered, f"{path.name} unreadable ({damage}), and {err}")
        problem = f"journal {path.name} unreadable ({damage}); moved to {aside}"
        _LOGGER.error("%s; starting a new one", problem)
        return renewed, problem

    @classmethod
    def _in_memory(cls, remembered: int, why: str) -> tuple[Journal, str]:
        problem = f"journal: {why}; kept in memory only (not across a restart)"
        _LOGGER.error("%s", problem)
        return cls(None, remembered), problem

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
        """Announcements that had not ended, oldest first (rows that cannot be read are set
        aside: see `recover`)."""
        return self.recover()[0]

    def recover(self) -> tuple[list[Pending], list[Damaged]]:
        """What a restart finds: the announcements that had not ended, oldest first, and the
        rows among them that cannot be used. Each of those is copied into `damaged`; one
        without a usable id is removed (nothing could end it), one with an id stays until its
        event ends it."""
        rows = self._db.execute(
            "SELECT seq, id, request, received, state, begun, crash_step, crashes "
            "FROM announcements WHERE state IS NOT ? ORDER BY seq",
            (EntryState.ENDED,),
        ).fetchall()
        out: list[Pending] = []
        damaged: list[Damaged] = []
        for row in rows:
            try:
                out.append(_pending(row))
                if _counts(row) is None:
                    self._set_aside.note(
                        f"announcement {row[1]}: its crash counts are unreadable; reset"
                    )
                    self._set_aside.quietly(
                        "UPDATE announcements SET begun = 0, crashes = 0, crash_step = NULL "
                        "WHERE seq = ?",
                        (row[0],),
                    )
            except _BadRowError as err:
                found = _salvage(row, str(err))
                damaged.append(found)
                self._set_aside.keep("announcements", row, found.problem)
                if found.id is None:  # no event can end it: noted, and kept in `damaged`
                    self._set_aside.note(f"an announcement without a readable id set aside ({err})")
                    self._set_aside.quietly("DELETE FROM announcements WHERE seq = ?", (row[0],))
        return out, damaged

    def remembered(self) -> tuple[list[str], list[str]]:
        """Ids and payload digests of recent announcements, oldest first (an unreadable one is
        left out, noted)."""
        rows = self._db.execute(
            "SELECT id, fingerprint FROM announcements ORDER BY seq DESC LIMIT ?",
            (self._remembered,),
        ).fetchall()
        rows.reverse()
        ids, fingerprints = [], []
        for request_id, fingerprint in rows:
            if _usable_id(request_id):
                ids.append(request_id)
            else:
                self._set_aside.note(
                    f"an announcement's id is unreadable ({value_kind(request_id)})"
                )
            if isinstance(fingerprint, str) and fingerprint and len(fingerprint) <= MAX_NAME:
                fingerprints.append(fingerprint)
        return ids, fingerprints

    def _set(self, request_id: str, state: EntryState) -> None:
        self._db.execute("UPDATE announcements SET state = ? WHERE id = ?", (state, request_id))

    # ---- outbox -------------------------------------------------------------------------------

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
        return self.outbox.add(topic, payload, rank)

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


class _BadRowError(Exception):
    """A row read back cannot be used (the message names the field and what was expected)."""


_MAX_ID: Final = 1024
_MAX_URL: Final = 8192
_STATES: Final = frozenset(EntryState)


def _dump(request: SpeakRequest) -> str:
    # recorded audio is not journaled (Hermes playBytes); the document is parsed again from the
    # text: neither is copied into the row
    body: dict[str, Any] = asdict(replace(request, audio=None, document=()))
    body["priority"] = int(request.priority)
    body["unknown_fields"] = list(request.unknown_fields)
    body.pop("audio")
    body.pop("document")
    return json.dumps(body)


def _load(text: object) -> SpeakRequest:
    """A journaled request, every field checked (raises _BadRowError)."""
    if not isinstance(text, str):
        raise _BadRowError(f"request: expected JSON text, found {value_kind(text)}")
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        raise _BadRowError("request: not JSON") from None
    if not isinstance(body, dict):
        raise _BadRowError(f"request: expected a JSON object, found {value_kind(body)}")
    values: dict[str, Any] = {}
    for name, value in body.items():
        check = REQUEST_FIELDS.get(name)
        if check is None:  # written by a later version: what this one cannot use is left out
            _LOGGER.warning("Journal: a request's field %s is unknown; left out", shown(name))
            continue
        try:
            values[name] = check(value)
        except (_BadRowError, TypeError, ValueError, OverflowError) as err:
            raise _BadRowError(f"request field {name}: {err}") from None
    for name in ("id", "text"):
        if name not in values:
            raise _BadRowError(f"request field {name}: missing")
    if values.get("ssml"):  # parsed again, as it was on arrival
        from agent.formats.ssml import SsmlError, parse_ssml  # noqa: PLC0415 - only for SSML

        try:
            values["document"] = parse_ssml(values["text"])
        except SsmlError as err:
            raise _BadRowError(
                f"request field ssml: its text is no SSML document ({err.detail})"
            ) from None
    return SpeakRequest(**values)


def request_json(request: SpeakRequest) -> str:
    """A request as the journal keeps it (JSON; recorded audio and the parsed document left
    out): also how it crosses between the node's two processes."""
    return _dump(request)


def request_from_json(text: str) -> SpeakRequest:
    """A request from `request_json`, every field checked as a journal row is; ValueError
    saying which field and what was expected."""
    try:
        return _load(text)
    except _BadRowError as err:
        raise ValueError(str(err)) from None


def _pending(row: tuple[object, ...]) -> Pending:
    """An announcement row as it can be used (raises _BadRowError). Its crash counts are only
    bookkeeping: unreadable ones are read as none (see `_counts`), never a reason to drop it."""
    _, request_id, text, received, state, *_ = row
    if not _usable_id(request_id):
        raise _BadRowError(f"id: expected 1-{_MAX_ID} printable characters")
    request = _load(text)
    if request.id != request_id:
        raise _BadRowError("request field id: not the row's id")
    if state not in _STATES:
        raise _BadRowError("state: expected one of " + ", ".join(sorted(_STATES)))
    begun, crash_step, crashes = _counts(row) or (0, None, 0)
    arrived = _number(0.0, 1e11, what="received")(received)
    return Pending(request, arrived, state == EntryState.STARTED, begun, crash_step, crashes)


def _counts(row: tuple[object, ...]) -> tuple[int, str | None, int] | None:
    """A row's crash counts (begun, crash step, crashes), or None when unreadable."""
    begun, crash_step, crashes = row[5:8]
    try:
        step = None if crash_step is None else str(_string(MAX_NAME)(crash_step))
        return _count(begun, "begun"), step, _count(crashes, "crashes")
    except _BadRowError:
        return None


def _salvage(row: tuple[object, ...], problem: str) -> Damaged:
    """What can be told of a damaged announcement row: its id, class and text if readable."""
    request_id = row[1] if isinstance(row[1], str) and _usable_id(row[1]) else None
    priority = text = None
    body: object = None
    with contextlib.suppress(TypeError, ValueError, RecursionError):
        body = json.loads(row[2]) if isinstance(row[2], str) else None
    if isinstance(body, dict):
        with contextlib.suppress(_BadRowError, TypeError, ValueError):
            priority = _priority(body.get("priority"))
        if isinstance(body.get("text"), str) and is_utf8(body["text"]):
            text = body["text"]
    return Damaged("announcements", request_id, problem, priority, text)


Check = Callable[[object], Any]
"""Checks one journaled value: the value to use, or raises _BadRowError saying what was
expected."""


def _usable_id(value: object) -> bool:
    return (
        isinstance(value, str)
        and 0 < len(value) <= _MAX_ID
        and value.isprintable()
        and is_utf8(value)
    )


def _string(max_chars: int, *, printable: bool = True) -> Check:
    def check(value: object) -> str:
        if (
            isinstance(value, str)
            and len(value) <= max_chars
            and (value.isprintable() or not printable)
            and is_utf8(value)
        ):
            return value
        raise _BadRowError(f"expected text of at most {max_chars} characters")

    return check


def _number(low: float, high: float, *, what: str = "") -> Check:
    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _BadRowError(f"{what}{': ' if what else ''}expected a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise _BadRowError(f"{what}{': ' if what else ''}expected a finite number")
        if not low <= value <= high:  # exact for integers of any size
            raise _BadRowError(f"{what}{': ' if what else ''}expected {low:g} to {high:g}")
        return float(value)

    return check


def _integer(low: int, high: int) -> Check:
    def check(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        raise _BadRowError(f"expected a whole number from {low} to {high}")

    return check


def _count(value: object, name: str) -> int:
    try:
        return int(_integer(0, 10**9)(value))
    except _BadRowError as err:
        raise _BadRowError(f"{name}: {err}") from None


def _boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise _BadRowError("expected true or false")


def _optional(check: Check) -> Check:
    def optional(value: object) -> Any:
        return None if value is None else check(value)

    return optional


def _priority(value: object) -> Priority:
    if isinstance(value, int) and not isinstance(value, bool) and value in set(Priority):
        return Priority(value)
    raise _BadRowError("expected a class from 0 to 4")


def _chime(value: object) -> bool | str | None:
    if value is None or isinstance(value, bool):
        return value
    return str(_string(64)(value))


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, list) and len(value) <= 1000:
        return tuple(_string(MAX_NAME)(v) for v in value)
    raise _BadRowError("expected a list of names")


def _fallback(value: object) -> str | None:
    if value is None or (isinstance(value, str) and value in FALLBACKS):
        return value
    raise _BadRowError("expected one of " + ", ".join(sorted(FALLBACKS)))


REQUEST_FIELDS: Final[Mapping[str, Check]] = {
    "id": _string(_MAX_ID),
    "text": _string(10**7, printable=False),
    "unknown_fields": _names,
    "voice": _optional(_string(MAX_NAME)),
    "rate": _number(0.01, 100.0),
    "volume": _number(0.0, 1.0),
    "priority": _priority,
    "ttl": _optional(_number(0.0, 1e11)),
    "interrupt": _optional(_boolean),
    "chime": _chime,
    "repeat": _integer(0, 10**6),
    "repeat_interval": _number(0.0, 1e9),
    "dedupe_key": _optional(_string(MAX_NAME)),
    "at": _optional(_number(0.0, 1e11)),
    "ssml": _boolean,
    "speaker": _optional(_string(MAX_NAME)),
    "lang": _optional(_string(64)),
    "sound": _optional(_string(_MAX_URL)),
    "sound_after": _optional(_string(_MAX_URL)),
    "fallback": _fallback,
    "source": _optional(_string(64)),
}
"""How each journaled field of a request is checked when read back: types, finite numbers,
bounds wide enough for anything the parser accepts (the journal only holds what it did), so
that a damaged or edited value is found here, not in the synthesizer or the player."""
UNJOURNALED: Final = frozenset({"audio", "document"})
"""Request fields never written to the journal: recorded audio (real-time only), and the parsed
SSML document (parsed again from `text` when it is read back)."""
