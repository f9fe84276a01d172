"""The synthesis worker: one thread that turns requests into audio chunks for the player.

Per sentence it looks in the phrase cache first (a hit plays without touching the ONNX
sessions); on a miss it synthesizes the sentence in clause groups, small first, each streamed
(`Voice.stream`: on a split voice a group's latent frames are decoded in chunks, small first and
growing, each handed to the player as soon as it is decoded). The whole sentence is then cached.
Between requests it renders the configured phrases into the cache; requests always go first.
The player's bounded buffer throttles it. A cut aborts the running inference and stops the
request between chunks. Its commands (a request, a new default voice) come through one bounded
queue, in order. It never decodes a sound file or downloads one: the media source makes them
ready from their request's arrival, and this thread only waits for them, a cut ending the wait
at once (so it is free for the request that cut in). Each piece of a request's work its content
could make fatal in this process (reading its text, an inference) runs inside a step of the
step marker (`Steps`: the crash-loop breaker); a decode runs in the decoder child, whose death
is a refused sound, not the agent's. An alarm the agent died on is said another way
(`SpeakRequest.fallback`). Two synthesizers can share an urgent gate (`urgent.UrgentGate`): the
main one holds it through each alarm or critical request, and the Wyoming render worker waits
before each of its inferences while it is held (a cached sentence does not wait).

Its parts: the plan of a request (`speech_plan.SpeechPlanner`: text read, phonemized, bounded,
estimated; sounds made ready), its inferences as streams it can cut (`inference_runs`), and here
the worker that plays the plan, caches sentences and renders phrases.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import astuple, dataclass, replace
from typing import Final

import numpy as np

from agent.core.messages import FALLBACK_CACHED, Event, SpeakRequest, SynthesisDone
from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.formats.chunk import Chunk
from agent.formats.chunking import FIRST_FRAMES, MAX_FRAMES, group_clauses, grow
from agent.formats.media import Resampler
from agent.formats.pcm import EDGE_SECONDS, PCM16, LeadTrim, TailTrim, le_bytes
from agent.formats.text import clean_text
from agent.speech.chimes import ChimePlan
from agent.speech.inference_runs import PHRASES, InferenceRuns
from agent.speech.media_source import MediaSource
from agent.speech.phrase_cache import PhraseCache, cache_key
from agent.speech.speech_plan import (
    NoSteps,
    PlanStep,
    Play,
    Say,
    SpeechPlanner,
    Steps,
    SynthesisCancelledError,
    TooLongError,
    VoiceChoice,
    step_digest,
)
from agent.speech.urgent import UrgentGate, is_urgent
from agent.speech.voice import Audio, Clause, FramePlan, SynthesisParams, to_pcm16

__all__ = ["CACHED_SECONDS_MAX", "COMMANDS", "CUT_FACTOR", "Synthesizer", "VoiceChoice"]
_LOGGER = logging.getLogger(__name__)
_POLL_SECONDS: Final = 0.2
CUT_FACTOR: Final = 1.25
"""Speech is cut at this many times `speak.max_audio_seconds` should the estimate be short."""
CACHED_SECONDS_MAX: Final = 10.0
"""Sentences longer than this are not kept in the phrase cache: phrases are short, and a long
one would take the room of many (and could push out what an operator configured)."""
COMMANDS: Final = 2
"""Commands that can wait: the core hands over a request only when the worker is free, and a
voice switch only while no request runs, so one of each at most."""


@dataclass(frozen=True, slots=True)
class _Job:
    request: SpeakRequest
    token: int
    start_at: float | None = None
    """The wall-clock instant its first sample should play (a timed request's first play)."""


class Synthesizer:
    """Synthesizes one request at a time into the player's buffer; renders phrases when idle."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        voices: Mapping[str, VoiceChoice],
        cache: PhraseCache,
        chunk_phonemes: tuple[int, int],
        put: Callable[[Chunk], bool],
        report: Callable[[Event], object],
        phrases: Sequence[str] = (),
        chimes: ChimePlan | None = None,
        chunk_frames: tuple[int, int] = (FIRST_FRAMES, MAX_FRAMES),
        max_seconds: float = 120.0,
        media: MediaSource | None = None,
        after_request: Callable[[], object] | None = None,
        steps: Steps | None = None,
        *,
        urgent: UrgentGate | None = None,
        yields_to: UrgentGate | None = None,
    ) -> None:
        """`urgent`: a gate this synthesizer holds while it works on an urgent request (the
        main synthesizer); `yields_to`: a gate it waits on before each inference while it is
        held (the Wyoming render worker). Never the same gate: it would wait on itself."""
        if urgent is not None and urgent is yields_to:
            raise ValueError("a synthesizer cannot yield to the gate it holds")
        self._urgent = urgent
        self._voices = dict(voices)  # this thread's own: a switch arrives as a command
        self._rate = voices["default"].voice.sample_rate
        """The device's rate: the configured default voice's; other voices are resampled."""
        self._media = media
        self._after_request = after_request
        """Called on this thread after each request (the allocator gives memory back)."""
        marker = steps or NoSteps()
        self._runs = InferenceRuns(marker, yields_to)
        self._cache = cache
        self._first_chunk, self._max_chunk = chunk_phonemes
        self._first_frames, self._max_frames = chunk_frames
        self._max_seconds = max_seconds
        self._put = put
        self._report = report
        self._chimes = chimes or ChimePlan({}, {})
        self._configured_phrases = tuple(phrases)
        self._phrases = deque(phrases)
        self._phrase_counts = {"total": len(phrases), "rendered": 0, "cached": 0}
        self._commands: queue.Queue[_Job | VoiceChoice] = queue.Queue(maxsize=COMMANDS)
        self._plan = SpeechPlanner(
            self._voices,
            self._rate,
            max_seconds,
            self._max_chunk,
            media,
            marker,
            self._runs.job_cancel,
        )
        self._thread = threading.Thread(target=self._run_blocking, name="synthesis", daemon=True)

    def start(self) -> None:
        """Start the worker thread."""
        if self._phrases:
            _LOGGER.info("Phrase cache: rendering %d phrases in the background", len(self._phrases))
        self._thread.start()

    def submit(self, request: SpeakRequest, job: int = 0, start_at: float | None = None) -> None:
        """Hand over a request (`job`: its activation token); the core only does so when the
        worker is free of requests. Phrase rendering in progress is aborted: requests go first."""
        self._runs.admit(job)
        self._commands.put_nowait(_Job(request, job, start_at))

    def use_voice(self, choice: VoiceChoice) -> None:
        """Replace a voice (a model update); requests after this one use it, and the configured
        phrases are rendered again for it (its digest is part of every cache key)."""
        self._runs.abort_phrases()
        self._commands.put_nowait(choice)

    def cancel(self, job: int) -> None:
        """Stop synthesizing this activation: abort its running inference, skip the rest."""
        self._runs.cancel(job)
        if self._media is not None:
            self._media.wake()  # a wait for a sound being downloaded or decoded ends now

    def stop(self) -> None:
        """Stop after the current chunk."""
        self._runs.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _run_blocking(self) -> None:
        started = time.monotonic()
        while not self._runs.stopping.is_set():
            try:
                if self._phrases:
                    command = self._commands.get_nowait()
                else:
                    command = self._commands.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                if self._phrases:
                    self._render_phrase_blocking(self._phrases.popleft(), started)
                continue
            if isinstance(command, VoiceChoice):
                self._voices[command.id] = command
                self._phrases = deque(self._configured_phrases)
                continue
            self._speak_blocking(command)
            self._report(SynthesisDone(command.request.id, command.token))
            if self._after_request is not None:
                self._after_request()

    # ---- requests ---------------------------------------------------------------------------

    def _speak_blocking(self, job: _Job) -> None:
        """The request's work, holding the urgent gate throughout when it is urgent: from its
        first step (its text read, its sounds waited for) to its end handed to `put`."""
        if self._urgent is None or not is_urgent(job.request.priority):
            self._request_blocking(job)
            return
        with self._urgent.holding():
            self._request_blocking(job)

    def _request_blocking(self, job: _Job) -> None:
        """Put the request's chime, sounds and speech into the player's buffer, then its end."""
        request = job.request
        self._runs.begin(job.token)
        end = Chunk(request.id, end=True, priority=request.priority, job=job.token)
        try:
            if request.audio is not None:  # recorded audio (Hermes playBytes): no synthesis
                self._clip_blocking(job, end)
                return
            if request.fallback is not None:  # an alarm the agent died on: said another way
                self._fallback_blocking(job, end)
                return
            steps = self._plan.steps(request)  # sounds fetched and decoded before the first sample
            chime = self._chimes.for_request(request)
            if chime is not None:
                self._emit_or_cancel(job, chime)
            sentences, cached = 0, 0
            for step in steps:
                if isinstance(step, Play):
                    self._emit_or_cancel(job, _gained(step.pcm, step.gain))
                else:
                    sentences += len(step.sentences)
                    cached += self._speech_blocking(job, step)
        except SynthesisCancelledError:
            self._put(end)
            return
        except TooLongError as err:
            self._put(replace(end, error=Reason.TOO_LONG, detail=str(err)))
            return
        except Refused as err:
            self._put(replace(end, error=err.reason, detail=err.detail))
            return
        except Exception as err:
            _LOGGER.exception("Synthesis of %s failed", request.id)
            self._put(replace(end, error=Reason.SYNTHESIS_ERROR, detail=str(err)))
            return
        self._put(self._ended(end, steps, sentences, cached))

    def _ended(self, end: Chunk, steps: list[PlanStep], sentences: int, cached: int) -> Chunk:
        """The end of a request that played what it had: a failure if that was nothing."""
        if not sentences and not any(isinstance(s, Play) for s in steps):
            return replace(end, error=Reason.NO_SPEECH, detail="no phonemes")
        info: dict[str, object] = {"sentences": sentences, "cached_sentences": cached}
        if self._runs.seconds:
            info["synthesis_seconds"] = round(self._runs.seconds, 4)
        return replace(end, info=info)

    def _clip_blocking(self, job: _Job, end: Chunk) -> None:
        """Recorded audio (Hermes playBytes), after the request's chime."""
        assert job.request.audio is not None  # noqa: S101 - checked by the caller
        if self._media is None:
            raise Refused(Reason.UNSUPPORTED_AUDIO, "no decoder")
        try:
            sound = self._media.clip(job.request.id, self._runs.job_cancel)  # decoded since arrival
        except Refused:
            if self._runs.job_cancel.is_set():
                raise SynthesisCancelledError from None
            raise
        chime = self._chimes.for_request(job.request)
        if chime is not None:
            self._emit_or_cancel(job, chime)
        self._emit_or_cancel(job, sound)
        self._put(replace(end, info={"audio_clip": True}))

    def _fallback_blocking(self, job: _Job, end: Chunk) -> None:
        """A request the agent died on, said another way: its chime (its class's, else the
        default one), then, for FALLBACK_CACHED, each of its sentences the phrase cache holds;
        nothing is synthesized, no sound decoded, no step marked (what killed the agent is not
        done again)."""
        request = job.request
        chimed = replace(request, chime=request.chime if isinstance(request.chime, str) else True)
        chime = self._chimes.for_request(chimed)
        if chime is not None:
            self._emit_or_cancel(job, chime)
        sentences = cached = 0
        if request.fallback == FALLBACK_CACHED:
            for say in self._plan.steps_to_say(request):
                for sentence in say.sentences:
                    sentences += 1
                    pcm = self._cache.get(self._key(say.choice, say.params, sentence), self._rate)
                    if pcm is not None:
                        cached += 1
                        self._emit_or_cancel(job, _gained(pcm, say.gain))
        info = {"fallback": request.fallback, "sentences": sentences, "cached_sentences": cached}
        self._put(replace(end, info=info))

    def _speech_blocking(self, job: _Job, say: Say) -> int:
        """Stream every sentence (cached, or synthesized in clause groups, resampled to the
        device's rate where the voice has another); how many came from the cache. Cut at
        CUT_FACTOR times the cap, should the estimate have been short; a sentence longer than
        CACHED_SECONDS_MAX is not kept for the cache. Next to a break, the first sentence's
        leading and the last one's trailing near-silence are cut (what is cached is not)."""
        voice, params = say.choice.voice, say.params
        budget = self._first_chunk
        plan = FramePlan(self._first_frames, self._max_frames)
        cached = 0
        rate, played = self._rate, 0
        edge = round(EDGE_SECONDS * rate)
        lead = LeadTrim(edge) if say.trim[0] else None
        tail = TailTrim(edge) if say.trim[1] else None

        def emit(pcm: PCM16, *, last: bool) -> None:
            if lead is not None:
                pcm = lead.feed(pcm)
            if tail is not None and last:
                pcm = tail.feed(pcm)
            if len(pcm):
                self._emit_or_cancel(job, _gained(pcm, say.gain))

        for number, sentence in enumerate(say.sentences, 1):
            last = number == len(say.sentences)
            key = self._key(say.choice, params, sentence)
            pcm = self._cache.get(key, rate)
            if pcm is not None:
                cached += 1
                budget = grow(budget, self._max_chunk)
                plan.next = min(plan.next * plan.growth, plan.largest)
                emit(pcm, last=last)
                played += len(pcm)
                continue
            parts: list[PCM16] | None = []
            resample = None if voice.sample_rate == rate else Resampler(voice.sample_rate, rate)
            groups = group_clauses([len(clause) for clause in sentence], budget, self._max_chunk)
            for index, group in enumerate(groups):
                ids = voice.ids(sentence[group.start : group.stop])
                step = (job.request.id, f"infer {step_digest(key, ids)}")
                chunks = self._runs.streamed(job.token, voice.stream, ids, params, plan, step=step)
                if resample is not None:
                    chunks = _resampled(chunks, resample, last=index == len(groups) - 1)
                for audio in chunks:
                    pcm = to_pcm16(audio)
                    played += len(pcm)
                    if played > CUT_FACTOR * self._max_seconds * rate:
                        raise TooLongError(f"cut at {played / rate:.0f} s of speech")
                    emit(pcm, last=last and index == len(groups) - 1)
                    if parts is not None:
                        parts.append(pcm)
                        if sum(len(p) for p in parts) > CACHED_SECONDS_MAX * rate:
                            parts = None  # too long to be a phrase: not kept
            budget = grow(budget, self._max_chunk, len(groups))
            if parts:
                self._cache.put(key, np.concatenate(parts), rate)
        if tail is not None:
            self._emit_or_cancel(job, _gained(tail.end(), say.gain))
        return cached

    def _emit_or_cancel(self, job: _Job, pcm: PCM16 | bytes) -> None:
        cut = self._runs.is_cut(job.token)
        request = job.request
        chunk = Chunk(
            request.id,
            pcm if isinstance(pcm, bytes) else le_bytes(pcm),  # a chime is bytes already
            volume=request.volume,
            priority=request.priority,
            job=job.token,
            start_at=job.start_at,  # the player waits for it before the first sample only
        )
        if cut or not self._put(chunk):
            raise SynthesisCancelledError

    def _key(self, choice: VoiceChoice, params: SynthesisParams, sentence: list[Clause]) -> str:
        scales = astuple(replace(params, speaker=None))[:3]
        speaker = -1 if params.speaker is None else params.speaker
        rate = () if params.rate == 1.0 else (params.rate,)  # rate 1: the keys of before
        voice_id = (
            choice.id if choice.voice.sample_rate == self._rate else f"{choice.id}@{self._rate}"
        )
        return cache_key(
            choice.voice.sha256, voice_id, (*scales, speaker, *rate), choice.voice.ids(sentence)
        )

    # ---- phrases ----------------------------------------------------------------------------

    def _render_phrase_blocking(self, phrase: str, started: float) -> None:
        """Render one configured phrase with the default voice, whole sentences at a time, each
        decoded in the largest chunks (bounded memory; within one PCM step of whole decoding)."""
        choice = self._voices["default"]
        voice, rate = choice.voice, choice.voice.sample_rate
        try:
            for sentence in voice.sentences(clean_text(phrase)):
                key = self._key(choice, choice.params, sentence)
                if self._cache.get(key, rate, count=False) is not None:  # checked, not trusted
                    self._cache.pin(key)
                    self._phrase_counts["cached"] += 1
                    continue
                audio: list[Audio] = []
                bounded = self._plan.bounded(sentence)
                lengths = [len(clause) for clause in bounded]
                for group in group_clauses(lengths, self._max_chunk, self._max_chunk):
                    ids = voice.ids(bounded[group.start : group.stop])
                    plan = FramePlan.largest_only(self._max_frames)
                    audio += self._runs.streamed(PHRASES, voice.stream, ids, choice.params, plan)
                self._cache.put(key, to_pcm16(np.concatenate(audio)), rate, pinned=True)
                self._phrase_counts["rendered"] += 1
        except SynthesisCancelledError:
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


def _gained(pcm: PCM16, gain: float) -> PCM16:
    """Samples times an SSML `prosody volume` gain (at most 1)."""
    if gain >= 1.0:
        return pcm
    out: PCM16 = np.round(pcm.astype(np.float32) * np.float32(gain)).astype(np.int16)
    return out


def _resampled(chunks: Iterator[Audio], resample: Resampler, *, last: bool) -> Iterator[Audio]:
    """A voice's chunks at the device's rate; the filter's tail after the sentence's last."""
    for audio in chunks:
        out = resample(audio)
        if len(out):
            yield out
    if last:
        tail = resample.flush()
        if len(tail):
            yield tail
