"""A release's files downloaded into `staging/`: resumed from what an earlier try left (a range
request), retried with backoff on failures worth it, never past the manifest's length, each
checked against its sha256 before it is kept; the manifest itself fetched small. Every URL within
`ota.hosts`; every file opened without following a link."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Final

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from agent.core.egress import EgressPolicy
from agent.core.refusal import Refused
from agent.core.states import UpdateReason
from agent.guarded.http_fetch import FetchError, FetchReason, fetch, fetch_bytes
from agent.protocol import manifest as manifests
from agent.protocol.manifest import FileEntry, Manifest
from agent.settings.declarations import OtaConfig
from agent.updates import update_store as store
from agent.updates.steps import Cancelled, fault_point
from agent.updates.update_store import UnsafeFileError

_LOGGER = logging.getLogger(__name__)

SPARE_BYTES: Final = 32 * 1024 * 1024
"""Free disk kept on top of the release's size."""
_RETRIED: Final = frozenset(
    {
        FetchReason.INCOMPLETE,
        FetchReason.STALLED,
        FetchReason.CONNECTION_FAILED,
        FetchReason.TIMEOUT,
        FetchReason.BAD_RESPONSE,
    }
)
"""Download failures worth another attempt (from where the file stopped)."""


class Downloads:
    """The worker's downloads under `directory`; `cancel` ends one within a second."""

    def __init__(
        self, config: OtaConfig, directory: Path, hosts: EgressPolicy, cancel: threading.Event
    ) -> None:
        self._config = config
        self._dir = directory
        self._hosts = hosts
        self._cancel = cancel

    def manifest(self, url: str) -> bytes:
        """A signed manifest (or revocation) from `url`, at most an envelope's size."""
        try:
            return fetch_bytes(
                url,
                policy=self._hosts,
                max_bytes=manifests.MAX_ENVELOPE_BYTES + 1,
                timeout=self._config.download_timeout,
                stall_timeout=self._config.download_timeout,
                cancel=self._cancel,
            )
        except FetchError as err:
            if err.reason == FetchReason.CANCELLED:
                raise Cancelled from None
            _LOGGER.debug("The manifest could not be fetched: %s (%s)", err, err.cause)
            raise Refused(UpdateReason.DOWNLOAD_FAILED, f"manifest: {err}") from None

    def release(
        self, release: Manifest, base: str, progress: Callable[[int], None]
    ) -> dict[str, Path]:
        """Every file of a release, staged and checked (by its path in the manifest);
        `progress` is told each new whole percent of the release's bytes."""
        staging = self._dir / "staging"
        store.make_directory(self._dir, "staging")  # never a link
        free = shutil.disk_usage(staging).free
        if free < release.total_bytes + SPARE_BYTES:
            raise Refused(UpdateReason.NO_SPACE, f"{free} bytes free, {release.total_bytes} needed")
        done = 0
        reported = [-1]  # the last percent reported
        staged: dict[str, Path] = {}
        for entry in release.every_file:  # the model's, then its tiers'
            url = urllib.parse.urljoin(base if base.endswith("/") else base + "/", entry.path)

            def bytes_so_far(got: int, before: int = done) -> None:
                percent = int(100 * (before + got) / max(release.total_bytes, 1))
                if percent != reported[0]:  # at most one report per percent
                    reported[0] = percent
                    progress(percent)

            staged[entry.path] = self._file(url, staging, entry, bytes_so_far)
            done += entry.length
        return staged

    def clean(self, release: Manifest) -> None:
        """The installed release's staged files go (the slot holds them now)."""
        try:
            with store.directory(self._dir, "staging") as staging:
                for entry in release.every_file:
                    store.remove(staging, entry.sha256)
        except OSError as err:  # installed all the same; the next start cleans up
            _LOGGER.error("The staged files of release %d stay: %s", release.release, err)

    def _file(
        self, url: str, staging: Path, entry: FileEntry, progress: Callable[[int], None]
    ) -> Path:
        final = staging / entry.sha256
        if self._staged_digest(entry.sha256) == entry.sha256:
            return final
        part = staging / f"{entry.sha256}.part"
        retrying = Retrying(
            stop=stop_after_attempt(self._config.download_retries),
            wait=wait_random_exponential(multiplier=0.5, max=10),
            retry=retry_if_exception(_worth_retrying),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._part(url, part, entry, progress)
        except FetchError as err:
            if err.reason == FetchReason.CANCELLED:
                raise Cancelled from None
            _LOGGER.debug("%s could not be fetched: %s (%s)", entry.path, err, err.cause)
            if err.reason == FetchReason.RANGE_UNSUPPORTED:
                raise Refused(UpdateReason.NO_RANGE_SUPPORT, str(err)) from None
            if err.reason == FetchReason.TOO_LARGE:  # it says it is longer than the manifest
                raise Refused(UpdateReason.CHECKSUM_MISMATCH, f"{entry.path}: {err}") from None
            raise Refused(UpdateReason.DOWNLOAD_FAILED, str(err)) from None
        if store.sha256_of(self._dir, ("staging", part.name)) != entry.sha256:
            part.unlink(missing_ok=True)
            raise Refused(
                UpdateReason.CHECKSUM_MISMATCH, f"{entry.path}: sha256 differs from the manifest"
            )
        os.replace(part, final)
        return final

    def _part(
        self, url: str, part: Path, entry: FileEntry, progress: Callable[[int], None]
    ) -> None:
        """Fetch the rest of one file into its `.part` (resumed from what is there), never past
        the manifest's length, within `ota.download_deadline`; a cancel is seen within a
        second, even from a server that sends a byte now and then."""
        have = store.file_size(self._dir, ("staging", part.name)) or 0  # never through a link
        if have > entry.length:
            part.unlink()
            have = 0
        if have == entry.length:
            return  # complete before a restart: only its hash is left to check
        got = [have]

        with store.open_append(self._dir, ("staging", part.name)) as out:

            def write(block: bytes) -> None:
                out.write(block)
                got[0] += len(block)
                progress(got[0])

            fault_point("download")
            try:
                fetch(
                    url,
                    write,
                    policy=self._hosts,
                    max_bytes=entry.length - have,  # never past the manifest's length
                    timeout=self._config.download_deadline,
                    stall_timeout=self._config.download_timeout,
                    cancel=self._cancel,
                    start=have,
                )
            except FetchError as err:
                if err.reason == FetchReason.TOO_LARGE and got[0] == entry.length:
                    pass  # it sent more after the file's length: cut there, the digest decides
                elif err.reason == FetchReason.RANGE_UNSUPPORTED or err.status == 416:
                    part.unlink(missing_ok=True)  # nothing to resume from
                    raise
                else:
                    raise
            finally:
                out.flush()
                os.fsync(out.fileno())
        if got[0] < entry.length:
            raise FetchError(
                FetchReason.INCOMPLETE, f"{entry.path}: {got[0]} of {entry.length} bytes"
            )

    def _staged_digest(self, name: str) -> str | None:
        """The sha256 of a complete staged download, None if there is none."""
        try:
            return store.sha256_of(self._dir, ("staging", name))
        except FileNotFoundError:
            return None

    def _sleep(self, seconds: float) -> None:
        if self._cancel.wait(seconds):
            raise Cancelled


def _worth_retrying(err: BaseException) -> bool:
    if isinstance(err, UnsafeFileError):  # a planted link stays where it is: no second try
        return False
    if isinstance(err, FetchError):
        server_error = err.reason == FetchReason.HTTP_ERROR and (err.status or 0) >= 500
        return err.reason in _RETRIED or server_error
    return isinstance(err, OSError)
