"""The journal on a real SQLite file: what a restart finds."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Final

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.messages import (
    FALLBACK_CACHED,
    FALLBACK_CHIME,
    Action,
    Delivery,
    Lifecycle,
    Notify,
    Priority,
    Record,
    SetVolume,
    SpeakReceived,
    SpeakRequest,
    SynthesisDone,
    Synthesize,
    Unfinished,
    UtteranceEnded,
)
from agent.core.scheduler import SpeakCore
from agent.core.segments import Speech
from agent.core.states import EntryState
from agent.formats.ssml import parse_ssml
from agent.storage import step_marker
from agent.storage.journal import REQUEST_FIELDS, UNJOURNALED, Journal, _dump
from agent.storage.ledger import DEATHS_IN_A_ROW, Ledger, Restored
from agent.storage.step_marker import StepMarker


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


def test_an_ssml_announcement_comes_back_parsed(tmp_path: Path) -> None:
    """The parsed document is not journaled: it is parsed again from the text read back, as it
    was on arrival, and a text that no longer parses is set aside (an edit, a damaged card)."""
    document = '<speak>Gate <say-as interpret-as="cardinal">21</say-as>.</speak>'
    path = unconstrained_journal(tmp_path)
    journal = Journal(path, remembered=10)
    journal.record(SpeakRequest("a", document, ssml=True, document=parse_ssml(document)), "", 1.0)
    journal.close()
    body = json.loads(_dump(SpeakRequest("b", document, ssml=True, document=parse_ssml(document))))
    assert "document" not in body
    write_row(path, {"id": "b", "request": json.dumps(body | {"text": "<speak>Gate"})})
    restored, _ = read_back(path)
    (back,) = restored.pending
    assert back.request.document == parse_ssml(document)
    assert [s.text for s in back.request.document if isinstance(s, Speech)] == ["Gate twenty-one."]
    (failed,) = restored.damaged
    assert (failed.id, failed.details["reason"]) == ("b", "damaged_journal")
    assert "no SSML document" in str(failed.details["detail"])


def test_ended_ids_are_kept_only_for_the_window(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sqlite3", remembered=3)
    for n in range(8):
        journal.record(request(f"r{n}"), f"f{n}", float(n))
        journal.ended(f"r{n}")
    ids, _ = journal.remembered()
    assert ids == ["r5", "r6", "r7"]
    rows = (
        sqlite3.connect(tmp_path / "j.sqlite3")
        .execute("SELECT COUNT(*) FROM announcements")
        .fetchone()
    )
    assert rows[0] <= 4


def test_the_outbox_keeps_events_until_acknowledged(tmp_path: Path) -> None:
    path = tmp_path / "j.sqlite3"
    journal = Journal(path, remembered=3)
    first = journal.outbox.add("voice/n/events", b"one")
    journal.note_event("nobody", None, "voice/n/events", b"two")
    journal.outbox.done([first])
    journal.close()
    assert [(t, p) for _, t, p in Journal(path, 3).outbox.pending()] == [("voice/n/events", b"two")]


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


class Life:
    """One process of the agent over the real journal and step marker files: it starts (counts
    the last death, restores), maybe receives a request, works, and dies."""

    def __init__(self, folder: Path) -> None:
        self.journal = Journal(folder / "j.sqlite3", remembered=10)
        self.marker = StepMarker(folder, "steps", environ={})
        self.link = _Link()
        self.ledger = Ledger(self.journal, self.link, "voice/n/events")
        self.core = SpeakCore(queue_size=8, remembered_ids=20)
        self.actions: list[Action] = []

    def start(self, *arriving: SpeakRequest) -> list[Action]:
        restored = self.ledger.unfinished(self.marker.last, self.marker.boot_id)
        self.marker.clear()
        with self.ledger.transaction():
            actions: list[Action] = [*restored.damaged]
            actions += self.core.restore(restored.pending, restored.ids, restored.fingerprints, 0.0)
            for n, request in enumerate(arriving):
                actions += self.core.handle(SpeakReceived(request, Delivery(n + 1, 1)), 0.0)
            for action in actions:
                self.execute(action)
        self.actions = actions
        return actions

    def execute(self, action: Action) -> None:
        if isinstance(action, Record):
            self.ledger.record(action.request, action.fingerprint)
        if isinstance(action, Synthesize):
            self.ledger.activated(action.request.id)
        if isinstance(action, Notify):
            self.ledger.event(action, b"{}")

    def finish(self, event: UtteranceEnded | SynthesisDone) -> list[Action]:
        with self.ledger.transaction():
            actions = self.core.handle(event, 1.0)
            for action in actions:
                self.execute(action)
        return actions

    def die_in(self, request_id: str, step: str | None) -> None:
        """Killed: inside `step` of the request's work, or (None) between steps."""
        self.marker.enter(request_id, "infer 0" if step is None else step)
        if step is None:
            self.marker.leave()
        self.journal.close()  # nothing else happens: no event, no cleared marker

    @property
    def synthesized(self) -> list[SpeakRequest]:
        return [a.request for a in self.actions if isinstance(a, Synthesize)]

    def notes(self, request_id: str) -> list[tuple[Lifecycle, object]]:
        return [
            (a.event, a.details.get("reason"))
            for a in self.actions
            if isinstance(a, Notify) and a.id == request_id
        ]


