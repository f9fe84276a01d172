"""The urgent gate: renders for Wyoming clients give way while an alarm is synthesized.

The node's two synthesizers share its voices' ONNX Runtime sessions and its cores. The main one
(whose audio goes to the player) holds the gate for the whole of an urgent request's work, from
its first step to its end handed to the player; the render worker (whose audio goes to Wyoming
clients) waits before each inference while the gate is held, so an alarm's synthesis never
shares the CPU with a render. A waiting render stays cancellable: each wait is bounded by a poll
that re-checks its cancellation, and `wake` ends the polls' sleep at once.

Urgent is `priority >= Priority.ALARM` (alarm and critical), the classes that preempt by
default. Holds are counted (nested or from several holders: the gate is clear only when every
hold has been released), and are not tied to a thread; a release without a hold is a bug and
raises RuntimeError.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Final

from agent.core.messages import Priority

URGENT: Final = Priority.ALARM
"""The lowest class whose synthesis holds the gate."""
POLL_SECONDS: Final = 0.05
"""How long a wait sleeps at most before it checks its cancellation again."""


def is_urgent(priority: Priority) -> bool:
    """Whether a request of this class holds the gate while it is synthesized."""
    return priority >= URGENT


class UrgentGate:
    """Held while something urgent is synthesized; others wait for it to be clear."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._holds = 0
        self._waiters = 0
        self._wakes = 0
        """Wakes so far: a wake between a waiter's check and its sleep is not lost."""

    @property
    def held(self) -> bool:
        """Whether some hold has not been released yet."""
        with self._condition:
            return self._holds > 0

    @property
    def waiters(self) -> int:
        """How many threads are waiting in `wait_clear` for the gate to be clear."""
        with self._condition:
            return self._waiters

    def hold(self) -> None:
        """Take one hold (holds are counted: each needs its `release`)."""
        with self._condition:
            self._holds += 1

    def release(self) -> None:
        """Give back one hold; the last one wakes the waiters. RuntimeError without a hold."""
        with self._condition:
            if self._holds == 0:
                raise RuntimeError("UrgentGate.release without a hold")
            self._holds -= 1
            if self._holds == 0:
                self._condition.notify_all()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """One hold for the work inside (released however it ends)."""
        self.hold()
        try:
            yield
        finally:
            self.release()

    def wake(self) -> None:
        """End the current sleep of every wait now, so each checks its cancellation (a waiter
        calls it when it is cancelled or stopped; without it a wait notices within its poll)."""
        with self._condition:
            self._wakes += 1
            self._condition.notify_all()

    def wait_clear(
        self, cancelled: Callable[[], bool] | threading.Event, poll: float = POLL_SECONDS
    ) -> bool:
        """Return True at once when nothing holds the gate; otherwise wait until nothing does
        (True) or `cancelled` says so (False), checking it at least every `poll` seconds.
        `cancelled` is called without the gate's lock held (it may take locks of its own)."""
        if poll <= 0:
            raise ValueError(f"poll must be positive, not {poll!r}")
        is_cancelled = cancelled.is_set if isinstance(cancelled, threading.Event) else cancelled
        with self._condition:
            if self._holds == 0:
                return True
            self._waiters += 1
        try:
            while True:
                with self._condition:
                    woken = self._wakes
                if is_cancelled():
                    return False
                with self._condition:
                    if self._holds == 0:
                        return True
                    if self._wakes == woken:  # no wake since the check: sleep until one
                        self._condition.wait(poll)
                    if self._holds == 0:
                        return True
        finally:
            with self._condition:
                self._waiters -= 1
