"""What the agent publishes about itself: the retained state JSON, the Home Assistant announce
(discovery) and the update entity's view, and when each is due.

Pure: the app gives it facts and times and publishes what it returns; one thread (the app loop)
calls it. The state is published on every change (gathered for `MIN_INTERVAL`) and at least every
`state.interval` seconds; discovery at every connect and, spread out, after Home Assistant's
birth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Final

from agent.core.messages import Lifecycle, Notify
from agent.core.states import FINAL_PHASES, RUNNING_PHASES, UpdatePhase, UpdateReport
from agent.protocol.discovery import STATE_TEXT_MAX, DeviceInfo, discovery_messages, update_state
from agent.protocol.telemetry import Telemetry
from agent.protocol.topics import Topics
from agent.settings.declarations import AgentConfig

MIN_INTERVAL: Final = 0.25
"""Changes are gathered this long before the state is published again (seconds)."""
PROGRESS_STEP: Final = 10
"""Download progress becomes an event in steps of this many percent."""

Message = tuple[str, bytes, bool]
"""Topic, payload, retained."""


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the rest of the agent knows at the moment the state is published."""

    audio_available: bool
    volume: float
    selected_voice: str
    queue_depth: int
    underruns: int
    model: str
    """The default voice's model file name without extension."""
    model_sha256: str
    installed_version: str | None
    """The installed release's version (None: the configured model)."""
    model_release: int
    voices: Sequence[str]
    cache: Mapping[str, float]
    link_error: str | None
    storage_error: str | None
    """The journal cannot be written, or was damaged at start and renewed."""
    hermes_muted: bool
    uptime_s: float
    agent_version: str
    speaking: bool = False
    """An announcement is being synthesized or played."""
    started_at: float = 0.0
    """When the agent started (epoch seconds)."""
    voice_names: Mapping[str, str] = field(default_factory=dict)
    """Voice id -> the name people see."""
    board: tuple[str, str] = ("Generic", "computer")
    """The machine's maker and model."""
    clock: Mapping[str, object] | None = None
    """The clock's synchronisation (`clock.ClockSync.as_json`); None: the system does not say."""
    voice_loading: bool = False
    """A voice's sessions are still loading (cached phrases play; other requests wait)."""
    tier: Mapping[str, object] | None = None
    """The default voice's precision (`core.tiers.TierState.as_json`)."""
    repeating: tuple[str, ...] = ()
    """Ids of the announcements that will play again (until their count runs out or an ack)."""
    link: Mapping[str, object] | None = None
    """The broker in use: `server` (host:port) and `protocol` (`5` or `3.1.1`)."""
    sparkplug: Mapping[str, object] | None = None
    """The Sparkplug session: `server` ("" while there is none); None when it is off."""
    wyoming: Mapping[str, object] | None = None
    """The Wyoming server's connections and renders (`Wyoming.facts`); None when it is off."""


@dataclass(frozen=True, slots=True)
class _UpdateView:
    """What Home Assistant's update entity shows of the update in progress (or the last)."""

    latest: str | None = None
    notes: str | None = None
    progress: int | None = None
    in_progress: bool = False


