"""What the core decides, carried out: each action to the part that does it (the journal, the
synthesizer, the player, the media source, the model-switch desk), and each lifecycle event to
its readers (its Hermes reply, the state, the event itself or the flood count, Home Assistant's
event entity, the log). Part of the composition root: it runs on the loop's thread only."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from agent.assembly import Parts
from agent.core.messages import (
    Acknowledge,
    Action,
    Cut,
    LetGo,
    Lifecycle,
    Notify,
    Prepare,
    Record,
    Remember,
    SetVolume,
    SwitchDeclined,
    SwitchVoice,
    Synthesize,
)
from agent.protocol.discovery import result_message
from agent.protocol.payloads import encode_event
from agent.speech.voice import Voice

_LOGGER = logging.getLogger(__name__)


class VoiceSwitch(Protocol):
    """Where a model switch the core decided on is made (`default_voice.DefaultVoice`)."""

    def switch(self, voice: Voice) -> bool:
        """Make `voice` the default one; False when it is refused."""
        ...


class Execution:
    """Carries out actions for the loop; `voice` makes the model switches."""

    def __init__(self, node_id: str, parts: Parts, voice: VoiceSwitch) -> None:
        self._node_id = node_id
        self._topics = parts.topics
        self._ledger = parts.ledger
        self._synthesizer = parts.synthesizer
        self._player = parts.player
        self._media = parts.media
        self._swaps = parts.swaps
        self._hermes = parts.hermes
        self._status = parts.status
        self._flood = parts.flood
        self._link = parts.link
        self._voice = voice
        satellite = parts.wyoming.satellite if parts.wyoming is not None else None
        self._announced = None if satellite is None else satellite.notified
        """The Wyoming announce target, told each event (it sends `played` at the last)."""

    def execute(self, action: Action, now: float, wall: float | None = None) -> None:
        """Carry out one action; `wall` is the time its events carry (default: now)."""
        match action:
            case Record(request, fingerprint):
                if request.audio is None:  # recorded audio (Hermes) is real-time only
                    self._ledger.record(request, fingerprint)
            case Acknowledge(delivery):
                self._ledger.acknowledge(delivery)  # after the journal is synced
            case Notify():
                self._notify(action, now, time.time() if wall is None else wall)
            case Synthesize(request, play, job, start_at):
                self._ledger.activated(request.id)  # crash loops: counted before it begins
                self._ledger.after_sync(lambda: self._synthesizer.submit(request, job, start_at))
                _LOGGER.debug("Synthesizing %s, play %d (job %d)", request.id, play, job)
            case Cut(_, job):
                self._synthesizer.cancel(job)
                self._player.cut(job)
            case Prepare(request):  # made ready while it waits: its sounds, its recording
                self._media.prepare(request)
            case LetGo(request_id):
                self._media.let_go(request_id)
            case SetVolume(volume):
                self._player.volume = volume
            case Remember(name, value):
                self._ledger.remember(name, value)
            case SwitchVoice(token):
                self._swaps.answer(token, self._voice.switch(self._swaps.voice(token)))
            case SwitchDeclined(token):
                self._swaps.answer(token, False)

    def alarm_notified(self, notify: Notify, now: float) -> None:
        """An event of the sounder's alarm lane (published there): its Hermes reply, Wyoming's
        `played`, the state's last event."""
        for topic, reply in self._hermes.notified(notify):
            self.publish(topic, reply)
        if self._announced is not None:
            self._announced(notify)
        self._status.record(notify, now, time.time())

    def notify(self, notify: Notify, now: float) -> None:
        """A lifecycle event of the loop's own (not the core's), in a journal transaction."""
        with self._ledger.transaction():
            self.execute(notify, now)

    def notify_guarded(self, notify: Notify, now: float) -> None:
        """`notify`, logging instead of raising (housekeeping goes on)."""
        try:
            self.notify(notify, now)
        except Exception:
            _LOGGER.exception("Publishing %s failed", notify.event)

    def publish(self, topic: str, payload: bytes, retain: bool = False) -> None:
        self._link.publish(topic, payload, retain=retain)

    def _notify(self, notify: Notify, now: float, at: float) -> None:
        """A lifecycle event: its Hermes reply, the status, the event itself (counted instead in
        a flood), Home Assistant's event entity, the log."""
        request_id, event, details = notify.id, notify.event, notify.details
        for topic, reply in self._hermes.notified(notify):
            self.publish(topic, reply)  # every Hermes request has its answer, flood or not
        if self._announced is not None:
            self._announced(notify)  # and every Wyoming announcement its `played`
        self._status.record(notify, now, at)
        if event == Lifecycle.REJECTED and not self._flood.allow(str(details.get("reason")), now):
            self._ledger.unreported(notify)  # its journal entry ends all the same
            return  # counted: one `suppressed` event per interval says how many
        payload = encode_event(self._node_id, request_id, event, details, at)
        self._ledger.event(notify, payload)
        result = result_message(event, request_id, details)
        if result is not None:  # Home Assistant's event entity
            self.publish(self._topics.result, result)
        _LOGGER.info("%s %s %r", request_id, event, dict(details) or "")
