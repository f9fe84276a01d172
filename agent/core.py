"""The pure core: decides what happens to each speak request. Events in, actions out.

No I/O, no clock, no threads: `SpeakCore.handle` is a plain function of its state and the event,
so every decision can be tested table by table. Allowed imports: stdlib and `messages`.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from .messages import (
    Acknowledge,
    Action,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    Reason,
    Rejection,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    SynthesisDone,
    Synthesize,
    UtteranceEnded,
    UtteranceStarted,
)


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


class SpeakCore:
    """First in, first out announcements; each id spoken once; one utterance synthesized at a time.

    The synthesizer works one request ahead of the player (the player's bounded buffer throttles
    it), so the next request is synthesized while the current one plays.
    """

    def __init__(
        self, queue_size: int, remembered_ids: int, voices: frozenset[str] = frozenset({"default"})
    ) -> None:
        self._queue_size = queue_size
        self._voices = voices
        self._pending: deque[SpeakRequest] = deque()
        self._synthesizing: str | None = None
        self._seen = RecentIds(remembered_ids)
        self._fingerprints = RecentIds(remembered_ids)

    @property
    def queue_depth(self) -> int:
        """Requests accepted and not yet handed to the synthesizer."""
        return len(self._pending)

    def handle(self, event: Event) -> list[Action]:  # noqa: PLR0911 - one return per event kind
        """Decide the actions that follow from one event."""
        match event:
            case SpeakReceived(request, delivery):
                if delivery.redelivered and (
                    request.id in self._seen or delivery.fingerprint in self._fingerprints
                ):
                    return [Acknowledge(delivery)]  # the broker resent what we already took
                return [*self._on_speak(request, delivery), Acknowledge(delivery)]
            case SpeakInvalid(rejection, delivery):
                return [_rejected(rejection), Acknowledge(delivery)]
            case SynthesisDone(request_id):
                if self._synthesizing == request_id:
                    self._synthesizing = None
                return self._next()
            case UtteranceStarted(request_id):
                return [Notify(request_id, Lifecycle.STARTED)]
            case UtteranceEnded(request_id, audio_seconds, None, _, info):
                seconds = {"audio_seconds": round(audio_seconds, 3)}
                return [Notify(request_id, Lifecycle.FINISHED, {**seconds, **info})]
            case UtteranceEnded(request_id, _, error, detail, info):
                failure = {"reason": str(error), "detail": detail}
                return [Notify(request_id, Lifecycle.FAILED, {**failure, **info})]
        raise AssertionError(f"unhandled event {event!r}")  # pragma: no cover - exhaustive match

    def _on_speak(self, request: SpeakRequest, delivery: Delivery) -> list[Action]:
        if request.id in self._seen:
            return [
                _rejected(
                    Rejection(request.id, Reason.DUPLICATE_ID, "this id was already accepted")
                )
            ]
        if request.voice not in self._voices:
            known = ", ".join(sorted(self._voices))
            unknown = Rejection(request.id, Reason.UNKNOWN_VOICE, f"known voices: {known}", "voice")
            return [_rejected(unknown)]
        if len(self._pending) >= self._queue_size:
            full = f"{self._queue_size} announcements waiting"
            return [_rejected(Rejection(request.id, Reason.QUEUE_FULL, full))]
        self._seen.add(request.id)
        if delivery.fingerprint:
            self._fingerprints.add(delivery.fingerprint)
        self._pending.append(request)
        start = self._next()
        details: dict[str, object] = {"queue_depth": len(self._pending)}
        if request.unknown_fields:
            details["unknown_fields"] = list(request.unknown_fields)
        return [Notify(request.id, Lifecycle.ACCEPTED, details), *start]

    def _next(self) -> list[Action]:
        if self._synthesizing is not None or not self._pending:
            return []
        request = self._pending.popleft()
        self._synthesizing = request.id
        return [Synthesize(request)]


def _rejected(rejection: Rejection) -> Notify:
    details: dict[str, object] = {"reason": str(rejection.reason), "detail": rejection.detail}
    if rejection.field is not None:
        details["field"] = rejection.field
    return Notify(rejection.id, Lifecycle.REJECTED, details)
