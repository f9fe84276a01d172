"""Protocol states shared by the agent and the operator's tools: what an update reports, what the
journal holds of an announcement, which kind of Hermes request a reply answers. Pure data.

The operator's tools (`ota/`) import this module, not the updater, so they never load ONNX
Runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final


class UpdatePhase(StrEnum):
    """The `state` of an `update` event (a model update's progress or result)."""

    VERIFYING = "verifying"
    DOWNLOADING = "downloading"
    INSTALLING = "installing"
    CHECKING = "checking"
    SWITCHING = "switching"
    INSTALLED = "installed"
    FAILED = "failed"
    ALREADY_INSTALLED = "already_installed"
    CANCELLED = "cancelled"
    BUSY = "busy"
    ROLLED_BACK = "rolled_back"
    NOTED = "noted"
    """A revocation was verified and kept; nothing had to change."""


RUNNING_PHASES: Final = frozenset(
    {
        UpdatePhase.VERIFYING,
        UpdatePhase.DOWNLOADING,
        UpdatePhase.INSTALLING,
        UpdatePhase.CHECKING,
        UpdatePhase.SWITCHING,
    }
)
"""Phases of an update still under way."""
FINAL_PHASES: Final = frozenset(set(UpdatePhase) - RUNNING_PHASES)
"""Phases after which an offer or command is over."""
GOOD_PHASES: Final = frozenset({UpdatePhase.INSTALLED, UpdatePhase.ALREADY_INSTALLED})
"""Final phases that leave a node on the offered release."""


class EntryState(StrEnum):
    """Where an accepted announcement stands in the journal."""

    QUEUED = "queued"
    STARTED = "started"
    ENDED = "ended"


class HermesKind(StrEnum):
    """What a Hermes request was: its reply topics depend on it."""

    SAY = "say"
    PLAY = "play"


@dataclass(frozen=True, slots=True)
class UpdateReport:
    """Progress or result of an update, for the events and Home Assistant's update entity."""

    offer: str
    """The id of the offer or command it is about."""
    state: UpdatePhase
    progress: int | None = None
    """Percent downloaded, while downloading."""
    reason: str | None = None
    """Why it failed, was refused or rolled back."""
    detail: str = ""
    release: int | None = None
    version: str | None = None
    notes: str | None = None
    """The manifest's release notes (for Home Assistant's update entity, not the events)."""
