"""Home Assistant's own Wyoming integration judges the node's Wyoming server: a real Home
Assistant core (harness.homeassistant) configured through the integration's config flow, and
the real agent (real voice). Its TTS entity must list the node's voices, and the audio Home
Assistant's TTS returns must be the speech the node says for the same text; its Assist
satellite entity's `assist_satellite.announce` must be heard through the node's device, after a
chime, and reported by the node's events."""

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

from harness import Broker, free_port, located, publish, read_pcm, same_speech, wait_until
from harness.homeassistant import HomeAssistant, install
from harness.wait import TIMEOUT
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.broker, pytest.mark.clients]


def _entities(ha: HomeAssistant, domain: str) -> list[dict[str, Any]]:
    return [s for s in ha.states() if s["entity_id"].startswith(f"{domain}.")]


def _tts_entities(ha: HomeAssistant) -> list[dict[str, Any]]:
    return _entities(ha, "tts")


def _add_wyoming(ha: HomeAssistant, port: int) -> dict[str, Any]:
    """The Wyoming integration's config flow as the UI runs it: host and port."""
    flow = ha.api("POST", "/api/config/config_entries/flow", {"handler": "wyoming"})
    assert flow["type"] == "form", flow
    made: dict[str, Any] = ha.api(
        "POST",
        f"/api/config/config_entries/flow/{flow['flow_id']}",
        {"host": "127.0.0.1", "port": port},
    )
    assert made["type"] == "create_entry", made
    return made


def test_home_assistant_synthesizes_through_the_node_over_wyoming(
    start_agent: StartAgent, broker: Broker, tmp_path: Path
) -> None:
    port = free_port()
    wyoming = {"enabled": True, "host": "127.0.0.1", "port": port}
    agent = start_agent(sections={"wyoming": wyoming})
    ha = HomeAssistant(install(), tmp_path / "homeassistant", broker)
    ha.start()
    try:
        assert _add_wyoming(ha, port)["title"] == "voice-agent"
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


def test_home_assistant_announces_through_the_node_as_a_wyoming_satellite(
    start_agent: StartAgent, broker: Broker, tmp_path: Path
) -> None:
    """`assist_satellite.announce` with a message: Home Assistant synthesizes it with the
    pipeline's TTS (the node's own Wyoming TTS entity), sends it to the node's announce target,
    and the node plays it through its scheduler: heard in the capture after a chime, the same
    speech as the node's `say` of the text, its events with `source: wyoming`."""
    tts_port, satellite_port = free_port(), free_port()
    wyoming = {"enabled": True, "host": "127.0.0.1", "port": tts_port}
    agent = start_agent(sections={"wyoming": {**wyoming, "satellite_port": satellite_port}})
    ha = HomeAssistant(install(), tmp_path / "homeassistant", broker)
    ha.start()
    text = "The garage door is open."
    try:
        _add_wyoming(ha, tts_port)
        assert _add_wyoming(ha, satellite_port)["title"] == f"voice-agent {agent.topics.node_id}"
        wait_until(lambda: bool(_tts_entities(ha)), what="the Wyoming TTS entity")
        wait_until(lambda: bool(_entities(ha, "assist_satellite")), what="the satellite entity")
        (engine,) = _tts_entities(ha)
        (satellite,) = _entities(ha, "assist_satellite")
        pipeline = ha.websocket(
            {
                "type": "assist_pipeline/pipeline/create",
                "name": "voice-agent",
                "language": "en",
                "conversation_engine": "conversation.home_assistant",
                "conversation_language": "en",
                "stt_engine": None,
                "stt_language": None,
                "tts_engine": engine["entity_id"],
                "tts_language": "en_US",
                "tts_voice": "default",
                "wake_word_entity": None,
                "wake_word_id": None,
            }
        )[0]
        ha.websocket(
            {"type": "assist_pipeline/pipeline/set_preferred", "pipeline_id": pipeline["id"]}
        )
        wait_until(
            lambda: (ha.state(satellite["entity_id"]) or {}).get("state") == "idle",
            what="the satellite connected",
        )
        ha.call_service(
            "assist_satellite",
            "announce",
            {"entity_id": satellite["entity_id"], "message": text, "preannounce": False},
        )
        wait_until(lambda: _announced(agent) is not None, what="the announcement's events")
        ids = _announced(agent)
        assert ids is not None
        agent.watcher.wait_event(ids, "finished")
    finally:
        ha.stop()
    events = agent.watcher.events(ids)
    assert [e["event"] for e in events] == ["accepted", "started", "finished"], events
    assert {e["source"] for e in events} == {"wyoming"}
    heard = read_pcm(agent.capture)

    said_id = uuid.uuid4().hex
    publish(broker, agent.topics.speak, json.dumps({"id": said_id, "text": text}).encode())
    agent.watcher.wait_event(said_id, "finished")
    said = read_pcm(agent.capture)[len(heard) :]
    lag, correlation = located(heard, said)
    assert correlation > 0.9, correlation  # Home Assistant's announcement is the node's speech
    assert np.abs(heard[:lag].astype(np.int32)).max() > 1000  # after a chime


def _announced(agent: RunningAgent) -> str | None:
    ids = {str(e["id"]) for e in agent.watcher.events() if e.get("source") == "wyoming"}
    return next(iter(ids)) if ids else None
