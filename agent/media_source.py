"""Sounds a request names, as PCM at the device's rate: files of `audio.media` and http(s) URLs.

A URL is fetched by one background thread as soon as its request arrives (`prefetch`), so that
it is ready before the announcement's turn; the synthesizer then takes the result (`get`),
waiting for a fetch still running, or fetching itself one that was never asked for. Downloads
go through `http_fetch` (streamed, size-capped, redirects only within the host, stall and
overall timeouts); decoding through `media`. Decoded sounds are kept in the phrase cache under
the digest of their bytes, so a file or URL played again is not decoded again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from .http_fetch import FetchError, fetch_bytes
from .media import MediaError, decode_audio
from .messages import Reason, is_url
from .pcm import PCM16
from .phrase_cache import PhraseCache

_LOGGER = logging.getLogger(__name__)
KEPT_FETCHES: Final = 8
"""Fetched URLs kept for their announcements (the oldest is dropped first)."""
_WAIT_SLICE: Final = 0.2
"""A wait for a fetch checks this often (seconds) whether its announcement was cut."""


class UnplayableError(Exception):
    """A part of a request that cannot be played (a sound, a speaker): `reason` for its event,
    `detail` safe to publish."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Bounds on a sound's download."""

    max_bytes: int
    timeout: float
    stall_timeout: float


class _Fetch:
    """One URL's download: done once `data` or `error` is set. Once decoded, only the key of
    its samples in the phrase cache is kept (`key`), not the bytes."""

    def __init__(self) -> None:
        self.begun = threading.Event()
        self.done = threading.Event()
        self.data: bytes | None = None
        self.key: str | None = None
        self.error: UnplayableError | None = None


