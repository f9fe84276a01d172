"""What the engine owes its sounder (part of the engine's composition root, run by the app
loop): the alarm-class requests of its other edges handed over, the acks of the alarms the
sounder holds left to it, the alarm lane's words said when asked (their sounds made ready
first), the chime files decoded here sent there, and the voice's readiness told.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Mapping, Sequence

from agent.core.catalog import VoiceFacts
from agent.core.intake import RecentIds
from agent.core.messages import (
    AckRequested,
    Event,
    Lifecycle,
    Notify,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
)
from agent.formats.text import clean_text
from agent.protocol.lanes import is_alarm
from agent.speaker_link import SpeakerLink
from agent.speech.media_source import MediaSource
from agent.speech.synthesizer import Synthesizer, VoiceChoice

_LOGGER = logging.getLogger(__name__)


class SounderDuty:
    """The engine's side of the alarm lane."""

    def __init__(
        self,
        speaker: SpeakerLink,
        words: Synthesizer,
        media: MediaSource,
        remembered_ids: int,
        phrases: Sequence[str],
    ) -> None:
        self._speaker = speaker
        self._words = words
        self._media = media
        self._alarm_ids = RecentIds(remembered_ids)
        """Ids the sounder's alarm lane accepted: their acks are its."""
        self._phrases = [clean_text(p) for p in phrases if p]
        self._stop: Callable[[], None] = lambda: None
        """Stops the engine (the loop's `request_stop`, once `serve` runs)."""

    def serve(self, chime_files: Mapping[str, bytes], stop: Callable[[], None]) -> None:
        """Say hello once the words can be said; the engine stops when the sounder is gone."""
        self._stop = stop
        self._words.start()
        self._speaker.hello(self)
        for name, pcm in chime_files.items():
            self._speaker.chime(name, pcm)

    def stop(self) -> None:
        self._words.stop()

    def takes(self, event: Event) -> bool:
        """Whether this event is the alarm lane's: an alarm-class request (handed over now),
        or the ack of an alarm it holds. The caller acknowledges its delivery."""
        if isinstance(event, SpeakReceived) and is_alarm(event.request.priority):
            self._speaker.hand_over(event.request)
            return True
        if isinstance(event, StopRequested):  # the engine's lane stops too: not taken
            self._speaker.stop(event.clear, event.current)
            return False
        if isinstance(event, AckRequested) and event.id in self._alarm_ids:
            self._speaker.acknowledge(event.id)
            return True
        return False

    def notified(self, notify: Notify) -> None:
        """An event of the alarm lane: its ids are remembered (their acks are the sounder's)."""
        if notify.event == Lifecycle.ACCEPTED:
            self._alarm_ids.add(notify.id)

    def ready(self, voices: Mapping[str, VoiceFacts], model: str) -> None:
        """The voice is ready (or switched): the voices' facts, the model, the phrases to keep."""
        self._speaker.ready(voices, model, self._phrases)

    def use_voice(self, choice: VoiceChoice) -> None:
        self._words.use_voice(choice)

    def sounder_gone(self) -> None:
        """On the pipe's thread: the sounder is gone; the engine stops."""
        self._stop()

    def cancel_words(self, job: int) -> None:
        """On the pipe's thread: the words of `job` are no longer wanted."""
        self._words.cancel(job)

    def say_words(self, job: int, request: SpeakRequest) -> None:
        """On the pipe's thread: an alarm's words (its sounds made ready first)."""
        if request.has_media:
            self._media.prepare(request)
        try:
            self._words.submit(request, job)
        except queue.Full:
            _LOGGER.warning("Words for %s refused: the words' synthesizer is busy", request.id)
