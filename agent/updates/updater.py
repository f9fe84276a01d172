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
Every point that picks a model (a start, a rollback, a revocation of the active release, a
model that does not load) picks only a slot whose release is not revoked and whose files still
have the digests they were installed with; the configured model otherwise. Every file below
the OTA directory is opened through `update_store`, which never follows a link. The model
loader is given: the updater never loads ONNX Runtime itself. The model a start begins with is
`model_at_start`'s to choose. Its parts: the trust in offers and revocations
(`release_trust`), the downloads (`downloads`), the health check (`health_check`).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, TypeVar

from agent.core.egress import EgressPolicy
from agent.core.refusal import Refused
from agent.core.states import FINAL_PHASES, UpdatePhase, UpdateReason, UpdateReport
from agent.protocol import manifest as manifests
from agent.protocol.manifest import Manifest
from agent.settings.declarations import OtaConfig
from agent.updates import update_store as store
from agent.updates.clean_up import clean_up
from agent.updates.downloads import Downloads
from agent.updates.health_check import HealthCheck
from agent.updates.model_at_start import recovered_state
from agent.updates.release_trust import ReleaseTrust
from agent.updates.steps import Cancelled, fault_point
from agent.updates.update_store import (
    Pending,
    UnsafeFileError,
    UpdateState,
    on_factory,
    rolled_back,
    save_state,
    slot_problem,
    without_previous,
)

