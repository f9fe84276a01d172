"""ONNX Runtime sessions for Piper graphs: the graph's inputs, session options chosen by
measurement, and the cache of optimized models keyed by the model's digest, the runtime and the
CPU.

A cached optimized model keeps its weights in a `.data` file beside it, which ONNX Runtime
memory-maps when it loads the model: clean page cache, shared by every process that loads the
same file (the agent and a health check), instead of a private copy (docs/memory.md). A `.seal`
beside them records each file's size and sha256, so a damaged or mixed-up copy is found before
it is run and built again. Copies are written in a work directory and moved into place, never
overwritten in place (another process may have the old weights mapped). The cache's files are
opened without following symbolic links (`nofollow`): a cache directory that is a link is not
used (`usable_cache_dir`: the model is optimized in a temporary directory instead), a link in
place of a cached file is refused and removed (the copy is built again).

onnxruntime is imported by the functions that make sessions, not with this module: the build's
graph steps (`split_graph`) use its names without the runtime (35 MB less at their peak).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from agent.guarded import nofollow

if TYPE_CHECKING:
    import onnxruntime as ort

_LOGGER = logging.getLogger(__name__)

PROVIDERS: Final = ["CPUExecutionProvider"]
PHONEMES_INPUT: Final = "input"
"""The graph's input of phoneme ids, int64 [1, N]."""
SPEAKER_INPUT: Final = "sid"
"""The graph's speaker input of a multi-speaker voice, int64 [1]."""
PER_UTTERANCE: Final = frozenset({SPEAKER_INPUT})
"""Graph inputs the flow and decoder may take besides frames: the speaker (multi-speaker)."""
WEIGHTS_SUFFIX: Final = ".data"
"""An optimized model's weights are in the file of its name plus this."""
EXTERNAL_MIN_BYTES: Final = 1024
"""Initializers at least this large (bytes) are saved in the weights file; smaller ones (shapes,
axes) stay in the graph."""
_SEAL_SUFFIX: Final = ".seal"
_WORK_PREFIX: Final = ".build-"
STALE_WORK_SECONDS: Final = 24 * 3600.0
"""A work directory older than this (seconds) was left by a build that was killed: removed at
the next build (a build takes seconds here, minutes on a slow board)."""
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


_ARENA: Final = {"enabled": True}
"""Whether sessions made from now on use ONNX Runtime's CPU memory arena (process-wide)."""


def use_memory_arena(enabled: bool) -> None:
    """Sessions made from now on keep (True) or return (False) their tensors' memory between
    runs: on is fastest, off holds a process's memory to what one run needs."""
    _ARENA["enabled"] = enabled


ARENA_SHRINKAGE: Final = ("memory.enable_memory_arena_shrinkage", "cpu:0")
"""A run option: at the end of the run, the CPU arena gives back the regions it grew by during
it (they go to glibc, which hands regions of `allocator.MMAP_THRESHOLD` or more back to the
kernel). Within a run the arena serves every tensor (its speed); between runs the process holds
only the arena's first region (docs/measurements.md, "Speed and memory together")."""


def releasing() -> ort.RunOptions | None:
    """Fresh run options that give the arena's growth back at the end of their run (None where
    sessions have no arena: ONNX Runtime refuses the option there). Used for a clause group's
    prior and flow and its last decoder chunk: the decoder's other chunks keep the arena, or
    it would grow again for each (+10-15 % synthesis compute, measured)."""
    if not _ARENA["enabled"]:
        return None
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    options = ort.RunOptions()
    options.add_run_config_entry(*ARENA_SHRINKAGE)
    return options


PART_PATTERN: Final = False
"""Whether a split voice's parts plan each run's memory as one block (ONNX Runtime's memory
pattern; a whole model's session does). A plan is made, and kept for the session's life, per set
of input shapes, and the parts' shapes change with every clause group and within one: the
streaming decoder's first run (its states empty), its middle runs and its last (the end flag)
each grew the arena by a block of its own (6, 6 and 9-14 MB at 32 frames), which no region's
free space could serve for the next plan's, and a group gave them back only at its end; the
prior and the flow kept a plan for each length of text they had seen. Without the pattern each
tensor comes from the arena's free space, whatever the shapes: a clause group holds ~7 MB, the
long text's engine peak 200.6 -> 185 MB, ~1 MB less after 400 announcements, the same CPU time
(0.99x; page faults 1,500 against 8,700) over the bench's texts (docs/memory.md)."""

