"""Per announcement, what the crash-loop breaker counts (`ledger`): its activations since its
last normal play, and the agent's deaths in a row inside one step of its work, in the journal's
`announcements` rows; a restart of the machine forgets them.
"""

from __future__ import annotations

import sqlite3

from agent.core.states import EntryState


class DeathCounts:
    """The activations and deaths counted against announcements in the journal's file."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def activated(self, request_id: str) -> None:
        """Its synthesis begins (again): counted, so that a crash loop is seen at restart."""
        self._db.execute("UPDATE announcements SET begun = begun + 1 WHERE id = ?", (request_id,))

    def played_through(self, request_id: str) -> None:
        """A play of it ended normally (a repeat finished, a preemption): its deaths are
        forgotten."""
        self._db.execute(
            "UPDATE announcements SET begun = 0, crashes = 0, crash_step = NULL WHERE id = ?",
            (request_id,),
        )

    def died_in(self, request_id: str, step: str, token: str) -> None:
        """The agent died inside `step` of this announcement's work (the step marker of the
        process `token` said so): one more death in that step if it was the last one's, else
        the first. Counted once per process, however often this is called for it."""
        self._db.execute(
            "UPDATE announcements SET "
            "crashes = CASE WHEN crash_step IS ? THEN crashes + 1 ELSE 1 END, "
            "crash_step = ?, crash_token = ? "
            "WHERE id = ? AND state IS NOT ? AND crash_token IS NOT ?",
            (step, step, token, request_id, EntryState.ENDED, token),
        )

    def machine_restarted(self) -> None:
        """The machine restarted since the last start (a power cut): no death before it counts
        against an announcement."""
        self._db.execute("UPDATE announcements SET begun = 0, crashes = 0, crash_step = NULL")