class MediaSource:
    """The sounds of `audio.media` by name, and of URLs, decoded for one device rate."""

    def __init__(
        self,
        files: Mapping[str, Path],
        rate: int,
        cache: PhraseCache,
        limits: FetchLimits,
    ) -> None:
        self._files = dict(files)
        self._rate = rate
        self._cache = cache
        self._limits = limits
        self._fetches: OrderedDict[str, _Fetch] = OrderedDict()
        self._lock = threading.Lock()
        self._queue: queue.Queue[str | None] = queue.Queue(maxsize=KEPT_FETCHES)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="media-fetch", daemon=True)

    @property
    def names(self) -> frozenset[str]:
        """The names a request may use."""
        return frozenset(self._files)

    def start(self) -> None:
        """Start the fetching thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop fetching (a download in progress ends at its next block)."""
        self._stopping.set()
        with self._lock:
            for fetch in self._fetches.values():
                if not fetch.done.is_set():
                    fetch.error = UnplayableError(Reason.SOUND_UNAVAILABLE, "stopping")
                    fetch.done.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def prefetch(self, urls: Sequence[str], renew: bool = False) -> None:
        """Start downloading these URLs (any thread; never blocks). A new request renews them
        (`renew`: a failure is not remembered, a changed file is played as it is now); its
        plays (a repeat) use what its arrival fetched. One still downloading is shared. Beyond
        KEPT_FETCHES waiting, a URL is fetched when its announcement plays instead."""
        for url in urls:
            with self._lock:
                known = self._fetches.get(url)
                if known is not None and (not renew or not known.done.is_set()):
                    continue
                self._fetches[url] = _Fetch()
                self._fetches.move_to_end(url)
                while len(self._fetches) > KEPT_FETCHES:
                    self._fetches.popitem(last=False)
            try:
                self._queue.put_nowait(url)
            except queue.Full:
                with self._lock:
                    self._fetches.pop(url, None)

    def get(self, sound: str, cancelled: threading.Event | None = None) -> PCM16:
        """A sound's samples at the device rate. Raises UnplayableError (reason
        `sound_unavailable`, `unsupported_audio`, or `unknown_sound`)."""
        if not is_url(sound):
            return self._decoded(self._read(sound))
        fetch = self._fetched(sound, cancelled)
        if fetch.key is not None:  # decoded before (a repeat): from the cache
            cached = self._cache.get(fetch.key, self._rate)
            if cached is not None:
                return cached
            fetch = self._fetched(sound, cancelled, again=True)  # evicted: fetch it again
        assert fetch.data is not None  # noqa: S101 - a fetch without error has its data
        samples = self._decoded(fetch.data)
        fetch.key, fetch.data = _key(fetch.data), None  # the bytes are not kept
        return samples

    def _decoded(self, data: bytes) -> PCM16:
        key = _key(data)
        cached = self._cache.get(key, self._rate)
        if cached is not None:
            return cached
        try:
            decoded = decode_audio(data, self._rate, max_bytes=self._limits.max_bytes)
        except MediaError as err:
            raise UnplayableError(Reason.UNSUPPORTED_AUDIO, str(err)) from None
        self._cache.put(key, decoded.samples, self._rate)
        return decoded.samples

    def _read(self, name: str) -> bytes:
        path = self._files.get(name)
        if path is None:
            raise UnplayableError(Reason.UNKNOWN_SOUND, f"no sound named {name[:64]!r}")
        try:
            size = path.stat().st_size
            if size > self._limits.max_bytes:
                detail = f"{name}: {size} bytes, at most {self._limits.max_bytes} allowed"
                raise UnplayableError(Reason.SOUND_UNAVAILABLE, detail)
            return path.read_bytes()
        except OSError as err:
            detail = f"{name}: {err.strerror or err}"
            raise UnplayableError(Reason.SOUND_UNAVAILABLE, detail) from None

    def _fetched(self, url: str, cancelled: threading.Event | None, again: bool = False) -> _Fetch:
        """The URL's completed fetch: the prefetched one (waited for: its deadline counts from
        when its download began), or one made here."""
        with self._lock:
            fetch = None if again else self._fetches.get(url)
        if fetch is None:  # never prefetched (or dropped): fetch it here
            fetch = _Fetch()
            self._fetch_into(url, fetch, cancelled)
            with self._lock:
                self._fetches[url] = fetch
                while len(self._fetches) > KEPT_FETCHES:
                    self._fetches.popitem(last=False)
        each = self._limits.timeout + 5
        running = waited = 0.0  # behind at most KEPT_FETCHES others, each within its deadline
        while not fetch.done.wait(_WAIT_SLICE):
            if cancelled is not None and cancelled.is_set():
                raise UnplayableError(Reason.SOUND_UNAVAILABLE, "cancelled")
            waited += _WAIT_SLICE
            running += _WAIT_SLICE if fetch.begun.is_set() else 0.0
            if running > each or waited > (KEPT_FETCHES + 1) * each:
                raise UnplayableError(Reason.SOUND_UNAVAILABLE, "timeout: still downloading")
        if fetch.error is not None:
            raise fetch.error
        return fetch

    def _run_blocking(self) -> None:
        while not self._stopping.is_set():
            url = self._queue.get()
            if url is None:
                return
            with self._lock:
                fetch = self._fetches.get(url)
            if fetch is not None and not fetch.done.is_set():
                self._fetch_into(url, fetch, self._stopping)

    def _fetch_into(self, url: str, fetch: _Fetch, cancelled: threading.Event | None) -> None:
        fetch.begun.set()
        try:
            fetch.data = fetch_bytes(
                url,
                max_bytes=self._limits.max_bytes,
                timeout=self._limits.timeout,
                stall_timeout=self._limits.stall_timeout,
                cancel=cancelled,
            )
            _LOGGER.info("Fetched a sound: %d bytes", len(fetch.data))
        except FetchError as err:
            _LOGGER.warning("A sound could not be fetched: %s", err)
            fetch.error = UnplayableError(Reason.SOUND_UNAVAILABLE, str(err))
        except Exception as err:  # noqa: BLE001 - whatever a server does, the sound is missing
            _LOGGER.warning("A sound could not be fetched: %r", err)
            fetch.error = UnplayableError(Reason.SOUND_UNAVAILABLE, f"{type(err).__name__}")
        finally:
            fetch.done.set()


def _key(data: bytes) -> str:
    """The phrase cache's key of a sound file's samples: the digest of its bytes."""
    return hashlib.sha256(b"media|" + data).hexdigest()
