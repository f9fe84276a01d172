"""Where a sound's bytes and samples come from: a file of `audio.media` read (a regular file,
within the size bound), a URL downloaded (`http_fetch`: streamed, size-capped, only where
`audio.media_hosts` allows, stall and overall timeouts; a failure is a coarse code and the URL
without credentials or query), and bytes decoded in the decoder child at the device's rate (or
found in the phrase cache under the digest of the bytes). The media source's threads call these;
they hold no state of the requests.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.egress import EgressPolicy
from agent.core.reasons import Reason
from agent.core.refusal import Refused
from agent.formats.pcm import PCM16
from agent.guarded import nofollow
from agent.guarded.http_fetch import FetchError, fetch_bytes, redact
from agent.speech.media_decoder import MediaDecoder
from agent.speech.phrase_cache import PhraseCache

_LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FetchLimits:
    """Bounds on a sound's download: its size, its time, where it may come from."""

    max_bytes: int
    timeout: float
    stall_timeout: float
    hosts: EgressPolicy = field(default_factory=EgressPolicy)
    """`audio.media_hosts` (empty: no URL is fetched)."""


class Fetch:
    """One URL's download: done once `data` or `error` is set. Once decoded, only the key of
    its samples in the phrase cache is kept (`key`), not the bytes."""

    def __init__(self) -> None:
        self.begun = threading.Event()
        self.done = threading.Event()
        self.data: bytes | None = None
        self.key: str | None = None
        self.error: Refused[Reason] | None = None


class SoundBytes:
    """Reads, downloads and decodes sounds for one device rate (no request state)."""

    def __init__(
        self,
        files: Mapping[str, Path],
        rate: int,
        cache: PhraseCache,
        limits: FetchLimits,
        decoder: MediaDecoder,
    ) -> None:
        self._files = files
        self._rate = rate
        self._cache = cache
        self._limits = limits
        self._decoder = decoder

    def decoded(self, data: bytes, *, cached: bool) -> PCM16:
        """The samples of a sound file: from the phrase cache (`cached`: a file or a URL, not a
        recording, which is played once), or decoded in the child (and kept there)."""
        key = _key(data) if cached else ""
        found = self._cache.get(key, self._rate) if cached else None
        if found is not None:
            return found
        decoded = self._decoder.decode(data, self._rate, max_bytes=self._limits.max_bytes)
        if cached:
            self._cache.put(key, decoded.samples, self._rate)
        return decoded.samples

    def read(self, name: str) -> bytes:
        path = self._files.get(name)
        if path is None:
            raise Refused(Reason.UNKNOWN_SOUND, f"no sound named {name[:64]!r}")
        try:  # the operator's file (a link is followed), a regular one: a FIFO never blocks
            return nofollow.read_regular(path, self._limits.max_bytes)
        except nofollow.FileRefusedError as err:
            if err.errno == errno.EFBIG:
                detail = f"{name}: {err.found}"
                raise Refused(Reason.TOO_LARGE, detail) from None
            raise Refused(Reason.SOUND_UNAVAILABLE, f"{name}: {err.found}") from None
        except OSError as err:
            detail = f"{name}: {err.strerror or err}"
            raise Refused(Reason.SOUND_UNAVAILABLE, detail) from None

    def fetch_into(self, url: str, fetch: Fetch, cancelled: threading.Event | None) -> None:
        fetch.begun.set()
        try:
            fetch.data = fetch_bytes(
                url,
                policy=self._limits.hosts,
                max_bytes=self._limits.max_bytes,
                timeout=self._limits.timeout,
                stall_timeout=self._limits.stall_timeout,
                cancel=cancelled,
            )
            _LOGGER.info("Fetched a sound: %d bytes", len(fetch.data))
        except FetchError as err:  # its text: a coarse code and the redacted URL
            _LOGGER.warning("A sound could not be fetched: %s", err)
            _LOGGER.debug("Why %s could not be fetched: %s", err.url, err.cause)
            fetch.error = Refused(Reason.SOUND_UNAVAILABLE, str(err))
        except Exception as err:  # noqa: BLE001 - whatever a server does, the sound is missing
            detail = f"unreachable: {redact(url)}"  # an exception's text may quote the server
            _LOGGER.warning("A sound could not be fetched: %s (%s)", detail, type(err).__name__)
            fetch.error = Refused(Reason.SOUND_UNAVAILABLE, detail)
        finally:
            fetch.done.set()


def _key(data: bytes) -> str:
    """The phrase cache's key of a sound file's samples: the digest of its bytes."""
    digest = hashlib.sha256(b"media|")
    digest.update(data)  # not a copy of 16 MiB
    return digest.hexdigest()
