"""The pure core: decides what happens to every announcement. Events and time in, actions out.

No I/O, no clock, no threads: `SpeakCore.handle(event, now, wall)` is a plain function of its state,
the event and the time it is given, so every rule is tested table by table.

The rules:
- Classes, highest first: critical, alarm, warning, info, chat. Waiting announcements are
  taken highest class first, and first in, first out within a class.
- One announcement is active at a time (synthesized and played). A new one of a higher class
  that interrupts (by default alarm and critical do) cuts the active one, which fades out.
  The cut one is re-queued (info, warning, alarm: it plays again from the start, ahead of
  later ones of its class) or dropped (chat). Lower or equal classes never preempt.
- The queue is bounded: when full, the lowest-class, oldest announcement is rejected with
  `queue_full` (the newcomer itself if it is the lowest), so a critical is never dropped for a
  lower one.
- So are the bytes of media held for waiting announcements (a recording's size on arrival,
  then what the media source reports holding: `MediaHeld`): beyond the budget, the
  lowest-class, oldest one that holds any is rejected with `queue_full`, until it fits. The
  core keeps no media bytes itself: an accepted request's are handed on (`Prepare`), and once
  a request has left, the edges let go of what they hold for it (`LetGo`).
- `ttl`: not started by then, it expires (also a repeat that has not started).
- `repeat`: after each play the announcement waits `repeat_interval` and plays again, until the
  count runs out or, for `repeat: 0`, until acknowledged; `ack` with its id ends it at once.
- `stop` cuts what is playing; with `clear` it also drops everything waiting.
- `dedupe_key`: a newcomer replaces a waiting announcement with the same key and takes its place;
  it never lowers the class of what waits (it takes the higher of the two).
- No announcement starts while the audio device is unavailable; they wait (their ttl runs).
- A voice switch (a model update) waits until nothing is synthesized or played, and nothing new
  starts meanwhile (an alarm still preempts what plays, then starts with the new voice).

Its parts: `intake` (arrivals: admission, ids, dedupe, the selected voice, the restore),
`stage` (the announcement on stage: its start, progress, repeats and what cuts it), `waiting`
(the bounded queue), `handed` (the media the edges hold); `SpeakCore` routes each event to them
and keeps what decides whether the next may start (the audio device, a waiting voice switch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from agent.core.admission import Timing
from agent.core.catalog import Catalog, VoiceFacts
from agent.core.handed import HandedMedia
from agent.core.intake import Intake
from agent.core.messages import (
    Acknowledge,
    AckRequested,
    Action,
    AudioStatus,
    Delivery,
    Event,
    MediaHeld,
    NormalPreempted,
    Rejection,
    Remember,
    ReplayRequested,
    SetVolume,
    SpeakInvalid,
    SpeakReceived,
    StopRequested,
    SwapCancelled,
    SwapRequested,
    SwitchDeclined,
    SwitchVoice,
    SynthesisDone,
    Tick,
    Unfinished,
    UtteranceEnded,
    UtteranceStarted,
    VoiceSelected,
    VolumeRequested,
)
from agent.core.reasons import Reason
from agent.core.stage import Stage
from agent.core.waiting import Item, WaitingQueue, rejected


class SpeakCore:
    """Scheduling of announcements by class, with preemption, expiry, repeats and stop."""

    def __init__(
        self,
        queue_size: int,
        remembered_ids: int,
        voices: frozenset[str] = frozenset({"default"}),
        chimes: frozenset[str] = frozenset(),
        *,
        timing: Timing | None = None,
        catalog: Catalog | None = None,
        media_budget: int | None = None,
    ) -> None:
        self._handed = HandedMedia()
        self._queue = WaitingQueue(queue_size, media_budget)
        known = catalog or Catalog({v: VoiceFacts() for v in voices}, chimes)
        self._intake = Intake(self._queue, self._handed, known, timing or Timing(), remembered_ids)
        self._stage = Stage(self._queue, self._handed)
        self._audio_available = True
        self._swap: int | None = None
        """A voice switch waiting for the current announcement to end (its token)."""
        self._replays = 0

    def restore(
        self,
        pending: list[Unfinished],
        ids: list[str],
        fingerprints: list[str],
        now: float,
        settings: Mapping[str, str] | None = None,
    ) -> list[Action]:
        """After a restart: remember recent ids; queue again what had not ended, in order.

        One that had started was cut by the crash: it is reported `interrupted` and plays again.
        One the agent died on too often (`crashed`: twice in the same step of its work) is not
        tried again as it is: it ends `failed` with `crash_loop`, except an alarm or a critical
        one, which is said another way (its chime, then what the phrase cache holds of it; its
        chime alone when reading its text was the fatal step) and then ends `failed` with
        `crash_loop`, saying how it was said and its text. The remembered settings (volume,
        voice) apply again when they are still valid.
        """
        actions = self._intake.restore(pending, ids, fingerprints, now, settings or {})
        return [*actions, *self._stage.expire(now), *self._next(now)]

    def discard(self, request_id: str, now: float) -> list[Action]:
        """Forget a request whose handling failed half-way (it was answered `rejected`): drop it
        if it waits; if it was made active, cut it and free the worker at once (whether or not
        its synthesis began: later reports of that activation are ignored). No event: its last
        one is out."""
        cut = self._stage.discard(request_id)
        if cut is None:
            return self._let_go()
        return [cut, *self._switch_when_idle(now), *self._let_go()]

    def knows(self, request_id: str) -> bool:
        """Whether this request is playing or waiting here."""
        playing = self._stage.active_id == request_id
        return playing or self._queue.find(request_id) is not None

    def use_catalog(self, catalog: Catalog) -> None:
        """Check later arrivals against this catalog (the voices became known)."""
        self._intake.use_catalog(catalog)

    @property
    def catalog(self) -> Catalog:
        return self._intake.catalog

    @property
    def speaking(self) -> bool:
        """An announcement is being synthesized or played."""
        return self._stage.active_id is not None

    @property
    def selected_voice(self) -> str:
        """The voice of requests that name none."""
        return self._intake.selected_voice

    @property
    def queue_depth(self) -> int:
        """Announcements waiting (not the active one)."""
        return len(self._queue)

    @property
    def repeating(self) -> tuple[str, ...]:
        """Ids of the announcements that will play again (a repeat count not run out, or
        until acknowledged): the one playing and those waiting between two plays."""
        return self._stage.repeating()

    def handle(self, event: Event, now: float, wall: float = 0.0) -> list[Action]:
        """Decide the actions that follow from one event at time `now` (seconds, monotonic);
        `wall` is the wall-clock time (Unix seconds) of `now`: a timed request's `at` is placed
        on the core's clock by it (by the event's own when it carries one)."""
        return [*self._decide(event, now, wall), *self._let_go()]

    def _decide(self, event: Event, now: float, wall: float) -> list[Action]:  # noqa: PLR0911, PLR0912 - per kind
        stage = self._stage
        match event:
            case SpeakReceived(request, delivery, stamped):
                if self._intake.resent(request, delivery):
                    return [Acknowledge(delivery)]  # the broker resent what we already took
                arrived = self._intake.admit(request, delivery, now, stamped or wall)
                admitted = self._admitted(*arrived)
                return [*admitted, Acknowledge(delivery), *self._next(now)]
            case SpeakInvalid(rejection, delivery):
                return [rejected(rejection), Acknowledge(delivery)]
            case StopRequested(clear, delivery, current):
                return [*stage.stop(clear, current), Acknowledge(delivery), *self._next(now)]
            case AckRequested(request_id, delivery):
                return [*stage.acknowledge(request_id), Acknowledge(delivery), *self._next(now)]
            case VolumeRequested(volume, delivery):
                return [SetVolume(volume), Remember("volume", repr(volume)), Acknowledge(delivery)]
            case VoiceSelected(voice, delivery):
                return [*self._intake.select_voice(voice), Acknowledge(delivery)]
            case ReplayRequested(delivery):
                return [*self._replay(delivery, now), Acknowledge(delivery), *self._next(now)]
            case Tick():
                return [*stage.expire(now), *stage.preempt_for_due(now), *self._next(now)]
            case AudioStatus(available, _):
                self._audio_available = available
                return self._next(now)
            case SynthesisDone(request_id, job):
                stage.synthesized(request_id, job)
                return self._finished(now)
            case UtteranceStarted(request_id, job, _, late_ms):
                return stage.started(request_id, job, late_ms)
            case UtteranceEnded():
                return [*stage.ended(event, now), *self._finished(now)]
            case SwapRequested(token):
                self._swap = token  # nothing new starts until it is done
                return self._switch_when_idle(now) if not self.speaking else []
            case SwapCancelled(token):
                if self._swap != token:
                    return []  # already switched
                self._swap = None
                return [SwitchDeclined(token), *self._next(now)]
            case MediaHeld(request_id, held):
                return self._media_held(request_id, held)
            case NormalPreempted():
                return [*stage.preempted_elsewhere(event), *self._finished(now)]
        raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover - exhaustive match

    def _admitted(self, actions: list[Action], item: Item | None) -> list[Action]:
        """An arrival's actions, then the preemption of what plays by it, when it may cut in."""
        if item is None:
            return actions
        return [*actions, *self._stage.preempt_for(item)]

    def _replay(self, delivery: Delivery, now: float) -> list[Action]:
        last = self._stage.last
        if last is None:
            nothing = Rejection("replay", Reason.UNKNOWN_ID, "nothing was spoken yet to replay")
            return [rejected(nothing)]
        self._replays += 1
        again = replace(  # said again now: a timed one's instant has passed
            last, id=f"{last.id}~replay{self._replays}", repeat=1, dedupe_key=None, at=None
        )
        admitted = self._intake.admit(again, replace(delivery, fingerprint=""), now)
        return self._admitted(*admitted)

    def _media_held(self, request_id: str, held: int) -> list[Action]:
        """The edges hold this much for a request now: within the budget, if it waits."""
        if self._stage.held(request_id, held):
            return []  # on stage: counted again if it comes back to wait
        item = self._queue.find(request_id)
        if item is None:
            return []  # gone: its bytes are let go
        item.held = held
        return [*self._queue.within_budget()]

    def _let_go(self) -> list[Action]:
        """LetGo for every request handed to the edges that has left the core."""
        here = [i.request.id for i in self._queue]
        active = self._stage.active_id
        return [*self._handed.let_go(here if active is None else [*here, active])]

    # ---- whether the next may start -------------------------------------------------------

    def _next(self, now: float) -> list[Action]:
        if self.speaking or not self._audio_available or self._swap is not None:
            return []
        return self._stage.start_next(now)

    def _finished(self, now: float) -> list[Action]:
        """The one on stage may have left it: then a waiting switch, then the next."""
        return self._switch_when_idle(now) if self._stage.finish() else []

    def _switch_when_idle(self, now: float) -> list[Action]:
        """Nothing runs: a waiting voice switch happens now, then the next announcement."""
        if self._swap is None:
            return self._next(now)
        token, self._swap = self._swap, None
        return [SwitchVoice(token), *self._next(now)]
