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
small write is tried every PROBE_SECONDS; when one succeeds the journal is used again and the
messages it held back are asked for again. Used by the app loop only. Allowed imports: stdlib,
`journal`, `messages`, `states`.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final, Protocol

from .journal import KEPT, Journal
from .messages import FINAL_EVENTS, Delivery, Lifecycle, Notify, SpeakRequest, Unfinished
from .states import FINAL_PHASES, EntryState

_LOGGER = logging.getLogger(__name__)

CRASHES_ALLOWED: Final = 1
"""Times an announcement is tried again after the agent died while synthesizing or playing it;
the next time it ends `failed` with reason `crash_loop` (a message that kills the agent must not
kill it at every start)."""
PROBE_SECONDS: Final = 5.0
"""While the journal cannot be written, how often a small write is tried."""


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
        self._recorded = False  # the open transaction recorded an announcement
        self._refused = False  # a write of the open transaction was refused
        self.problem: str | None = None
        """Why the journal cannot be written now (None: it can)."""
        self.held_back = 0
        """Messages left unacknowledged because their announcement could not be recorded."""
        self._next_probe = 0.0

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Journal writes at once with one sync; then what they made safe goes out. Nothing goes
        out if the block raises (the writes are rolled back). A write the disk refuses rolls
        the journal's part back and makes the ledger volatile (see the module); the block
        carries on."""
        self._recorded = self._refused = False
        try:
            if self.problem is None and self._begun():
                try:
                    yield
                except BaseException:
                    self._journal.rollback()
                    raise
                self._end()
            else:
                yield
        except BaseException:
            self._unsent.clear()
            raise
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
        self._unsent.clear()

    def _begun(self) -> bool:
        try:
            self._journal.begin()
        except sqlite3.Error as err:
            self._failed(err)
            return False
        return True

    def _end(self) -> None:
        if self._refused:
            self._journal.rollback()
            return
        try:
            self._journal.commit()
        except sqlite3.Error as err:
            self._journal.rollback()
            self._failed(err)

    def record(self, request: SpeakRequest, fingerprint: str) -> None:
        """Record an accepted announcement (inside a transaction)."""
        self._recorded = True
        self._write(lambda: self._journal.record(request, fingerprint, time.time()))

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
                self._journal.played_through(notify.id)

        self._write(write)
        self._unsent.append((keys[0] if keys else None, payload))

    def unreported(self, notify: Notify) -> None:
        """An event that is not published (held back in a flood): its announcement's journal
        entry still follows it."""
        state = entry_state(notify)
        if state == EntryState.ENDED:
            self._write(lambda: self._journal.ended(notify.id))

    def remember(self, name: str, value: str) -> None:
        """Keep a setting across restarts (inside a transaction)."""
        self._write(lambda: self._journal.remember(name, value))

    def settings(self) -> dict[str, str]:
        """The settings kept (none if the journal cannot be read)."""
        try:
            return self._journal.settings()
        except sqlite3.Error as err:
            _LOGGER.error("The kept settings cannot be read: %s", err)
            return {}

    def activated(self, request_id: str) -> None:
        """Its synthesis begins: counted in the journal (see `CRASHES_ALLOWED`)."""
        self._write(lambda: self._journal.activated(request_id))

    def unfinished(self) -> tuple[list[Unfinished], list[str], list[str]]:
        """After a restart: publish again what the broker never acknowledged; return the
        announcements that had not ended, and the recent ids and payload digests."""
        for key, topic, payload in self._journal.outbox_pending():
            self._outbox[self._broker.publish(topic, payload)] = key
        wall = time.time()
        pending = [
            Unfinished(
                p.request,
                None if p.request.ttl is None else p.request.ttl - (wall - p.received),
                p.started,
                crashed=p.begun >= CRASHES_ALLOWED + 1,
            )
            for p in self._journal.pending()
        ]
        ids, fingerprints = self._journal.remembered()
        return pending, ids, fingerprints

    def settle(self) -> None:
        """Forget the events the broker acknowledged."""
        keys = []
        acknowledged = self._broker.acknowledged
        while acknowledged:
            key = self._outbox.pop(acknowledged.popleft(), None)
            if key is not None:
                keys.append(key)
        if keys and self.problem is None:
            self._write(lambda: self._journal.outbox_done(keys))

    def recovered(self, now: float) -> bool:
        """While volatile: try a small write (every PROBE_SECONDS); True when it worked, i.e.
        the journal is used again (the caller asks for the held back messages again)."""
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

    def close(self) -> None:
        """Settle and close the journal."""
        self.settle()
        self._journal.close()

    def _write(self, write: Callable[[], object]) -> None:
        """One journal write, unless volatile; a refused write makes the ledger volatile (the
        transaction's writes are rolled back at its end)."""
        if self.problem is not None:
            return
        try:
            write()
        except sqlite3.Error as err:
            self._refused = True
            self._failed(err)

    def _failed(self, err: sqlite3.Error) -> None:
        if self.problem is None:
            _LOGGER.error("The journal cannot be written (%s): serving without it", err)
        self.problem = f"journal: {err}"


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
