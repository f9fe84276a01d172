"""The one bounded inbox of the app loop: every input reaches the loop here, and only here.

Lanes, each with its own budget, so that no input can crowd out another:
- **Urgent** (`offer` with a `rank`): alarm-class requests, from any source, each source with a
  budget of its own. The loop is served these first, the highest rank (class) first, then in
  order of arrival: an alarm overtakes every request that waits. When a source's urgent budget
  is full, a higher class takes the place of the lowest, newest one there (which is answered).
  A stop that arrived before the alarm (an `offer` with `barrier`) is served before it all the
  same, so that it never stops an alarm published after it.
- **Per source** (`offer`): every other request, command or message, by where it came from
  (each MQTT topic family, Sparkplug, Wyoming's announce target). One source's flood fills its
  own budget only. Served in order of arrival across sources.
- **Refusals** (`refuse`): what a full source had no room for, as the caller's answer (its
  `rejected` event); beyond this lane's own budget only counted (a flood's summary says how
  many). The caller acknowledges the delivery at once: a full inbox never leaves a delivery
  unacknowledged, so the broker never has to send it again and the link never reconnects for it.
- **Notices** of the link (`notice`: connected, Sparkplug's session; never blocks): one of a kind
  waits at most (a second one would say the same).
- **Reports** of the agent's own workers (`report`: synthesis, audio, updater): never dropped; a
  worker waits while the budget is full (the loop drains it; the loop itself never reports).

Producers never block but a worker's report; `get` is the loop's alone.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Mapping
from typing import Final, Generic, TypeVar

E = TypeVar("E")

_REPORT: Final = "\0report"
_NOTICE: Final = "\0notice"
_REFUSAL: Final = "\0refusal"


def _urgent(source: str) -> str:
    return f"{source}\0urgent"


class Inbox(Generic[E]):
    """A bounded multi-producer, single-consumer queue with an urgent lane and a budget per
    source."""

    def __init__(
        self,
        budgets: Mapping[str, int],
        *,
        default: int = 256,
        urgent: int = 64,
        refusals: int = 64,
        reports: int = 256,
        notices: int = 8,
        evicted: Callable[[E, str], E | None] = lambda _event, _source: None,
    ) -> None:
        """`budgets`: requests that may wait per source (others: `default`); `urgent`: alarm-class
        requests that may wait per source; `refusals`: answers to what found its source full;
        `evicted`: the answer to an urgent request that a higher class took the place of (it
        acknowledges the request's delivery, if any: the request was taken)."""
        self._budgets = dict(budgets)
        self._default = default
        self._urgent_budget = urgent
        self._fixed = {_REPORT: reports, _NOTICE: notices, _REFUSAL: refusals}
        self._evicted = evicted
        self._waiting: Counter[str] = Counter()
        self._items: deque[tuple[int, str, E]] = deque()
        """Every waiting input but the urgent ones, in order of arrival: (seq, lane, event)."""
        self._urgent: list[tuple[int, int, str, E]] = []
        """The urgent ones, a heap of (-rank, seq, lane, event)."""
        self._barriers: deque[tuple[int, str, E]] = deque()
        """The items of `_items` offered with `barrier`, in order."""
        self._seq = itertools.count()
        self._changed = threading.Condition()
        self._closed = False
        self.refused: Counter[str] = Counter()
        """Inputs refused because their source's budget was full, by source (since start)."""
        self.uncounted: Counter[str] = Counter()
        """Of those, the ones whose refusal found the refusal lane full too: counted only."""

    @property
    def capacity(self) -> int:
        """The most events the fixed lanes and the named sources can hold at once."""
        named = sum(self._budgets.values()) + self._urgent_budget * len(self._budgets)
        return named + sum(self._fixed.values())

    def _budget(self, lane: str) -> int:
        if lane in self._fixed:
            return self._fixed[lane]
        if lane.endswith("\0urgent"):
            return self._urgent_budget
        return self._budgets.get(lane, self._default)

    def has_room(self, source: str) -> bool:
        """Whether a request of `source` that is not urgent would be taken now (a cheap look
        before the work of reading it)."""
        with self._changed:
            return self._waiting[source] < self._budget(source)

    def offer(self, event: E, source: str, *, rank: int = 0, barrier: bool = False) -> bool:
        """Queue an input of `source` without blocking: urgent when `rank` > 0 (served first,
        higher ranks first, then in order of arrival); `barrier`: served before any urgent one
        that arrived after it (a stop). False when the lane's budget is full: the caller
        answers it (`refuse`) and acknowledges it. A full urgent lane takes a higher class all
        the same: the lowest class that waits there, the newest of it, makes room (answered by
        `evicted`), so that no flood of alarms keeps a critical out."""
        lane = _urgent(source) if rank > 0 else source
        with self._changed:
            if self._waiting[lane] >= self._budget(lane) and not self._evict(lane, rank, source):
                return False
            seq = next(self._seq)
            self._waiting[lane] += 1
            if rank > 0:
                heapq.heappush(self._urgent, (-rank, seq, lane, event))
            else:
                item = (seq, lane, event)
                self._items.append(item)
                if barrier:
                    self._barriers.append(item)
            self._changed.notify_all()
        return True

    def _evict(self, lane: str, rank: int, source: str) -> bool:
        """Make room in a full urgent `lane` for a request of `rank`: drop the lowest-ranked,
        newest one there if its rank is lower (its answer queued); False when none is."""
        if rank <= 0:
            return False
        mine = [entry for entry in self._urgent if entry[2] == lane]
        if not mine:
            return False
        victim = max(mine, key=lambda entry: (entry[0], entry[1]))  # lowest rank, then newest
        if -victim[0] >= rank:
            return False
        self._urgent.remove(victim)
        heapq.heapify(self._urgent)
        self._waiting[lane] -= 1
        self.refused[source] += 1
        answer = self._evicted(victim[3], source)
        if answer is not None:  # past the refusal lane's budget: it answers a taken delivery
            self._append(_REFUSAL, answer)
        return True

    def refuse(self, answer: E | None, source: str) -> None:
        """Count an input of `source` that had no room and queue its answer (None: nothing to
        answer); when the refusal lane is full too, the answer is only counted (`uncounted`)."""
        with self._changed:
            self.refused[source] += 1
            if answer is None:
                return
            if self._waiting[_REFUSAL] >= self._budget(_REFUSAL):
                self.uncounted[source] += 1
                return
            self._append(_REFUSAL, answer)

    def notice(self, event: E) -> None:
        """Queue a notice of the link without blocking, unless an equal one already waits."""
        with self._changed:
            waiting = any(lane == _NOTICE and item == event for _, lane, item in self._items)
            if not waiting and self._waiting[_NOTICE] < self._budget(_NOTICE):
                self._append(_NOTICE, event)

    def report(self, event: E) -> bool:
        """Queue a worker's report, waiting while the report budget is full; False only once
        the inbox is closed (the agent is stopping)."""
        with self._changed:
            while self._waiting[_REPORT] >= self._budget(_REPORT) and not self._closed:
                self._changed.wait()
            if self._closed:
                return False
            self._append(_REPORT, event)
        return True

    def get(self, timeout: float) -> E | None:
        """The next event, waiting up to `timeout` seconds; None if none came. Urgent ones
        first (but a barrier that arrived before them), then the others in order of arrival."""
        with self._changed:
            if not self._items and not self._urgent:
                self._changed.wait(timeout)
            if self._urgent:
                head = self._urgent[0]
                if self._barriers and self._barriers[0][0] < head[1]:
                    item = self._barriers.popleft()
                    self._items.remove(item)
                    lane, event = item[1], item[2]
                else:
                    _, _, lane, event = heapq.heappop(self._urgent)
            elif self._items:
                _, lane, event = item = self._items.popleft()
                if self._barriers and self._barriers[0] is item:
                    self._barriers.popleft()
            else:
                return None
            self._waiting[lane] -= 1
            self._changed.notify_all()  # a reporter may wait for room
            return event

    def close(self) -> None:
        """Release reporters waiting for room (at stop); later reports are refused."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def __len__(self) -> int:
        with self._changed:
            return len(self._items) + len(self._urgent)

    def _append(self, lane: str, event: E) -> None:
        self._items.append((next(self._seq), lane, event))
        self._waiting[lane] += 1
        self._changed.notify_all()
