"""What a request plays after its chime, planned before its first sample: its text read and
phonemized into bounded clauses in its voices, its pauses as silence, its sounds as samples (made
ready by the media source), with its length estimated from its phonemes and refused beyond the
cap before a sound past it is decoded. The synthesis worker (`synthesizer.Synthesizer`) plays the
plan; this module does no inference.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from array import array
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Final, Protocol

import numpy as np

from agent.core.messages import SpeakRequest, is_url
from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.core.segments import Pause, Segment, Sound
from agent.formats.chunking import split_clause
from agent.formats.pcm import EDGE_SECONDS, PCM16
from agent.formats.program import program
from agent.speech.media_source import MediaSource
from agent.speech.voice import Clause, SynthesisParams, TooManyPhonemesError, Voice

_LOGGER = logging.getLogger(__name__)
SECONDS_PER_PHONEME: Final = 0.045
"""Speech per phoneme at length scale 1 (measured on en_US-joe-medium: 0.044-0.053 s over
English, CJK and nonsense text), to estimate a request's length before synthesizing it."""


@dataclass(frozen=True, slots=True)
class VoiceChoice:
    """A loaded voice under its id, with the synthesis parameters it uses by default."""

    id: str
    voice: Voice
    params: SynthesisParams


class Steps(Protocol):
    """The step marker (`step_marker.StepMarker`): marks a piece of a request's work."""

    def step(self, request_id: str, step: str) -> AbstractContextManager[None]:
        """Mark the work inside as `step` of request `request_id`."""


class NoSteps:
    """No step marker: nothing is marked."""

    def step(self, request_id: str, step: str) -> AbstractContextManager[None]:
        """Nothing to mark."""
        return contextlib.nullcontext()


class SynthesisCancelledError(Exception):
    """The request was cut (or the worker is stopping): synthesize no more of it."""


class TooLongError(Exception):
    """The request's speech would last longer than allowed (the message says how long)."""


@dataclass(frozen=True, slots=True)
class Say:
    """Speech in one voice: its sentences, parameters and gain."""

    choice: VoiceChoice
    params: SynthesisParams
    sentences: list[list[Clause]]
    gain: float = 1.0
    trim: tuple[bool, bool] = (False, False)
    """Whether a break stands just before it and just after it: the voice's own near-silence
    there is cut to `EDGE_SECONDS` (`pcm.LeadTrim`, `pcm.TailTrim`)."""


@dataclass(frozen=True, slots=True)
class Play:
    """Samples at the device's rate: a sound, or silence."""

    pcm: PCM16
    gain: float = 1.0
    pause: bool = False
    """Silence of a break (shortened by the edges the trimmed speech beside it keeps)."""


PlanStep = Say | Play


