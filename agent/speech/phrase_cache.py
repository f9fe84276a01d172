"""The phrase cache: synthesized sentences kept in memory and on disk, content-addressed.

A key is the sha256 of everything that decides the samples: the model's digest, the voice id,
the synthesis parameters and the sentence's phoneme ids (a function of the normalized text and
the voice's phonemizer). A new model therefore never finds old entries, with no invalidation
code. Both tiers are bounded in bytes and drop the least recently used entry first, but never a
pinned one (the configured phrases: requests cannot push the alarm texts out). Disk
entries are written atomically (temporary file, then rename) and carry their length and sha256,
so a truncated or corrupt entry is detected, dropped and synthesized again. The directory and
every entry are opened without following symbolic links, and an entry only when it is a regular
file no larger than the cache (`nofollow`): a link, a FIFO, a device, a directory or a huge file
planted in the cache is removed at start and named in `problem` (the state's `storage`), never
read through, written through or deleted through (one planted later is dropped when met); a
cache directory that is itself a link leaves the cache in memory only (`problem`). Opening the
cache also sweeps the optimized-model cache beside it once (`cache_sweep`), so that what was
planted there is named in the same `problem`. Used from one thread (the synthesis thread);
`stats` may be read from any.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from agent.formats.pcm import PCM16
from agent.guarded import nofollow
from agent.speech.cache_sweep import sweep_models

_LOGGER = logging.getLogger(__name__)

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
    refused: int = 0
    """Symbolic links (or other non-files) found in the cache and refused."""

    @property
    def hit_rate(self) -> float:
        """Hits over lookups (0 when nothing was looked up)."""
        lookups = self.memory_hits + self.disk_hits + self.misses
        return (self.memory_hits + self.disk_hits) / lookups if lookups else 0.0


class PhraseCache:
    """Two tiers of sentence audio: an LRU in memory and an LRU directory on disk."""

    def __init__(self, directory: Path | None, memory_bytes: int, disk_bytes: int) -> None:
        self._memory_limit = memory_bytes
        self._disk_limit = disk_bytes if directory is not None else 0
        self._memory: OrderedDict[str, PCM16] = OrderedDict()
        self._memory_bytes = 0
        self._disk: OrderedDict[str, int] = OrderedDict()  # key -> file size, oldest first
        self._disk_bytes = 0
        self._pinned: set[str] = set()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("memory_hits", "disk_hits", "misses", "stores", "evictions", "corrupt", "refused"), 0
        )
        self.problem: str | None = None
        """Why the disk tier is off although configured (its directory was refused), or what
        was planted in it and removed at start: for the state's `storage`."""
        self._found: list[str] = []
        self._fd: int | None = None
        if directory is not None and self._disk_limit > 0:
            try:
                self._fd = nofollow.open_inner_directory(directory)  # the cache root no link either
            except OSError as err:
                self._note(f"phrase cache: {err}; kept in memory only")
                _LOGGER.warning("Phrase cache: %s; kept in memory only", err)
                self._disk_limit = 0
            else:
                self._index_disk()
        if directory is not None:  # the cache root's other tenant, checked once at start
            for found in sweep_models(directory.parent / "models"):
                self._note(found)

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
        if self._fd is not None and 0 < _HEADER.size + pcm.nbytes <= self._disk_limit:
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

    @contextlib.contextmanager
    def _folder(self, key: str, *, create: bool = False) -> Iterator[int]:
        """The open subdirectory of a key's entry (no link followed)."""
        assert self._fd is not None  # noqa: S101 - only called with a directory
        fd = nofollow.open_subdirectory(self._fd, key[:2], create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    def _refused(self, what: str, err: OSError) -> None:
        with self._lock:
            self._counts["refused"] += 1
        _LOGGER.warning("Phrase cache: %s refused: %s", what, err)

    def _index_disk(self) -> None:
        """Read what the disk holds (names and sizes, no entry opened): what is no entry of
        the cache's own (a link, a FIFO, a device, a directory where an entry goes, an entry
        larger than the whole cache) is removed, never followed, and named in `problem`."""
        assert self._fd is not None  # noqa: S101 - only called with a directory
        entries = []
        for name, info in nofollow.entries(self._fd):
            if stat.S_ISDIR(info.st_mode):
                try:
                    entries += self._index_folder(name)
                except OSError as err:
                    self._refused(name, err)
            else:
                self._planted(self._fd, name, nofollow.describe(info.st_mode))
        for _, key, size in sorted(entries):
            self._disk[key] = size
            self._disk_bytes += size
        self._evict_disk()
        _LOGGER.info(
            "Phrase cache on disk: %d entries, %.1f MB", len(self._disk), self._disk_bytes / 1e6
        )

    def _index_folder(self, name: str) -> list[tuple[int, str, int]]:
        """The entries of one subdirectory (modification time, key, size); what a crash left
        mid-write is removed, and so is what was planted."""
        assert self._fd is not None  # noqa: S101 - only called with a directory
        entries = []
        fd = nofollow.open_subdirectory(self._fd, name, create=False)
        try:
            for entry, info in nofollow.entries(fd):
                if entry.endswith(".partial"):  # left by a crash mid-write
                    nofollow.remove(fd, entry)
                elif not stat.S_ISREG(info.st_mode):
                    self._planted(fd, f"{name}/{entry}", nofollow.describe(info.st_mode))
                elif info.st_size > self._disk_limit:
                    size = f"{info.st_size} bytes, over the cache's {self._disk_limit}"
                    self._planted(fd, f"{name}/{entry}", size)
                elif entry.endswith(_SUFFIX) and entry[:2] == name:
                    entries.append((info.st_mtime_ns, entry.removesuffix(_SUFFIX), info.st_size))
        finally:
            os.close(fd)
        return entries

    def _planted(self, folder: int, name: str, found: str) -> None:
        """Something that is no entry of the cache's own found at start: removed (a link, never
        its target; a directory with what it holds), counted, logged once and named in
        `problem` (for the state's `storage`)."""
        self._refused(name, nofollow.FileRefusedError(name, found))
        try:
            nofollow.remove(folder, name.rpartition("/")[2])
        except OSError as err:
            _LOGGER.warning("Phrase cache: %s could not be removed: %s", name, err)
        self._note(f"phrase cache: {name} was {found}: removed")

    def _note(self, found: str) -> None:
        """Something planted in the cache directory, for the state's `storage` (the first
        two, and how many more)."""
        self._found.append(found)
        shown = "; ".join(self._found[:2])
        more = len(self._found) - 2
        self.problem = shown if more <= 0 else f"{shown}; and {more} more"

    def _read(self, key: str, sample_rate: int) -> PCM16 | None:
        with self._lock:
            if key not in self._disk:
                return None
        name = f"{key}{_SUFFIX}"
        data = b""
        try:
            with self._folder(key) as folder:
                try:
                    data = nofollow.read_file(folder, name, self._disk_limit)
                except nofollow.FileRefusedError as err:  # planted since the start
                    self._refused(name, err)
                except OSError:
                    pass
                pcm = _decode(data, sample_rate)
                if pcm is None:  # a link goes, never its target; a directory with its files
                    nofollow.remove(folder, name)
                else:
                    with contextlib.suppress(OSError):  # recency survives a restart
                        os.utime(name, dir_fd=folder, follow_symlinks=False)
        except OSError as err:  # its subdirectory is gone or refused
            self._refused(key[:2], err)
            pcm = None
        with self._lock:
            if pcm is None:
                _LOGGER.warning("Phrase cache entry %s is corrupt or truncated; dropped", key)
                self._counts["corrupt"] += 1
                self._forget_disk(key)
                return None
            self._disk.move_to_end(key)
        return pcm

    def _write(self, key: str, pcm: PCM16, sample_rate: int) -> None:
        data = _encode(pcm, sample_rate)
        try:
            with self._folder(key, create=True) as folder:
                nofollow.write_file_atomic(folder, f"{key}{_SUFFIX}", data)
        except OSError as err:
            _LOGGER.warning("Phrase cache entry %s not written: %s", key, err)
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
            with contextlib.suppress(OSError), self._folder(key) as folder:
                nofollow.unlink(folder, f"{key}{_SUFFIX}")


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
