"""The journal's writes while the disk may refuse them (disk full, a read-only or failing card):
the first refused write makes the ledger volatile (`problem` says why), later writes are not
tried, and a small write is tried every PROBE_SECONDS until one succeeds. Reads at start that
the file refuses are logged and noted, and the start goes on without them. Used by the ledger
(the app loop) only.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import Final, TypeVar

from agent.storage.journal import Journal

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

PROBE_SECONDS: Final = 5.0
"""While the journal cannot be written, how often a small write is tried."""


class JournalGuard:
    """A journal's transactions and writes, volatile once the disk refuses one."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.problem: str | None = None
        """Why the journal cannot be written now (None: it can)."""
        self.refused = False
        """A write of the open transaction was refused (its writes are rolled back at its end)."""
        self._next_probe = 0.0

    def begin(self) -> bool:
        """Start a transaction; False if the disk refused (volatile now)."""
        try:
            self._journal.begin()
        except sqlite3.Error as err:
            self._failed(err)
            return False
        return True

    def end(self) -> None:
        """Commit the transaction, or roll it back if a write in it was refused (or the commit
        is)."""
        if self.refused:
            self._journal.rollback()
            return
        try:
            self._journal.commit()
        except sqlite3.Error as err:
            self._journal.rollback()
            self._failed(err)

    def rollback(self) -> None:
        """Forget the transaction's writes."""
        self._journal.rollback()

    def write(self, write: Callable[[], object]) -> None:
        """One journal write, unless volatile; a refused write makes the ledger volatile (the
        transaction's writes are rolled back at its end)."""
        if self.problem is not None:
            return
        try:
            write()
        except sqlite3.Error as err:
            self.refused = True
            self._failed(err)

    def read(self, what: str, read: Callable[[], _T], nothing: _T) -> _T:
        """A read of the journal at start; one the file refuses (damage SQLite finds only now)
        is logged and noted, and the start goes on without it."""
        try:
            return read()
        except sqlite3.Error as err:
            _LOGGER.error("The journal's %s cannot be read: %s", what, err)
            self._journal.notes.append(f"{what} unreadable: {err}")
            return nothing

    def recovered(self, now: float) -> bool:
        """While volatile: try a small write (every PROBE_SECONDS); True when it worked, i.e.
        the journal is used again."""
        if self.problem is None or now < self._next_probe:
            return False
        self._next_probe = now + PROBE_SECONDS
        try:
            self._journal.probe()
        except sqlite3.Error:
            return False
        _LOGGER.warning("The journal can be written again (it could not: %s)", self.problem)
        self.problem = None
        return True

    def _failed(self, err: sqlite3.Error) -> None:
        if self.problem is None:
            _LOGGER.error("The journal cannot be written (%s): serving without it", err)
        self.problem = f"journal: {err}"