class SpeechPlanner:
    """Reads requests into steps (`Say`, `Play`) within the speech cap, every clause bounded."""

    def __init__(  # noqa: PLR0917 - the synthesizer hands over its collaborators
        self,
        voices: Mapping[str, VoiceChoice],
        rate: int,
        max_seconds: float,
        max_chunk: int,
        media: MediaSource | None,
        marker: Steps,
        job_cancel: threading.Event,
    ) -> None:
        """`voices`: the synthesizer's own (switched in place, read here at each request);
        `job_cancel`: set when the request being planned is cut (ends a wait for a sound)."""
        self._voices = voices
        self._rate = rate
        self._max_seconds = max_seconds
        self._max_chunk = max_chunk
        self._media = media
        self._marker = marker
        self._job_cancel = job_cancel

    def steps(self, request: SpeakRequest) -> list[PlanStep]:
        """What the request plays after its chime: speech planned (refused before a sound when
        its speech is estimated beyond the cap), pauses, and its sounds as samples."""
        choice = self._voices[request.voice or "default"]
        lang = choice.voice.info.language or "en"
        segments = program(request, choice.id, lang)  # parsed on arrival; said in `lang`
        steps: list[PlanStep] = []
        estimate = 0.0
        for segment in segments:  # the cap checked as it grows: no sound past it is decoded
            planned = self._planned(segment, request)
            estimate += sum(self._seconds(step) for step in planned)
            if estimate > self._max_seconds:
                detail = f"~{estimate:.0f} s of speech, at most {self._max_seconds:g} s"
                raise TooLongError(detail)
            steps += planned
        return self._fitted(steps)

    def steps_to_say(self, request: SpeakRequest) -> list[Say]:
        """A request's speech, read into sentences (no sound is fetched or decoded)."""
        choice = self._voices[request.voice or "default"]
        segments = program(request, choice.id, choice.voice.info.language or "en")
        says: list[Say] = []
        for segment in segments:
            if not isinstance(segment, Pause | Sound):
                with contextlib.suppress(Refused):
                    says += [s for s in self._planned(segment, request) if isinstance(s, Say)]
        return says

    def bounded(self, sentence: list[Clause]) -> list[Clause]:
        """The sentence with every clause at most `max_chunk_phonemes` long (one inference
        never runs over more)."""
        return [piece for clause in sentence for piece in split_clause(clause, self._max_chunk)]

    def _fitted(self, steps: list[PlanStep]) -> list[PlanStep]:
        """Each pause less the edge that the trimmed speech on either side keeps, so the
        silence from the last loud sample before it to the first after it is the pause (at
        least the edges: a break of no time leaves twice EDGE_SECONDS)."""
        edge = round(EDGE_SECONDS * self._rate)
        out: list[PlanStep] = []
        for index, step in enumerate(steps):
            if not (isinstance(step, Play) and step.pause):
                out.append(step)
                continue
            before = steps[index - 1] if index else None
            after = steps[index + 1] if index + 1 < len(steps) else None
            edges = (isinstance(before, Say) and before.trim[1]) + (
                isinstance(after, Say) and after.trim[0]
            )
            out.append(replace(step, pcm=step.pcm[: max(0, len(step.pcm) - edges * edge)]))
        return out

    def _seconds(self, step: PlanStep) -> float:
        """How long a step plays (speech estimated from its phonemes)."""
        if isinstance(step, Play):
            return len(step.pcm) / self._rate
        return sum(
            len(clause) * SECONDS_PER_PHONEME * step.params.length_scale / step.params.rate
            for sentence in step.sentences
            for clause in sentence
        )

    def _planned(self, segment: Segment, request: SpeakRequest) -> list[PlanStep]:
        """One segment as steps: speech in its voice (every clause bounded), silence, or a
        sound (what stands in for it, if it is missing and has a stand-in)."""
        if isinstance(segment, Pause):
            silence = np.zeros(round(segment.seconds * self._rate), dtype=np.int16)
            return [Play(silence, pause=True)]
        if isinstance(segment, Sound):
            try:
                if segment.names_only and is_url(segment.name):
                    detail = "SSML <audio src> takes a name of audio.media, not a URL"
                    raise Refused(Reason.UNKNOWN_SOUND, detail)
                return [Play(self._sound(segment.name, request), segment.volume)]
            except Refused:
                if not segment.fallback:
                    raise
                _LOGGER.info("Sound %r missing: its SSML content is said instead", segment.name)
                return [step for part in segment.fallback for step in self._planned(part, request)]
        choice = self._voices.get(segment.voice or request.voice or "default")
        if choice is None:
            raise Refused(Reason.UNKNOWN_VOICE, f"no voice {segment.voice!r}")
        params = choice.voice.at_rate(choice.params, request.rate * segment.rate)
        if segment.speaker is not None:
            try:
                params = replace(params, speaker=choice.voice.speaker_id(segment.speaker))
            except ValueError as err:
                raise Refused(Reason.UNKNOWN_SPEAKER, str(err)) from None
        most = self._max_seconds * params.rate / (SECONDS_PER_PHONEME * params.length_scale)
        with self._step(request, "phonemize", segment.text):
            try:  # stopped at the cap: the rest of a long text is never phonemized
                said = choice.voice.sentences(segment.text, int(most))
            except TooManyPhonemesError:
                detail = f"over {self._max_seconds:g} s of speech, phonemized no further"
                raise TooLongError(detail) from None
            sentences = [self.bounded(s) for s in said]
        trim = (segment.break_before, segment.break_after)
        return [Say(choice, params, sentences, segment.volume, trim)]

    def _sound(self, name: str, request: SpeakRequest) -> PCM16:
        if self._media is None:
            raise Refused(Reason.UNKNOWN_SOUND, "no sounds configured")
        try:
            return self._media.get(request.id, request.priority, name, self._job_cancel)
        except Refused:
            if self._job_cancel.is_set():
                raise SynthesisCancelledError from None
            raise

    def _step(self, request: SpeakRequest, kind: str, subject: str) -> AbstractContextManager[None]:
        """A step of the step marker for this request's work on `subject` (none for a request
        said another way)."""
        if request.fallback is not None:
            return contextlib.nullcontext()
        return self._marker.step(request.id, f"{kind} {step_digest(subject)}")


def step_digest(text: str, ids: Sequence[int] = ()) -> str:
    """A short name of what a step works on (the same content, the same name at every try):
    a few microseconds for a clause group's ids."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass"))
    digest.update(array("q", ids).tobytes())
    return digest.hexdigest()[:16]
