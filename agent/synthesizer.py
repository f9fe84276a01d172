"""The synthesis worker: one thread that turns requests into audio chunks for the player.

It runs inference off the MQTT thread and off the app loop; the player's bounded buffer
throttles it. Allowed imports: stdlib, `messages`, `player`, `voice`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Final

from .messages import Event, Reason, SpeakRequest, SynthesisDone
from .player import Chunk
from .voice import Voice

_LOGGER = logging.getLogger(__name__)
_POLL_SECONDS: Final = 0.2


class Synthesizer:
    """Synthesizes one request at a time, sentence by sentence, into the player's buffer."""

    def __init__(
        self, voice: Voice, put: Callable[[Chunk], bool], report: Callable[[Event], None]
    ) -> None:
        self._voice = voice
        self._put = put
        self._report = report
        self._jobs: queue.Queue[SpeakRequest] = queue.Queue(maxsize=1)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="synthesis", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, request: SpeakRequest) -> None:
        """Hand over a request; the core only does so when the worker is free."""
        self._jobs.put_nowait(request)

    def stop(self) -> None:
        """Stop after the current sentence."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run_blocking(self) -> None:
        while not self._stopping.is_set():
            try:
                request = self._jobs.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                continue
            self._synthesize_blocking(request)
            self._report(SynthesisDone(request.id))

    def _synthesize_blocking(self, request: SpeakRequest) -> None:
        sentences = 0
        try:
            for pcm in self._voice.synthesize(request.text):
                if self._stopping.is_set() or not self._put(Chunk(request.id, pcm)):
                    return
                sentences += 1
        except Exception as err:
            _LOGGER.exception("Synthesis of %s failed", request.id)
            self._put(Chunk(request.id, end=True, error=Reason.SYNTHESIS_ERROR, detail=str(err)))
            return
        if sentences == 0:
            self._put(Chunk(request.id, end=True, error=Reason.NO_SPEECH, detail="no phonemes"))
        else:
            self._put(Chunk(request.id, end=True))