@pytest.fixture
def boot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The machine's boot id, as the step marker reads it (a test may restart the machine)."""
    path = tmp_path / "boot_id"
    path.write_text("boot-1\n")
    monkeypatch.setattr(step_marker, "BOOT_ID", path)
    return path


def test_two_deaths_in_the_same_step_make_a_poison_that_is_not_tried_a_third_time(
    tmp_path: Path, boot: Path
) -> None:
    """A clause that kills the agent at each inference: the death after the first play is
    counted (once, though the next start dies before clearing the marker), the replay dies in
    the same step, and the third start ends it `failed`/`crash_loop` naming the step."""
    first = Life(tmp_path)
    first.start(request("poison"))
    first.die_in("poison", "infer abc")
    second = Life(tmp_path)
    second.ledger.unfinished(second.marker.last, second.marker.boot_id)  # counted, and then
    second.journal.close()  # killed while starting, before it cleared the marker
    third = Life(tmp_path)
    third.start()
    assert [r.id for r in third.synthesized] == ["poison"]  # counted once: tried again
    third.die_in("poison", "infer abc")
    fourth = Life(tmp_path)
    fourth.start()
    assert fourth.synthesized == []
    assert fourth.notes("poison") == [(Lifecycle.FAILED, "crash_loop")]
    (failed,) = [a for a in fourth.actions if isinstance(a, Notify)]
    assert "infer abc" in str(failed.details["detail"])
    assert Journal(tmp_path / "j.sqlite3", 10).pending() == []  # ended: never tried again


def test_deaths_at_different_points_or_outside_any_step_do_not_count(
    tmp_path: Path, boot: Path
) -> None:
    """Killed in one step, then in another, then between steps, then in the first again:
    never two in a row in one step, so the announcement is replayed each time."""
    life = Life(tmp_path)
    life.start(request("story"))
    for step in ["infer one", "infer two", None, "infer one"]:  # DEATHS_IN_A_ROW - 1
        life.die_in("story", step)
        life = Life(tmp_path)
        life.start()
        assert [r.id for r in life.synthesized] == ["story"], step
    assert [p.crashes for p in life.journal.pending()] == [1]


def test_a_power_cut_never_counts_against_an_announcement(tmp_path: Path, boot: Path) -> None:
    """Two deaths in the same step, but the machine restarted in between (a power cut: a new
    boot id): neither counts, nor do the activations before it."""
    life = Life(tmp_path)
    life.start(request("fire", priority=Priority.ALARM))
    for n in range(6):
        life.die_in("fire", "infer same")
        boot.write_text(f"boot-{n + 2}\n")
        life = Life(tmp_path)
        life.start()
        assert [(r.id, r.fallback) for r in life.synthesized] == [("fire", None)]
    assert [(p.begun, p.crashes) for p in life.journal.pending()] == [(1, 0)]


