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


class UpdateReason(StrEnum):
    """The `reason` of an `update` event that is not a success: why an offer was refused, why it
    failed, why a node rolled back, or what a start noted (docs/updates.md lists them)."""

    # refused: the offer is not installed
    MALFORMED = "malformed"
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    DOWNGRADE = "downgrade"
    WRONG_TARGET = "wrong_target"
    RELEASE_JUMP = "release_jump"
    REVOKED = "revoked"
    NO_TRUSTED_KEYS = "no_trusted_keys"
    ALREADY_INSTALLED = "already_installed"
    ALREADY_IN_PROGRESS = "already_in_progress"
    URL_NOT_ALLOWED = "url_not_allowed"
    # failed on the way
    DOWNLOAD_FAILED = "download_failed"
    NO_RANGE_SUPPORT = "no_range_support"
    CHECKSUM_MISMATCH = "checksum_mismatch"
    NO_SPACE = "no_space"
    HEALTH_CHECK = "health_check"
    SWITCH_FAILED = "switch_failed"
    NOTHING_TO_ROLL_BACK = "nothing_to_roll_back"
    DAMAGED = "damaged"
    UNSAFE_FILE = "unsafe_file"
    INTERNAL = "internal"
    # rolled back, or noted at start
    START_FAILED = "start_failed"
    STATE_DAMAGED = "state_damaged"


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
