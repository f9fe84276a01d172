"""The ledger: what must survive a crash, and when acknowledgements and events may go out.

Inside one `transaction` the journal records accepted announcements, moves their state and
keeps each event in its outbox; only after the transaction's one sync do the acknowledgements
of the messages and the events go to the broker, in order. So a crash never acknowledges what
was not recorded, and an event the broker did not acknowledge is published again after a
restart.

When the journal cannot be written (disk full, a read-only or failing card), the agent keeps
serving: the ledger goes volatile. Events go out at once (not kept); a message whose
announcement could not be recorded is not acknowledged (the broker keeps it: it comes again
after a reconnect, and a crash meanwhile loses nothing); other messages are acknowledged. A
small write is tried every `journal_guard.PROBE_SECONDS`; when one succeeds the journal is used
again and the messages it held back are asked for again.

The crash-loop breaker: a message whose content kills the agent (a clause on which the model
runs out of memory, a text espeak-ng crashes on, a sound whose decoding segfaults) must not kill
it at every start, but a death that is not the message's doing (a power cut, a kill from
outside, the OOM killer picking the agent for another reason) must not cost the message. So a
death counts against an announcement only when it happened inside a step of its work (see
`step_marker`), and only deaths in the *same* step, one after the other, add up:
SAME_STEP_DEATHS of them and it is not tried again as it is. Deaths outside any step (while its
audio plays, between steps, idle, while starting) and across a restart of the machine never
count; a play that ends normally forgets them. A bound of DEATHS_IN_A_ROW deaths in a row while
it was the active announcement, wherever they happened, ends a loop that moves from step to
step. Used by the app loop only. Writes that the disk may refuse go through `journal_guard`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Protocol, TypeVar

from agent.core.messages import (
    FINAL_EVENTS,
    TEXT_REPORTED,
    Delivery,
    Lifecycle,
    Notify,
    SpeakRequest,
    Unfinished,
)
from agent.core.reasons import Reason
from agent.core.states import FINAL_PHASES, EntryState
from agent.storage.journal import BOOT_SETTING, Damaged, Journal, Pending
from agent.storage.journal_guard import JournalGuard
from agent.storage.outbox import KEPT
from agent.storage.step_marker import Death

_LOGGER = logging.getLogger(__name__)
_T = TypeVar("_T")

SAME_STEP_DEATHS: Final = 2
"""Deaths of the agent in a row inside the same step of an announcement's work that make it a
poison: it is then not tried again as it is (`crash_loop`; an alarm is said another way). Two:
a message that kills the agent is tried once more (the first death may have been a kill from
outside that happened to fall in that step), never a third time."""
DEATHS_IN_A_ROW: Final = 5
"""Deaths in a row while an announcement was the active one, wherever in its work they fell,
that end it all the same (a fault that moves from step to step). Five: at systemd's restart
every 2 s and a start of a few seconds, the node is stuck at most about half a minute, and
random kills (the fault tests make three) never reach it."""


class Broker(Protocol):
    """The part of the MQTT link the ledger uses."""

    acknowledged: deque[int]
    """Ids of publishes the broker acknowledged."""

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        """Publish at QoS 1; returns the message id."""

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a received message."""


