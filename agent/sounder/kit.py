"""What the sounder says from memory: the pinned phrases (`cache.phrases`) and the generic alarm
phrase (`cache.alarm_phrase`) as the engine rendered them, the chime files as the engine decoded
them, and the voices' facts (for the alarm lane's admission), kept in `<cache.dir>/sounder/` so
that an alarm is said from power-on, before the engine has even started.

The sounder alone writes these files (the engine only sends audio over the pipe); each is read
back without following links, bounded, and checked against the digest the index keeps: a
missing, damaged or planted file is left out (logged once) and rendered again by the engine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.core.catalog import VoiceFacts
from agent.guarded import nofollow

_LOGGER = logging.getLogger(__name__)

INDEX: Final = "index.json"
MAX_INDEX_BYTES: Final = 1 << 20
MAX_SOUND_BYTES: Final = 16 << 20
"""The longest phrase or chime kept (about six minutes at 22 kHz)."""
MAX_KIT_BYTES: Final = 64 << 20
"""All of them together: what the sounder holds in memory at most."""


@dataclass(slots=True)
class Kit:
    """The sounds the sounder holds, at the device's rate."""

    rate: int
    phrases: dict[str, bytes] = field(default_factory=dict)
    """Cleaned text → 16-bit PCM, as the engine said it."""
    chimes: dict[str, bytes] = field(default_factory=dict)
    """Chime files by name, decoded by the engine (the built-ins the sounder renders itself)."""
    voices: dict[str, VoiceFacts] = field(default_factory=dict)
    """The voices' facts the engine last reported (empty: never yet)."""
    model: str = ""
    """The digest of the default model the phrases were rendered with."""

    def held_bytes(self) -> int:
        return sum(map(len, self.phrases.values())) + sum(map(len, self.chimes.values()))


DIRECTORY: Final = "sounder"
"""The kit's directory in the cache directory."""


class KitFiles:
    """The kit's directory (`<cache>/sounder`): read once at start, written as the engine
    renders. Neither the cache directory nor the kit's may be a symbolic link (as for every
    cache of the node): then the kit is kept in memory only."""

    def __init__(self, cache: Path | None) -> None:
        self._cache = cache
        self._lock = threading.Lock()
        self.problem: str | None = None

    def _open(self) -> int:
        """The kit's directory, opened without following a link (made when missing)."""
        if self._cache is None:
            raise FileNotFoundError("no cache directory")
        root = nofollow.open_directory(self._cache)
        try:
            return nofollow.open_subdirectory(root, DIRECTORY)
        finally:
            os.close(root)

    def load(self, rate: int) -> Kit:
        """The kit as kept (empty when there is none, or it was for another rate)."""
        kit = Kit(rate)
        if self._cache is None:
            return kit
        try:
            fd = self._open()
        except OSError as err:
            self.problem = f"sounder kit: {err}"
            _LOGGER.warning("Sounder kit kept in memory only: %s", err)
            self._cache = None
            return kit
        try:
            index = _index(fd)
            if index.get("rate") != rate:
                return kit
            kit.model = str(index.get("model", ""))[:128]
            kit.voices = _voices(index.get("voices"))
            budget = MAX_KIT_BYTES
            for kind, into in (("phrases", kit.phrases), ("chimes", kit.chimes)):
                entries = index.get(kind)
                for name, entry in entries.items() if isinstance(entries, dict) else ():
                    pcm = _sound(fd, entry, budget)
                    if pcm is None:
                        _LOGGER.warning("Sounder kit: %s %r left out (missing or damaged)",
                                        kind[:-1], str(name)[:64])  # fmt: skip
                        continue
                    into[str(name)] = pcm
                    budget -= len(pcm)
        finally:
            os.close(fd)
        return kit

    def save(self, kit: Kit) -> None:
        """Keep the kit (the index last: a crash between leaves the old index, whose sounds
        are still there or found damaged)."""
        if self._cache is None:
            return
        with self._lock:
            try:
                fd = self._open()
            except OSError as err:
                _LOGGER.warning("Sounder kit not kept: %s", err)
                return
            try:
                index: dict[str, object] = {"rate": kit.rate, "model": kit.model}
                index["voices"] = {
                    vid: {"language": f.language, "speakers": list(f.speakers),
                          "speaker_count": f.speaker_count}
                    for vid, f in kit.voices.items()
                }  # fmt: skip
                names: set[str] = {INDEX}
                for kind, sounds in (("phrases", kit.phrases), ("chimes", kit.chimes)):
                    entries = {}
                    for name, pcm in sounds.items():
                        digest = hashlib.sha256(pcm).hexdigest()
                        file = f"{digest}.pcm"
                        if nofollow.kind(fd, file) != "file":
                            nofollow.write_file_atomic(fd, file, pcm)
                        entries[name] = {"file": file, "sha256": digest, "bytes": len(pcm)}
                        names.add(file)
                    index[kind] = entries
                nofollow.write_file_atomic(fd, INDEX, json.dumps(index).encode())
                for stale in set(_listing(fd)) - names:  # sounds no longer named
                    nofollow.unlink(fd, stale)
            except OSError as err:
                _LOGGER.warning("Sounder kit not kept: %s", err)
            finally:
                os.close(fd)


def _index(fd: int) -> dict[str, object]:
    try:
        data = nofollow.read_file(fd, INDEX, MAX_INDEX_BYTES)
    except FileNotFoundError:
        return {}
    except OSError as err:
        _LOGGER.warning("Sounder kit: its index cannot be read (%s); starting without it", err)
        return {}
    try:
        index = json.loads(data) if len(data) <= MAX_INDEX_BYTES else None
    except (ValueError, RecursionError):
        index = None
    if not isinstance(index, dict):
        _LOGGER.warning("Sounder kit: its index is damaged; starting without it")
        return {}
    return index


def _sound(fd: int, entry: object, budget: int) -> bytes | None:
    if not isinstance(entry, dict):
        return None
    file, digest, size = entry.get("file"), entry.get("sha256"), entry.get("bytes")
    if not (isinstance(file, str) and isinstance(digest, str) and isinstance(size, int)):
        return None
    if file != f"{digest}.pcm" or not 0 < size <= min(MAX_SOUND_BYTES, budget) or size % 2:
        return None
    try:
        pcm = nofollow.read_file(fd, file, size)
    except OSError:
        return None
    return pcm if len(pcm) == size and hashlib.sha256(pcm).hexdigest() == digest else None


def _voices(raw: object) -> dict[str, VoiceFacts]:
    voices: dict[str, VoiceFacts] = {}
    for vid, facts in raw.items() if isinstance(raw, dict) else ():
        if not isinstance(facts, dict):
            continue
        language, speakers, count = (
            facts.get(k) for k in ("language", "speakers", "speaker_count")
        )
        if isinstance(language, str) and isinstance(speakers, list) and isinstance(count, int):
            names = tuple(str(s)[:256] for s in speakers[:4096])
            voices[str(vid)[:64]] = VoiceFacts(language[:64], names, max(1, count))
    return voices


def _listing(fd: int) -> list[str]:
    with contextlib.suppress(OSError):
        return [n for n in os.listdir(fd) if n.endswith((".pcm", ".partial"))]
    return []