NO_SPINNING: Final = ("session.intra_op.allow_spinning", "0")
"""A session option: the intra-op pool's threads block while they wait for work."""


def session_options(
    threads: int, level: ort.GraphOptimizationLevel, part: bool = False
) -> ort.SessionOptions:
    """Options of one session: `threads` intra-op threads, sequential, at this optimization
    level, with or without ONNX Runtime's memory arena (`use_memory_arena`); `part` for the
    parts of a split voice, which run one after another, each tensor taken from the arena's
    free space (no memory pattern: PART_PATTERN)."""
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # The arena keeps the largest request's tensors for the life of the session (+106 MB after
    # the bench's long text); without it they go back to malloc after each run, which costs CPU
    # time (docs/memory.md): off in throwaway processes (builds, the health check) and where
    # `tts.low_memory` asks.
    options.enable_cpu_mem_arena = _ARENA["enabled"]
    # The pool's threads wait for work blocked, not spinning: a thread that spins between the
    # operators of a run (and after it) burns a core whenever the other thread is late, which on
    # a busy CPU is most of the time: measured here, the streaming decoder's CPU time -27 % and
    # the whole decoder's -22 % at the same or better wall time (docs/measurements.md,
    # "Streaming decoder"). It also keeps one part's threads from taking the cores from the
    # next (what `session.force_spinning_stop` did before: +30 to +90 % without it).
    options.add_session_config_entry(*NO_SPINNING)
    options.enable_mem_pattern = PART_PATTERN if part else True
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = level
    return options


def usable_cache_dir(cache_dir: Path | None) -> Path | None:
    """`cache_dir` when it and its `models` directory are directories of their own (made if
    missing), else None: one that is a symbolic link (or cannot be made) is refused, with a
    warning, and the caller works without a cache."""
    if cache_dir is None:
        return None
    try:
        nofollow.check_directory(cache_dir)
        nofollow.check_directory(cache_dir / "models")
    except OSError as err:
        _LOGGER.warning("Model cache not used: %s", err)
        return None
    return cache_dir


def model_digest(path: Path, cache_dir: Path | None) -> str:
    """The sha256 of a model file, remembered in cache_dir while the file is unchanged.

    Hashing 63 MB costs ~0.1 s and a full read at every start. The memo is keyed by the file's
    path, size, inode and modification and change times; any write changes the change time,
    so a file altered in place is hashed again.
    """
    memo: Path | None = None
    if cache_dir is not None:
        ident = f"{path.resolve()}|{_identity(path)}"
        memo = cache_dir / "models" / f"digest-{hashlib.sha256(ident.encode()).hexdigest()[:32]}"
        with contextlib.suppress(OSError, UnicodeDecodeError):
            remembered = read_cached(memo, 256).decode("ascii").strip()
            if _SHA256.fullmatch(remembered):
                return remembered
    digest = _sha256_of(path)
    if memo is not None:
        with contextlib.suppress(OSError):
            write_atomic(memo, digest.encode("ascii"))
    return digest


def _identity(path: Path, *, follow: bool = True) -> str:
    """What changes whenever a file is written, replaced or restored: size, inode, times (of a
    link itself, not its target, unless `follow`)."""
    stat = os.stat(path, follow_symlinks=follow)
    return f"{stat.st_size}|{stat.st_ino}|{stat.st_mtime_ns}|{stat.st_ctime_ns}"


