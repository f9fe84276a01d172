"""Rows of the journal that cannot be used, read back after a restart (a damaged card, an edit):
noted (for the log and the state's `storage`), and a copy kept in the `damaged` table for
inspection. Writing that copy never stops the reading: a disk that refuses it is logged."""

from __future__ import annotations

import logging
import sqlite3
import time
from typing import Final

_LOGGER = logging.getLogger(__name__)

DAMAGED_KEPT: Final = 100
"""Rows set aside that are kept for inspection (the newest)."""


class SetAside:
    """The journal's notes and its `damaged` table, over its connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.notes: list[str] = []
        """Problems met while reading rows back (rows set aside): for the log and the state."""

    def note(self, problem: str) -> None:
        _LOGGER.warning("Journal: %s", problem)
        self.notes.append(problem)

    def keep(self, table: str, row: tuple[object, ...], problem: str) -> None:
        """Keep a copy of a row that cannot be used (its values' repr, bounded)."""
        shown = repr(tuple(_plain(v) for v in row))[:4000]
        self.quietly(
            "INSERT INTO damaged (source, row, problem, at) VALUES (?, ?, ?, ?)",
            (table, shown, problem, time.time()),
        )
        self.quietly(
            "DELETE FROM damaged WHERE seq <= (SELECT seq FROM damaged ORDER BY seq DESC "
            "LIMIT 1 OFFSET ?)",
            (DAMAGED_KEPT,),
        )

    def quietly(self, statement: str, values: tuple[object, ...]) -> None:
        """A write made while reading back (a row set aside): a disk that refuses it does not
        stop the reading (the row is set aside again at the next start)."""
        try:
            self._db.execute(statement, values)
        except sqlite3.Error as err:
            _LOGGER.warning("Journal: a damaged row could not be set aside: %s", err)


def _plain(value: object) -> object:
    """A value as it can be kept in the `damaged` table's text."""
    if isinstance(value, bytes):
        return bytes(value[:1000])
    if isinstance(value, str):
        return value[:1000]
    return value
