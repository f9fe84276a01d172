"""Model updates over the air: verify, download, install into the other slot, check, switch.

States and files under the OTA directory:
- `state.json`: which slot is active, which was before, the installed release, and a pending
  switch with its start-attempt count. Written atomically (temporary file, fsync, rename, fsync
  of the directory), so a process killed at any moment finds either the old or the new state.
- `staging/<sha256>.part`: downloads in progress (resumed with HTTP Range), `staging/<sha256>`
  when complete and verified.
- `slots/a`, `slots/b`: the two model slots. The factory model (config `tts.voice`) is release 0.

An offer is verified (Ed25519 over the exact manifest bytes, expiry, target, release order)
before any model byte is downloaded. Files are fetched with the sha256 computed on the fly,
never past the manifest length, with bounded retries and a stall timeout; then hard-linked into
the inactive slot, checked in a subprocess (memory and time limited), loaded and prewarmed here,
and only then switched to, between announcements. A switch not yet confirmed by a successful
start is rolled back after `ota.max_start_attempts` starts. Every step can be repeated.
Allowed imports: stdlib, tenacity, cryptography, `config`, `manifest`, `states` (the model
loader is given: the updater never loads ONNX Runtime itself).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Generic, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_random_exponential

from . import manifest as manifests
from .config import OtaConfig
from .http_fetch import FetchError, FetchReason, fetch, fetch_bytes
from .manifest import FileEntry, Manifest, Refusal
from .states import FINAL_PHASES, UpdatePhase, UpdateReport

_LOGGER = logging.getLogger(__name__)
M = TypeVar("M")
"""A loaded model, as the agent's loader makes it (the updater only hands it over)."""

_CHUNK: Final = 64 * 1024
_SPARE_BYTES: Final = 32 * 1024 * 1024
"""Free disk kept on top of the release's size."""
STAGING_MAX_AGE: Final = 7 * 86400.0
"""Staged downloads of a release that was never installed are removed at start after this long
(seconds): long enough for an operator to offer it again and resume."""
STAGING_MAX_FILES: Final = 8
"""At most this many staged files are kept at start (the newest)."""
FAULT_ENV: Final = "VOICE_AGENT_FAULT_AT"
"""Test hook: the agent kills itself (SIGKILL) when it reaches this step of an update."""
CHECK_ENVIRONMENT: Final = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc settings of the health check (and the build processes it starts) unless the agent's
environment sets them: the agent's own (`allocator`, set there with mallopt, which a child does
not inherit). Measured: the check's peak 181 MB with them, 227 without (docs/memory.md)."""


@dataclass(slots=True)
class Pending:
    slot: str
    release: int
    version: str
    attempts: int = 0
    offer: str = "start"
    """The offer that installed it: results reached after a restart are reported under it."""


@dataclass(slots=True)
class UpdateState:
    """What `state.json` holds."""

    release: int = 0
    version: str | None = None
    active: str | None = None
    model: str | None = None
    previous: str | None = None
    previous_release: int = 0
    previous_version: str | None = None
    previous_model: str | None = None
    pending: Pending | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    """Results reached before they could be published (delivered after the next start)."""
    model_sha256: str | None = None
    """The active slot's model digest, from its manifest: checked at every start."""
    previous_model_sha256: str | None = None
    revocation: dict[str, Any] | None = None
    """The newest verified revocation (`issued`, `min_release`, `revoked`), honoured before
    every install and at every start."""

    def revoked(self, release: int) -> bool:
        """Whether the stored revocation withdraws this release."""
        if self.revocation is None or release <= 0:
            return False
        return release < int(self.revocation["min_release"]) or release in set(
            self.revocation["revoked"]
        )


class _Cancelled(Exception):  # noqa: N818 - control flow, not an error
    pass


