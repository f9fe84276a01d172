"""The model a start begins with, chosen from the update slots before the voices load.

A switch not yet confirmed by a successful start counts this start, and is rolled back after
`ota.max_start_attempts`. The active slot is used only if its release is not revoked and its
files still have the digests they were installed with (opened through `update_store`, never
following a link); else the previous slot if that one checks out, else the configured model.
Nothing in the update directory stops a start. The update worker (`updater`) reads the state
recovered here.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from agent.core.states import UpdatePhase, UpdateReason, UpdateReport
from agent.settings.declarations import OtaConfig
from agent.updates import update_store as store
from agent.updates.update_store import (
    UpdateState,
    on_factory,
    rolled_back,
    save_state,
    slot_problem,
)

_LOGGER = logging.getLogger(__name__)


def start_model(config: OtaConfig, directory: Path, factory: Path) -> Path:
    """At start, before the voices load: the model to start with. A switch not yet confirmed
    counts this start; after `max_start_attempts` starts it is rolled back. The active slot is
    checked against the stored revocation and its files against their recorded digests
    (without following a link): a revoked or damaged one is left for the previous slot if that
    one checks out, else the configured model (`rolled_back`, reason `revoked` or `damaged`).
    Nothing in the update directory stops a start: an unusable state is set aside (the
    configured model, `rolled_back`, `state_damaged`), a disk that refuses to save it starts the
    configured model."""
    try:
        state = _chosen_at_start(config, directory)
    except Exception:  # never a failed start: the configured model speaks
        _LOGGER.exception("The update state cannot be used: starting the configured model")
        return factory
    return _path_of(directory, factory, state)


def _chosen_at_start(config: OtaConfig, directory: Path) -> UpdateState:
    state = recovered_state(directory)
    if state.pending is not None:
        state.pending.attempts += 1
        if state.pending.attempts > config.max_start_attempts:
            failed = state.pending
            _LOGGER.warning(
                "Back to release %d: %d starts with release %d",
                state.previous_release,
                failed.attempts - 1,
                failed.release,
            )
            state = rolled_back(state, keep_other=False)
            report = UpdateReport(
                failed.offer,
                UpdatePhase.ROLLED_BACK,
                reason=UpdateReason.START_FAILED,
                release=failed.release,
            )
            state.reports.append(asdict(report))
        save_state(directory, state)
    problem = slot_problem(directory, state)
    if problem is not None:
        state = _fallen_back(directory, state, problem.reason, problem.detail)
    return state


def fall_back(directory: Path, factory: Path, detail: str) -> Path:
    """The active slot's model did not load: leave it as `damaged` (see `start_model`); the
    model to load instead."""
    try:
        state = _fallen_back(directory, recovered_state(directory), "damaged", detail)
    except Exception:  # never a failed start: the configured model speaks
        _LOGGER.exception("The update state cannot be used: starting the configured model")
        return factory
    return _path_of(directory, factory, state)


def _path_of(directory: Path, factory: Path, state: UpdateState) -> Path:
    if state.active is None or state.model is None:
        return factory
    return directory / "slots" / state.active / state.model


def recovered_state(directory: Path) -> UpdateState:
    """The persisted state, as `update_store.read_state` validates it: an unusable one is set
    aside for the configured model (`rolled_back`, `state_damaged`), an unusable rollback
    target or result dropped (`noted`, `state_damaged`); said in a result kept for after the
    start, and saved."""
    found = store.read_state(directory)
    if found.unusable is None and not found.set_aside:
        return found.state
    state = found.state
    if found.unusable is not None:
        _LOGGER.error("%s: set aside, the configured model speaks", found.unusable)
        store.set_aside(directory)
        phase, detail = UpdatePhase.ROLLED_BACK, f"{found.unusable}; set aside"
    else:
        what = "; ".join(found.set_aside)
        _LOGGER.error("%s: set aside %s", store.STATE_FILE, what)
        phase, detail = UpdatePhase.NOTED, f"{store.STATE_FILE}: set aside {what}"
    report = UpdateReport("start", phase, reason=UpdateReason.STATE_DAMAGED, detail=detail[:300])
    state.reports.append(asdict(report))
    try:
        save_state(directory, state)
    except OSError as err:
        _LOGGER.error("The update state could not be saved: %s", err)
    return state


def _fallen_back(directory: Path, state: UpdateState, reason: str, detail: str) -> UpdateState:
    """The state moved off an unusable active slot: to the previous one if that one is usable
    (never back), else to the configured model; the report kept for after the start."""
    _LOGGER.error("Release %d cannot be used (%s): %s", state.release, reason, detail)
    failed = state.release
    offer = state.pending.offer if state.pending is not None else "start"
    back = on_factory(state)
    if state.previous is not None:
        candidate = rolled_back(state, keep_other=False)
        problem = slot_problem(directory, candidate)
        if problem is None:
            back = candidate
        else:
            detail += f"; not release {candidate.release}: {problem.detail}"
    _LOGGER.warning("Starting release %d instead", back.release)
    back.reports.append(
        asdict(
            UpdateReport(
                offer, UpdatePhase.ROLLED_BACK, reason=reason, detail=detail[:300], release=failed
            )
        )
    )
    save_state(directory, back)
    return back