_LOGGER = logging.getLogger(__name__)
M = TypeVar("M")
"""A loaded model, as the agent's loader makes it (the updater only hands it over)."""


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
        self._hosts = EgressPolicy.parse(config.hosts, "ota.hosts")
        self._load = load
        self._dir = directory
        self._factory = factory_model
        self._send = report
        self._finals: list[UpdateReport] = []
        self._swap = swap
        self._trust = ReleaseTrust(config, self._hosts)
        self._offers: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue(maxsize=1)
        self._revocations: deque[tuple[str, dict[str, Any]]] = deque(maxlen=16)
        self._busy = threading.Event()
        self._cancel = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run_blocking, name="updater", daemon=True)
        self._running: str | None = None
        self._envelope = b""
        """The signed envelope of the release being installed."""
        self._downloads = Downloads(config, directory, self._hosts, self._cancel)
        self._health = HealthCheck(config, rate, threads, cache_dir, self._cancel)
        """`cache_dir`: the model cache `load` uses: the health check builds the candidate's
        parts there, so `load` finds them (None: the check builds in a temporary directory,
        `load` again)."""
        self.state = recovered_state(directory)

    # ---- start-up -----------------------------------------------------------------------------

    def active_model(self) -> Path:
        """The model file of the active slot, or the factory model."""
        return self._model_of(self.state)

    def started(self) -> None:
        """The agent is up with the active model: confirm a pending switch; deliver the
        results kept for after the start. The state is read again first: the voices load
        after the updater is made, and a model that did not load was left meanwhile
        (`model_at_start.fall_back` wrote the state; this updater had not written it yet)."""
        self.state = recovered_state(self._dir)
        if self.state.pending is not None:
            fault_point("commit")
            pending = self.state.pending
            self.state = replace(self.state, pending=None)
            self._save()
            self._deliver(
                UpdateReport(
                    pending.offer,
                    UpdatePhase.INSTALLED,
                    release=pending.release,
                    version=pending.version,
                )
            )
        for earlier in self.state.reports:  # results reached while nobody could be told
            self._deliver(UpdateReport(**{**earlier, "state": UpdatePhase(earlier["state"])}))
        if self.state.reports:
            self.state = replace(self.state, reports=[])
            self._save()

    def _deliver(self, report: UpdateReport) -> None:
        """Send a job's result and keep it as the last one (only on the updater's own thread,
        or before it starts: the one writer of `state.json`)."""
        kept = {k: v for k, v in asdict(report).items() if k not in {"progress", "notes"}}
        self.state = replace(self.state, last={**kept, "at": time.time()})
        self._save()
        self._send(report)

    def _save(self) -> None:
        """Persist the state at start; a disk that refuses is said, never a failed start."""
        try:
            save_state(self._dir, self.state)
        except OSError as err:
            _LOGGER.error("The update state could not be saved: %s", err)

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
        """What an interrupted update left goes (`clean_up`); a link or a special file where the
        updater keeps its own is removed (never followed) and reported `noted`, `unsafe_file`."""
        for what in clean_up(self._dir, self.state):
            _LOGGER.error("Removed %s (never followed)", what)
            detail = f"{what}: removed, never followed"
            self._report(
                UpdateReport(
                    "start", UpdatePhase.NOTED, reason=UpdateReason.UNSAFE_FILE, detail=detail
                )
            )

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
            self._report(
                UpdateReport(offer_id, UpdatePhase.BUSY, reason=UpdateReason.ALREADY_IN_PROGRESS)
            )
            return
        try:
            self._offers.put_nowait((offer_id, body))
        except queue.Full:
            self._report(
                UpdateReport(offer_id, UpdatePhase.BUSY, reason=UpdateReason.ALREADY_IN_PROGRESS)
            )

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
            except Cancelled:
                self._report(UpdateReport(offer_id, UpdatePhase.CANCELLED))
            except UnsafeFileError as err:  # a link planted where the updater keeps its files
                _LOGGER.error("Update %s refused a file: %s", offer_id, err.strerror)
                self._report(
                    UpdateReport(
                        offer_id,
                        UpdatePhase.FAILED,
                        reason=UpdateReason.UNSAFE_FILE,
                        detail=str(err.strerror),
                    )
                )
            except Refused as err:  # refused or failed, and said so in its event
                _LOGGER.warning("Update %s failed: %s", offer_id, err)
                self._report(
                    UpdateReport(offer_id, UpdatePhase.FAILED, reason=err.reason, detail=err.detail)
                )
            except Exception as err:
                _LOGGER.exception("Update %s failed", offer_id)
                self._report(
                    UpdateReport(
                        offer_id, UpdatePhase.FAILED, reason=UpdateReason.INTERNAL, detail=str(err)
                    )
                )
            finally:
                self._running = None
                self._busy.clear()  # before the result goes out: its reader may command again
                finals, self._finals = self._finals, []
                for report in finals:
                    self._deliver(report)

    def _report(self, report: UpdateReport) -> None:
        """Report progress at once; the result of the job under way once it is over."""
        if report.offer == self._running and report.state in FINAL_PHASES:
            self._finals.append(report)
        else:
            self._send(report)

    def _update_blocking(self, offer_id: str, body: dict[str, Any]) -> None:
        self._report(UpdateReport(offer_id, UpdatePhase.VERIFYING))
        release, self._envelope = self._trust.offer(body, self._downloads)
        if self.state.revoked(release.release):
            raise Refused(UpdateReason.REVOKED, f"release {release.release} was revoked")
        refusal = manifests.admissible(
            release, datetime.now(UTC), self.state.release, self._config.device_class, "default"
        )
        if refusal is not None and refusal.reason == "already_installed":
            self._report(
                UpdateReport(offer_id, UpdatePhase.ALREADY_INSTALLED, release=release.release)
            )
            return
        if refusal is not None:
            raise refusal
        base = body.get("base_url")
        if not isinstance(base, str) or urllib.parse.urlsplit(base).scheme not in ("http", "https"):
            raise Refused(UpdateReason.MALFORMED, "base_url: expected an http(s) URL")
        if (problem := self._hosts.url_problem(base)) is not None:
            raise Refused(UpdateReason.URL_NOT_ALLOWED, f"base_url: {problem}")

        def progress(percent: int) -> None:
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

        staged = self._downloads.release(release, base, progress)
        fault_point("verify")
        slot = self._install_blocking(offer_id, release, staged)
        candidate = self._check_blocking(offer_id, release, slot)
        self._switch_blocking(offer_id, release, slot, candidate)

    # ---- install, check, switch -----------------------------------------------------------------

    def _install_blocking(self, offer_id: str, release: Manifest, staged: dict[str, Path]) -> str:
        self._report(UpdateReport(offer_id, UpdatePhase.INSTALLING, release=release.release))
        slot = "b" if self.state.active == "a" else "a"
        if self.state.previous == slot:  # about to be overwritten: no longer a rollback target
            self.state = without_previous(self.state)
            save_state(self._dir, self.state)
        store.make_directory(self._dir, "slots")
        with (
            store.directory(self._dir, "staging") as staging,
            store.directory(self._dir, "slots") as slots,
        ):
            store.remove(slots, slot)  # what was there, a link included (never followed)
            os.mkdir(slot, 0o755, dir_fd=slots)
            with store.directory(self._dir, "slots", slot) as target:
                for name, source in staged.items():
                    os.link(
                        source.name,
                        name,
                        src_dir_fd=staging,
                        dst_dir_fd=target,
                        follow_symlinks=False,
                    )
                store.write_new(target, store.RELEASE_ENVELOPE, self._envelope)
                os.fsync(target)
            os.fsync(slots)
        fault_point("install")
        return slot

    def _check_blocking(self, offer_id: str, release: Manifest, slot: str) -> M:
        self._report(UpdateReport(offer_id, UpdatePhase.CHECKING, release=release.release))
        if self._cancel.is_set():
            raise Cancelled
        model = self._dir / "slots" / slot / release.model.path
        fault_point("healthcheck")
        self._health.run(model, self.active_model())
        if self._cancel.is_set():
            raise Cancelled
        files = {entry.path: entry.sha256 for entry in release.files}
        problem = store.files_problem(self._dir, slot, files)  # what is loaded is what was verified
        if problem is not None:
            raise Refused(UpdateReason.CHECKSUM_MISMATCH, problem)
        return self._load(model)  # as a start loads it: from the parts the check left in the cache

    def _switch_blocking(self, offer_id: str, release: Manifest, slot: str, voice: M) -> None:
        if self.state.revoked(release.release):  # a revocation came while it was downloaded
            raise Refused(UpdateReason.REVOKED, f"release {release.release} was revoked")
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
            files={entry.path: entry.sha256 for entry in release.files},
            previous_files=old.files,
            pending=Pending(slot, release.release, release.version, offer=offer_id),
        )
        fault_point("switch")
        save_state(self._dir, new)  # the pointer: from here a restart starts with the new model
        self.state = new
        if not self._swap(voice):  # in this process, between two announcements
            _LOGGER.warning("Back to release %d: the agent could not switch", old.release)
            self.state = rolled_back(self.state, keep_other=False)
            save_state(self._dir, self.state)
            raise Refused(
                UpdateReason.SWITCH_FAILED, "the running agent could not take the new model"
            )
        fault_point("commit")
        self.state = replace(self.state, pending=None)  # confirmed: this process speaks with it
        save_state(self._dir, self.state)
        self._report(
            UpdateReport(
                offer_id, UpdatePhase.INSTALLED, release=release.release, version=release.version
            )
        )
        self._downloads.clean(release)

    def _rollback_blocking(self, offer_id: str) -> None:
        """Back to the rollback target: a slot only if its release is not revoked and its files
        still have the digests they were installed with (else refused with `revoked` or
        `damaged`, and the model speaking goes on); the configured model when the slot left
        behind is no target."""
        if self.state.previous is None and self.state.active is None:
            raise Refused(UpdateReason.NOTHING_TO_ROLL_BACK, "the factory model is active")
        fault_point("rollback")
        target = rolled_back(self.state)
        problem = slot_problem(self._dir, target)
        if problem is not None:
            raise Refused(
                problem.reason,
                f"the rollback target, release {target.release}: {problem.detail}; release "
                f"{self.state.release} goes on speaking",
            )
        _LOGGER.warning("Rolling back from release %d to %d", self.state.release, target.release)
        try:  # loaded first: the pointer moves only to a model that loads
            voice = self._load(self._model_of(target))
        except Exception as err:
            raise Refused(
                UpdateReason.SWITCH_FAILED, f"the previous model does not load: {err}"
            ) from err
        self._switch_to(target, voice)
        self._report(
            UpdateReport(
                offer_id,
                UpdatePhase.ROLLED_BACK,
                release=self.state.release,
                version=self.state.version,
            )
        )

    def _switch_to(self, target: UpdateState, voice: M) -> None:
        """Move the pointer to `target` and the running agent to its loaded model; the pointer
        moves back if the agent cannot switch."""
        before = self.state
        self.state = target
        save_state(self._dir, self.state)
        if not self._swap(voice):
            self.state = before
            save_state(self._dir, self.state)
            raise Refused(UpdateReason.SWITCH_FAILED, "the running agent could not take the model")

    def _revoke_blocking(self, offer_id: str, envelope: object) -> None:
        """A signed revocation: kept if newer than the one known; the active release, if it
        is revoked, is left at once for the previous one (if that one is not revoked too, its
        files still have their digests and it loads) or the configured model."""
        revocation = self._trust.revocation(envelope)
        known = self.state.revocation
        if known is not None and revocation.issued <= datetime.fromisoformat(known["issued"]):
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
        detail = f"release {revoked} was revoked"
        target = on_factory(self.state)
        if self.state.previous is not None:
            back = rolled_back(self.state, keep_other=False)
            problem = slot_problem(self._dir, back)
            if problem is None:
                target = back
            else:
                detail += f"; not release {back.release}: {problem.detail}"
        try:  # loaded first, as a rollback does
            voice = self._load(self._model_of(target))
        except Exception as err:
            if target.active is None:
                raise
            _LOGGER.exception("Release %d does not load", target.release)
            detail += f"; not release {target.release}: it does not load ({err})"
            target = on_factory(self.state)
            voice = self._load(self._factory)
        _LOGGER.warning("Leaving the revoked release %d for %d", revoked, target.release)
        self._switch_to(target, voice)
        self._report(
            UpdateReport(
                offer_id,
                UpdatePhase.ROLLED_BACK,
                reason=UpdateReason.REVOKED,
                detail=detail[:300],
                release=self.state.release,
            )
        )

    def _model_of(self, state: UpdateState) -> Path:
        if state.active is None or state.model is None:
            return self._factory
        return self._dir / "slots" / state.active / state.model
