"""The ledger: what must survive a crash, and when acknowledgements and events may go out.

Inside one `transaction` the journal records accepted announcements, moves their state and
keeps each event in its outbox; only after the transaction's one sync do the acknowledgements
of the messages and the events go to the broker, in order. So a crash never acknowledges what
was not recorded, and an event the broker did not acknowledge is published again after a
restart. Used by the app loop only. Allowed imports: stdlib, `journal`, `messages`, `states`.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from .journal import Journal
from .messages import FINAL_EVENTS, Delivery, Lifecycle, Notify, SpeakRequest
from .states import EntryState


class Broker(Protocol):
    """The part of the MQTT link the ledger uses."""

    acknowledged: deque[int]
    """Ids of publishes the broker acknowledged."""

    def publish(self, topic: str, payload: bytes | str, *, retain: bool = False) -> int:
        """Publish at QoS 1; returns the message id."""

    def ack(self, delivery: Delivery) -> None:
        """Acknowledge a received message."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """An announcement accepted before a restart that had not ended."""

    request: SpeakRequest
    ttl_left: float | None
    """Seconds of its ttl left now (None: no ttl)."""
    started: bool


class Ledger:
    """The journal, its outbox, and the acknowledgements and events waiting for a sync."""

    def __init__(self, journal: Journal, broker: Broker, events_topic: str) -> None:
        self._journal = journal
        self._broker = broker
        self._events_topic = events_topic
        self._outbox: dict[int, int] = {}  # publish mid -> outbox key
        self._unsent: list[Delivery | tuple[int, bytes]] = []

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """Journal writes at once with one sync; then what they made safe goes out. Nothing goes
        out if the block raises (the writes are rolled back)."""
        try:
            with self._journal.transaction():
                yield
        except BaseException:
            self._unsent.clear()
            raise
        for item in self._unsent:
            if isinstance(item, Delivery):
                self._broker.ack(item)
            else:
                key, payload = item
                self._outbox[self._broker.publish(self._events_topic, payload)] = key
        self._unsent.clear()

    def record(self, request: SpeakRequest, fingerprint: str) -> None:
        """Record an accepted announcement (inside a transaction)."""
        self._journal.record(request, fingerprint, time.time())

    def acknowledge(self, delivery: Delivery) -> None:
        """Acknowledge this message once the transaction is synced."""
        self._unsent.append(delivery)

    def event(self, notify: Notify, payload: bytes) -> None:
        """Publish this event once the transaction is synced, keeping it until the broker
        acknowledges it; the announcement's journal entry follows it in the same transaction."""
        key = self._journal.note_event(notify.id, entry_state(notify), self._events_topic, payload)
        self._unsent.append((key, payload))

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
        if keys:
            self._journal.outbox_done(keys)

    def close(self) -> None:
        """Settle and close the journal."""
        self.settle()
        self._journal.close()


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