def test_an_alarm_the_agent_dies_on_is_said_another_way(tmp_path: Path, boot: Path) -> None:
    """An alarm that kills the agent twice in one inference is not dropped: it is played its
    other way (its chime and what the phrase cache holds of it); a critical one that kills it
    while its text is read gets its chime only. Each time it plays so, no step is marked, so
    a later death does not undo that."""
    for request_id, priority, step, fallback in [
        ("fire", Priority.ALARM, "infer abc", FALLBACK_CACHED),
        ("read", Priority.CRITICAL, "phonemize xyz", FALLBACK_CHIME),
    ]:
        folder = tmp_path / request_id
        folder.mkdir()
        life = Life(folder)
        life.start(request(request_id, priority=priority))
        for _ in range(2):
            life.die_in(request_id, step)
            life = Life(folder)
            life.start()
        assert [(r.id, r.fallback) for r in life.synthesized] == [(request_id, fallback)]
        assert life.notes(request_id) == []  # nothing ended: it is played its other way
        life.die_in(request_id, None)  # killed while its chime plays
        life = Life(folder)
        life.start()
        assert [(r.id, r.fallback) for r in life.synthesized] == [(request_id, fallback)]


def test_the_fallback_ends_failed_with_the_text_and_how_it_was_said() -> None:
    core = SpeakCore(queue_size=8, remembered_ids=20)
    alarm = request("fire", priority=Priority.ALARM)
    crashed = Unfinished(alarm, None, started=True, crashed=True, crash_step="infer abc")
    actions = core.restore([crashed], [], [], 0.0)
    (job,) = [a for a in actions if isinstance(a, Synthesize)]
    assert job.request.fallback == FALLBACK_CACHED
    info = {"fallback": FALLBACK_CACHED, "sentences": 2, "cached_sentences": 1}
    ended = core.handle(UtteranceEnded("fire", 1.5, info=info, job=job.job), 1.0)
    (failed,) = [a for a in ended if isinstance(a, Notify)]
    assert failed.event == Lifecycle.FAILED
    assert failed.details["reason"] == "crash_loop"
    assert failed.details["text"] == alarm.text
    assert failed.details["cached_sentences"] == 1
    assert "infer abc" in str(failed.details["detail"])


def test_deaths_in_a_row_wherever_they_fall_end_a_loop(tmp_path: Path, boot: Path) -> None:
    """A fault that moves from step to step: after DEATHS_IN_A_ROW activations that all ended
    in a death, the announcement ends `crash_loop` all the same."""
    life = Life(tmp_path)
    life.start(request("moving"))
    for n in range(DEATHS_IN_A_ROW):
        life.die_in("moving", f"infer {n}")
        life = Life(tmp_path)
        life.start()
    assert life.synthesized == []
    assert life.notes("moving") == [(Lifecycle.FAILED, "crash_loop")]


def test_a_play_that_ends_normally_forgets_the_deaths(tmp_path: Path, boot: Path) -> None:
    life = Life(tmp_path)
    life.start(request("again", repeat=3, repeat_interval=0.0))
    life.die_in("again", "infer abc")
    life = Life(tmp_path)
    (job,) = [a for a in life.start() if isinstance(a, Synthesize)]
    life.finish(UtteranceEnded("again", 1.0, job=job.job))
    life.finish(SynthesisDone("again", job.job))
    assert [(p.crashes, p.crash_step) for p in life.journal.pending()] == [(0, None)]


@pytest.mark.allow_error_logs(r"journal \S+ unreadable \(.*\); moved to ")
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


@pytest.mark.allow_error_logs("The journal cannot be written")
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


# ---- rows read back: whatever a damaged card or an edit left, set aside, never raised ---------

UNCONSTRAINED: Final = """
CREATE TABLE announcements (seq INTEGER PRIMARY KEY AUTOINCREMENT, id, fingerprint, request,
    received, state, begun DEFAULT 0, crash_step, crashes DEFAULT 0, crash_token);
CREATE TABLE settings (name, value);
CREATE TABLE outbox (seq INTEGER PRIMARY KEY AUTOINCREMENT, topic, payload, rank DEFAULT 9);
"""
"""The journal's tables without their constraints: what a hand edit or another program could
have left (a NULL anywhere, text in an integer column, two rows with one id)."""
COLUMNS: Final = ("id", "fingerprint", "request", "received", "state", "begun", "crashes")
COLUMNS_AND_STEP: Final = (*COLUMNS, "crash_step")

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=10**18).map(lambda n: n**20)  # 400 digits and more
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(st.characters(codec=None, exclude_categories=())),  # lone surrogates too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
"""Any JSON value: integers of any size, NaN and infinities, any text, any nesting."""
sqlite_values = (
    st.none()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(st.characters(codec="utf-8"))
    | st.binary(max_size=64)
    | st.just(json.dumps({"id": "x"}))
)
"""Any value SQLite stores (NaN becomes NULL; text that is no UTF-8 is written by CAST)."""