class UpdateError(Exception):
    """An update step failed for a reason worth reporting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def fault_point(step: str) -> None:
    """The test hook: SIGKILL this process at `step` when $VOICE_AGENT_FAULT_AT names it."""
    if os.environ.get(FAULT_ENV) == step:
        _LOGGER.warning("Fault injection: killed at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)


class Updater(Generic[M]):
    """Runs one update at a time in its own thread; reports through `report`."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        config: OtaConfig,
        directory: Path,
        factory_model: Path,
        rate: int,
        threads: int,
        report: Callable[[UpdateReport], object],
        load: Callable[[Path], M],
        swap: Callable[[M], bool],
        *,
        cache_dir: Path | None = None,
    ) -> None:
        self._config = config
        self._cache_dir = cache_dir
        """The model cache `load` uses: the health check builds the candidate's parts there, so
        `load` finds them (None: the check builds in a temporary directory, `load` again)."""
        self._load = load
        self._dir = directory
        self._factory = factory_model
        self._rate = rate
        self._threads = threads
        self._send = report
        self._finals: list[UpdateReport] = []
        self._swap = swap
        self._trusted: dict[str, Ed25519PublicKey] = {}
        for text in config.trusted_keys:
            key = manifests.public_key_from_text(text)
            self._trusted[manifests.key_id(key)] = key
        self._offers: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(maxsize=1)
        self._revocations: deque[tuple[str, dict[str, Any]]] = deque(maxlen=16)
        self._busy = threading.Event()
        self._cancel = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="updater", daemon=True)
        self._running: str | None = None
        self.state = load_state(directory)

    # ---- start-up -----------------------------------------------------------------------------

    def active_model(self) -> Path:
        """The model file of the active slot, or the factory model."""
        return self._model_of(self.state)

    def started(self) -> None:
        """The agent is up with the active model: confirm a pending switch."""
        if self.state.pending is not None:
            fault_point("commit")
            pending = self.state.pending
            self.state = replace(self.state, pending=None)
            save_state(self._dir, self.state)
            self._report(
                UpdateReport(
                    pending.offer,
                    UpdatePhase.INSTALLED,
                    release=pending.release,
                    version=pending.version,
                )
            )
        for earlier in self.state.reports:  # results reached while nobody could be told
            self._report(UpdateReport(**{**earlier, "state": UpdatePhase(earlier["state"])}))
        if self.state.reports:
            self.state = replace(self.state, reports=[])
            save_state(self._dir, self.state)

    @property
    def installed_version(self) -> str | None:
        """The installed release's display version (None for the factory model)."""
        return self.state.version

    # ---- commands (any thread; never blocking) ------------------------------------------

    def start(self) -> None:
        """Clean up what an interrupted update left, then start the worker thread."""
        self._clean_up()
        self._thread.start()

    def _clean_up(self) -> None:
        """Slots neither active nor previous (an install that never switched) and temporary
        state files go; staged downloads stay a while, so offering the release again resumes
        them, but not for ever (STAGING_MAX_AGE, STAGING_MAX_FILES)."""
        for leftover in self._dir.glob("*.partial"):
            leftover.unlink(missing_ok=True)
        staged = sorted(
            (p for p in (self._dir / "staging").glob("*") if p.is_file()),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        now = time.time()
        for rank, path in enumerate(staged):
            if rank >= STAGING_MAX_FILES or now - path.stat().st_mtime > STAGING_MAX_AGE:
                _LOGGER.info("Removing the staged download %s of a release never installed", path)
                path.unlink(missing_ok=True)
        keep = {self.state.active, self.state.previous}
        slots = self._dir / "slots"
        for slot in slots.iterdir() if slots.is_dir() else ():
            if slot.name not in keep:
                _LOGGER.info("Removing the unused slot %s", slot)
                shutil.rmtree(slot, ignore_errors=True)

    def stop(self) -> None:
        """Stop: an update in progress is cancelled (what was downloaded stays for a resume)."""
        self._stopping.set()
        self._cancel.set()
        self._thread.join(timeout=10)

    def command(self, offer_id: str, body: dict[str, Any]) -> None:
        """An offer, `{"cancel": true}`, `{"rollback": true}` or `{"revocation": {...}}`."""
        if body.get("cancel") is True:
            if self._busy.is_set():
                self._cancel.set()
            return
        if "revocation" in body:  # never refused as busy: it waits for the update under way
            self._revocations.append((offer_id, body))
            return
        if offer_id == self._running:
            _LOGGER.info("Offer %s is already being carried out (delivered again)", offer_id)
            return
        if self._busy.is_set():
            self._report(UpdateReport(offer_id, UpdatePhase.BUSY, reason="already_in_progress"))
            return
        try:
            self._offers.put_nowait((offer_id, body))
        except queue.Full:
            self._report(UpdateReport(offer_id, UpdatePhase.BUSY, reason="already_in_progress"))

    # ---- the worker -------------------------------------------------------------------------

    def _run_blocking(self) -> None:
        while not self._stopping.is_set():
            try:
                offer_id, body = self._revocations.popleft()
            except IndexError:
                try:
                    offer_id, body = self._offers.get(timeout=0.2)
                except queue.Empty:
                    continue
            self._busy.set()
            self._running = offer_id
            self._cancel.clear()
            try:
                if body.get("rollback") is True:
                    self._rollback_blocking(offer_id)
                elif "revocation" in body:
                    self._revoke_blocking(offer_id, body["revocation"])
                else:
                    self._update_blocking(offer_id, body)
            except _Cancelled:
                self._report(UpdateReport(offer_id, UpdatePhase.CANCELLED))
            except UpdateError as err:
                _LOGGER.error("Update %s failed: %s", offer_id, err)
                self._report(
                    UpdateReport(offer_id, UpdatePhase.FAILED, reason=err.reason, detail=err.detail)
                )
            except Exception as err:
                _LOGGER.exception("Update %s failed", offer_id)
                self._report(
                    UpdateReport(offer_id, UpdatePhase.FAILED, reason="internal", detail=str(err))
                )
            finally:
                self._running = None
                self._busy.clear()  # before the result goes out: its reader may command again
                finals, self._finals = self._finals, []
                for report in finals:
                    self._send(report)

    def _report(self, report: UpdateReport) -> None:
        """Report progress at once; the result of the job under way once it is over."""
        if report.offer == self._running and report.state in FINAL_PHASES:
            self._finals.append(report)
        else:
            self._send(report)

    def _update_blocking(self, offer_id: str, body: dict[str, Any]) -> None:
        self._report(UpdateReport(offer_id, UpdatePhase.VERIFYING))
        release = self._verified(body)
        if self.state.revoked(release.release):
            raise UpdateError("revoked", f"release {release.release} was revoked")
        refusal = manifests.admissible(
            release, datetime.now(UTC), self.state.release, self._config.device_class, "default"
        )
        if refusal is not None and refusal.reason == "already_installed":
            self._report(
                UpdateReport(offer_id, UpdatePhase.ALREADY_INSTALLED, release=release.release)
            )
            return
        if refusal is not None:
            raise UpdateError(refusal.reason, refusal.detail)
        base = body.get("base_url")
        if not isinstance(base, str) or urllib.parse.urlsplit(base).scheme not in ("http", "https"):
            raise UpdateError("malformed", "base_url: expected an http(s) URL")
        staged = self._download_blocking(offer_id, release, base)
        fault_point("verify")
        slot = self._install_blocking(offer_id, release, staged)
        candidate = self._check_blocking(offer_id, release, slot)
        self._switch_blocking(offer_id, release, slot, candidate)

    def _verified(self, body: dict[str, Any]) -> Manifest:
        if not self._trusted:
            raise UpdateError("no_trusted_keys", "ota.trusted_keys is empty")
        envelope = body.get("manifest")
        if isinstance(envelope, dict):
            data = json.dumps(envelope).encode()
        elif isinstance(body.get("manifest_url"), str):
            url = str(body["manifest_url"])
            if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
                raise UpdateError("malformed", "manifest_url: expected an http(s) URL")
            data = self._fetch_small(url)
        else:
            raise UpdateError("malformed", "expected `manifest` or `manifest_url`")
        checked = manifests.verify(data, self._trusted)
        if isinstance(checked, Refusal):
            raise UpdateError(checked.reason, checked.detail)
        return checked

    def _fetch_small(self, url: str) -> bytes:
        try:
            return fetch_bytes(
                url,
                max_bytes=manifests.MAX_ENVELOPE_BYTES + 1,
                timeout=self._config.download_timeout,
                stall_timeout=self._config.download_timeout,
                cancel=self._cancel,
            )
        except FetchError as err:
            if err.reason == FetchReason.CANCELLED:
                raise _Cancelled from None
            raise UpdateError("download_failed", f"manifest: {err.reason}: {err.detail}") from None

    # ---- download -----------------------------------------------------------------------------

    def _download_blocking(self, offer_id: str, release: Manifest, base: str) -> dict[str, Path]:
        staging = self._dir / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(staging).free
        if free < release.total_bytes + _SPARE_BYTES:
            raise UpdateError("no_space", f"{free} bytes free, {release.total_bytes} needed")
        done = 0
        reported = [-1]  # the last percent reported
        staged: dict[str, Path] = {}
        for entry in release.files:
            url = urllib.parse.urljoin(base if base.endswith("/") else base + "/", entry.path)

            def progress(got: int, before: int = done) -> None:
                percent = int(100 * (before + got) / max(release.total_bytes, 1))
                if percent == reported[0]:
                    return  # at most one report per percent, however small the reads
                reported[0] = percent
                self._report(
                    UpdateReport(
                        offer_id,
                        UpdatePhase.DOWNLOADING,
                        progress=percent,
                        release=release.release,
                        version=release.version,
                        notes=release.notes,
                    )
                )

            staged[entry.path] = self._fetch_file_blocking(url, staging, entry, progress)
            done += entry.length
        return staged

    def _fetch_file_blocking(
        self, url: str, staging: Path, entry: FileEntry, progress: Callable[[int], None]
    ) -> Path:
        final = staging / entry.sha256
        if final.is_file() and _sha256_of(final) == entry.sha256:
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
                    self._fetch_part(url, part, entry, progress)
        except FetchError as err:
            if err.reason == FetchReason.CANCELLED:
                raise _Cancelled from None
            if err.reason == FetchReason.RANGE_UNSUPPORTED:
                raise UpdateError("no_range_support", err.detail) from None
            if err.reason == FetchReason.TOO_LARGE:  # it says it is longer than the manifest
                raise UpdateError("checksum_mismatch", f"{entry.path}: {err.detail}") from None
            raise UpdateError("download_failed", f"{err.reason}: {err.detail}") from None
        if _sha256_of(part) != entry.sha256:
            part.unlink(missing_ok=True)
            raise UpdateError(
                "checksum_mismatch", f"{entry.path}: sha256 differs from the manifest"
            )
        os.replace(part, final)
        return final

    def _fetch_part(
        self, url: str, part: Path, entry: FileEntry, progress: Callable[[int], None]
    ) -> None:
        """Fetch the rest of one file into its `.part` (resumed from what is there), never past
        the manifest's length, within `ota.download_deadline`; a cancel is seen within a
        second, even from a server that sends a byte now and then."""
        have = part.stat().st_size if part.is_file() else 0
        if have > entry.length:
            part.unlink()
            have = 0
        if have == entry.length:
            return  # complete before a restart: only its hash is left to check
        got = [have]

        with part.open("ab") as out:

            def write(block: bytes) -> None:
                out.write(block)
                got[0] += len(block)
                progress(got[0])

            fault_point("download")
            try:
                fetch(
                    url,
                    write,
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

    def _sleep(self, seconds: float) -> None:
        if self._cancel.wait(seconds):
            raise _Cancelled

    # ---- install, check, switch -----------------------------------------------------------------

    def _install_blocking(self, offer_id: str, release: Manifest, staged: dict[str, Path]) -> str:
        self._report(UpdateReport(offer_id, UpdatePhase.INSTALLING, release=release.release))
        slot = "b" if self.state.active == "a" else "a"
        if self.state.previous == slot:  # about to be overwritten: no longer a rollback target
            self.state = without_previous(self.state)
            save_state(self._dir, self.state)
        target = self._dir / "slots" / slot
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name, source in staged.items():
            os.link(source, target / name)
        _fsync_dir(target)
        fault_point("install")
        return slot

    def _check_blocking(self, offer_id: str, release: Manifest, slot: str) -> M:
        self._report(UpdateReport(offer_id, UpdatePhase.CHECKING, release=release.release))
        if self._cancel.is_set():
            raise _Cancelled
        model = self._dir / "slots" / slot / release.model.path
        fault_point("healthcheck")
        command = [sys.executable, "-m", "agent.healthcheck", str(model), "--rate", str(self._rate)]
        command += ["--reference", str(self.active_model()), "--threads", str(self._threads)]
        command += ["--memory-mb", str(self._config.health_memory_mb)]  # it limits itself
        if self._cache_dir is not None:
            command += ["--cache-dir", str(self._cache_dir)]
        returncode, stdout, stderr = self._run_check(command)
        verdict = _last_json(stdout)
        if returncode != 0 or not verdict.get("ok"):
            problems = verdict.get("problems") or [_exit_reason(returncode, stderr)]
            raise UpdateError("health_check", "; ".join(str(p) for p in problems)[:300])
        if self._cancel.is_set():
            raise _Cancelled
        return self._load(model)  # as a start loads it: from the parts the check left in the cache

    def _run_check(self, command: list[str]) -> tuple[int, str, str]:
        """Run the health check in a process group of its own; a timeout, a cancel or a stop
        kills the group (the check and the build processes it started)."""
        deadline = time.monotonic() + self._config.health_timeout
        environment = {**CHECK_ENVIRONMENT, **os.environ}
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            start_new_session=True,
        ) as child:
            while True:
                try:
                    stdout, stderr = child.communicate(timeout=0.25)
                    return child.returncode, stdout, stderr
                except subprocess.TimeoutExpired as err:
                    cancelled, late = self._cancel.is_set(), time.monotonic() > deadline
                    if not (cancelled or late):
                        continue
                    os.killpg(child.pid, signal.SIGKILL)  # not reaped yet: the group is its own
                    child.communicate()
                    if cancelled:
                        raise _Cancelled from err
                    raise UpdateError(
                        "health_check", f"no answer in {self._config.health_timeout:g} s"
                    ) from err

    def _switch_blocking(self, offer_id: str, release: Manifest, slot: str, voice: M) -> None:
        if self.state.revoked(release.release):  # a revocation came while it was downloaded
            raise UpdateError("revoked", f"release {release.release} was revoked")
        self._report(UpdateReport(offer_id, UpdatePhase.SWITCHING, release=release.release))
        old = self.state
        new = replace(
            old,
            release=release.release,
            version=release.version,
            active=slot,
            model=release.model.path,
            previous=old.active,
            previous_release=old.release,
            previous_version=old.version,
            previous_model=old.model,
            model_sha256=release.model.sha256,
            previous_model_sha256=old.model_sha256,
            pending=Pending(slot, release.release, release.version, offer=offer_id),
        )
        fault_point("switch")
        save_state(self._dir, new)  # the pointer: from here a restart starts with the new model
        self.state = new
        if not self._swap(voice):  # in this process, between two announcements
            self.state = rolled_back(
                self.state, "the running agent could not switch", keep_other=False
            )
            save_state(self._dir, self.state)
            raise UpdateError("switch_failed", "the running agent could not take the new model")
        fault_point("commit")
        self.state = replace(self.state, pending=None)  # confirmed: this process speaks with it
        save_state(self._dir, self.state)
        self._report(
            UpdateReport(
                offer_id, UpdatePhase.INSTALLED, release=release.release, version=release.version
            )
        )
        self._clean_staging(release)

    def _rollback_blocking(self, offer_id: str) -> None:
        if self.state.previous is None and self.state.active is None:
            raise UpdateError("nothing_to_roll_back", "the factory model is active")
        fault_point("rollback")
        target = rolled_back(self.state, "rollback requested")
        model = self._model_of(target)
        try:  # loaded first: the pointer moves only to a model that loads
            voice = self._load(model)
        except Exception as err:
            raise UpdateError("switch_failed", f"the previous model does not load: {err}") from err
        self.state = target
        save_state(self._dir, self.state)
        if not self._swap(voice):
            raise UpdateError("switch_failed", "the running agent could not take the model")
        self._report(
            UpdateReport(
                offer_id,
                UpdatePhase.ROLLED_BACK,
                release=self.state.release,
                version=self.state.version,
            )
        )

    def _revoke_blocking(self, offer_id: str, envelope: object) -> None:
        """A signed revocation: kept if newer than the one known; the active release, if it
        is revoked, is left at once for the previous one (if not revoked too) or the configured
        model."""
        if not self._trusted:
            raise UpdateError("no_trusted_keys", "ota.trusted_keys is empty")
        if not isinstance(envelope, dict):
            raise UpdateError("malformed", "revocation: expected a signed envelope")
        revocation = manifests.verify_revocation(json.dumps(envelope).encode(), self._trusted)
        if isinstance(revocation, Refusal):
            raise UpdateError(revocation.reason, revocation.detail)
        if revocation.device_class != self._config.device_class:
            raise UpdateError("wrong_target", f"for {revocation.device_class}")
        known = self.state.revocation
        if known is not None and revocation.issued.isoformat() <= str(known["issued"]):
            _LOGGER.debug("Revocation %s is not newer than the one kept", offer_id)
            return  # the retained one, read again at every connect
        stored = {
            "issued": revocation.issued.isoformat(),
            "min_release": revocation.min_release,
            "revoked": sorted(revocation.revoked),
        }
        self.state = replace(self.state, revocation=stored)
        save_state(self._dir, self.state)
        if not self.state.revoked(self.state.release):
            self._report(UpdateReport(offer_id, UpdatePhase.NOTED, release=self.state.release))
            return
        revoked = self.state.release
        target = rolled_back(self.state, f"release {revoked} revoked", keep_other=False)
        if self.state.previous is None or _unusable(self._dir, target) is not None:
            target = without_previous(
                replace(
                    self.state, release=0, version=None, active=None, model=None, model_sha256=None
                )
            )
        voice = self._load(self._model_of(target))  # loaded first, as a rollback does
        self.state = target
        save_state(self._dir, self.state)
        if not self._swap(voice):
            raise UpdateError("switch_failed", "the running agent could not take the model")
        self._report(
            UpdateReport(
                offer_id, UpdatePhase.ROLLED_BACK, reason="revoked", release=self.state.release
            )
        )

    def _model_of(self, state: UpdateState) -> Path:
        if state.active is None or state.model is None:
            return self._factory
        return self._dir / "slots" / state.active / state.model

    def _clean_staging(self, release: Manifest) -> None:
        for entry in release.files:
            (self._dir / "staging" / entry.sha256).unlink(missing_ok=True)


# ---- helpers ------------------------------------------------------------------------------------


def start_model(config: OtaConfig, directory: Path, factory: Path) -> Path:
    """At start, before the voices load: the model to start with. A switch not yet confirmed
    counts this start; after `max_start_attempts` starts it is rolled back. The active slot's
    model is checked against its digest and the stored revocation: a damaged or revoked one is
    left for the previous verified slot, or the configured model (`rolled_back`, reason
    `damaged` or `revoked`)."""
    state = load_state(directory)
    if state.pending is not None:
        state.pending.attempts += 1
        if state.pending.attempts > config.max_start_attempts:
            failed = state.pending
            state = rolled_back(
                state,
                f"{failed.attempts - 1} starts with release {failed.release}",
                keep_other=False,
            )
            report = UpdateReport(
                failed.offer, UpdatePhase.ROLLED_BACK, reason="start_failed", release=failed.release
            )
            state.reports.append(asdict(report))
        save_state(directory, state)
    problem = _unusable(directory, state)
    if problem is not None:
        reason, detail = problem
        state = _fallen_back(directory, state, reason, detail)
    if state.active is None or state.model is None:
        return factory
    return directory / "slots" / state.active / state.model


def fall_back(directory: Path, factory: Path, detail: str) -> Path:
    """The active slot's model did not load: leave it as `damaged` (see `start_model`); the
    model to load instead."""
    state = _fallen_back(directory, load_state(directory), "damaged", detail)
    if state.active is None or state.model is None:
        return factory
    return directory / "slots" / state.active / state.model


def _unusable(directory: Path, state: UpdateState) -> tuple[str, str] | None:
    """Why the active slot cannot be used, if it cannot (reason, detail)."""
    if state.active is None or state.model is None:
        return None
    if state.revoked(state.release):
        return "revoked", f"release {state.release} was revoked"
    model = directory / "slots" / state.active / state.model
    if not model.is_file():
        return "damaged", f"{model.name} is missing"
    if state.model_sha256 is not None and _sha256_of(model) != state.model_sha256:
        return "damaged", f"{model.name} no longer has the digest it was installed with"
    return None


def _fallen_back(directory: Path, state: UpdateState, reason: str, detail: str) -> UpdateState:
    """The state moved off an unusable active slot: to the previous one if that one is usable
    (never back), else to the configured model; the report kept for after the start."""
    _LOGGER.error("Release %d cannot be used (%s): %s", state.release, reason, detail)
    failed = state.release
    offer = state.pending.offer if state.pending is not None else "start"
    back = rolled_back(state, detail, keep_other=False) if state.previous is not None else None
    if back is None or _unusable(directory, back) is not None:
        back = without_previous(
            replace(state, release=0, version=None, active=None, model=None, model_sha256=None)
        )
    back.reports.append(
        asdict(
            UpdateReport(
                offer, UpdatePhase.ROLLED_BACK, reason=reason, detail=detail, release=failed
            )
        )
    )
    save_state(directory, back)
    return back


def rolled_back(state: UpdateState, why: str, *, keep_other: bool = True) -> UpdateState:
    """The state with the previous slot active again. With `keep_other` the slot left becomes
    the previous one (a second rollback returns to it); without, it is no rollback target (it
    was never confirmed: failed starts, a refused switch)."""
    _LOGGER.warning("Rolling back to release %d: %s", state.previous_release, why)
    back = replace(
        state,
        release=state.previous_release,
        version=state.previous_version,
        active=state.previous,
        model=state.previous_model,
        model_sha256=state.previous_model_sha256,
        previous=state.active,
        previous_release=state.release,
        previous_version=state.version,
        previous_model=state.model,
        previous_model_sha256=state.model_sha256,
        pending=None,
    )
    return back if keep_other else without_previous(back)


def without_previous(state: UpdateState) -> UpdateState:
    """The state with no rollback target."""
    return replace(
        state,
        previous=None,
        previous_release=0,
        previous_version=None,
        previous_model=None,
        previous_model_sha256=None,
    )


def load_state(directory: Path) -> UpdateState:
    """The persisted state (a fresh one when there is none)."""
    path = directory / "state.json"
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        pending = body.pop("pending", None)
        known = {f.name for f in fields(UpdateState)}
        body = {k: v for k, v in body.items() if k in known}  # a newer version's keys go
        return UpdateState(**body, pending=Pending(**pending) if pending else None)
    except FileNotFoundError:
        return UpdateState()
    except (ValueError, TypeError) as err:  # written atomically, so only by hand or a bad disk
        _LOGGER.error("%s is unreadable (%s): starting with the factory model", path, err)
        return UpdateState()


def save_state(directory: Path, state: UpdateState) -> None:
    """Write the state atomically and durably: temporary file, fsync, rename, fsync of the dir."""
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".partial")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(asdict(state), out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / "state.json")
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256_of(path: Path) -> str:
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


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


def _worth_retrying(err: BaseException) -> bool:
    if isinstance(err, FetchError):
        server_error = err.reason == FetchReason.HTTP_ERROR and (err.status or 0) >= 500
        return err.reason in _RETRIED or server_error
    return isinstance(err, OSError)


def _exit_reason(code: int, stderr: str) -> str:
    """Why the health check process ended without a verdict: its signal or its last words."""
    if code < 0:
        return f"the check process was killed by {signal.Signals(-code).name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"the check process failed (exit code {code}): {lines[-1] if lines else 'no output'}"


def _last_json(text: str) -> Mapping[str, Any]:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}