def _sha256_of(path: Path, *, follow: bool = True) -> str:
    """The digest of a regular file (a symbolic link refused unless `follow`: the model the
    operator names may be one, a cached copy may not; a FIFO or a device never: `nofollow`)."""
    fd = nofollow.open_regular(None, path, follow=follow)
    with os.fdopen(fd, "rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def read_cached(path: Path, max_bytes: int) -> bytes:
    """A small cached file (no symbolic link followed, neither it nor its directory; a regular
    file of at most `max_bytes`, else `nofollow.FileRefusedError`)."""
    folder = nofollow.open_directory(path.parent, create=False)
    try:
        return nofollow.read_file(folder, path.name, max_bytes)
    finally:
        os.close(folder)


def write_atomic(path: Path, data: bytes) -> None:
    """Write a cache file whole or not at all (its directory made if missing; neither it nor
    the file followed if a symbolic link: SymlinkRefusedError)."""
    folder = nofollow.open_directory(path.parent)
    try:
        nofollow.write_file_atomic(folder, path.name, data)
    finally:
        os.close(folder)


def peak_rss_mb() -> float | None:
    """This process's peak resident memory in MB since it started its program (Linux VmHWM),
    or None where the kernel does not say. (A parent's rusage of a child counts the parent's
    own memory at the fork: this does not.)"""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


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
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    machine = f"{platform.machine()}-{_cpu_id()}"
    return cache_dir / "models" / f"{digest}-ort{ort.__version__}-{machine}"


@contextlib.contextmanager
def work_directory(parent: Path | None) -> Iterator[Path]:
    """A fresh directory for a build, removed afterwards: under `parent` (the cache, so its
    files move into place by renaming), or the system's temporary directory. Work directories
    a killed build left under `parent` are removed first."""
    if parent is None:
        with tempfile.TemporaryDirectory(prefix="voice-agent-build-") as temporary:
            yield Path(temporary)
        return
    nofollow.check_directory(parent)  # a link: refused (SymlinkRefusedError)
    for stale in parent.glob(f"{_WORK_PREFIX}*"):
        with contextlib.suppress(OSError):  # rmtree refuses a link, and follows none inside
            if time.time() - stale.lstat().st_mtime > STALE_WORK_SECONDS:
                shutil.rmtree(stale)
    work = Path(tempfile.mkdtemp(prefix=_WORK_PREFIX, dir=parent))
    try:
        yield work
    finally:
        shutil.rmtree(work, ignore_errors=True)


def whole_session(
    model_path: Path, digest: str, threads: int, cache_dir: Path | None
) -> ort.InferenceSession:
    """A session over the whole model, via a cached fully optimized copy when a cache is given.

    Measured on the joe voice (docs/measurements.md): optimizing at load costs 0.4-1 s; loading
    the saved ENABLE_ALL copy with no further optimization ~0.14 s, at the same speed. That copy
    holds layouts for this CPU (ONNX Runtime warns so), hence the CPU fingerprint in its name:
    moved to another CPU, the cache simply does not match and a new copy is made.
    """
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    if cache_dir is None:
        options = session_options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
        return ort.InferenceSession(str(model_path), options, providers=PROVIDERS)
    cached = Path(f"{cache_stem(cache_dir, digest)}.onnx")
    session = cached_session(cached, threads)
    if session is not None:
        return session
    with work_directory(cached.parent) as work:
        built = work / cached.name
        save_optimized(str(model_path), built, threads)
        install_optimized(built, cached)
    _LOGGER.info("Saved optimized model %s", cached)
    return load_optimized(cached, threads)


def save_optimized(model: str, target: Path, threads: int) -> None:
    """Optimize a model file fully (ENABLE_ALL) and save it as `target`, its weights in
    `target` + WEIGHTS_SUFFIX. The weights file's name is written into the model: the two move
    together, under these names (`install_optimized`)."""
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    options = session_options(threads, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    options.optimized_model_filepath = str(target)
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_file_name", target.name + WEIGHTS_SUFFIX
    )
    options.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes",
        str(EXTERNAL_MIN_BYTES),
    )
    ort.InferenceSession(model, options, providers=PROVIDERS)


def install_optimized(built: Path, cached: Path) -> None:
    """Move a model saved by `save_optimized` (in a work directory on the cache's file system)
    to `cached` under the same name, with its weights, and seal it. The weights are renamed
    first and the graph last, so a reader never finds the new graph beside old weights."""
    if built.name != cached.name:
        raise ValueError(f"{built.name} must keep its name: its weights file is named after it")
    nofollow.check_directory(cached.parent, create=False)  # never moved through a link
    files = [path for path in (built, _weights(built)) if path.is_file()]
    digests = {path.name: _sha256_of(path, follow=False) for path in files}
    if any(_planted(p) for p in (cached, _weights(cached), _seal_path(cached))):
        remove_optimized(cached)  # a link, a FIFO, a directory where a file goes: not kept
    _seal_path(cached).unlink(missing_ok=True)
    for path in reversed(files):
        os.replace(path, cached.parent / path.name)
    seal = [
        {"name": name, "sha256": digest, "identity": _identity(cached.parent / name, follow=False)}
        for name, digest in digests.items()
    ]
    write_atomic(_seal_path(cached), json.dumps({"files": seal}).encode())


