"""The settings made at run time and kept across restarts (the volume, the selected voice), in
the journal's `settings` table; one that cannot be used when read back is removed and noted
(kept in `damaged` for inspection).
"""

from __future__ import annotations

import math
import sqlite3

from agent.storage.journal_file import MAX_NAME, is_utf8, shown, value_kind
from agent.storage.set_aside import SetAside


class RunSettings:
    """The kept settings of the journal's file."""

    def __init__(self, db: sqlite3.Connection, set_aside: SetAside) -> None:
        self._db = db
        self._set_aside = set_aside

    def remember(self, name: str, value: str) -> None:
        """Keep a setting (the volume, the selected voice) across restarts."""
        self._db.execute(
            "INSERT INTO settings (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value = excluded.value",
            (name, value),
        )

    def read(self) -> dict[str, str]:
        """The settings kept; one that cannot be used (a volume that is no number from 0 to 1,
        a value that is no text) is removed and noted."""
        out: dict[str, str] = {}
        for name, value in self._db.execute("SELECT name, value FROM settings").fetchall():
            problem = _problem(name, value)
            if problem is None:
                out[name] = value
                continue
            self._set_aside.note(f"setting {shown(name)}: {problem}; removed")
            self._set_aside.keep("settings", (name, value), problem)
            self._set_aside.quietly("DELETE FROM settings WHERE name IS ?", (name,))
        return out


def _problem(name: object, value: object) -> str | None:
    """Why a kept setting cannot be used, or None."""
    if not isinstance(name, str) or not name.isprintable() or len(name) > 64:
        return "its name is unreadable"
    if not isinstance(value, str) or not is_utf8(value) or len(value) > MAX_NAME:
        return f"expected text, found {value_kind(value)}"
    if name == "volume":
        try:
            volume = float(value)
        except ValueError:
            return "expected a number from 0 to 1"
        if not (math.isfinite(volume) and 0.0 <= volume <= 1.0):
            return "expected a number from 0 to 1"
    elif name == "voice" and not (value and value.isprintable()):
        return "expected a voice id"
    return None
