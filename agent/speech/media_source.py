"""Sounds a request plays, as PCM at the device's rate: files of `audio.media`, http(s) URLs and
recorded audio (Hermes playBytes), each made ready from its request's arrival.

`prepare` (the loop, when the core accepts a request) hands over what a request will play: a
URL is downloaded by the fetch thread (through `http_fetch`: streamed, size-capped, only where
`audio.media_hosts` allows, checked again at every address connected to and every redirect,
stall and overall timeouts; a failure is published as a coarse code and the URL without
credentials or query, never what the server sent), and then every sound is decoded by the
decode thread in the decoder child (`media_decoder`), which can be killed: the synthesis thread
never downloads or decodes, it only waits (`get`, `clip`), and a cut ends its wait at once
(`wake`). Only the decoded samples are kept for a request that waits; its downloaded or
recorded bytes are let go once decoded. What is held for each request is reported
(`MediaHeld`), so that the core keeps it within `audio.max_queued_media_bytes`; `let_go` drops
everything of a request that ended. Both threads take the most urgent work first: a sound the
synthesizer waits for, then by class, then in order of arrival; a decode of a lower class in
progress is aborted (the child killed) when a higher class needs the decoder, and done again
later. A download does not begin while one that landed waits for the decoder (unless it is of
a higher class), so undecoded downloads hold at most two downloads' bytes. Decoded sounds
are kept in the phrase cache under the digest of their bytes, so a file or URL played again is
not decoded again (a recording is not kept: it plays once). Reading, downloading and decoding
themselves are `media_bytes.SoundBytes`' work; here the sounds of requests, their order, the
threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Final

from agent.core.messages import Event, MediaHeld, SpeakRequest, is_url
from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.formats.pcm import PCM16
from agent.speech.media_bytes import Fetch, FetchLimits, SoundBytes
from agent.speech.media_decoder import DecodeAbortedError, MediaDecoder
from agent.speech.phrase_cache import PhraseCache

__all__ = ["CLIP", "FetchLimits", "MediaSource"]
_LOGGER = logging.getLogger(__name__)
CLIP: Final = ""
"""The source of a request's recorded audio (Hermes playBytes) among its sounds."""
_DECODE_WAIT_SECONDS: Final = 35.0
"""Beyond its download, the longest the synthesizer waits for a sound's decode (seconds): the
decoder child's deadline (30 s) and its replacement's start."""


class _Stage(Enum):
    FETCH = "waiting for its download"
    FETCHING = "downloading"
    DECODE = "waiting for its decode"
    DECODING = "decoding"
    DONE = "done"


@dataclass(eq=False)
class _Sound:
    """One sound of one request, from its request's arrival until it ends."""

    request_id: str
    source: str
    """Its URL, its name in `audio.media`, or CLIP."""
    priority: int
    seq: int
    stage: _Stage
    data: bytes | None = None
    """Its bytes, downloaded, read or recorded, until decoded."""
    pcm: PCM16 | None = None
    error: Refused[Reason] | None = None
    awaited: bool = False
    """The synthesizer waits for it (its request is playing)."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set when its request is let go (its download ends at the next block)."""

    @property
    def counted(self) -> bool:
        """Whether its bytes count against the budget of waiting requests: a URL's or a
        recording's (a name of `audio.media` is the operator's file, decoded once and shared)."""
        return self.source == CLIP or is_url(self.source)

    @property
    def held(self) -> int:
        """Bytes it holds now."""
        return len(self.data or b"") + (0 if self.pcm is None else self.pcm.nbytes)

    @property
    def urgency(self) -> tuple[bool, int, int]:
        """The most urgent first: awaited, then the higher class, then the earlier."""
        return (self.awaited, self.priority, -self.seq)


