"""The phrase cache: synthesized sentences kept in memory and on disk, content-addressed.

A key is the sha256 of everything that decides the samples: the model's digest, the voice id,
the synthesis parameters and the sentence's phoneme ids (a function of the normalized text and
the voice's phonemizer). A new model therefore never finds old entries, with no invalidation
code. Both tiers are bounded in bytes and drop the least recently used entry first, but never a
pinned one (the configured phrases: requests cannot push the alarm texts out). Disk
entries are written atomically (temporary file, then rename) and carry their length and sha256,
so a truncated or corrupt entry is detected, dropped and synthesized again. Used from one
thread (the synthesis thread); `stats` may be read from any. Allowed imports: stdlib, numpy.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import struct
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

_LOGGER = logging.getLogger(__name__)

PCM16 = npt.NDArray[np.int16]
_MAGIC: Final = b"VAPCM\x00\x01\x00"
_HEADER: Final = struct.Struct("<8sII32s")  # magic, sample rate, samples, sha256 of samples
_SUFFIX: Final = ".pcm"


def cache_key(
    model_sha256: str, voice_id: str, params: Sequence[float], phoneme_ids: Sequence[int]
) -> str:
    """The content address of one sentence's audio."""
    text = "|".join(
        [
            "v1",
            model_sha256,
            voice_id,
            ",".join(repr(float(p)) for p in params),
            ",".join(str(i) for i in phoneme_ids),
        ]
    )
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters for telemetry."""

    memory_hits: int
    disk_hits: int
    misses: int
    stores: int
    evictions: int
    corrupt: int
    memory_bytes: int
    disk_bytes: int
    disk_entries: int

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 when nothing was looked up)."""
        lookups = self.memory_hits + self.disk_hits + self.misses
        return (self.memory_hits + self.disk_hits) / lookups if lookups else 0.0


