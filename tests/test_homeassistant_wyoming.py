"""Home Assistant's own Wyoming integration judges the node's Wyoming server: a real Home
Assistant core (harness.homeassistant) configured through the integration's config flow, and
the real agent (real voice). Its TTS entity must list the node's voices, and the audio Home
Assistant's TTS returns must be the speech the node says for the same text."""

from __future__ import annotations

import io
import json
import urllib.request
import uuid
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness import Broker, free_port, publish, read_pcm, same_speech, wait_until
from harness.homeassistant import HomeAssistant, install
from harness.wait import TIMEOUT
from tests.conftest import StartAgent

pytestmark = [pytest.mark.broker, pytest.mark.clients]


def _tts_entities(ha: HomeAssistant) -> list[dict[str, Any]]:
    return [s for s in ha.states() if s["entity_id"].startswith("tts.")]


def test_home_assistant_synthesizes_through_the_node_over_wyoming(
    start_agent: StartAgent, broker: Broker, tmp_path: Path
) -> None:
    port = free_port()
    wyoming = {"enabled": True, "host": "127.0.0.1", "port": port}
    agent = start_agent(sections={"wyoming": wyoming})
    ha = HomeAssistant(install(), tmp_path / "homeassistant", broker)
    ha.start()
    try:
        flow = ha.api("POST", "/api/config/config_entries/flow", {"handler": "wyoming"})
        assert flow["type"] == "form", flow
        made = ha.api(
            "POST",
            f"/api/config/config_entries/flow/{flow['flow_id']}",
            {"host": "127.0.0.1", "port": port},
        )
        assert made["type"] == "create_entry", made
        assert made["title"] == "voice-agent"
        wait_until(lambda: bool(_tts_entities(ha)), what="the Wyoming TTS entity")
        (entity,) = _tts_entities(ha)
        voices = ha.websocket(
            {"type": "tts/engine/voices", "engine_id": entity["entity_id"], "language": "en_US"}
        )[0]
        assert [v["voice_id"] for v in voices["voices"]] == ["default"], voices

        text = "The front door is open."
        url = ha.api(
            "POST",
            "/api/tts_get_url",
            {
                "engine_id": entity["entity_id"],
                "message": text,
                "language": "en_US",
                # WAV as the engine gives it (what a Wyoming satellite asks for): no ffmpeg
                "options": {"preferred_format": "wav", "preferred_sample_rate": 22050},
            },
        )
        request = urllib.request.Request(  # noqa: S310 - our own loopback server
            f"{ha.url}{url['path']}", headers={"Authorization": f"Bearer {ha.token}"}
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
            data = response.read()
        with wave.open(io.BytesIO(data)) as wav:
            assert (wav.getframerate(), wav.getsampwidth(), wav.getnchannels()) == (22050, 2, 1)
            from_ha = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
    finally:
        ha.stop()
    assert len(from_ha) > 22050

    said_id = uuid.uuid4().hex
    body = {"id": said_id, "text": text, "chime": False}
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    agent.watcher.wait_event(said_id, "finished")
    said = read_pcm(agent.capture)
    correlation = same_speech(from_ha, said)
    assert correlation > 0.9, correlation
