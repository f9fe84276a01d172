"""Home Assistant MQTT discovery: one device per node, its entities and their config. Pure.

One config message per entity on `<ha_prefix>/<component>/<node_id>/<object_id>/config`, each
with the shared `device` and `origin` blocks and the agent's availability topic (its Last Will),
using only keys the Home Assistant MQTT documentation gives for that entity type. Sensors read
the retained state JSON. Entities follow Home Assistant's conventions: settings in the `config`
category, telemetry in `diagnostic`, the controls people use on the device page uncategorised;
an icon on each. Requires Home Assistant 2024.12 or newer (the `event` entity with
`event_types`, the update entity's `update_percentage`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agent.protocol.topics import Topics

TEXT_MAX: Final = 255
"""Home Assistant's cap on a text entity's value: longer messages go to the JSON speak topic."""
STATE_TEXT_MAX: Final = 255
"""Home Assistant refuses sensor states longer than this."""
SUPPORT_URL: Final = "https://github.com/voice-agent/voice-agent#readme"
TEST_CHIME_PAYLOAD: Final = '{"text": "This is a test.", "chime": true, "priority": "info"}'
CLEAR_QUEUE_PAYLOAD: Final = '{"clear": true, "current": false}'
RESULTS: Final = ("finished", "failed", "expired", "stopped", "rejected", "preempted")
"""The event types of the announcement event entity (how announcements ended)."""

Entity = tuple[str, str, dict[str, object]]
"""(component, object id, config)."""


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What Home Assistant shows about the node."""

    node_id: str
    name: str
    version: str
    manufacturer: str
    """The board's maker (e.g. Raspberry Pi Foundation), not the software's name."""
    model: str
    """The board (e.g. Raspberry Pi Zero 2 W Rev 1.0): stable across model updates."""
    voices: Mapping[str, str] = field(default_factory=dict)
    """Voice id -> the name people see (the voice select's options)."""
    area: str | None = None
    """The area suggested for the device."""


def discovery_messages(prefix: str, topics: Topics, device: DeviceInfo) -> list[tuple[str, bytes]]:
    """Every entity's (config topic, config payload), to be published retained."""
    node = topics.node_id
    hardware: dict[str, object] = {
        "identifiers": [f"voice_agent_{node}"],
        "name": device.name,
        "manufacturer": device.manufacturer,
        "model": device.model,
        "sw_version": device.version,
    }
    if device.area:
        hardware["suggested_area"] = device.area
    shared = {
        "availability_topic": topics.status,
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": hardware,
        "origin": {"name": "voice-agent", "sw_version": device.version, "support_url": SUPPORT_URL},
        "qos": 1,
    }
    entities = [
        *_controls(topics, device),
        *_settings(topics, device),
        *_sensors(topics.state),
        *_status(topics),
    ]
    messages = []
    for component, object_id, config in entities:
        common = shared
        if "availability" in config:  # its own (both processes' topics)
            common = {
                k: v for k, v in shared.items() if not k.startswith(("availability", "payload_"))
            }
        body = {**config, **common, "unique_id": f"voice_agent_{node}_{object_id}"}
        topic = f"{prefix}/{component}/{node}/{object_id}/config"
        messages.append((topic, json.dumps(body, separators=(",", ":")).encode("utf-8")))
    return messages


def _controls(topics: Topics, device: DeviceInfo) -> list[Entity]:
    """What people use on the device page: speak, stop, replay, clear."""
    return [
        ("notify", "speak", {"name": "Speak", "command_topic": topics.say, "icon": "mdi:bullhorn"}),
        (
            "text",
            "say",
            {
                "name": "Say",
                "command_topic": topics.say,
                "min": 0,
                "max": TEXT_MAX,
                "mode": "text",
                "icon": "mdi:account-voice",
            },
        ),
        _button("stop", "Stop", topics.stop, "stop", "mdi:stop-circle-outline"),
        _button("replay", "Replay last", topics.replay, "replay", "mdi:replay"),
        _button(
            "clear_queue", "Clear queue", topics.stop, CLEAR_QUEUE_PAYLOAD, "mdi:playlist-remove"
        ),
    ]


def _settings(topics: Topics, device: DeviceInfo) -> list[Entity]:
    """Settings (`config`): volume in percent, the voice by name, the test chime."""
    names = dict(device.voices)
    return [
        (
            "number",
            "volume",
            {
                "name": "Volume",
                "command_topic": topics.volume,
                "command_template": "{{ (value / 100) | round(2) }}",
                "state_topic": topics.state,
                "value_template": "{{ (value_json.volume * 100) | round(0) }}",
                "min": 0,
                "max": 100,
                "step": 5,
                "unit_of_measurement": "%",
                "mode": "slider",
                "icon": "mdi:volume-high",
                "entity_category": "config",
            },
        ),
        (
            "select",
            "voice",
            {
                "name": "Voice",
                "command_topic": topics.voice,
                "state_topic": topics.state,
                "value_template": _voice_template(names),
                "options": list(names.values()),
                "icon": "mdi:account-tie-voice",
                "entity_category": "config",
            },
        ),
        (
            "button",
            "test_chime",
            {
                **_button(
                    "test_chime", "Test chime", topics.speak, TEST_CHIME_PAYLOAD, "mdi:bell-ring"
                )[2],
                "entity_category": "config",
            },
        ),
    ]


def _button(object_id: str, name: str, topic: str, payload: str, icon: str) -> Entity:
    config: dict[str, object] = {
        "name": name,
        "command_topic": topic,
        "payload_press": payload,
        "icon": icon,
    }
    return ("button", object_id, config)


