"""The one bounded inbox of the app loop: every input reaches the loop here, and only here.

Four budgets share one FIFO, so that no kind of input can crowd out another:
- QoS 1 deliveries (`deliver`, from paho's thread; never blocks). When their budget is full the
  delivery is refused and left unacknowledged; the loop, once the inbox has room again, has the
  link reconnect, and the broker sends every unacknowledged message again (persistent session).
  A compliant broker sends at most `mqtt.receive_maximum` before the agent acknowledges one;
  Mosquitto 2.0 does not hold to it when it resumes a session with messages queued (measured:
  hundreds at once), hence the refusal path.
- QoS 0 deliveries (`deliver`; never blocks): when their budget is full, the newest is dropped
  (QoS 0 is at most once by definition) and counted.
- Notices of the link (`notice`: connected; never blocks): one of a kind waits at most (a
  second one would say the same).
- Reports of the agent's own workers (`report`: synthesis, audio, updater): never dropped; a
  worker waits while the budget is full (the loop drains it; the loop itself never reports).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Final, Generic, TypeVar

E = TypeVar("E")

DELIVERY: Final = 0
QOS0: Final = 1
REPORT: Final = 2
NOTICE: Final = 3


class Inbox(Generic[E]):
    """A bounded multi-producer, single-consumer queue with a budget per kind of input."""

    def __init__(self, deliveries: int, qos0: int, reports: int, notices: int = 8) -> None:
        self._budgets = (deliveries, qos0, reports, notices)
        self._waiting = [0, 0, 0, 0]
        self._items: deque[tuple[int, E]] = deque()
        self._changed = threading.Condition()
        self._closed = False
        self.dropped = 0
        """QoS 0 deliveries dropped because their budget was full (since start)."""
        self.refused = 0
        """QoS 1 deliveries left unacknowledged because their budget was full (since start)."""

    @property
    def capacity(self) -> int:
        """The most events that can wait at once."""
        return sum(self._budgets)

    def deliver(self, event: E, qos: int) -> bool:
        """Queue an MQTT delivery without blocking; False if its budget is full."""
        kind = DELIVERY if qos > 0 else QOS0
        with self._changed:
            if self._waiting[kind] >= self._budgets[kind]:
                if kind == QOS0:
                    self.dropped += 1
                else:
                    self.refused += 1
                return False
            self._append(kind, event)
        return True

    def notice(self, event: E) -> None:
        """Queue a notice of the link without blocking, unless an equal one already waits."""
        with self._changed:
            waiting = any(kind == NOTICE and item == event for kind, item in self._items)
            if not waiting and self._waiting[NOTICE] < self._budgets[NOTICE]:
                self._append(NOTICE, event)

    def refusals_to_redeliver(self) -> int:
        """QoS 1 deliveries refused since the last call, once there is room for them again (a
        quarter of their budget used or less); 0 otherwise. The caller has them sent again."""
        with self._changed:
            if not self.refused or self._waiting[DELIVERY] > self._budgets[DELIVERY] // 4:
                return 0
            refused, self.refused = self.refused, 0
            return refused

    def report(self, event: E) -> bool:
        """Queue a worker's report, waiting while the report budget is full; False only once
        the inbox is closed (the agent is stopping)."""
        with self._changed:
            while self._waiting[REPORT] >= self._budgets[REPORT] and not self._closed:
                self._changed.wait()
            if self._closed:
                return False
            self._append(REPORT, event)
        return True

    def get(self, timeout: float) -> E | None:
        """The oldest event, waiting up to `timeout` seconds; None if none came."""
        with self._changed:
            if not self._items:
                self._changed.wait(timeout)
            if not self._items:
                return None
            kind, event = self._items.popleft()
            self._waiting[kind] -= 1
            self._changed.notify_all()  # a reporter may wait for room
            return event

    def close(self) -> None:
        """Release reporters waiting for room (at stop); later reports are refused."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._items)

    def _append(self, kind: int, event: E) -> None:
        self._items.append((kind, event))
        self._waiting[kind] += 1
        self._changed.notify_all()