class PhraseCache:
    """Two tiers of sentence audio: an LRU in memory and an LRU directory on disk."""

    def __init__(self, directory: Path | None, memory_bytes: int, disk_bytes: int) -> None:
        self._dir = directory
        self._memory_limit = memory_bytes
        self._disk_limit = disk_bytes if directory is not None else 0
        self._memory: OrderedDict[str, PCM16] = OrderedDict()
        self._memory_bytes = 0
        self._disk: OrderedDict[str, int] = OrderedDict()  # key -> file size, oldest first
        self._disk_bytes = 0
        self._pinned: set[str] = set()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("memory_hits", "disk_hits", "misses", "stores", "evictions", "corrupt"), 0
        )
        if self._dir is not None and self._disk_limit > 0:
            self._dir.mkdir(parents=True, exist_ok=True)
            self._index_disk()

    def get(self, key: str, sample_rate: int, *, count: bool = True) -> PCM16 | None:
        """The audio stored under key (checked against its digest), or None.

        `count=False` leaves the hit and miss counters alone (a check, not a use).
        """
        with self._lock:
            pcm = self._memory.get(key)
            if pcm is not None:
                self._memory.move_to_end(key)
                self._counts["memory_hits"] += count
                return pcm
        pcm = self._read(key, sample_rate)
        with self._lock:
            if pcm is None:
                self._counts["misses"] += count
                return None
            self._counts["disk_hits"] += count
        self._remember(key, pcm)
        return pcm

    def contains(self, key: str) -> bool:
        """Whether key is stored (without counting a lookup or reading the file)."""
        with self._lock:
            return key in self._memory or key in self._disk

    def put(self, key: str, pcm: PCM16, sample_rate: int, *, pinned: bool = False) -> None:
        """Store audio in both tiers (over-large entries are not kept); a pinned entry is never
        dropped to make room."""
        pcm = np.ascontiguousarray(pcm, dtype=np.int16)
        if pinned:
            self.pin(key)
        self._remember(key, pcm)
        if self._dir is not None and 0 < _HEADER.size + pcm.nbytes <= self._disk_limit:
            self._write(key, pcm, sample_rate)
        with self._lock:
            self._counts["stores"] += 1

    def pin(self, key: str) -> None:
        """Never drop this entry to make room (it may already be stored)."""
        with self._lock:
            self._pinned.add(key)

    def stats(self) -> CacheStats:
        """A snapshot of the counters."""
        with self._lock:
            return CacheStats(
                **self._counts,
                memory_bytes=self._memory_bytes,
                disk_bytes=self._disk_bytes,
                disk_entries=len(self._disk),
            )

    # ---- memory tier ------------------------------------------------------------------------

    def _remember(self, key: str, pcm: PCM16) -> None:
        if pcm.nbytes > self._memory_limit:
            return
        with self._lock:
            if key in self._memory:
                self._memory.move_to_end(key)
                return
            self._memory[key] = pcm
            self._memory_bytes += pcm.nbytes
            for old in [k for k in self._memory if k not in self._pinned]:
                if self._memory_bytes <= self._memory_limit:
                    break
                self._memory_bytes -= self._memory.pop(old).nbytes
                self._counts["evictions"] += 1

    # ---- disk tier --------------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        assert self._dir is not None  # noqa: S101 - only called with a directory
        return self._dir / key[:2] / f"{key}{_SUFFIX}"

    def _index_disk(self) -> None:
        assert self._dir is not None  # noqa: S101 - only called with a directory
        for partial in self._dir.glob("*/*.partial"):  # left by a crash mid-write
            with contextlib.suppress(OSError):
                partial.unlink()
        entries = []
        for path in self._dir.glob(f"*/*{_SUFFIX}"):
            with contextlib.suppress(OSError):
                stat = path.stat()
                entries.append((stat.st_mtime_ns, path.stem, stat.st_size))
        for _, key, size in sorted(entries):
            self._disk[key] = size
            self._disk_bytes += size
        self._evict_disk()
        _LOGGER.info(
            "Phrase cache on disk: %d entries, %.1f MB", len(self._disk), self._disk_bytes / 1e6
        )

    def _read(self, key: str, sample_rate: int) -> PCM16 | None:
        with self._lock:
            if key not in self._disk:
                return None
        path = self._path(key)
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        pcm = _decode(data, sample_rate)
        with self._lock:
            if pcm is None:
                _LOGGER.warning("Phrase cache entry %s is corrupt or truncated; dropped", key)
                self._counts["corrupt"] += 1
                self._forget_disk(key)
                with contextlib.suppress(OSError):
                    path.unlink()
                return None
            self._disk.move_to_end(key)
        with contextlib.suppress(OSError):
            os.utime(path)  # recency survives a restart
        return pcm

    def _write(self, key: str, pcm: PCM16, sample_rate: int) -> None:
        path = self._path(key)
        data = _encode(pcm, sample_rate)
        tmp: str | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(tmp, path)
        except OSError as err:
            _LOGGER.warning("Phrase cache entry %s not written: %s", key, err)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            return
        with self._lock:
            self._forget_disk(key)
            self._disk[key] = len(data)
            self._disk_bytes += len(data)
        self._evict_disk()

    def _forget_disk(self, key: str) -> None:
        size = self._disk.pop(key, None)
        if size is not None:
            self._disk_bytes -= size

    def _evict_disk(self) -> None:
        while True:
            with self._lock:
                if self._disk_bytes <= self._disk_limit:
                    return
                key = next((k for k in self._disk if k not in self._pinned), None)
                if key is None:
                    return  # only pinned entries left
                self._disk_bytes -= self._disk.pop(key)
                self._counts["evictions"] += 1
            with contextlib.suppress(OSError):
                self._path(key).unlink()


def _encode(pcm: PCM16, sample_rate: int) -> bytes:
    payload = pcm.astype("<i2").tobytes()
    return _HEADER.pack(_MAGIC, sample_rate, len(pcm), hashlib.sha256(payload).digest()) + payload


def _decode(data: bytes, sample_rate: int) -> PCM16 | None:
    """Samples from an entry, or None when it is not exactly what was written."""
    if len(data) < _HEADER.size:
        return None
    magic, rate, samples, digest = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or rate != sample_rate or len(payload) != samples * 2:
        return None
    if hashlib.sha256(payload).digest() != digest:
        return None
    return np.frombuffer(payload, dtype="<i2").astype(np.int16)
