"""The journal on a real SQLite file: what a restart finds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.core import SpeakCore
from agent.journal import Journal
from agent.messages import (
    Delivery,
    Lifecycle,
    Notify,
    Priority,
    SpeakReceived,
    SpeakRequest,
    Synthesize,
)
from agent.states import EntryState


def request(request_id: str, **fields: object) -> SpeakRequest:
    return SpeakRequest(request_id, f"text {request_id}", **fields)  # type: ignore[arg-type]


def test_pending_announcements_and_ids_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, remembered=10)
    journal.record(
        request("a", priority=Priority.ALARM, ttl=30.0, unknown_fields=("x",)), "fa", 100.0
    )
    journal.record(request("b"), "fb", 101.0)
    journal.record(request("c"), "", 102.0)
    journal.note_event("a", EntryState.STARTED, "voice/n/events", b"a started")
    journal.note_event("c", EntryState.ENDED, "voice/n/events", b"c finished")
    journal.close()

    again = Journal(path, remembered=10)
    pending = again.pending()
    assert [(p.request.id, p.started, p.received) for p in pending] == [
        ("a", True, 100.0),
        ("b", False, 101.0),
    ]
    assert pending[0].request == request(
        "a", priority=Priority.ALARM, ttl=30.0, unknown_fields=("x",)
    )
    assert again.remembered() == (["a", "b", "c"], ["fa", "fb"])


def test_ended_ids_are_kept_only_for_the_window(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", remembered=3)
    for n in range(8):
        journal.record(request(f"r{n}"), f"f{n}", float(n))
        journal.ended(f"r{n}")
    ids, _ = journal.remembered()
    assert ids == ["r5", "r6", "r7"]
    rows = sqlite3.connect(journal.path).execute("SELECT COUNT(*) FROM announcements").fetchone()
    assert rows[0] <= 4


def test_the_outbox_keeps_events_until_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, remembered=3)
    first = journal.outbox_add("voice/n/events", b"one")
    journal.note_event("nobody", None, "voice/n/events", b"two")
    journal.outbox_done([first])
    journal.close()
    assert [(t, p) for _, t, p in Journal(path, 3).outbox_pending()] == [("voice/n/events", b"two")]


def test_a_restored_core_requeues_refuses_known_ids_and_expires_stale_ones() -> None:
    core = SpeakCore(queue_size=8, remembered_ids=20)
    actions = core.restore(
        [
            (request("playing"), None, True),
            (request("waiting"), 5.0, False),
            (request("old"), -1.0, False),
        ],
        ids=["done"],
        fingerprints=["fp-done"],
        now=0.0,
    )
    notes = [(a.id, a.event) for a in actions if isinstance(a, Notify)]
    assert notes == [("playing", Lifecycle.INTERRUPTED), ("old", Lifecycle.EXPIRED)]
    assert [a.request.id for a in actions if isinstance(a, Synthesize)] == ["playing"]
    again = core.handle(SpeakReceived(request("done"), Delivery(1, 1)), 0.0)
    assert any(isinstance(a, Notify) and a.details.get("reason") == "duplicate_id" for a in again)
    redelivered = Delivery(2, 1, True, "fp-done")
    assert len(core.handle(SpeakReceived(request("gen-x"), redelivered), 0.0)) == 1  # only acked
