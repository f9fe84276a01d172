"""ONNX Runtime sessions for Piper graphs: the graph's inputs, session options chosen by
measurement, and the cache of optimized models keyed by the model's digest, the runtime and the
CPU. Allowed imports: stdlib, numpy, onnxruntime.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import re
import tempfile
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

_LOGGER = logging.getLogger(__name__)

PROVIDERS: Final = ["CPUExecutionProvider"]
PHONEMES_INPUT: Final = "input"
"""The graph's input of phoneme ids, int64 [1, N]."""
SPEAKER_INPUT: Final = "sid"
"""The graph's speaker input of a multi-speaker voice, int64 [1]."""
PER_UTTERANCE: Final = frozenset({SPEAKER_INPUT})
"""Graph inputs the flow and decoder may take besides frames: the speaker (multi-speaker)."""
_SHA256: Final = re.compile(r"[0-9a-f]{64}")

Feed = dict[str, npt.NDArray[Any]]
Scales = tuple[float, float, float]
"""Piper's synthesis scales: noise, length (phoneme duration factor), noise width."""


def graph_feed(ids: list[int], scales: Scales, speaker: npt.NDArray[Any] | None) -> Feed:
    """The inputs of a Piper graph for one run over phoneme ids."""
    feed: Feed = {
        PHONEMES_INPUT: np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }
    if speaker is not None:
        feed[SPEAKER_INPUT] = speaker
    return feed


def takes(session: ort.InferenceSession, name: str) -> bool:
    """Whether the session has an input of this name."""
    return any(i.name == name for i in session.get_inputs())


def session_options(
    threads: int, level: ort.GraphOptimizationLevel, part: bool = False
) -> ort.SessionOptions:
    """Options of one session: `threads` intra-op threads, sequential, at this optimization
    level; `part` for the parts of a split voice, which run one after another."""
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
            write_atomic(memo, digest.encode("ascii"))
    return digest


def write_atomic(path: Path, data: bytes) -> None:
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


def cache_stem(cache_dir: Path, digest: str) -> Path:
    """Where a model's optimized copies go: named by digest, runtime, architecture and CPU."""
    machine = f"{platform.machine()}-{_cpu_id()}"
    return cache_dir / "models" / f"{digest}-ort{ort.__version__}-{machine}"


def whole_session(
    model_path: Path, digest: str, threads: int, cache_dir: Path | None
) -> ort.InferenceSession:
    """A session over the whole model, via a cached fully optimized copy when a cache is given.

    Measured on the joe voice (docs/measurements.md): optimizing at load costs 0.4-1 s; loading
    the saved ENABLE_ALL copy with no further optimization ~0.14 s, at the same speed. That copy
    holds layouts for this CPU (ONNX Runtime warns so), hence the CPU fingerprint in its name:
    moved to another CPU, the cache simply does not match and a new copy is made.
    """
    if cache_dir is None:
        return optimized_session(str(model_path), None, threads)
    cached = Path(f"{cache_stem(cache_dir, digest)}.onnx")
    session = cached_session(cached, threads)
    return session or optimized_session(str(model_path), cached, threads)


def cached_session(cached: Path, threads: int, part: bool = False) -> ort.InferenceSession | None:
    """A saved optimized copy, loaded with no further optimization; None if absent or damaged
    (a damaged copy is removed, so it is built again)."""
    if not cached.is_file():
        return None
    load_options = session_options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, part)
    try:
        return ort.InferenceSession(str(cached), load_options, providers=PROVIDERS)
    except Exception:  # noqa: BLE001 - any load failure means a damaged copy: rebuild it
        _LOGGER.warning("Optimized model %s is damaged; rebuilding it", cached)
        cached.unlink(missing_ok=True)
        return None


def optimized_session(
    model: str | bytes, cached: Path | None, threads: int, part: bool = False
) -> ort.InferenceSession:
    """Optimize a model fully (ENABLE_ALL); with `cached`, save that copy and load it back."""
    if cached is None:
        options = session_options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL, part)
        return ort.InferenceSession(model, options, providers=PROVIDERS)
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".partial.onnx")
    os.close(fd)
    try:
        save_options = session_options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        save_options.optimized_model_filepath = tmp
        ort.InferenceSession(model, save_options, providers=PROVIDERS)
        os.replace(tmp, cached)
        _LOGGER.info("Saved optimized model %s", cached)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    load_options = session_options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, part)
    return ort.InferenceSession(str(cached), load_options, providers=PROVIDERS)
