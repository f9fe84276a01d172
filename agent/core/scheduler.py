"""The pure core: decides what happens to every announcement. Events and time in, actions out.

No I/O, no clock, no threads: `SpeakCore.handle(event, now)` is a plain function of its state,
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

"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.core.admission import Admission, Timing
from agent.core.catalog import Catalog, VoiceFacts
from agent.core.messages import (
    FALLBACK_CACHED,
    FALLBACK_CHIME,
    TEXT_REPORTED,
    UNTIL_ACKNOWLEDGED,
    Acknowledge,
    AckRequested,
    Action,
    AudioClip,
    AudioStatus,
    Cut,
    Delivery,
    Event,
    LetGo,
    Lifecycle,
    MediaHeld,
    NormalPreempted,
    Prepare,
    Priority,
    Record,
    Rejection,
    Remember,
    ReplayRequested,
    SetVolume,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    SwapCancelled,
    SwapRequested,
    SwitchDeclined,
    SwitchVoice,
    SynthesisDone,
    Synthesize,
    Tick,
    Unfinished,
    UtteranceEnded,
    UtteranceStarted,
    VoiceSelected,
    VolumeRequested,
)
from agent.core.reasons import Reason
from agent.core.waiting import Item, WaitingQueue, notify, rejected

REQUEUED_WHEN_PREEMPTED = frozenset({Priority.INFO, Priority.WARNING, Priority.ALARM})
"""Classes that are played again after a preemption; chat is dropped (critical is never cut)."""


class RecentIds:
    """The most recent `capacity` ids, oldest forgotten first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def add(self, request_id: str) -> None:
        """Remember an id, forgetting the oldest beyond capacity."""
        self._ids[request_id] = None
        self._ids.move_to_end(request_id)
        while len(self._ids) > self._capacity:
            self._ids.popitem(last=False)


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
        self._handed: set[str] = set()
        """Requests whose media the edges may hold (prepared or synthesized): let go of once
        they leave the core."""
        self._timing = timing or Timing()
        self._catalog = catalog or Catalog({v: VoiceFacts() for v in voices}, chimes)
        self._admission = Admission(self._catalog, self._timing)
        self._queue = WaitingQueue(queue_size, media_budget)
        self._active: _Active | None = None
        self._audio_available = True
        self._seq = 0
        self._seen = RecentIds(remembered_ids)
        self._fingerprints = RecentIds(remembered_ids)
        self._jobs = 0
        self._selected_voice = "default"
        self._swap: int | None = None
        """A voice switch waiting for the current announcement to end (its token)."""
        self._last: SpeakRequest | None = None
        self._replays = 0
        self._loops: dict[str, str] = {}
        """Why each announcement said another way is (a crash loop), by id."""

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
        actions: list[Action] = []
        settings = settings or {}
        voice = settings.get("voice")
        if isinstance(voice, str) and self._admission.voice_is_known(voice):
            self._selected_voice = voice
        volume = _volume(settings.get("volume"))
        if volume is not None:
            actions.append(SetVolume(volume))
        for request_id in ids:
            self._seen.add(request_id)
        for fingerprint in fingerprints:
            self._fingerprints.add(fingerprint)
        for unfinished in pending:
            request = replace(unfinished.request, at=None)  # its moment is gone: as soon as it can
            self._seen.add(request.id)
            self._seq += 1
            ttl_left = unfinished.ttl_left
            item = Item(request, self._seq, None if ttl_left is None else now + ttl_left)
            if unfinished.crashed and request.priority < Priority.ALARM:
                actions.append(
                    notify(
                        item,
                        Lifecycle.FAILED,
                        reason=str(Reason.CRASH_LOOP),
                        detail=_loop(unfinished),
                    )
                )
                continue
            if unfinished.crashed:  # never dropped: said another way, then reported
                reading = (unfinished.crash_step or "phonemize").startswith("phonemize")
                fallback = FALLBACK_CHIME if reading else FALLBACK_CACHED
                item.request = replace(request, fallback=fallback, repeat=1, dedupe_key=None)
                self._loops[request.id] = _loop(unfinished)
            self._queue.add(item)
            if unfinished.started:
                actions.append(notify(item, Lifecycle.INTERRUPTED, queue_depth=len(self._queue)))
        return [*actions, *self._expire(now), *self._next(now)]

    def discard(self, request_id: str, now: float) -> list[Action]:
        """Forget a request whose handling failed half-way (it was answered `rejected`): drop it
        if it waits; if it was made active, cut it and free the worker at once (whether or not
        its synthesis began: later reports of that activation are ignored). No event: its last
        one is out."""
        self._queue.drop(lambda i: i.request.id == request_id)
        active = self._active
        if active is None or active.item.request.id != request_id:
            return self._let_go()
        self._active = None
        return [Cut(request_id, active.job), *self._switch_when_idle(now), *self._let_go()]

    def knows(self, request_id: str) -> bool:
        """Whether this request is playing or waiting here."""
        active = self._active
        playing = active is not None and active.item.request.id == request_id
        return playing or self._queue.find(request_id) is not None

    def use_catalog(self, catalog: Catalog) -> None:
        """Check later arrivals against this catalog (the voices became known)."""
        self._catalog = catalog
        self._admission = Admission(catalog, self._timing)

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    @property
    def speaking(self) -> bool:
        """An announcement is being synthesized or played."""
        return self._active is not None

    @property
    def selected_voice(self) -> str:
        """The voice of requests that name none."""
        return self._selected_voice

    @property
    def queue_depth(self) -> int:
        """Announcements waiting (not the active one)."""
        return len(self._queue)

    @property
    def repeating(self) -> tuple[str, ...]:
        """Ids of the announcements that will play again (a repeat count not run out, or
        until acknowledged): the one playing and those waiting between two plays."""
        ids = [i.request.id for i in self._queue if i.plays > 0]
        active = self._active
        if active is not None and _plays_again(active.item):
            ids.insert(0, active.item.request.id)
        return tuple(ids)

    def handle(self, event: Event, now: float) -> list[Action]:
        """Decide the actions that follow from one event at time `now` (seconds)."""
        return [*self._decide(event, now), *self._let_go()]

    def _decide(self, event: Event, now: float) -> list[Action]:  # noqa: PLR0911, PLR0912 - per kind
        match event:
            case SpeakReceived(request, delivery, wall):
                if delivery.redelivered and (
                    request.id in self._seen or delivery.fingerprint in self._fingerprints
                ):
                    return [Acknowledge(delivery)]  # the broker resent what we already took
                admitted = self._admit(request, delivery, now, wall)
                return [*admitted, Acknowledge(delivery), *self._next(now)]
            case SpeakInvalid(rejection, delivery):
                return [rejected(rejection), Acknowledge(delivery)]
            case StopRequested(clear, delivery, current):
                return [*self._stop(clear, current), Acknowledge(delivery), *self._next(now)]
            case AckRequested(request_id, delivery):
                return [*self._acknowledge(request_id), Acknowledge(delivery), *self._next(now)]
            case VolumeRequested(volume, delivery):
                return [SetVolume(volume), Remember("volume", repr(volume)), Acknowledge(delivery)]
            case VoiceSelected(voice, delivery):
                return [*self._select_voice(voice), Acknowledge(delivery)]
            case ReplayRequested(delivery):
                return [*self._replay(delivery, now), Acknowledge(delivery), *self._next(now)]
            case Tick():
                return [*self._expire(now), *self._preempt_for_due(now), *self._next(now)]
            case AudioStatus(available, _):
                self._audio_available = available
                return self._next(now)
            case SynthesisDone(request_id, job):
                if self._active is not None and self._is_active(request_id, job):
                    self._active.synthesized = True
                return self._finish_active(now)
            case UtteranceStarted(request_id, job, _, late_ms):
                return self._started(request_id, job, late_ms)
            case UtteranceEnded():
                return [*self._ended(event, now), *self._finish_active(now)]
            case SwapRequested(token):
                self._swap = token  # nothing new starts until it is done
                return self._switch_when_idle(now) if self._active is None else []
            case SwapCancelled(token):
                if self._swap != token:
                    return []  # already switched
                self._swap = None
                return [SwitchDeclined(token), *self._next(now)]
            case MediaHeld(request_id, held):
                return self._media_held(request_id, held)
            case NormalPreempted():
                return self._preempted_elsewhere(event, now)
        raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover - exhaustive match

    # ---- arrivals ---------------------------------------------------------------------------

    def _admit(
        self, request: SpeakRequest, delivery: Delivery, now: float, wall: float = 0.0
    ) -> list[Action]:
        chosen = self._admission.voice_of(request, self._selected_voice)
        if isinstance(chosen, Rejection):
            return [rejected(chosen)]
        request = chosen
        refusal = self._duplicate(request) or self._admission.refusal(request, wall)
        if refusal is not None:
            return [rejected(refusal)]
        if delivery.expiry is not None and (request.ttl is None or delivery.expiry < request.ttl):
            request = replace(request, ttl=max(delivery.expiry, 0.001))  # MQTT 5 expiry
        replaced = self._queue.with_key(request.dedupe_key)
        if replaced is not None and replaced.request.priority > request.priority:
            request = replace(request, priority=replaced.request.priority)  # never lowered
        self._seq += 1
        deadline = None if request.ttl is None else now + request.ttl
        arrived = request
        if request.audio is not None:  # its bytes go to the edges (Prepare); the size stays
            request = replace(request, audio=AudioClip(b""))
        item = Item(request, self._seq, deadline, held=arrived.media_bytes)
        if request.at is not None:  # made ready `prepare` before its start: not before
            item.not_before = now + (request.at - wall) - self._timing.prepare
        actions: list[Action] = []
        if replaced is not None:
            self._queue.remove(replaced)
            item.seq = replaced.seq  # the newcomer takes its place in the queue
            actions.append(notify(replaced, Lifecycle.COALESCED, into=request.id))
        bounded = self._queue.add_bounded(item)
        actions += bounded
        if item not in self._queue:  # the newcomer was the lowest, oldest: refused
            return actions
        self._seen.add(request.id)  # only accepted ids are remembered
        if delivery.fingerprint:
            self._fingerprints.add(delivery.fingerprint)
        actions.append(Record(arrived, delivery.fingerprint))
        if arrived.has_media:
            self._handed.add(request.id)
            actions.append(Prepare(arrived))
        details: dict[str, object] = {"queue_depth": len(self._queue)}
        if request.unknown_fields:
            details["unknown_fields"] = list(request.unknown_fields)
        actions.insert(0, notify(item, Lifecycle.ACCEPTED, **details))
        if item.not_before > now:  # a timed one cuts in when it falls due (`_preempt_for_due`)
            return actions
        return [*actions, *self._preempt_for(item)]

    def _duplicate(self, request: SpeakRequest) -> Rejection | None:
        if request.id not in self._seen:
            return None
        detail = "this id was already accepted"
        return Rejection(request.id, Reason.DUPLICATE_ID, detail, None, request.priority)

    def _media_held(self, request_id: str, held: int) -> list[Action]:
        """The edges hold this much for a request now: within the budget, if it waits."""
        active = self._active
        if active is not None and active.item.request.id == request_id:
            active.item.held = held  # playing: counted again if it comes back to wait
            return []
        item = self._queue.find(request_id)
        if item is None:
            return []  # gone: its bytes are let go
        item.held = held
        return [*self._queue.within_budget()]

    def _let_go(self) -> list[Action]:
        """LetGo for every request handed to the edges that has left the core."""
        here = {i.request.id for i in self._queue}
        if self._active is not None:
            here.add(self._active.item.request.id)
        gone = sorted(self._handed - here)
        self._handed -= set(gone)
        return [LetGo(request_id) for request_id in gone]

    def _is_active(self, request_id: str, job: int) -> bool:
        active = self._active
        return active is not None and active.item.request.id == request_id and active.job == job

    def _preempt_for(self, item: Item) -> list[Action]:
        active = self._active
        if active is None or not active.cuttable or not item.request.interrupts:
            return []
        if item.request.priority <= active.item.request.priority:
            return []
        return self._preempt_active(active, item.request.id)

    def _preempted_elsewhere(self, event: NormalPreempted, now: float) -> list[Action]:
        """The speaker gave the device to an alarm of the other lane: what played is cut and
        requeued as a preemption here would do; it is over as far as the speaker goes."""
        active = self._active
        if active is None or not self._is_active(event.request_id, event.job):
            return []
        actions = self._preempt_active(active, event.by) if active.cuttable else []
        active.played = True
        return [*actions, *self._finish_active(now)]

    def _preempt_active(self, active: _Active, by: str) -> list[Action]:
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

    def _preempt_for_due(self, now: float) -> list[Action]:
        """A waiting announcement that became due (a repeat) may preempt what plays."""
        ready = self._queue.first_ready(now)
        return [] if ready is None else self._preempt_for(ready)

    # ---- operator commands ------------------------------------------------------------------

    def _select_voice(self, voice: str) -> list[Action]:
        """Select a voice (`id`) or a voice's speaker (`id#speaker`) for requests naming none."""
        voice_id, hash_sign, speaker = voice.partition("#")
        facts = self._catalog.voices.get(voice_id)
        if facts is None or (hash_sign and not facts.has_speaker(speaker)):
            known = ", ".join(v if s is None else f"{v}#{s}" for v, s in self._catalog.pairs())
            detail = f"{voice[:64]!r} is none of: {known}"
            return [rejected(Rejection("select-voice", Reason.UNKNOWN_VOICE, detail, "voice"))]
        self._selected_voice = voice
        return [Remember("voice", voice)]

    def _replay(self, delivery: Delivery, now: float) -> list[Action]:
        if self._last is None:
            nothing = Rejection("replay", Reason.UNKNOWN_ID, "nothing was spoken yet to replay")
            return [rejected(nothing)]
        self._replays += 1
        again = replace(  # said again now: a timed one's instant has passed
            self._last,
            id=f"{self._last.id}~replay{self._replays}",
            repeat=1,
            dedupe_key=None,
            at=None,
        )
        return self._admit(again, replace(delivery, fingerprint=""), now)

    def _stop(self, clear: bool, current: bool = True) -> list[Action]:
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

    def _acknowledge(self, request_id: str) -> list[Action]:
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

    # ---- time -------------------------------------------------------------------------------

    def _expire(self, now: float) -> list[Action]:
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

    def _next(self, now: float) -> list[Action]:
        if self._active is not None or not self._audio_available or self._swap is not None:
            return []
        actions = self._expire(now)
        ready = self._queue.first_ready(now)
        if ready is None:
            return actions
        self._queue.remove(ready)
        self._jobs += 1
        self._active = _Active(ready, self._jobs)
        self._handed.add(ready.request.id)  # its sounds may be made at its turn
        play = ready.plays + 1
        start_at = ready.request.at if play == 1 else None  # a repeat plays when its turn comes
        return [*actions, Synthesize(ready.request, play, self._jobs, start_at)]

    # ---- playback ---------------------------------------------------------------------------

    def _started(self, request_id: str, job: int, late_ms: float | None) -> list[Action]:
        active = self._active
        if active is None or active.cut or not self._is_active(request_id, job):
            return []
        active.started = True
        details: dict[str, object] = {"play": active.item.plays + 1}
        if late_ms is not None:
            details["late_ms"] = round(late_ms, 1)
        return [notify(active.item, Lifecycle.STARTED, **details)]

    def _ended(self, event: UtteranceEnded, now: float) -> list[Action]:
        active = self._active
        if active is None or not self._is_active(event.id, event.job):
            return []
        active.played = True
        if active.cut:
            return []  # its last event went out when it was cut
        item = active.item
        if item.request.fallback is not None and event.error is None:  # said another way
            detail = self._loops.pop(item.request.id, "the agent died on it") + ": said another way"
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
        item.plays += 1
        request = item.request
        self._last = request
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
        self._seq += 1
        item.seq = self._seq  # a repeat waits behind its class's others: it cannot starve them
        return [finished, *self._queue.add_bounded(item)]

    def _finish_active(self, now: float) -> list[Action]:
        active = self._active
        if active is None or not (active.synthesized and active.played):
            return []
        self._active = None
        return self._switch_when_idle(now)

    def _switch_when_idle(self, now: float) -> list[Action]:
        """Nothing runs: a waiting voice switch happens now, then the next announcement."""
        if self._swap is None:
            return self._next(now)
        token, self._swap = self._swap, None
        return [SwitchVoice(token), *self._next(now)]


def _volume(text: object) -> float | None:
    """A remembered volume, if it is one (text of a number from 0 to 1)."""
    if not isinstance(text, str):
        return None
    try:
        volume = float(text)
    except ValueError:
        return None
    return volume if 0.0 <= volume <= 1.0 else None  # NaN is neither


def _loop(unfinished: Unfinished) -> str:
    """The detail of a `crash_loop`: where the agent died."""
    if unfinished.crash_step is None:
        return "the agent died each time it played, too many times in a row"
    return f"the agent died twice in the same step of its work ({unfinished.crash_step})"


def _past(deadline: float | None, now: float) -> bool:
    return deadline is not None and now >= deadline


def _plays_again(item: Item) -> bool:
    """Whether an announcement will play again after the play under way."""
    request = item.request
    return request.repeat == UNTIL_ACKNOWLEDGED or item.plays + 1 < request.repeat