class MediaSource:
    """The sounds of requests, made ready for one device rate, by a fetch and a decode thread."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        files: Mapping[str, Path],
        rate: int,
        cache: PhraseCache,
        limits: FetchLimits,
        decoder: MediaDecoder | None = None,
        report: Callable[[Event], object] | None = None,
        after_work: Callable[[], object] | None = None,
    ) -> None:
        """`report` takes the `MediaHeld` reports; `after_work` is called on the fetch and
        decode threads after each piece of work (the allocator gives memory back)."""
        self._files = dict(files)
        self._rate = rate
        self._cache = cache
        self._limits = limits
        self._decoder = decoder or MediaDecoder()
        self._report = report or (lambda _event: None)
        self._after_work = after_work or (lambda: None)
        self._bytes = SoundBytes(self._files, rate, cache, limits, self._decoder)
        self._sounds: dict[tuple[str, str], _Sound] = {}
        self._held: dict[str, int] = {}
        """What was last reported held for each request (bytes)."""
        self._seq = 0
        self._decoding: _Sound | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._fetch_blocking, name="media-fetch", daemon=True),
            threading.Thread(target=self._decode_blocking, name="media-decode", daemon=True),
        ]

    @property
    def names(self) -> frozenset[str]:
        """The names a request may use."""
        return frozenset(self._files)

    def start(self) -> None:
        """Start the fetch and decode threads (the decoder child starts with the first sound)."""
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop: waits end, a download ends at its next block, the decoder child is killed."""
        with self._changed:
            self._stopping = True
            for sound in self._sounds.values():
                sound.cancel.set()
            self._changed.notify_all()
        self._decoder.stop()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=5)

    # ---- the loop ---------------------------------------------------------------------------

    def prepare(self, request: SpeakRequest) -> None:
        """Start making ready what this accepted request plays (never blocks): its `sound` and
        `sound_after` (a URL is downloaded, a name read) and its recorded audio, each decoded
        in turn. Each message makes its own (a URL is fetched anew); its plays (a repeat) use
        what its arrival made."""
        with self._changed:
            for source in dict.fromkeys(s for s in (request.sound, request.sound_after) if s):
                self._add(request.id, source, int(request.priority))
            if request.audio is not None and request.audio.data:  # a replay's has none
                self._add(request.id, CLIP, int(request.priority), request.audio.data)
            self._changed.notify_all()
        self._report_held(request.id)

    def let_go(self, request_id: str) -> None:
        """Drop everything held for a request that ended (its download or decode in progress
        ends at once)."""
        with self._changed:
            gone = [key for key in self._sounds if key[0] == request_id]
            for key in gone:
                sound = self._sounds.pop(key)
                sound.cancel.set()
                if sound is self._decoding:
                    self._decoder.abort()
            self._held.pop(request_id, None)
            self._changed.notify_all()

    def held(self) -> int:
        """Bytes held now for all requests (what counts against the budget)."""
        with self._lock:
            return sum(s.held for s in self._sounds.values() if s.counted)

    # ---- the synthesis thread ---------------------------------------------------------------

    def get(
        self, request_id: str, priority: int, sound: str, cancelled: threading.Event | None = None
    ) -> PCM16:
        """A request's sound at the device rate, waiting for it to be ready (made now if its
        request never had it prepared: a request restored after a restart, an SSML `<audio>`).
        Raises Refused (`sound_unavailable`, `unsupported_audio`, `too_long`,
        `too_large`, `unknown_sound`)."""
        if not is_url(sound) and sound not in self._files:
            raise Refused(Reason.UNKNOWN_SOUND, f"no sound named {sound[:64]!r}")
        with self._changed:
            entry = self._sounds.get((request_id, sound))
            if entry is None:
                entry = self._add(request_id, sound, priority)
        return self._wait(entry, cancelled)

    def clip(self, request_id: str, cancelled: threading.Event | None = None) -> PCM16:
        """A request's recorded audio (Hermes playBytes), decoded. Raises Refused."""
        with self._lock:
            entry = self._sounds.get((request_id, CLIP))
        if entry is None:
            detail = "its recorded audio is no longer held (it is not kept for a replay)"
            raise Refused(Reason.SOUND_UNAVAILABLE, detail)
        return self._wait(entry, cancelled)

    def wake(self) -> None:
        """End the synthesizer's wait at once, to look at its cancel event (any thread)."""
        with self._changed:
            self._changed.notify_all()

    def _wait(self, entry: _Sound, cancelled: threading.Event | None) -> PCM16:
        deadline = time.monotonic() + 2 * (self._limits.timeout + 5) + _DECODE_WAIT_SECONDS
        with self._changed:
            entry.awaited = True  # most urgent now: a lower decode in progress gives way
            self._preempt_for(entry)
            self._changed.notify_all()
            try:
                while entry.stage is not _Stage.DONE:
                    if (cancelled is not None and cancelled.is_set()) or self._stopping:
                        raise Refused(Reason.SOUND_UNAVAILABLE, "cancelled")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        detail = f"timeout: still {entry.stage.value}"
                        raise Refused(Reason.SOUND_UNAVAILABLE, detail)
                    self._changed.wait(left)
            finally:
                entry.awaited = False
        if entry.error is not None:
            raise entry.error
        assert entry.pcm is not None  # noqa: S101 - a sound done without error has samples
        return entry.pcm

    # ---- under the lock ---------------------------------------------------------------------

    def _add(
        self, request_id: str, source: str, priority: int, data: bytes | None = None
    ) -> _Sound:
        self._seq += 1
        stage = _Stage.FETCH if is_url(source) else _Stage.DECODE
        entry = _Sound(request_id, source, priority, self._seq, stage, data)
        old = self._sounds.get((request_id, source))
        if old is not None:  # the same id again (a request the core took anew): made anew
            old.cancel.set()
        self._sounds[request_id, source] = entry
        self._preempt_for(entry)
        return entry

    def _preempt_for(self, entry: _Sound) -> None:
        """Abort the decode in progress if this sound is more urgent (it is done again later)."""
        running = self._decoding
        if (
            running is not None
            and running is not entry
            and entry.stage is _Stage.DECODE
            and entry.urgency > running.urgency
        ):
            self._decoder.abort()

    def _next(self, stage: _Stage) -> _Sound | None:
        """The most urgent sound at this stage, waiting for one (None once stopping)."""
        while not self._stopping:
            ready = [s for s in self._sounds.values() if s.stage is stage]
            if ready:
                return max(ready, key=lambda s: s.urgency)
            self._changed.wait()
        return None

    def _next_fetch(self) -> _Sound | None:
        """The most urgent sound to download, once the fetch thread may: not while a download
        that landed waits for the decoder (one may be decoding), unless this one is of a higher
        class or the synthesizer waits for it. So the bytes of downloads held before their
        decode stay within two downloads however slow the decoder and the loop are (measured on
        a fresh CI machine, without it: +131 MiB over the start with 8 URLs of 16 MiB queued,
        downloads landing faster than the core refused them). None once stopping."""
        while not self._stopping:
            landed = [
                s.priority
                for s in self._sounds.values()
                if s.stage is _Stage.DECODE and s.data is not None and is_url(s.source)
            ]
            ready = [
                s
                for s in self._sounds.values()
                if s.stage is _Stage.FETCH and (not landed or s.awaited or s.priority > max(landed))
            ]
            if ready:
                return max(ready, key=lambda s: s.urgency)
            self._changed.wait()
        return None

    def _live(self, entry: _Sound) -> bool:
        return self._sounds.get((entry.request_id, entry.source)) is entry

    def _report_held(self, request_id: str) -> None:
        """Tell the core what is held for this request now, if that changed."""
        with self._lock:
            sounds = [s for k, s in self._sounds.items() if k[0] == request_id and s.counted]
            if not sounds:
                return
            held = sum(s.held for s in sounds)
            if self._held.get(request_id) == held:
                return
            self._held[request_id] = held
        self._report(MediaHeld(request_id, held))

    # ---- the fetch thread -------------------------------------------------------------------

    def _fetch_blocking(self) -> None:
        while True:
            with self._changed:
                entry = self._next_fetch()
                if entry is None:
                    return
                entry.stage = _Stage.FETCHING
            fetch = Fetch()
            self._bytes.fetch_into(entry.source, fetch, entry.cancel)
            with self._changed:
                if not self._live(entry):
                    continue  # its request ended meanwhile: the bytes go
                if fetch.error is not None:
                    entry.error, entry.stage = fetch.error, _Stage.DONE
                else:
                    entry.data, entry.stage = fetch.data, _Stage.DECODE
                    self._preempt_for(entry)
                fetch.data = None
                self._changed.notify_all()
            del fetch
            self._report_held(entry.request_id)
            self._after_work()

    # ---- the decode thread ------------------------------------------------------------------

    def _decode_blocking(self) -> None:
        while True:
            with self._changed:
                entry = self._next(_Stage.DECODE)
                if entry is None:
                    return
                entry.stage = _Stage.DECODING
                self._decoding = entry
                self._changed.notify_all()  # the fetch thread may go on (`_next_fetch`)
            self._decode_one(entry)
            self._after_work()

    def _decode_one(self, entry: _Sound) -> None:
        """Decode one sound (its bytes let go), or put it back when aborted."""
        pcm: PCM16 | None = None
        error: Refused[Reason] | None = None
        try:
            data = entry.data if entry.data is not None else self._bytes.read(entry.source)
            pcm = self._bytes.decoded(data, cached=entry.source != CLIP)
        except Refused as err:
            error = err
        except DecodeAbortedError:
            with self._changed:
                self._decoding = None
                if self._live(entry):
                    entry.stage = _Stage.DECODE  # done again when it is the most urgent
                self._changed.notify_all()
            return
        with self._changed:
            self._decoding = None
            if self._live(entry):
                entry.pcm, entry.error, entry.data = pcm, error, None
                entry.stage = _Stage.DONE
            self._changed.notify_all()
        self._report_held(entry.request_id)
