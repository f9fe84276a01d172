"""The announcement on stage: the one handed to the synthesizer and the player (one at a time),
taken from the waiting queue, and what its progress decides: its start, its end (a repeat waits
again; an alarm said another way after a crash loop is reported `failed`), and what cuts it (a
preemption here or at the speaker, a stop, an ack, its ttl). Pure.

Reports of an activation carry its job token; those of earlier activations are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agent.core.handed import HandedMedia
from agent.core.messages import (
    TEXT_REPORTED,
    UNTIL_ACKNOWLEDGED,
    Action,
    Cut,
    Lifecycle,
    NormalPreempted,
    Priority,
    Rejection,
    SpeakRequest,
    Synthesize,
    UtteranceEnded,
)
from agent.core.reasons import Reason
from agent.core.waiting import Item, WaitingQueue, notify, rejected

REQUEUED_WHEN_PREEMPTED = frozenset({Priority.INFO, Priority.WARNING, Priority.ALARM})
"""Classes that are played again after a preemption; chat is dropped (critical is never cut)."""


@dataclass(slots=True)
class _Active:
    """The announcement handed to the synthesizer and the player."""

    item: Item
    job: int
    """The token of this activation (reports of earlier ones are ignored)."""
    started: bool = False
    cut: bool = False
    """Cut (preempted, stopped, acknowledged, expired): its last event is already out."""
    synthesized: bool = False
    played: bool = False

    @property
    def cuttable(self) -> bool:
        """Neither cut already nor played out (then its outcome is decided)."""
        return not self.cut and not self.played


class Stage:
    """The active announcement and the queue it is taken from."""

    def __init__(self, queue: WaitingQueue, handed: HandedMedia) -> None:
        self._queue = queue
        self._handed = handed
        self._active: _Active | None = None
        self._jobs = 0
        self.last: SpeakRequest | None = None
        """The last announcement played through (what `replay` says again)."""

    @property
    def active_id(self) -> str | None:
        """The id of the announcement on stage (synthesized or played), if one is."""
        return None if self._active is None else self._active.item.request.id

    def repeating(self) -> tuple[str, ...]:
        """Ids of the announcements that will play again (a repeat count not run out, or
        until acknowledged): the one playing and those waiting between two plays."""
        ids = [i.request.id for i in self._queue if i.plays > 0]
        active = self._active
        if active is not None and _plays_again(active.item):
            ids.insert(0, active.item.request.id)
        return tuple(ids)

    def start_next(self, now: float) -> list[Action]:
        """The stage is free and may be used: what expired goes, the first ready one starts."""
        actions = self.expire(now)
        ready = self._queue.first_ready(now)
        if ready is None:
            return actions
        self._queue.remove(ready)
        self._jobs += 1
        self._active = _Active(ready, self._jobs)
        self._handed.hand(ready.request.id)  # its sounds may be made at its turn
        play = ready.plays + 1
        start_at = ready.request.at if play == 1 else None  # a repeat plays when its turn comes
        return [*actions, Synthesize(ready.request, play, self._jobs, start_at)]

    def expire(self, now: float) -> list[Action]:
        """Waiting ones past their ttl, and the active one if it has not started yet."""
        actions: list[Action] = []
        for item in self._queue.drop(lambda i: _past(i.deadline, now)):
            actions.append(notify(item, Lifecycle.EXPIRED))
        active = self._active
        if active is None or not active.cuttable or active.started:
            return actions
        if _past(active.item.deadline, now):  # e.g. it waited for the audio device
            active.cut = True
            expired = notify(active.item, Lifecycle.EXPIRED)
            actions += [Cut(active.item.request.id, active.job), expired]
        return actions

    # ---- what cuts it -----------------------------------------------------------------------

    def preempt_for(self, item: Item) -> list[Action]:
        """A newcomer (or one that fell due) of a higher class that interrupts cuts it."""
        active = self._active
        if active is None or not active.cuttable or not item.request.interrupts:
            return []
        if item.request.priority <= active.item.request.priority:
            return []
        return self._preempt(active, item.request.id)

    def preempt_for_due(self, now: float) -> list[Action]:
        """A waiting announcement that became due (a repeat) may preempt what plays."""
        ready = self._queue.first_ready(now)
        return [] if ready is None else self.preempt_for(ready)

    def preempted_elsewhere(self, event: NormalPreempted) -> list[Action]:
        """The speaker gave the device to an alarm of the other lane: what played is cut and
        requeued as a preemption here would do; it is over as far as the speaker goes."""
        active = self._active
        if active is None or not self._is_active(event.request_id, event.job):
            return []
        actions = self._preempt(active, event.by) if active.cuttable else []
        active.played = True
        return actions

    def _preempt(self, active: _Active, by: str) -> list[Action]:
        current = active.item
        active.cut = True
        actions: list[Action] = [
            Cut(current.request.id, active.job),
            notify(current, Lifecycle.PREEMPTED, by=by),
        ]
        if current.request.priority in REQUEUED_WHEN_PREEMPTED:
            if active.started or current.request.at is None:  # played again when it can
                current.not_before = 0.0
                current.request = replace(current.request, at=None)
            # a timed one cut while it waited for its instant keeps it: still in step
            refused = self._queue.add_bounded(current)
            if current in self._queue:
                actions.append(notify(current, Lifecycle.REQUEUED, queue_depth=len(self._queue)))
            actions += refused
        return actions

    def stop(self, clear: bool, current: bool = True) -> list[Action]:
        """`stop`: what plays is cut (`current`), and a repeating one between two plays; with
        `clear` everything waiting goes too."""
        actions: list[Action] = []
        active = self._active
        if current and active is not None and active.cuttable:
            active.cut = True
            actions += [
                Cut(active.item.request.id, active.job),
                notify(active.item, Lifecycle.STOPPED),
            ]
        # a repeating announcement between two plays is also "what is playing"
        ending = self._queue.drop(lambda i: clear or (i.plays > 0 and current))
        actions += [notify(i, Lifecycle.STOPPED, cleared=clear) for i in ending]
        return actions

    def acknowledge(self, request_id: str) -> list[Action]:
        """`ack`: the announcement with this id ends at once, playing or waiting."""
        active = self._active
        if active is not None and active.cuttable and active.item.request.id == request_id:
            active.cut = True
            return [Cut(request_id, active.job), notify(active.item, Lifecycle.ACKNOWLEDGED)]
        waiting = self._queue.find(request_id)
        if waiting is not None:
            self._queue.remove(waiting)
            return [notify(waiting, Lifecycle.ACKNOWLEDGED)]
        nothing = Rejection(
            request_id, Reason.UNKNOWN_ID, "nothing with this id is playing or waiting"
        )
        return [rejected(nothing)]

    def discard(self, request_id: str) -> Cut | None:
        """Forget a request whose handling failed half-way: dropped if it waits; cut and off
        the stage at once if it is on it (the Cut; later reports of it are ignored)."""
        self._queue.drop(lambda i: i.request.id == request_id)
        active = self._active
        if active is None or active.item.request.id != request_id:
            return None
        self._active = None
        return Cut(request_id, active.job)

    # ---- its progress -----------------------------------------------------------------------

    def held(self, request_id: str, held: int) -> bool:
        """The edges hold this much for the one on stage (counted again if it comes back to
        wait); False when it is not on stage."""
        active = self._active
        if active is None or active.item.request.id != request_id:
            return False
        active.item.held = held
        return True

    def synthesized(self, request_id: str, job: int) -> None:
        if self._active is not None and self._is_active(request_id, job):
            self._active.synthesized = True

    def started(self, request_id: str, job: int, late_ms: float | None) -> list[Action]:
        active = self._active
        if active is None or active.cut or not self._is_active(request_id, job):
            return []
        active.started = True
        details: dict[str, object] = {"play": active.item.plays + 1}
        if late_ms is not None:
            details["late_ms"] = round(late_ms, 1)
        return [notify(active.item, Lifecycle.STARTED, **details)]

    def ended(self, event: UtteranceEnded, now: float) -> list[Action]:
        """It was played out (or failed): its outcome, and a repeat waits again."""
        active = self._active
        if active is None or not self._is_active(event.id, event.job):
            return []
        active.played = True
        if active.cut:
            return []  # its last event went out when it was cut
        item = active.item
        if item.request.fallback is not None and event.error is None:  # said another way
            detail = (item.crash_loop or "the agent died on it") + ": said another way"
            said = {"fallback": item.request.fallback, "text": item.request.text[:TEXT_REPORTED]}
            crash_loop = str(Reason.CRASH_LOOP)
            failed = notify(item, Lifecycle.FAILED, reason=crash_loop, detail=detail, **said)
            return [replace(failed, details={**failed.details, **event.info})]
        if event.error is not None:
            # nothing was heard of one refused by its size (speech estimated, a sound's header)
            refused = event.error in (Reason.TOO_LONG, Reason.TOO_LARGE) and not active.started
            ended = Lifecycle.REJECTED if refused else Lifecycle.FAILED
            heard = event.info if ended == Lifecycle.FAILED else {}  # the alarm lane's `said`
            return [notify(item, ended, reason=str(event.error), detail=event.detail, **heard)]
        return self._played(item, event, now)

    def _played(self, item: Item, event: UtteranceEnded, now: float) -> list[Action]:
        """A play counted: `finished`, and the repeat bookkeeping (it waits `repeat_interval`
        behind its class's others, until its count runs out or it is acknowledged)."""
        item.plays += 1
        request = item.request
        self.last = request
        more = request.repeat == UNTIL_ACKNOWLEDGED or item.plays < request.repeat
        left: object = (
            "until_acknowledged"
            if request.repeat == UNTIL_ACKNOWLEDGED
            else (request.repeat - item.plays)
        )
        finished = notify(
            item,
            Lifecycle.FINISHED,
            audio_seconds=round(event.audio_seconds, 3),
            play=item.plays,
            repeats_left=left,
            **event.info,
        )
        if not more:
            return [finished]
        item.not_before = now + request.repeat_interval
        item.seq = self._queue.ticket()  # a repeat waits behind its class's others: no starving
        return [finished, *self._queue.add_bounded(item)]

    def finish(self) -> bool:
        """Off the stage once both synthesized and played out: True when it just left."""
        active = self._active
        if active is None or not (active.synthesized and active.played):
            return False
        self._active = None
        return True

    def _is_active(self, request_id: str, job: int) -> bool:
        active = self._active
        return active is not None and active.item.request.id == request_id and active.job == job


def _past(deadline: float | None, now: float) -> bool:
    return deadline is not None and now >= deadline


def _plays_again(item: Item) -> bool:
    """Whether an announcement will play again after the play under way."""
    request = item.request
    return request.repeat == UNTIL_ACKNOWLEDGED or item.plays + 1 < request.repeat