def _voice_template(names: Mapping[str, str]) -> str:
    """The name shown for the selected voice id (the id itself if it has none)."""
    cases = " ".join(f"'{vid}': {json.dumps(name)}," for vid, name in names.items())
    return "{{ {" + cases + "}.get(value_json.voice, value_json.voice) }}"


def _sensors(state: str) -> list[Entity]:
    def sensor(object_id: str, name: str, template: str, **extra: object) -> Entity:
        config: dict[str, object] = {
            "name": name,
            "state_topic": state,
            "value_template": template,
            **extra,
        }
        return ("sensor", object_id, config)

    return [
        sensor(
            "queue_depth",
            "Queue depth",
            "{{ value_json.queue_depth }}",
            state_class="measurement",
            icon="mdi:tray-full",
        ),
        sensor(
            "time_to_first_audio",
            "Time to first audio",
            "{{ value_json.last_ttfa_ms }}",
            unit_of_measurement="ms",
            device_class="duration",
            state_class="measurement",
            entity_category="diagnostic",
            icon="mdi:timer-outline",
        ),
        sensor(
            "synthesis_speed",
            "Synthesis speed (times real time)",
            "{{ value_json.synthesis_speed }}",
            state_class="measurement",
            suggested_display_precision=1,
            entity_category="diagnostic",
            icon="mdi:speedometer",
        ),
        sensor(
            "voice_tier",
            "Voice precision",
            "{{ value_json.tier.used if value_json.tier else 'fp32' }}",
            json_attributes_topic=state,
            json_attributes_template="{{ (value_json.tier or {}) | tojson }}",
            entity_category="diagnostic",
            icon="mdi:chip",
        ),
        sensor(
            "cache_hit_rate",
            "Phrase cache hit rate",
            "{{ (value_json.cache.hit_rate * 100) | round(1) }}",
            unit_of_measurement="%",
            state_class="measurement",
            entity_category="diagnostic",
            icon="mdi:cached",
        ),
        sensor(
            "underruns",
            "Audio underruns",
            "{{ value_json.underruns }}",
            state_class="total_increasing",
            entity_category="diagnostic",
            icon="mdi:waveform",
        ),
        sensor(
            "last_error",
            "Last error",
            "{{ value_json.last_error }}",  # null renders None: Home Assistant shows unknown
            entity_category="diagnostic",
            icon="mdi:alert-circle-outline",
        ),
        sensor(
            "started",
            "Started",
            "{{ value_json.started_at }}",
            device_class="timestamp",
            entity_category="diagnostic",
            icon="mdi:clock-start",
        ),
        sensor(
            "groups",
            "Speak groups",
            "{{ value_json.groups | join(', ') }}",
            entity_category="diagnostic",
            icon="mdi:account-group",
        ),
    ]


def _status(topics: Topics) -> list[Entity]:
    """The speaker, speaking, how announcements end, and the voice model's updates."""
    state = topics.state
    return [
        (
            "binary_sensor",
            "speaker",
            {
                "name": "Speaker",
                "state_topic": state,
                "value_template": "{{ 'OFF' if value_json.audio == 'available' else 'ON' }}",
                "device_class": "problem",
                "entity_category": "diagnostic",
                "icon": "mdi:speaker-off",
            },
        ),
        (
            "binary_sensor",
            "voice_ready",
            {
                "name": "Voice ready",
                "state_topic": state,
                "value_template": "{{ 'ON' if value_json.voice_ready else 'OFF' }}",
                "entity_category": "diagnostic",
                "icon": "mdi:account-voice",
                # online (alarms are heard) and the engine up: its state is then current
                "availability": [
                    {
                        "topic": topics.status,
                        "payload_available": "online",
                        "payload_not_available": "offline",
                    },
                    {
                        "topic": topics.engine,
                        "payload_available": "online",
                        "payload_not_available": "offline",
                    },
                ],
                "availability_mode": "all",
            },
        ),
        (
            "binary_sensor",
            "speaking",
            {
                "name": "Speaking",
                "state_topic": state,
                "value_template": "{{ 'ON' if value_json.speaking else 'OFF' }}",
                "icon": "mdi:account-voice",
            },
        ),
        (
            "event",
            "announcement",
            {
                "name": "Announcement",
                "state_topic": topics.result,
                "event_types": list(RESULTS),
                "icon": "mdi:message-badge-outline",
            },
        ),
        (
            "update",
            "voice_model",
            {
                "name": "Voice model",
                "state_topic": topics.update,
                "title": "Voice model",
                "entity_category": "config",
                "icon": "mdi:update",
            },
        ),
    ]


def result_message(event: str, request_id: str, details: Mapping[str, object]) -> bytes | None:
    """The event entity's message for how an announcement ended (None for other events)."""
    if event not in RESULTS:
        return None
    body: dict[str, object] = {"event_type": event, "id": request_id}
    for key in ("priority", "reason", "audio_seconds"):
        if key in details:
            body[key] = details[key]
    return json.dumps(body, separators=(",", ":")).encode("utf-8")


def update_state(
    installed: str,
    latest: str | None,
    title: str,
    *,
    in_progress: bool = False,
    percentage: int | None = None,
    notes: str | None = None,
) -> bytes:
    """The update entity's state: `latest` is shown only while it is being installed (updates
    are pushed by the operator, so there is never one waiting for Home Assistant to start);
    `release_summary` always present (empty when there are no notes, so old ones disappear:
    Home Assistant refuses null there)."""
    body: dict[str, object] = {
        "installed_version": installed,
        "latest_version": latest if in_progress and latest else installed,
        "title": title,
        "in_progress": in_progress,
        "update_percentage": percentage,
        "release_summary": notes[:255] if notes else "",
    }
    return json.dumps(body, separators=(",", ":")).encode("utf-8")
