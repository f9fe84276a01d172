"""The synthesis worker: one thread that turns requests into audio chunks for the player.

Per sentence it looks in the phrase cache first (a hit plays without touching the ONNX
session); on a miss it synthesizes the sentence in clause groups, small first, streaming each
group to the player as soon as it is ready, then caches the whole sentence. Between requests it
renders the configured phrases into the cache; requests always go first. The player's bounded
buffer throttles it. Allowed imports: stdlib, numpy, `chunking`, `messages`, `phrase_cache`,
`player`, `text`, `voice`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Final

import numpy as np

from .chunking import group_clauses
from .messages import Event, Reason, SpeakRequest, SynthesisDone
from .phrase_cache import PCM16, PhraseCache, cache_key
from .player import Chunk
from .text import clean_text
from .voice import Clause, SynthesisParams, Voice, to_pcm16

_LOGGER = logging.getLogger(__name__)
_POLL_SECONDS: Final = 0.2


@dataclass(frozen=True, slots=True)
class VoiceChoice:
    """A loaded voice under its id, with the synthesis parameters it uses by default."""

    id: str
    voice: Voice
    params: SynthesisParams


class Synthesizer:
    """Synthesizes one request at a time into the player's buffer; renders phrases when idle."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        voices: Mapping[str, VoiceChoice],
        cache: PhraseCache,
        first_chunk_phonemes: int,
        put: Callable[[Chunk], bool],
        report: Callable[[Event], None],
        phrases: Sequence[str] = (),
    ) -> None:
        self._voices = voices
        self._cache = cache
        self._first_chunk = first_chunk_phonemes
        self._put = put
        self._report = report
        self._phrases = deque(phrases)
        self._phrase_counts = {"total": len(phrases), "rendered": 0, "cached": 0}
        self._jobs: queue.Queue[SpeakRequest] = queue.Queue(maxsize=1)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="synthesis", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        if self._phrases:
            _LOGGER.info("Phrase cache: rendering %d phrases in the background", len(self._phrases))
        self._thread.start()

    def submit(self, request: SpeakRequest) -> None:
        """Hand over a request; the core only does so when the worker is free."""
        self._jobs.put_nowait(request)

    def stop(self) -> None:
        """Stop after the current chunk."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run_blocking(self) -> None:
        started = time.monotonic()
        while not self._stopping.is_set():
            try:
                if self._phrases:
                    request = self._jobs.get_nowait()
                else:
                    request = self._jobs.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._phrases:
                    self._render_phrase_blocking(self._phrases.popleft(), started)
                continue
            self._speak_blocking(request)
            self._report(SynthesisDone(request.id))

    # ---- requests ---------------------------------------------------------------------------

    def _speak_blocking(self, request: SpeakRequest) -> None:
        choice = self._voices[request.voice]
        params = replace(choice.params, length_scale=choice.params.length_scale / request.rate)
        budget = self._first_chunk
        cached = 0
        try:
            sentences = choice.voice.sentences(request.text)
            for sentence in sentences:
                key = self._key(choice, params, sentence)
                pcm = self._cache.get(key, choice.voice.sample_rate)
                if pcm is not None:
                    cached += 1
                    budget *= 2
                    if not self._emit(request, pcm):
                        return
                    continue
                parts: list[PCM16] = []
                groups = group_clauses([len(clause) for clause in sentence], budget)
                for group in groups:
                    ids = choice.voice.ids(sentence[group.start : group.stop])
                    parts.append(to_pcm16(choice.voice.ids_to_audio(ids, params)))
                    if self._stopping.is_set() or not self._emit(request, parts[-1]):
                        return
                budget *= 2 ** len(groups)
                self._cache.put(key, np.concatenate(parts), choice.voice.sample_rate)
        except Exception as err:
            _LOGGER.exception("Synthesis of %s failed", request.id)
            self._put(Chunk(request.id, end=True, error=Reason.SYNTHESIS_ERROR, detail=str(err)))
            return
        if not sentences:
            self._put(Chunk(request.id, end=True, error=Reason.NO_SPEECH, detail="no phonemes"))
        else:
            info = {"sentences": len(sentences), "cached_sentences": cached}
            self._put(Chunk(request.id, end=True, info=info))

    def _emit(self, request: SpeakRequest, pcm: PCM16) -> bool:
        if request.volume != 1.0:
            pcm = np.round(pcm.astype(np.float32) * request.volume).astype(np.int16)
        return self._put(Chunk(request.id, pcm))

    @staticmethod
    def _key(choice: VoiceChoice, params: SynthesisParams, sentence: list[Clause]) -> str:
        return cache_key(
            choice.voice.sha256, choice.id, astuple(params), choice.voice.ids(sentence)
        )

    # ---- phrases ----------------------------------------------------------------------------

    def _render_phrase_blocking(self, phrase: str, started: float) -> None:
        """Render one configured phrase with the default voice, whole sentences at a time."""
        choice = self._voices["default"]
        try:
            for sentence in choice.voice.sentences(clean_text(phrase)):
                key = self._key(choice, choice.params, sentence)
                if self._cache.contains(key):
                    self._phrase_counts["cached"] += 1
                    continue
                audio = choice.voice.ids_to_audio(choice.voice.ids(sentence), choice.params)
                self._cache.put(key, to_pcm16(audio), choice.voice.sample_rate)
                self._phrase_counts["rendered"] += 1
        except Exception:
            _LOGGER.exception("Rendering the phrase %r failed", phrase[:80])
        done = self._phrase_counts["total"] - len(self._phrases)
        _LOGGER.info("Phrase cache: %d/%d phrases ready", done, self._phrase_counts["total"])
        if not self._phrases:
            _LOGGER.info(
                "Phrase cache ready: %d sentences rendered, %d already cached, in %.1f s",
                self._phrase_counts["rendered"],
                self._phrase_counts["cached"],
                time.monotonic() - started,
            )