class Ledger:
    """The journal, its outbox, and the acknowledgements and events waiting for a sync."""

    def __init__(self, journal: Journal, broker: Broker, events_topic: str) -> None:
        self._journal = journal
        self._broker = broker
        self._events_topic = events_topic
        self._outbox: dict[int, int] = {}  # publish mid -> outbox key
        self._unsent: list[Delivery | tuple[int | None, bytes]] = []
        self._after: list[Callable[[], object]] = []
        self._recorded = False  # the open transaction recorded an announcement
        self._guard = JournalGuard(journal)
        self.held_back = 0
        """Messages left unacknowledged because their announcement could not be recorded."""

    @property
    def problem(self) -> str | None:
        """Why the journal cannot be written now (None: it can)."""
        return self._guard.problem

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Journal writes at once with one sync; then what they made safe goes out. Nothing goes
        out if the block raises (the writes are rolled back). A write the disk refuses rolls
        the journal's part back and makes the ledger volatile (see the module); the block
        carries on. Work handed to `after_sync` runs at the end, whatever happened."""
        self._recorded = self._guard.refused = False
        try:
            if self.problem is None and self._guard.begin():
                try:
                    yield
                except BaseException:
                    self._guard.rollback()
                    raise
                self._guard.end()
            else:
                yield
            self._send()
        finally:
            self._unsent.clear()
            after, self._after = self._after, []
            for work in after:
                work()

    def _send(self) -> None:
        """The acknowledgements and events the transaction made safe, in order."""
        hold = self.problem is not None and self._recorded
        for item in self._unsent:
            if isinstance(item, Delivery):
                if hold and item.qos > 0:
                    self.held_back += 1  # not recorded: the broker keeps it
                else:
                    self._broker.ack(item)
            else:
                key, payload = item
                mid = self._broker.publish(self._events_topic, payload)
                if key is not None and self.problem is None:
                    self._outbox[mid] = key

    def after_sync(self, work: Callable[[], object]) -> None:
        """Run `work` once the transaction is synced (or over, should it fail): a synthesis
        begins only once its activation is on disk, so that a death in its first step always
        finds its announcement in the journal (a message that kills the agent within the
        commit's milliseconds would otherwise never be counted, and come back forever)."""
        self._after.append(work)

    def record(self, request: SpeakRequest, fingerprint: str) -> None:
        """Record an accepted announcement (inside a transaction)."""
        self._recorded = True
        self._guard.write(lambda: self._journal.record(request, fingerprint, time.time()))

    def acknowledge(self, delivery: Delivery) -> None:
        """Acknowledge this message once the transaction is synced."""
        self._unsent.append(delivery)

    def event(self, notify: Notify, payload: bytes) -> None:
        """Publish this event once the transaction is synced, keeping it until the broker
        acknowledges it; the announcement's journal entry follows it in the same transaction."""
        state = entry_state(notify)
        keys: list[int] = []

        def write() -> None:
            topic, rank = self._events_topic, outbox_rank(notify)
            keys.append(self._journal.note_event(notify.id, state, topic, payload, rank))
            if notify.event in (Lifecycle.FINISHED, Lifecycle.REQUEUED) and state is not None:
                self._journal.deaths.played_through(notify.id)

        self._guard.write(write)
        self._unsent.append((keys[0] if keys else None, payload))

    def unreported(self, notify: Notify) -> None:
        """An event that is not published (held back in a flood): its announcement's journal
        entry still follows it."""
        state = entry_state(notify)
        if state == EntryState.ENDED:
            self._guard.write(lambda: self._journal.ended(notify.id))

    def remember(self, name: str, value: str) -> None:
        """Keep a setting across restarts (inside a transaction)."""
        self._guard.write(lambda: self._journal.run_settings.remember(name, value))

    def settings(self) -> dict[str, str]:
        """The settings kept (none if the journal cannot be read; one that cannot be used is
        left out and noted)."""
        try:
            return self._journal.run_settings.read()
        except sqlite3.Error as err:
            _LOGGER.error("The kept settings cannot be read: %s", err)
            return {}

    @property
    def notes(self) -> list[str]:
        """Problems met reading the journal back (rows set aside), for the state."""
        return self._journal.notes

    def activated(self, request_id: str) -> None:
        """Its synthesis begins: counted in the journal (see `DEATHS_IN_A_ROW`)."""
        self._guard.write(lambda: self._journal.deaths.activated(request_id))

    def unfinished(self, death: Death | None = None, boot_id: str = "") -> Restored:
        """After a restart: count the previous process's death against the announcement it
        died on, if it died inside a step of one (`death`, from the step marker) and the
        machine did not restart since (`boot_id`); publish again what the broker never
        acknowledged; return what had not ended, what cannot be read, and the recent ids and
        payload digests."""
        self._count_death(death, boot_id)
        unsent: list[tuple[int, str, bytes]] = self._guard.read(
            "unsent events", self._journal.outbox.pending, []
        )
        for key, topic, payload in unsent:
            if topic != self._events_topic:  # the outbox only ever holds this node's events
                self._guard.write(
                    functools.partial(self._journal.outbox.drop_unsent, key, topic[:64])
                )
                continue
            self._outbox[self._broker.publish(topic, payload)] = key
        wall = time.time()
        nothing: tuple[list[Pending], list[Damaged]] = ([], [])
        pending, damaged = self._guard.read("announcements", self._journal.recover, nothing)
        restored = Restored(damaged=[_damaged_event(d) for d in damaged if d.id is not None])
        for p in pending:
            poison = p.crashes >= SAME_STEP_DEATHS
            ttl_left = None if p.request.ttl is None else p.request.ttl - (wall - p.received)
            crashed = poison or p.begun >= DEATHS_IN_A_ROW
            step = p.crash_step if poison else None
            restored.pending.append(Unfinished(p.request, ttl_left, p.started, crashed, step))
        no_ids: tuple[list[str], list[str]] = ([], [])
        restored.ids, restored.fingerprints = self._guard.read(
            "recent ids", self._journal.remembered, no_ids
        )
        return restored

    def _count_death(self, death: Death | None, boot_id: str) -> None:
        no_settings: dict[str, str] = {}
        settings = self._guard.read("settings", self._journal.run_settings.read, no_settings)
        before = settings.get(BOOT_SETTING)
        if boot_id and before and before != boot_id:
            _LOGGER.info("The machine restarted since the last start: no death counts before it")
            self._guard.write(self._journal.deaths.machine_restarted)
        if boot_id and before != boot_id:
            self._guard.write(lambda: self._journal.run_settings.remember(BOOT_SETTING, boot_id))
        if death is None:
            return
        if not death.same_boot:
            _LOGGER.info(
                "The machine restarted while %s was in step %r: not counted", death.id, death.step
            )
            return
        _LOGGER.warning("The agent died in step %r of %s; counted against it", death.step, death.id)
        self._guard.write(lambda: self._journal.deaths.died_in(death.id, death.step, death.token))

    def settle(self) -> None:
        """Forget the events the broker acknowledged."""
        keys = []
        acknowledged = self._broker.acknowledged
        while acknowledged:
            key = self._outbox.pop(acknowledged.popleft(), None)
            if key is not None:
                keys.append(key)
        if keys and self.problem is None:
            self._guard.write(lambda: self._journal.outbox.done(keys))

    def recovered(self, now: float) -> bool:
        """While volatile: try a small write (every `journal_guard.PROBE_SECONDS`); True when it
        worked, i.e. the journal is used again (the caller asks for the held back messages
        again)."""
        return self._guard.recovered(now)

    def close(self) -> None:
        """Settle and close the journal."""
        self.settle()
        self._journal.close()


@dataclass(slots=True)
class Restored:
    """What a restart finds in the journal."""

    pending: list[Unfinished] = field(default_factory=list)
    """Announcements that had not ended, oldest first."""
    damaged: list[Notify] = field(default_factory=list)
    """The `failed` events of announcements whose rows cannot be used (`damaged_journal`)."""
    ids: list[str] = field(default_factory=list)
    fingerprints: list[str] = field(default_factory=list)


def _damaged_event(damaged: Damaged) -> Notify:
    assert damaged.id is not None  # noqa: S101 - only rows with a usable id have an event
    details: dict[str, object] = {
        "reason": str(Reason.DAMAGED_JOURNAL),
        "detail": f"its journal entry cannot be used: {damaged.problem}",
    }
    if damaged.priority is not None:
        details["priority"] = damaged.priority.label
    if damaged.text is not None:
        details["text"] = damaged.text[:TEXT_REPORTED]
    return Notify(damaged.id, Lifecycle.FAILED, details)


def outbox_rank(notify: Notify) -> int:
    """How long an unacknowledged event is kept in a long broker outage (see `journal`): what
    is dropped first is a flood's rejections, then progress (accepted, started, requeued, ...),
    then the results of chat and info, then those of warnings and updates; the events of alarm
    and critical announcements never."""
    priority = notify.details.get("priority")
    if priority in ("alarm", "critical"):
        return KEPT
    if notify.event in (Lifecycle.REJECTED, Lifecycle.SUPPRESSED):
        return 0
    final = notify.event in FINAL_EVENTS
    if notify.event == Lifecycle.UPDATE:
        return 3 if notify.details.get("state") in FINAL_PHASES else 1
    if not final:
        return 1
    return 3 if priority == "warning" else 2


def entry_state(notify: Notify) -> EntryState | None:
    """What an event means for the announcement's journal entry."""
    event = notify.event
    if event == Lifecycle.STARTED:
        return EntryState.STARTED
    if event in (Lifecycle.REQUEUED, Lifecycle.INTERRUPTED) or (
        event == Lifecycle.FINISHED and notify.details.get("repeats_left") not in (0, None)
    ):
        return EntryState.QUEUED
    return EntryState.ENDED if event in FINAL_EVENTS else None
