"""The announcements that wait, in the order they will play (highest class first, then first
in, first out), within two bounds: how many wait, and how many bytes of media are held for
them. Beyond either, the lowest-class, oldest one is refused (`queue_full`), so a higher class
never goes for a lower one. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from agent.core.messages import Lifecycle, Notify, Rejection, SpeakRequest
from agent.core.reasons import Reason


@dataclass(slots=True)
class Item:
    """An accepted announcement and its schedule."""

    request: SpeakRequest
    seq: int
    deadline: float | None
    not_before: float = 0.0
    plays: int = 0
    """Plays finished so far."""
    held: int = 0
    """Bytes of media held for it (counted against the budget while it waits)."""
    crash_loop: str = ""
    """Where the agent died on it, for one said another way after a crash loop (restored)."""

    @property
    def order(self) -> tuple[int, int]:
        """Queue order: highest class first, then first in, first out."""
        return (-self.request.priority, self.seq)


class WaitingQueue:
    """Waiting announcements: at most `size`, holding at most `media_budget` bytes (None: no
    bound on the bytes)."""

    def __init__(self, size: int, media_budget: int | None) -> None:
        self._size = size
        self._budget = media_budget
        self._items: list[Item] = []
        self._seq = 0

    def ticket(self) -> int:
        """The next number in arrival order (an arrival, a restored one, a repeat that waits
        again: each goes behind those of its class already here)."""
        self._seq += 1
        return self._seq

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Item]:
        return iter(list(self._items))

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def find(self, request_id: str) -> Item | None:
        return next((i for i in self._items if i.request.id == request_id), None)

    def with_key(self, key: str | None) -> Item | None:
        """The waiting announcement with this `dedupe_key`, if any."""
        if key is None:
            return None
        return next((i for i in self._items if i.request.dedupe_key == key), None)

    def first_ready(self, now: float) -> Item | None:
        """The first in order that may start now."""
        return next((i for i in self._items if i.not_before <= now), None)

    def add(self, item: Item) -> None:
        """Queue an item in its place, unbounded (one cut off and going back)."""
        self._items.append(item)
        self._items.sort(key=lambda i: i.order)

    def add_bounded(self, item: Item) -> list[Notify]:
        """Queue an item; when full, the lowest-class, oldest of all (maybe it) is refused;
        then the bytes are brought within the budget."""
        refused: list[Notify] = []
        if len(self._items) >= self._size:
            victim = min([*self._items, item], key=lambda i: (i.request.priority, i.seq))
            full = f"{self._size} announcements waiting; dropped the lowest, oldest"
            refused.append(rejected(rejection(victim, Reason.QUEUE_FULL, full)))
            if victim is item:
                return refused
            self._items.remove(victim)
        self.add(item)
        return [*refused, *self.within_budget()]

    def within_budget(self) -> list[Notify]:
        """Within the media budget: the lowest-class, oldest waiting announcement that holds
        media is refused until the rest fits."""
        refused: list[Notify] = []
        if self._budget is None:
            return refused
        while (held := sum(i.held for i in self._items)) > self._budget:
            victim = min(
                (i for i in self._items if i.held), key=lambda i: (i.request.priority, i.seq)
            )
            full = (
                f"{held} bytes of sounds held for waiting announcements, at most {self._budget}; "
                "dropped the lowest, oldest"
            )
            refused.append(rejected(rejection(victim, Reason.QUEUE_FULL, full)))
            self._items.remove(victim)
        return refused

    def remove(self, item: Item) -> None:
        self._items.remove(item)

    def drop(self, which: Callable[[Item], bool]) -> list[Item]:
        """Take out every item `which` selects; returns them, in order."""
        dropped = [i for i in self._items if which(i)]
        self._items = [i for i in self._items if not which(i)]
        return dropped


def notify(item: Item, event: Lifecycle, **details: object) -> Notify:
    """A lifecycle event of an accepted announcement, with its class."""
    source = {"source": item.request.source} if item.request.source else {}
    return Notify(
        item.request.id, event, {"priority": item.request.priority.label, **source, **details}
    )


def rejection(item: Item, reason: Reason, detail: str) -> Rejection:
    return Rejection(item.request.id, reason, detail, None, item.request.priority)


def rejected(refusal: Rejection) -> Notify:
    """The `rejected` event of a refusal."""
    details: dict[str, object] = {"reason": str(refusal.reason), "detail": refusal.detail}
    if refusal.field is not None:
        details["field"] = refusal.field
    if refusal.priority is not None:
        details["priority"] = refusal.priority.label
    return Notify(refusal.id, Lifecycle.REJECTED, details)
