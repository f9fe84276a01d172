"""The synthesis worker: one thread that turns requests into audio chunks for the player.

Per sentence it looks in the phrase cache first (a hit plays without touching the ONNX
sessions); on a miss it synthesizes the sentence in clause groups, small first. On a voice split
for chunked decoding each group runs through the prior, then its latent frames are decoded in
chunks, small first and growing, each streamed to the player as soon as it is decoded; a voice
that runs whole streams each group whole. The whole sentence is then cached. Between requests it
renders the configured phrases into the cache; requests always go first. The player's bounded
buffer throttles it. A cut aborts the running inference (RunOptions.terminate) and stops the
request between chunks. Allowed imports: stdlib, numpy, `chunking`, `messages`,
`phrase_cache`, `player`, `text`, `voice`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from functools import partial
from typing import Final, TypeVar

import numpy as np
from onnxruntime import RunOptions

from .chimes import ChimePlan, convert_pcm
from .chunking import FIRST_FRAMES, FRAME_GROWTH, MAX_FRAMES, frame_chunks, group_clauses, grow
from .messages import Event, Reason, SpeakRequest, SynthesisDone
from .phrase_cache import PCM16, PhraseCache, cache_key
from .player import Chunk
from .text import clean_text
from .voice import Clause, SynthesisParams, Voice, cancellable_run, to_pcm16

_LOGGER = logging.getLogger(__name__)
_POLL_SECONDS: Final = 0.2
T = TypeVar("T")


class _CancelledError(Exception):
    """The request was cut (or the worker is stopping): synthesize no more of it."""


@dataclass(frozen=True, slots=True)
class VoiceChoice:
    """A loaded voice under its id, with the synthesis parameters it uses by default."""

    id: str
    voice: Voice
    params: SynthesisParams


_PHRASES: Final = -1
"""The job token of phrase rendering: a request arriving aborts it (it is done again later)."""


@dataclass(frozen=True, slots=True)
class _Job:
    request: SpeakRequest
    token: int


class Synthesizer:
    """Synthesizes one request at a time into the player's buffer; renders phrases when idle."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        voices: Mapping[str, VoiceChoice],
        cache: PhraseCache,
        chunk_phonemes: tuple[int, int],
        put: Callable[[Chunk], bool],
        report: Callable[[Event], None],
        phrases: Sequence[str] = (),
        chimes: ChimePlan | None = None,
        chunk_frames: tuple[int, int] = (FIRST_FRAMES, MAX_FRAMES),
    ) -> None:
        self._voices = voices
        self._cache = cache
        self._first_chunk, self._max_chunk = chunk_phonemes
        self._first_frames, self._max_frames = chunk_frames
        self._put = put
        self._report = report
        self._chimes = chimes or ChimePlan({}, {})
        self._configured_phrases = tuple(phrases)
        self._phrases = deque(phrases)
        self._phrase_counts = {"total": len(phrases), "rendered": 0, "cached": 0}
        self._jobs: queue.Queue[_Job] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._run: tuple[int, RunOptions] | None = None
        self._job_seconds = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="synthesis", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        if self._phrases:
            _LOGGER.info("Phrase cache: rendering %d phrases in the background", len(self._phrases))
        self._thread.start()

    def submit(self, request: SpeakRequest, job: int = 0) -> None:
        """Hand over a request (`job`: its activation token); the core only does so when the
        worker is free of requests. Phrase rendering in progress is aborted: requests go first."""
        with self._lock:
            self._cancelled = {token for token in self._cancelled if token >= job}
            if self._run is not None and self._run[0] == _PHRASES:
                self._run[1].terminate = True
        self._jobs.put_nowait(_Job(request, job))

    def cancel(self, job: int) -> None:
        """Stop synthesizing this activation: abort its running inference, skip the rest."""
        with self._lock:
            self._cancelled.add(job)
            if self._run is not None and self._run[0] == job:
                self._run[1].terminate = True

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
                    job = self._jobs.get_nowait()
                else:
                    job = self._jobs.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._phrases:
                    self._render_phrase_blocking(self._phrases.popleft(), started)
                continue
            self._speak_blocking(job)
            self._report(SynthesisDone(job.request.id, job.token))

    # ---- requests ---------------------------------------------------------------------------

    def _speak_blocking(self, job: _Job) -> None:
        """Put the request's chime and speech into the player's buffer, then its end."""
        request = job.request
        choice = self._voices[request.voice or "default"]
        self._job_seconds = 0.0
        params = replace(choice.params, length_scale=choice.params.length_scale / request.rate)
        end = Chunk(request.id, end=True, priority=request.priority, job=job.token)
        try:
            chime = self._chimes.for_request(request)
            if chime is not None:
                self._emit_or_cancel(job, chime)
            if request.audio is not None:  # recorded audio (Hermes playBytes): no synthesis
                clip = request.audio
                pcm = convert_pcm(clip.frames, clip.channels, clip.rate, choice.voice.sample_rate)
                self._emit_or_cancel(job, pcm)
                self._put(replace(end, info={"audio_clip": True}))
                return
            sentences, cached = self._speech_blocking(job, choice, params)
        except _CancelledError:
            self._put(end)
            return
        except Exception as err:
            _LOGGER.exception("Synthesis of %s failed", request.id)
            self._put(replace(end, error=Reason.SYNTHESIS_ERROR, detail=str(err)))
            return
        if sentences == 0:
            self._put(replace(end, error=Reason.NO_SPEECH, detail="no phonemes"))
        else:
            info: dict[str, object] = {"sentences": sentences, "cached_sentences": cached}
            if self._job_seconds:
                info["synthesis_seconds"] = round(self._job_seconds, 4)
            self._put(replace(end, info=info))

    def _speech_blocking(
        self, job: _Job, choice: VoiceChoice, params: SynthesisParams
    ) -> tuple[int, int]:
        """Stream every sentence (cached, or synthesized in clause groups); (sentences, cached)."""
        voice = choice.voice
        budget, frames = self._first_chunk, self._first_frames
        cached = 0
        sentences = voice.sentences(job.request.text)
        for sentence in sentences:
            key = self._key(choice, params, sentence)
            pcm = self._cache.get(key, voice.sample_rate)
            if pcm is not None:
                cached += 1
                budget = grow(budget, self._max_chunk)
                frames = min(frames * FRAME_GROWTH, self._max_frames)
                self._emit_or_cancel(job, pcm)
                continue
            parts: list[PCM16] = []
            groups = group_clauses([len(clause) for clause in sentence], budget, self._max_chunk)
            for group in groups:
                ids = voice.ids(sentence[group.start : group.stop])
                if voice.chunked:
                    frames = self._decode_blocking(job, voice, ids, params, frames, parts)
                    continue
                audio = self._infer(job.token, partial(voice.ids_to_audio, ids, params))
                parts.append(to_pcm16(audio))
                self._emit_or_cancel(job, parts[-1])
            budget = grow(budget, self._max_chunk, len(groups))
            self._cache.put(key, np.concatenate(parts), voice.sample_rate)
        return len(sentences), cached

    def _decode_blocking(  # noqa: PLR0917 - one clause group's state, passed through
        self,
        job: _Job,
        voice: Voice,
        ids: list[int],
        params: SynthesisParams,
        budget: int,
        parts: list[PCM16],
    ) -> int:
        """Run one clause group through the prior, then decode and stream its frames chunk by
        chunk (each added to `parts`); returns the frame budget of the next group."""
        latent = self._infer(job.token, partial(voice.encode, ids, params))
        chunks, budget = frame_chunks(latent.frames, budget, self._max_frames)
        for frames in chunks:
            audio = self._infer(job.token, partial(voice.decode, latent, frames))
            parts.append(to_pcm16(audio))
            self._emit_or_cancel(job, parts[-1])
        return budget

    def _infer(self, token: int, run: Callable[[RunOptions], T]) -> T:
        """One inference that `cancel(token)` (or, for phrases, `submit`) can abort."""
        options = cancellable_run()
        with self._lock:
            if token in self._cancelled:
                raise _CancelledError
            self._run = (token, options)
        began = time.perf_counter()
        try:
            return run(options)
        except Exception:
            if options.terminate:
                raise _CancelledError from None
            raise
        finally:
            self._job_seconds += time.perf_counter() - began
            with self._lock:
                self._run = None

    def _emit_or_cancel(self, job: _Job, pcm: PCM16) -> None:
        with self._lock:
            cancelled = job.token in self._cancelled
        request = job.request
        chunk = Chunk(
            request.id, pcm, volume=request.volume, priority=request.priority, job=job.token
        )
        if cancelled or self._stopping.is_set() or not self._put(chunk):
            raise _CancelledError

    @staticmethod
    def _key(choice: VoiceChoice, params: SynthesisParams, sentence: list[Clause]) -> str:
        return cache_key(
            choice.voice.sha256, choice.id, astuple(params), choice.voice.ids(sentence)
        )

    # ---- phrases ----------------------------------------------------------------------------

    def render_phrases_again(self) -> None:
        """After a model switch: the configured phrases are rendered for the new model (its
        digest is part of every cache key, so the old entries are simply not found)."""
        self._phrases = deque(self._configured_phrases)

    def _render_blocking(self, voice: Voice, ids: list[int], params: SynthesisParams) -> PCM16:
        """A whole sentence for the cache; on a split voice decoded in chunks of the largest
        size (bounded memory; within one PCM step of whole decoding)."""
        if not voice.chunked:
            return to_pcm16(self._infer(_PHRASES, partial(voice.ids_to_audio, ids, params)))
        latent = self._infer(_PHRASES, partial(voice.encode, ids, params))
        chunks, _ = frame_chunks(latent.frames, self._max_frames, self._max_frames)
        return np.concatenate(
            [to_pcm16(self._infer(_PHRASES, partial(voice.decode, latent, c))) for c in chunks]
        )

    def _render_phrase_blocking(self, phrase: str, started: float) -> None:
        """Render one configured phrase with the default voice, whole sentences at a time."""
        choice = self._voices["default"]
        rate = choice.voice.sample_rate
        try:
            for sentence in choice.voice.sentences(clean_text(phrase)):
                key = self._key(choice, choice.params, sentence)
                if self._cache.get(key, rate, count=False) is not None:  # checked, not trusted
                    self._phrase_counts["cached"] += 1
                    continue
                pcm = self._render_blocking(choice.voice, choice.voice.ids(sentence), choice.params)
                self._cache.put(key, pcm, rate)
                self._phrase_counts["rendered"] += 1
        except _CancelledError:
            self._phrases.appendleft(phrase)  # a request came first: render it again later
            return
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