def unconstrained_journal(folder: Path) -> Path:
    path = folder / "j.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(UNCONSTRAINED)
    return path


def write_row(path: Path, values: dict[str, object]) -> None:
    base: dict[str, object] = {
        "id": "row",
        "fingerprint": "fp",
        "request": _dump(request("row", priority=Priority.ALARM, ttl=30.0)),
        "received": time.time(),
        "state": "queued",
        "begun": 0,
        "crashes": 0,
    }
    base.update(values)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        names = ", ".join(base)
        db.execute(
            f"INSERT INTO announcements ({names}) VALUES ({', '.join('?' * len(base))})",  # noqa: S608
            tuple(base.values()),
        )


def read_back(path: Path) -> tuple[Restored, list[str]]:
    """A start over the file: the ledger's view, and what it noted."""
    journal = Journal(path, remembered=10)
    ledger = Ledger(journal, _Link(), "voice/n/events")
    restored = ledger.unfinished()
    ledger.settings()
    journal.close()
    return restored, journal.notes


def test_every_request_field_is_checked_when_read_back() -> None:
    """A field added to requests must get its check here (or be declared unjournaled)."""
    fields = {f.name for f in dataclasses.fields(SpeakRequest)}
    assert set(REQUEST_FIELDS) | UNJOURNALED == fields


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(sorted(REQUEST_FIELDS)), value=json_values)
def test_any_value_in_any_field_of_a_journaled_request(field: str, value: object) -> None:
    """Each example: one field of a journaled alarm replaced by any JSON value. Either the row
    is still a valid request (and comes back with that value), or it is set aside with a
    `failed`/`damaged_journal` event that names the field and keeps the id, the class (when
    readable) and the text; nothing raises."""
    with tempfile.TemporaryDirectory() as folder:
        path = unconstrained_journal(Path(folder))
        body = json.loads(_dump(request("row", priority=Priority.ALARM, ttl=30.0)))
        body[field] = value
        write_row(path, {"request": json.dumps(body)})
        restored, _ = read_back(path)
    if restored.pending:
        (unfinished,) = restored.pending
        assert unfinished.request.id == "row"
        assert not restored.damaged
        return
    (failed,) = restored.damaged
    assert (failed.id, failed.event) == ("row", Lifecycle.FAILED)
    assert failed.details["reason"] == "damaged_journal"
    assert field in str(failed.details["detail"])
    if field != "priority":
        assert failed.details["priority"] == "alarm"
    if field != "text":
        assert failed.details["text"] == "text row"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(column=st.sampled_from(COLUMNS_AND_STEP), value=sqlite_values, bad_utf8=st.booleans())
def test_any_value_in_any_column_of_an_announcement_row(
    column: str, value: object, bad_utf8: bool
) -> None:
    """Each example: one column of a row holds any value SQLite can hold (text that is no
    UTF-8 among them). Nothing raises; the row is used, or set aside (reported with its id
    when the id is readable, noted otherwise)."""
    with tempfile.TemporaryDirectory() as folder:
        path = unconstrained_journal(Path(folder))
        if bad_utf8:
            write_row(path, {})
            with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
                db.execute(f"UPDATE announcements SET {column} = CAST(X'C3FF28' AS TEXT)")  # noqa: S608
        else:
            write_row(path, {column: value})
        restored, notes = read_back(path)
        again, _ = read_back(path)  # a row set aside stays aside: reported once, not again
    usable = len(restored.pending) + len(restored.damaged)
    if column == "id":  # an id that is no printable text: nothing can end it, only a note
        assert usable == 1 or (usable == 0 and notes)
    else:
        assert usable == 1
    for failed in restored.damaged:
        assert failed.details["reason"] == "damaged_journal"
        assert column in str(failed.details["detail"]) or column == "id"
    if column in ("fingerprint", "crash_step") and not restored.pending:
        assert restored.damaged or notes
    assert len(again.damaged) <= len(restored.damaged)


