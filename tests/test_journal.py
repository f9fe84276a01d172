"""The journal on a real SQLite file: what a restart finds."""

from __future__ import annotations

import sqlite3
from collections import deque
from pathlib import Path

import pytest

from agent.core import SpeakCore
from agent.journal import Journal
from agent.ledger import Ledger
from agent.messages import (
    Delivery,
    Lifecycle,
    Notify,
    Priority,
    Record,
    SpeakReceived,
    SpeakRequest,
    Synthesize,
    Unfinished,
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
            Unfinished(request("playing"), None, started=True),
            Unfinished(request("waiting"), 5.0, started=False),
            Unfinished(request("old"), -1.0, started=False),
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


def test_an_announcement_the_agent_died_on_twice_ends_as_a_crash_loop(tmp_path: Path) -> None:
    """Played, died; replayed, died again: the third start does not try it again."""
    path = tmp_path / "j.sqlite3"
    for start in range(3):
        journal = Journal(path, remembered=10)
        ledger = Ledger(journal, _Link(), "voice/n/events")
        pending, ids, fingerprints = ledger.unfinished()
        core = SpeakCore(queue_size=8, remembered_ids=20)
        with ledger.transaction():
            if start == 0:
                accepted = core.handle(SpeakReceived(request("poison"), Delivery(1, 1)), 0.0)
                actions = accepted
            else:
                actions = core.restore(pending, ids, fingerprints, 0.0)
            for action in actions:
                if isinstance(action, Record):
                    ledger.record(action.request, action.fingerprint)
                if isinstance(action, Synthesize):
                    ledger.activated(action.request.id)  # and then the agent dies
                if isinstance(action, Notify):
                    ledger.event(action, b"{}")
        journal.close()  # killed: nothing ended
        notes = [(a.id, a.event, a.details.get("reason")) for a in actions if isinstance(a, Notify)]
        if start == 1:
            assert [a for a in actions if isinstance(a, Synthesize)]  # replayed once
        if start == 2:
            assert notes == [("poison", Lifecycle.FAILED, "crash_loop")]
            assert not [a for a in actions if isinstance(a, Synthesize)]
    assert Journal(path, 10).pending() == []  # ended: not tried at the next start either


@pytest.mark.allow_error_logs  # the damage is logged as an error
def test_a_damaged_journal_is_moved_aside_and_a_new_one_started(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    journal = Journal(path, 10)
    journal.record(request("a"), "fp", 0.0)
    journal.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # power lost mid-write on an SD card
    renewed, problem = Journal.open_or_renew(path, 10)
    assert problem is not None
    assert "moved to" in problem
    assert renewed.pending() == []
    assert list(tmp_path.glob("journal.sqlite3.damaged-*"))  # kept for inspection
    assert path.stat().st_mode & 0o777 == 0o600
    renewed.record(request("b"), "fp", 0.0)  # and it works
    assert [p.request.id for p in renewed.pending()] == ["b"]


class _Link:
    """Records what the ledger would send (the ledger's `Broker`)."""

    def __init__(self) -> None:
        self.acknowledged: deque[int] = deque()
        self.acks: list[Delivery] = []
        self.published: list[bytes] = []

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        self.published.append(payload if isinstance(payload, bytes) else payload.encode())
        return len(self.published)

    def ack(self, delivery: Delivery) -> None:
        self.acks.append(delivery)


@pytest.mark.allow_error_logs  # the failing disk is logged as an error
def test_a_journal_that_cannot_be_written_holds_back_acks_and_recovers(tmp_path: Path) -> None:
    """Disk full: what could not be recorded is not acknowledged (the broker keeps it); events
    still go out; once a write works again the journal is used again."""
    journal = Journal(tmp_path / "j.sqlite3", 10)
    link = _Link()
    ledger = Ledger(journal, link, "voice/n/events")
    journal._db.execute("PRAGMA query_only = 1")  # the card turned read-only
    with ledger.transaction():
        ledger.record(request("full"), "fp")
        ledger.acknowledge(Delivery(7, 1))
        ledger.event(Notify("full", Lifecycle.ACCEPTED), b"accepted")
    assert ledger.problem is not None
    assert link.acks == []  # not recorded: not acknowledged
    assert ledger.held_back == 1
    assert link.published == [b"accepted"]  # the event went out all the same
    with ledger.transaction():  # a stop command meanwhile: nothing to record, acknowledged
        ledger.acknowledge(Delivery(8, 1))
    assert [d.mid for d in link.acks] == [8]
    assert not ledger.recovered(0.0)  # still full
    journal._db.execute("PRAGMA query_only = 0")  # writable again
    assert ledger.recovered(10.0)
    with ledger.transaction():
        ledger.record(request("after"), "fp")
        ledger.acknowledge(Delivery(9, 1))
    assert [d.mid for d in link.acks] == [8, 9]
    assert [p.request.id for p in journal.pending()] == ["after"]