def remove_optimized(cached: Path) -> None:
    """Remove a cached optimized model, its weights and its seal, whatever is in their place (a
    link, never its target; a directory with what it holds: `nofollow.remove`)."""
    folder = nofollow.open_directory(cached.parent, create=False)
    try:
        for path in (cached, _weights(cached), _seal_path(cached)):
            nofollow.remove(folder, path.name)
    finally:
        os.close(folder)


def _weights(model: Path) -> Path:
    return model.with_name(model.name + WEIGHTS_SUFFIX)


def _seal_path(model: Path) -> Path:
    return model.with_name(model.name + _SEAL_SUFFIX)


def load_optimized(model: Path, threads: int, part: bool = False) -> ort.InferenceSession:
    """A saved optimized model, loaded with no further optimization (its weights mapped)."""
    import onnxruntime as ort  # noqa: PLC0415 - see the module's docstring

    options = session_options(threads, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, part)
    return ort.InferenceSession(str(model), options, providers=PROVIDERS)


def cached_session(cached: Path, threads: int, part: bool = False) -> ort.InferenceSession | None:
    """A cached optimized model, loaded with no further optimization; None if absent or
    damaged (a file missing, changed or not loading; a damaged copy is removed, so it is built
    again; a symbolic link among them, or as their directory, is refused)."""
    try:
        nofollow.check_directory(cached.parent, create=False)
    except OSError as err:
        _LOGGER.warning("Optimized model %s not used: %s", cached.name, err)
        return None
    planted = [p for p in (cached, _weights(cached), _seal_path(cached)) if _planted(p)]
    if planted:
        _LOGGER.warning(
            "Optimized model %s: %s is %s: refused, rebuilt",
            cached,
            planted[0].name,
            _planted(planted[0]),
        )
        remove_optimized(cached)  # the links themselves, never their targets
        return None
    if not cached.is_file():
        return None
    if not _seal_path(cached).exists():  # an older version's copy (weights inside): replaced
        _LOGGER.info("Optimized model %s has no seal (an older format); rebuilding it", cached)
        remove_optimized(cached)
        return None
    problem = _seal_problem(cached)
    if problem is None:
        try:
            return load_optimized(cached, threads, part)
        except Exception as err:  # noqa: BLE001 - any load failure means a damaged copy
            problem = f"it does not load: {str(err)[:200]}"
    _LOGGER.warning("Optimized model %s is damaged (%s); rebuilding it", cached, problem)
    remove_optimized(cached)
    return None


def _planted(path: Path) -> str | None:
    """What is in the place of a cached file if it is no regular file (a link, a FIFO, a
    directory, a device), None if it is one or absent."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    return None if stat.S_ISREG(mode) else nofollow.describe(mode)


def _current_identity(folder: Path, name: str, digest: str, sealed: str) -> str:
    """A sealed file's identity now, after "|" (hashed when it is not the sealed one); or what
    is wrong with it (a link, missing, another content)."""
    path = folder / name
    if "/" in name or name in ("", ".", "..") or path.is_symlink():
        return f"{name!r} is no file of its own"
    try:
        current = _identity(path, follow=False)
        resized = current.split("|", 1)[0] != sealed.split("|", 1)[0]  # never hashed then
        if current != sealed and (resized or _sha256_of(path, follow=False) != digest):
            return f"{name} is not the file it was built as"
    except FileNotFoundError:
        return f"{name} is missing"
    except OSError as err:
        return f"{name}: {err}"
    return f"|{current}"


def _seal_problem(cached: Path) -> str | None:
    """What is wrong with a cached model's files against its seal, or None. A file whose
    identity (size, inode, times) is still the sealed one is taken as sealed; another is
    hashed (e.g. a restored backup), and its new identity kept when the hash matches."""
    try:
        seal = json.loads(read_cached(_seal_path(cached), 65536))
        entries = [(str(e["name"]), str(e["sha256"]), str(e["identity"])) for e in seal["files"]]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return "its seal is unreadable"
    if cached.name not in {name for name, _, _ in entries}:
        return "its seal does not cover it"
    renewed = []
    for name, digest, sealed in entries:
        current = _current_identity(cached.parent, name, digest, sealed)
        if not current.startswith("|"):
            return current
        renewed.append({"name": name, "sha256": digest, "identity": current[1:]})
    if renewed != seal["files"]:
        with contextlib.suppress(OSError):
            write_atomic(_seal_path(cached), json.dumps({"files": renewed}).encode())
    return None
