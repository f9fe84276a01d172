"""A rollout's plan and progress as a JSON file, written atomically (temp file, fsync, rename,
fsync of the folder), so a rollout outlives the operator's process or machine; and its control
file (`<state file>.control`), through which `rollout-control` pauses, resumes or aborts it.

Only the running rollout writes the state file; `rollout-control` writes only the control file,
so the two never race. What a node was offered is recorded *before* the offer is published.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

FORMAT: Final = 1
CONTROL_COMMANDS: Final = ("pause", "resume", "abort")


class Step:
    """Where a node stands in its wave (`NodeProgress.step`)."""

    PLANNED: Final = "planned"
    OFFLINE: Final = "offline"
    """Offline or unknown when its wave began: not offered."""
    OFFERING: Final = "offering"
    """Recorded, publication not yet acknowledged by the broker."""
    OFFERED: Final = "offered"
    ANSWERED: Final = "answered"
    NO_ANSWER: Final = "no_answer"


class Status:
    """The rollout's status (`Rollout.status`)."""

    RUNNING: Final = "running"
    PAUSED: Final = "paused"
    HALTED: Final = "halted"
    ABORTED: Final = "aborted"
    DONE: Final = "done"
    ENDED: Final = frozenset({HALTED, ABORTED, DONE})


@dataclass
class NodeProgress:
    """One node of the rollout."""

    wave: int
    step: str = Step.PLANNED
    offered_at: float | None = None
    first_event_at: float | None = None
    answered_at: float | None = None
    state: str | None = None
    """The final update state."""
    reason: str | None = None
    detail: str | None = None
    presence: str | None = None
    """Its presence when it was found offline, or when it timed out."""
    rollback: str | None = None
    """The rollback command: `sending`, `sent`, then the node's final state."""
    rollback_at: float | None = None


@dataclass
class Wave:
    """One wave: its nodes, the offer id they get, when it ran, how it ended."""

    index: int
    nodes: list[str]
    offer_id: str
    started_at: float | None = None
    offered_at: float | None = None
    ended_at: float | None = None
    soak_until: float | None = None
    outcome: str | None = None
    """passed, halted, aborted."""
    halt_reason: str | None = None
    rollback_id: str | None = None


@dataclass
class Rollout:
    """Everything a rollout needs to continue after its process died."""

    id: str
    created_at: float
    broker: dict[str, Any]
    """host, port, prefix (no credentials: they are given again on --resume)."""
    release: int
    version: str
    model_sha256: str
    envelope: str
    base_url: str
    target: str
    waves_spec: str
    success_threshold: float
    error_threshold: float
    soak_s: float
    node_timeout_s: float
    rollback_on_halt: bool
    session_expiry_s: int
    waves: list[Wave]
    nodes: dict[str, NodeProgress]
    status: str = Status.RUNNING
    halt_reason: str | None = None
    finished_at: float | None = None
    control: str | None = None
    """The last control command acted on."""
    control_at: float | None = None
    resumed_at: list[float] = field(default_factory=list)
    timeline: list[tuple[float, str, str]] = field(default_factory=list)
    """(time, node, what): offers, final answers, timeouts, rollbacks, for the report."""
    format: int = FORMAT

    @property
    def client_id(self) -> str:
        """The MQTT client id of the rollout's persistent session."""
        return f"ota-rollout-{self.id}"

    def note(self, node: str, what: str, at: float | None = None) -> None:
        """Add to the timeline."""
        self.timeline.append((at if at is not None else time.time(), node, what))


def save(path: Path, rollout: Rollout) -> None:
    """Write atomically: a crash leaves either the old file or the new one, never half."""
    data = json.dumps(asdict(rollout), separators=(",", ":")).encode()
    _atomic_write(path, data)


def _atomic_write(path: Path, data: bytes) -> None:
    directory = path.resolve().parent
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    folder = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def load(path: Path) -> Rollout:
    """Read a state file; ValueError with the reason when it is not one."""
    try:
        raw = json.loads(path.read_bytes())
    except OSError as err:
        raise ValueError(f"{path}: {err.strerror}") from None
    except ValueError:
        raise ValueError(f"{path}: not JSON (not a rollout state file)") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: not a rollout state file of format {FORMAT}")
    try:
        raw["waves"] = [Wave(**w) for w in raw["waves"]]
        raw["nodes"] = {n: NodeProgress(**p) for n, p in raw["nodes"].items()}
        raw["timeline"] = [tuple(t) for t in raw["timeline"]]
        return Rollout(**raw)
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: damaged rollout state ({err})") from None


def control_path(state_path: Path) -> Path:
    """Where `rollout-control` writes its command for the rollout of this state file."""
    return state_path.with_name(state_path.name + ".control")


def write_control(state_path: Path, command: str) -> None:
    """Ask the running (or next resumed) rollout to pause, resume or abort."""
    if command not in CONTROL_COMMANDS:
        raise ValueError(f"unknown control command {command!r} ({', '.join(CONTROL_COMMANDS)})")
    body = {"command": command, "at": time.time()}
    _atomic_write(control_path(state_path), json.dumps(body).encode())


def read_control(state_path: Path) -> tuple[str, float] | None:
    """The pending control command and when it was given, if any."""
    try:
        raw = json.loads(control_path(state_path).read_bytes())
    except (OSError, ValueError):
        return None
    command, at = raw.get("command"), raw.get("at")
    if command in CONTROL_COMMANDS and isinstance(at, int | float):
        return str(command), float(at)
    return None