class Status:
    """The state, the announce and the update entity of one node."""

    def __init__(self, config: AgentConfig, topics: Topics) -> None:
        self._config = config
        self._topics = topics
        self.telemetry = Telemetry()
        self._view = _UpdateView()
        self._last_update: dict[str, object] | None = None
        self._changed = True
        self._due = 0.0
        self._announce_at: float | None = None

    # ---- when -------------------------------------------------------------------------------

    def changed(self) -> None:
        """Something the state shows changed: publish it soon."""
        self._changed = True

    def connected(self, now: float) -> None:
        """The link is up (again): announce and publish the state at once."""
        self._announce_at = now
        self._changed = True

    def home_assistant_born(self, now: float, spread: float) -> None:
        """Home Assistant restarted: announce again after `spread` seconds (a fleet spreads
        its announces out)."""
        self._announce_at = now + spread

    def announce_due(self, now: float) -> bool:
        """Whether discovery is due now (then it is no longer due)."""
        if self._announce_at is None or now < self._announce_at:
            return False
        self._announce_at = None
        return True

    def state_due(self, now: float) -> bool:
        """Whether the state is due now: changed (and gathered long enough), or the interval
        passed since it was last published."""
        interval = self._config.state.interval
        debounced = now >= self._due - interval + MIN_INTERVAL
        return (self._changed and debounced) or now >= self._due

    # ---- what -------------------------------------------------------------------------------

    def record(self, notify: Notify, now: float, wall: float) -> None:
        """Account for one lifecycle event at `now` (monotonic; `wall`: epoch seconds):
        counters, time to first audio, last error, the last update's result."""
        self.telemetry.record(notify, now)
        if notify.event != Lifecycle.UPDATE:
            return
        state = notify.details.get("state")
        if state in FINAL_PHASES:
            self._last_update = {
                "id": notify.id,
                "state": state,
                "reason": notify.details.get("reason"),
                "release": notify.details.get("release"),
                "ts": _stamp(wall),
            }
            self._changed = True

    def recall_update(self, report: UpdateReport, wall: float) -> None:
        """The last update's result from before this start (`wall`: its epoch seconds), shown
        until a newer one."""
        if self._last_update is None:
            self._last_update = {
                "id": report.offer,
                "state": str(report.state),
                "reason": report.reason,
                "release": report.release,
                "ts": _stamp(wall),
            }
            self._changed = True

    def state(self, facts: NodeFacts, now: float, wall: float) -> Message:
        """The retained state JSON (`now` monotonic, `wall` the epoch seconds it carries)."""
        self._changed = False
        self._due = now + self._config.state.interval
        telemetry = self.telemetry
        body = {
            "ts": _stamp(wall),
            "node": self._config.node_id,
            "agent_version": facts.agent_version,
            "device_class": self._config.ota.device_class,
            "groups": sorted(self._config.speak.groups),
            "ota_groups": sorted(self._config.ota.groups),
            "audio": "available" if facts.audio_available else "unavailable",
            "volume": round(facts.volume, 3),
            "voice": facts.selected_voice,
            "queue_depth": facts.queue_depth,
            "repeating": list(facts.repeating),
            "underruns": facts.underruns,
            "model": facts.model,
            "model_version": self.model_version(facts),
            "model_sha256": facts.model_sha256,
            "model_release": facts.model_release,
            "last_update": self._last_update,
            "last_ttfa_ms": telemetry.last_ttfa_ms,
            "synthesis_speed": telemetry.synthesis_speed,
            "last_error": _short(facts.link_error or facts.storage_error or telemetry.last_error),
            "storage": "ok" if facts.storage_error is None else facts.storage_error,
            "events": dict(telemetry.counts),
            "cache": dict(facts.cache),
            "hermes_audio": "off" if facts.hermes_muted else "on",
            "uptime_s": round(facts.uptime_s),
            "started_at": _stamp(facts.started_at),
            "speaking": facts.speaking,
            "clock": "unknown" if facts.clock is None else dict(facts.clock),
            "tier": None if facts.tier is None else dict(facts.tier),
            "voice_loading": facts.voice_loading,
            "voice_ready": not facts.voice_loading,
            "mqtt": None if facts.link is None else dict(facts.link),
            "sparkplug": None if facts.sparkplug is None else dict(facts.sparkplug),
            "wyoming": None if facts.wyoming is None else dict(facts.wyoming),
        }
        return self._topics.state, json.dumps(body).encode("utf-8"), True

    @staticmethod
    def model_version(facts: NodeFacts) -> str:
        """The installed release's version; the configured model's first 12 sha256 digits."""
        return facts.installed_version or facts.model_sha256[:12]

    def announce(self, facts: NodeFacts) -> list[Message]:
        """The update entity's state and, with discovery on, every entity's config."""
        messages = [self.update_entity(facts)]
        ha = self._config.homeassistant
        if not ha.discovery:
            return messages
        maker, model = facts.board
        device = DeviceInfo(
            node_id=self._config.node_id,
            name=ha.name or f"Voice {self._config.node_id}",
            version=facts.agent_version,
            manufacturer=maker,
            model=model,
            voices=facts.voice_names or {v: v for v in facts.voices},
            area=ha.area,
        )
        messages += [(t, p, True) for t, p in discovery_messages(ha.prefix, self._topics, device)]
        return messages

    def update_entity(self, facts: NodeFacts) -> Message:
        """The update entity's retained state."""
        view = self._view
        body = update_state(
            self.model_version(facts),
            view.latest,
            f"Voice model {facts.model}",
            in_progress=view.in_progress,
            percentage=view.progress,
            notes=view.notes,
        )
        return self._topics.update, body, True

    def update_reported(self, report: UpdateReport) -> Notify | None:
        """An update's progress or result: the view follows it; the event to publish, if any
        (download progress only in steps of PROGRESS_STEP percent)."""
        view = self._view
        if (
            report.state == UpdatePhase.DOWNLOADING
            and view.progress is not None
            and report.progress is not None
            and report.progress // PROGRESS_STEP == view.progress // PROGRESS_STEP
            and report.progress != 100
        ):
            self._view = _UpdateView(view.latest, view.notes, report.progress, view.in_progress)
            return None
        in_progress = report.state in RUNNING_PHASES
        keeps_notes = in_progress or report.state == UpdatePhase.INSTALLED
        self._view = _UpdateView(
            latest=report.version or view.latest,
            notes=(report.notes or view.notes) if keeps_notes else None,
            progress=report.progress if in_progress else None,
            in_progress=in_progress,
        )
        details = {
            k: str(v) if k == "state" else v
            for k, v in asdict(report).items()
            if v not in (None, "") and k not in {"offer", "notes"}
        }
        return Notify(report.offer, Lifecycle.UPDATE, details)


def _short(text: str | None) -> str | None:
    """An error for a sensor: Home Assistant refuses states over STATE_TEXT_MAX characters."""
    if text is None or len(text) <= STATE_TEXT_MAX:
        return text
    return text[: STATE_TEXT_MAX - 1] + "…"


def _stamp(wall: float) -> str:
    stamp = datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")
