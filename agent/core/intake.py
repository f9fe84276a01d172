"""Arrivals: a request taken into the waiting queue or refused (its voice decided, the checks of
`admission`, a duplicate id, a dedupe key, MQTT 5's expiry, a timed start), the voice selected for
requests that name none, and what a restart brings back from the journal. Pure.

The rules (the scheduler's docstring has them all): only accepted ids are remembered, and a
redelivery of one (or of a delivery's fingerprint) is acknowledged and nothing more; a dedupe
key's newcomer takes the place of the one that waits and never lowers its class; the media of an
accepted request is handed on (`Prepare`), the core keeps its size only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import replace

from agent.core.admission import Admission, Timing
from agent.core.catalog import Catalog
from agent.core.handed import HandedMedia
from agent.core.messages import (
    FALLBACK_CACHED,
    FALLBACK_CHIME,
    Action,
    AudioClip,
    Delivery,
    Lifecycle,
    Prepare,
    Priority,
    Record,
    Rejection,
    Remember,
    SetVolume,
    SpeakRequest,
    Unfinished,
)
from agent.core.reasons import Reason
from agent.core.waiting import Item, WaitingQueue, notify, rejected


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


class Intake:
    """The arrival side of the core: the catalog and timing checks, the ids and delivery
    fingerprints taken, the selected voice."""

    def __init__(
        self,
        queue: WaitingQueue,
        handed: HandedMedia,
        catalog: Catalog,
        timing: Timing,
        remembered_ids: int,
    ) -> None:
        self._queue = queue
        self._handed = handed
        self._timing = timing
        self.catalog = catalog
        self._admission = Admission(catalog, timing)
        self._seen = RecentIds(remembered_ids)
        self._fingerprints = RecentIds(remembered_ids)
        self.selected_voice = "default"
        """The voice of requests that name none (`id` or `id#speaker`)."""

    def use_catalog(self, catalog: Catalog) -> None:
        """Check later arrivals against this catalog (the voices became known)."""
        self.catalog = catalog
        self._admission = Admission(catalog, self._timing)

    def resent(self, request: SpeakRequest, delivery: Delivery) -> bool:
        """The broker resent what was already taken (its id, or its delivery's fingerprint)."""
        return delivery.redelivered and (
            request.id in self._seen or delivery.fingerprint in self._fingerprints
        )

    def admit(
        self, request: SpeakRequest, delivery: Delivery, now: float, wall: float = 0.0
    ) -> tuple[list[Action], Item | None]:
        """The actions of an arrival at `now` (`wall`: the wall-clock time of it, for `at`),
        and the item queued when it may cut in at once (None: refused, or timed for later)."""
        chosen = self._admission.voice_of(request, self.selected_voice)
        if isinstance(chosen, Rejection):
            return [rejected(chosen)], None
        request = chosen
        refusal = self._duplicate(request) or self._admission.refusal(request, wall)
        if refusal is not None:
            return [rejected(refusal)], None
        if delivery.expiry is not None and (request.ttl is None or delivery.expiry < request.ttl):
            request = replace(request, ttl=max(delivery.expiry, 0.001))  # MQTT 5 expiry
        replaced = self._queue.with_key(request.dedupe_key)
        if replaced is not None and replaced.request.priority > request.priority:
            request = replace(request, priority=replaced.request.priority)  # never lowered
        seq = self._queue.ticket()
        deadline = None if request.ttl is None else now + request.ttl
        arrived = request
        if request.audio is not None:  # its bytes go to the edges (Prepare); the size stays
            request = replace(request, audio=AudioClip(b""))
        item = Item(request, seq, deadline, held=arrived.media_bytes)
        if request.at is not None:  # made ready `prepare` before its start: not before
            item.not_before = now + (request.at - wall) - self._timing.prepare
        actions: list[Action] = []
        if replaced is not None:
            self._queue.remove(replaced)
            item.seq = replaced.seq  # the newcomer takes its place in the queue
            actions.append(notify(replaced, Lifecycle.COALESCED, into=request.id))
        actions += self._queue.add_bounded(item)
        if item not in self._queue:  # the newcomer was the lowest, oldest: refused
            return actions, None
        self._seen.add(request.id)  # only accepted ids are remembered
        if delivery.fingerprint:
            self._fingerprints.add(delivery.fingerprint)
        actions.append(Record(arrived, delivery.fingerprint))
        if arrived.has_media:
            self._handed.hand(request.id)
            actions.append(Prepare(arrived))
        details: dict[str, object] = {"queue_depth": len(self._queue)}
        if request.unknown_fields:
            details["unknown_fields"] = list(request.unknown_fields)
        actions.insert(0, notify(item, Lifecycle.ACCEPTED, **details))
        if item.not_before > now:  # a timed one cuts in when it falls due
            return actions, None
        return actions, item

    def _duplicate(self, request: SpeakRequest) -> Rejection | None:
        if request.id not in self._seen:
            return None
        detail = "this id was already accepted"
        return Rejection(request.id, Reason.DUPLICATE_ID, detail, None, request.priority)

    def select_voice(self, voice: str) -> list[Action]:
        """Select a voice (`id`) or a voice's speaker (`id#speaker`) for requests naming none."""
        voice_id, hash_sign, speaker = voice.partition("#")
        facts = self.catalog.voices.get(voice_id)
        if facts is None or (hash_sign and not facts.has_speaker(speaker)):
            known = ", ".join(v if s is None else f"{v}#{s}" for v, s in self.catalog.pairs())
            detail = f"{voice[:64]!r} is none of: {known}"
            return [rejected(Rejection("select-voice", Reason.UNKNOWN_VOICE, detail, "voice"))]
        self.selected_voice = voice
        return [Remember("voice", voice)]

    def restore(
        self,
        pending: list[Unfinished],
        ids: list[str],
        fingerprints: list[str],
        now: float,
        settings: Mapping[str, str],
    ) -> list[Action]:
        """After a restart (see `SpeakCore.restore`): the remembered settings that are still
        valid, the recent ids and fingerprints, and what had not ended queued again."""
        actions: list[Action] = []
        voice = settings.get("voice")
        if isinstance(voice, str) and self._admission.voice_is_known(voice):
            self.selected_voice = voice
        volume = _volume(settings.get("volume"))
        if volume is not None:
            actions.append(SetVolume(volume))
        for request_id in ids:
            self._seen.add(request_id)
        for fingerprint in fingerprints:
            self._fingerprints.add(fingerprint)
        for unfinished in pending:
            actions += self._requeue(unfinished, now)
        return actions

    def _requeue(self, unfinished: Unfinished, now: float) -> list[Action]:
        """One announcement that had not ended, queued again (or ended, after a crash loop)."""
        request = replace(unfinished.request, at=None)  # its moment is gone: as soon as it can
        self._seen.add(request.id)
        ttl_left = unfinished.ttl_left
        item = Item(request, self._queue.ticket(), None if ttl_left is None else now + ttl_left)
        if unfinished.crashed and request.priority < Priority.ALARM:
            loop = _loop(unfinished)
            return [notify(item, Lifecycle.FAILED, reason=str(Reason.CRASH_LOOP), detail=loop)]
        if unfinished.crashed:  # never dropped: said another way, then reported
            reading = (unfinished.crash_step or "phonemize").startswith("phonemize")
            fallback = FALLBACK_CHIME if reading else FALLBACK_CACHED
            item.request = replace(request, fallback=fallback, repeat=1, dedupe_key=None)
            item.crash_loop = _loop(unfinished)
        self._queue.add(item)
        if unfinished.started:
            return [notify(item, Lifecycle.INTERRUPTED, queue_depth=len(self._queue))]
        return []


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