def test_a_request_nested_beyond_any_parser_and_text_that_is_no_object(tmp_path: Path) -> None:
    path = unconstrained_journal(tmp_path)
    for n, text in enumerate(["[" * 100_000 + "]" * 100_000, "[1, 2]", "null", '"x"', "{", ""]):
        write_row(path, {"id": f"r{n}", "request": text})
    restored, _ = read_back(path)
    assert not restored.pending
    assert [d.id for d in restored.damaged] == [f"r{n}" for n in range(6)]
    assert "expected a JSON object" in str(restored.damaged[1].details["detail"])


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["volume", "voice", "boot", "other"]), value=sqlite_values)
def test_any_kept_setting_is_used_only_if_it_is_valid(name: str, value: object) -> None:
    """A setting of any type: the core applies a volume only when it is a number from 0 to 1,
    anything else is removed and noted; nothing raises."""
    with tempfile.TemporaryDirectory() as folder:
        path = unconstrained_journal(Path(folder))
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("INSERT INTO settings (name, value) VALUES (?, ?)", (name, value))
        journal = Journal(path, 10)
        kept = Ledger(journal, _Link(), "voice/n/events").settings()
        journal.close()
    actions = SpeakCore(8, 20).restore([], [], [], 0.0, kept)
    volumes = [a.volume for a in actions if isinstance(a, SetVolume)]
    assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in volumes)
    if name in kept:
        assert kept[name] == value
    elif value is not None:
        assert journal.notes


@settings(max_examples=100, deadline=None)
@given(topic=sqlite_values, payload=sqlite_values)
def test_any_unsent_event_row(topic: object, payload: object) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = unconstrained_journal(Path(folder))
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("INSERT INTO outbox (topic, payload) VALUES (?, ?)", (topic, payload))
        journal = Journal(path, 10)
        link = _Link()
        Ledger(journal, link, "voice/n/events").unfinished()
        journal.close()
    assert len(link.published) + len(journal.notes) == 1


@pytest.mark.allow_error_logs(r"journal \S+ unreadable \(.*\); moved to ")
@pytest.mark.parametrize(
    "damage", ["truncated", "garbage", "text", "empty_header", "directory", "symlink", "wal_link"]
)
def test_a_journal_file_of_any_damage_is_moved_aside(tmp_path: Path, damage: str) -> None:
    """Cut short, random bytes, no database at all, a directory or a symbolic link in its place
    (the link's target is never touched): moved aside, a fresh journal, and it works."""
    path = tmp_path / "journal.sqlite3"
    outside = tmp_path / "outside"
    outside.write_bytes(b"someone else's file")
    if damage in ("truncated", "wal_link"):
        journal = Journal(path, 10)
        journal.record(request("a"), "fp", 0.0)
        journal.close()
        if damage == "truncated":
            path.write_bytes(path.read_bytes()[:1500])
        else:
            Path(f"{path}-wal").symlink_to(outside)
    elif damage == "garbage":
        path.write_bytes(os.urandom(8192))
    elif damage == "text":
        path.write_text("not a database, a note somebody left\n" * 50)
    elif damage == "empty_header":
        path.write_bytes(b"SQLite format 3\x00" + bytes(4080))
    elif damage == "directory":
        path.mkdir()
    else:
        path.symlink_to(outside)
    renewed, problem = Journal.open_or_renew(path, 10)
    assert problem is not None
    assert "moved to" in problem
    assert renewed.path == path
    assert outside.read_bytes() == b"someone else's file"
    assert list(tmp_path.glob("journal.sqlite3.damaged-*"))
    renewed.record(request("b"), "fp", 0.0)
    assert [p.request.id for p in renewed.pending()] == ["b"]
    assert not path.is_symlink()


@pytest.mark.allow_error_logs(r"is a symbolic link: refused, not followed")
def test_a_storage_directory_that_is_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    """storage.dir pointing elsewhere: never followed; the journal is kept in memory (the node
    serves, the state says so) and nothing is written at the link's target."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "storage"
    link.symlink_to(target)
    journal, problem = Journal.open_or_renew(link / "journal.sqlite3", 10)
    assert journal.path is None
    assert problem is not None
    assert "symbolic link" in problem
    journal.record(request("a"), "fp", 0.0)
    assert [p.request.id for p in journal.pending()] == ["a"]
    assert list(target.iterdir()) == []
