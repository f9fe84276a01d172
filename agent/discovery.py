"""Home Assistant MQTT discovery: one device per node, its entities and their config. Pure.

One config message per entity on `<ha_prefix>/<component>/<node_id>/<object_id>/config`, each
with the shared `device` and `origin` blocks and the agent's availability topic (its Last Will),
using only keys the Home Assistant MQTT documentation gives for that entity type. Sensors read
the retained state JSON. Allowed imports: stdlib, `topics`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from .topics import Topics

TEXT_MAX: Final = 255
"""Home Assistant's cap on a text entity's value: longer messages go to the JSON speak topic."""

TEST_CHIME_PAYLOAD: Final = '{"text": "This is a test.", "chime": true, "priority": "info"}'


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What Home Assistant shows about the node."""

    node_id: str
    name: str
    version: str
    model: str
    voices: Sequence[str]


def discovery_messages(prefix: str, topics: Topics, device: DeviceInfo) -> list[tuple[str, bytes]]:
    """Every entity's (config topic, config payload), to be published retained."""
    node = topics.node_id
    shared = {
        "availability_topic": topics.status,
        "payload_available": "online",
        "payload_not_available": "offline",
        "device": {
            "identifiers": [f"voice_agent_{node}"],
            "name": device.name,
            "manufacturer": "voice-agent",
            "model": device.model,
            "sw_version": device.version,
        },
        "origin": {"name": "voice-agent", "sw_version": device.version},
        "qos": 1,
    }
    state = topics.state
    entities: list[tuple[str, str, dict[str, object]]] = [
        (
            "notify",
            "speak",
            {"name": "Speak", "command_topic": topics.speak, "icon": "mdi:bullhorn"},
        ),
        (
            "text",
            "say",
            {
                "name": "Say",
                "command_topic": topics.speak,
                "min": 0,
                "max": TEXT_MAX,
                "mode": "text",
                "icon": "mdi:account-voice",
            },
        ),
        ("button", "stop", {"name": "Stop", "command_topic": topics.stop, "payload_press": "stop"}),
        (
            "button",
            "test_chime",
            {
                "name": "Test chime",
                "command_topic": topics.speak,
                "payload_press": TEST_CHIME_PAYLOAD,
            },
        ),
        (
            "button",
            "replay",
            {"name": "Replay last", "command_topic": topics.replay, "payload_press": "replay"},
        ),
        (
            "number",
            "volume",
            {
                "name": "Volume",
                "command_topic": topics.volume,
                "state_topic": state,
                "value_template": "{{ value_json.volume }}",
                "min": 0,
                "max": 1,
                "step": 0.05,
                "mode": "slider",
                "icon": "mdi:volume-high",
            },
        ),
        (
            "select",
            "voice",
            {
                "name": "Voice",
                "command_topic": topics.voice,
                "state_topic": state,
                "value_template": "{{ value_json.voice }}",
                "options": list(device.voices),
            },
        ),
        *_sensors(state),
        (
            "update",
            "voice_model",
            {
                "name": "Voice model",
                "state_topic": topics.update,
                "title": "Voice model",
                "entity_category": "config",
            },
        ),
    ]
    messages = []
    for component, object_id, config in entities:
        body = {**config, **shared, "unique_id": f"voice_agent_{node}_{object_id}"}
        topic = f"{prefix}/{component}/{node}/{object_id}/config"
        messages.append((topic, json.dumps(body, separators=(",", ":")).encode("utf-8")))
    return messages


def _sensors(state: str) -> list[tuple[str, str, dict[str, object]]]:
    def sensor(
        object_id: str, name: str, template: str, **extra: object
    ) -> tuple[str, str, dict[str, object]]:
        config: dict[str, object] = {
            "name": name,
            "state_topic": state,
            "value_template": template,
            **extra,
        }
        return ("sensor", object_id, config)

    return [
        sensor(
            "queue_depth", "Queue depth", "{{ value_json.queue_depth }}", state_class="measurement"
        ),
        sensor(
            "time_to_first_audio",
            "Time to first audio",
            "{{ value_json.last_ttfa_ms }}",
            unit_of_measurement="ms",
            device_class="duration",
            state_class="measurement",
            entity_category="diagnostic",
        ),
        sensor(
            "synthesis_speed",
            "Synthesis speed",
            "{{ value_json.synthesis_speed }}",
            unit_of_measurement="x",
            state_class="measurement",
            entity_category="diagnostic",
        ),
        sensor(
            "cache_hit_rate",
            "Phrase cache hit rate",
            "{{ (value_json.cache.hit_rate * 100) | round(1) }}",
            unit_of_measurement="%",
            state_class="measurement",
            entity_category="diagnostic",
        ),
        sensor(
            "underruns",
            "Audio underruns",
            "{{ value_json.underruns }}",
            state_class="total_increasing",
            entity_category="diagnostic",
        ),
        sensor(
            "model_version",
            "Voice model version",
            "{{ value_json.model_version }}",
            entity_category="diagnostic",
        ),
        sensor(
            "last_error",
            "Last error",
            "{{ value_json.last_error or 'none' }}",
            entity_category="diagnostic",
        ),
    ]


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
    are pushed by the operator, so there is never one waiting for Home Assistant to start)."""
    body: dict[str, object] = {
        "installed_version": installed,
        "latest_version": latest if in_progress and latest else installed,
        "title": title,
        "in_progress": in_progress,
        "update_percentage": percentage,
    }
    if notes:
        body["release_summary"] = notes[:255]
    return json.dumps(body, separators=(",", ":")).encode("utf-8")
