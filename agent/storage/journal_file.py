"""The journal's file: where it may be (a directory that is no link, a file and companions that
are regular files of a sane size, checked through `nofollow` before SQLite opens any of them),
its schema and the columns added since the first journal (added to an older file when it is
opened), the whole file read and checked at open, and a file that cannot be used moved aside
with its companions. What the rows hold is `journal`'s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Final

from agent.guarded import nofollow

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS announcements (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    fingerprint TEXT NOT NULL,
    request TEXT NOT NULL,
    received REAL NOT NULL,
    state TEXT NOT NULL,
    begun INTEGER NOT NULL DEFAULT 0,
    crash_step TEXT,
    crashes INTEGER NOT NULL DEFAULT 0,
    crash_token TEXT
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
CREATE TABLE IF NOT EXISTS damaged (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    row TEXT NOT NULL,
    problem TEXT NOT NULL,
    at REAL NOT NULL
);
"""
_COLUMNS: Final = {
    "announcements": (
        ("begun", "INTEGER NOT NULL DEFAULT 0"),  # journals written before the crash-loop breaker
        ("crash_step", "TEXT"),  # before deaths were counted per step
        ("crashes", "INTEGER NOT NULL DEFAULT 0"),
        ("crash_token", "TEXT"),
    ),
    "outbox": (("rank", "INTEGER NOT NULL DEFAULT 9"),),  # before the outbox was bounded
}
"""Columns added since the first journal: added to an older file when it is opened."""
COMPANIONS: Final = ("", "-wal", "-shm", "-journal")
"""The journal file and the files SQLite keeps beside it (its write-ahead log and shared
memory; a rollback journal, which a WAL database never makes but SQLite would read)."""
MAX_FILE_BYTES: Final = 256 * 1024 * 1024
"""The largest journal (or companion) opened: what this agent writes stays far below (recent
ids, waiting announcements, at most OUTBOX_MAX unsent events: a few MB); a larger one is no
journal of its own (a planted sparse file), moved aside unread."""


class JournalDamagedError(Exception):
    """The journal file cannot be used (the message says why)."""


class StorageRefusedError(Exception):
    """The journal's directory cannot be used (a symbolic link, not writable): the message says
    why."""


def open_database(path: Path | None) -> sqlite3.Connection:
    """The journal's database at `path` (None: in memory), its schema brought up to date and
    every page read. Raises StorageRefusedError when the directory cannot be used,
    JournalDamagedError when the file cannot."""
    if path is not None:
        _check_place(path)
    # autocommit: each write is durable; one thread at a time (the app loop), which need not
    # be the one that opened it
    try:
        db = sqlite3.connect(
            ":memory:" if path is None else path, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as err:
        raise StorageRefusedError(f"{path}: {err}") from None
    db.text_factory = _text  # a TEXT value that is no UTF-8 is read as damage
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.executescript(_SCHEMA)
        for table, columns in _COLUMNS.items():
            present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            for name, declaration in columns:
                if name not in present:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")
        checked = db.execute("PRAGMA quick_check").fetchone()
        for table in ("announcements", "settings", "outbox", "damaged"):  # every page read
            db.execute(f"SELECT * FROM {table}").fetchall()  # noqa: S608 - our names
    except sqlite3.DatabaseError as err:
        db.close()
        raise JournalDamagedError(str(err)) from err
    if not checked or checked[0] != "ok":
        db.close()
        raise JournalDamagedError(f"integrity check: {checked[0] if checked else 'no answer'}")
    return db


def move_aside(path: Path) -> str:
    """Move the journal and its companions aside (renamed in their directory, never followed
    or read); the new name. Raises OSError."""
    aside = f"{path.name}.damaged-{int(time.time())}"
    directory = nofollow.open_directory(path.parent)
    try:
        for suffix in COMPANIONS:
            with contextlib.suppress(FileNotFoundError):
                os.replace(
                    f"{path.name}{suffix}",
                    f"{aside}{suffix}",
                    src_dir_fd=directory,
                    dst_dir_fd=directory,
                )
    finally:
        os.close(directory)
    return aside


def _check_place(path: Path) -> None:
    """The journal's directory is one (no symbolic link: StorageRefusedError); the file and its
    companions (COMPANIONS) are regular files of at most MAX_FILE_BYTES, or absent (else
    JournalDamagedError: moved aside), checked before SQLite opens any of them. A new file is
    private from the start (SQLite's -wal and -shm take its mode)."""
    try:
        directory = nofollow.open_directory(path.parent)
    except OSError as err:
        raise StorageRefusedError(str(err)) from None
    try:
        for suffix in COMPANIONS:
            name = f"{path.name}{suffix}"
            try:
                os.close(nofollow.open_regular(directory, name, max_bytes=MAX_FILE_BYTES))
            except FileNotFoundError:
                continue
            except nofollow.FileRefusedError as err:
                raise JournalDamagedError(f"{name} is {err.found}") from None
        if nofollow.kind(directory, path.name) is None:
            flags = os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(path.name, flags, 0o600, dir_fd=directory))
    except OSError as err:
        raise StorageRefusedError(f"{path.parent}: {err}") from None
    finally:
        os.close(directory)


class Undecodable(bytes):
    """A TEXT value that is no UTF-8 (as SQLite returned it)."""


def _text(data: bytes) -> str | Undecodable:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return Undecodable(data)


MAX_NAME: Final = 1024
"""The longest name, id or digest read back (characters)."""


def is_utf8(value: str) -> bool:
    """Whether the text encodes as UTF-8 (no lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def value_kind(value: object) -> str:
    """A value's kind, for a problem's text (never its content)."""
    if isinstance(value, Undecodable):
        return "text that is no UTF-8"
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "text",
        bytes: "bytes",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def shown(name: object) -> str:
    """A name for a problem's text: text cut short, else its kind."""
    return repr(name)[:66] if isinstance(name, str) else value_kind(name)
