"""The Wyoming announce target (`wyoming.satellite_port`), through the `wyoming` client library
as Home Assistant's satellite entity speaks to it, against the real agent: `describe` says it is
a satellite; an announcement's audio plays through the node's scheduler after a chime, its events
carry `source: wyoming`, and `played` comes once it was heard; an alarm preempts it; hostile or
oversized audio gets an `error` and the connection goes on; the newest connection is served."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.satellite import RunSatellite
from wyoming.snd import Played

from harness import PulseNullSink, free_port, located, read_pcm, wait_until
from tests.conftest import RunningAgent, StartAgent

pytestmark = [pytest.mark.broker]

RATE = 22050
DEADLINE = 240.0
"""Seconds an exchange may take on a busy 2-core machine."""
CHUNK = 2048
"""Bytes per `audio-chunk`, as Home Assistant sends them (1,024 samples)."""


def _agent(
    start_agent: StartAgent, paced: PulseNullSink | None = None, **speak: object
) -> tuple[RunningAgent, int]:
    """The agent with its announce target on a free port; `speak` keys merged in."""
    port = free_port()
    wyoming = {
        "enabled": True,
        "host": "127.0.0.1",
        "port": free_port(),
        "satellite_port": port,
        "idle_seconds": 600,  # Home Assistant pings every 2 s; these clients wait in silence
    }
    sections: dict[str, dict[str, object]] = {"wyoming": wyoming, "speak": speak}
    agent = start_agent(sections=sections, paced=paced)
    agent.wait_voice_ready()  # the announce target is the engine's
    return agent, port


def chirp(seconds: float, rate: int = RATE) -> npt.NDArray[np.int16]:
    """A rising tone (no two stretches alike: where it is found in the capture is unambiguous)."""
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * (300 * t + 400 * t * t / seconds)
    return (8000 * np.sin(phase)).astype(np.int16)


def announcement(audio: npt.NDArray[np.int16], rate: int = RATE) -> list[Event]:
    """audio-start, the chunks, audio-stop, as Home Assistant's `async_announce` sends them."""
    data = audio.tobytes()
    events = [AudioStart(rate=rate, width=2, channels=1, timestamp=0).event()]
    for offset in range(0, len(data), CHUNK):
        part = data[offset : offset + CHUNK]
        events.append(AudioChunk(rate=rate, width=2, channels=1, audio=part).event())
    events.append(AudioStop().event())
    return events


async def _until(client: AsyncTcpClient, wanted: Sequence[str]) -> list[Event]:
    """Events read until one of the wanted types (or an error) comes; pongs are not kept."""
    received: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), DEADLINE)
        assert event is not None, "connection closed early"
        received.append(event)
        if event.type in wanted or Error.is_type(event.type):
            return received


async def _session(port: int, *events: Event, until: Sequence[str]) -> list[Event]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(RunSatellite().event())
        for event in events:
            await client.write_event(event)
        return await _until(client, until)


def _wyoming_events(agent: RunningAgent) -> list[dict[str, object]]:
    return [e for e in agent.watcher.events() if str(e["id"]).startswith("wyoming-")]


def test_describe_says_satellite_and_a_ping_is_answered(start_agent: StartAgent) -> None:
    agent, port = _agent(start_agent)
    events = asyncio.run(_session(port, Describe().event(), until=["info"]))
    info = Info.from_event(events[-1])
    assert info.satellite is not None
    assert info.satellite.installed
    assert info.satellite.name == f"voice-agent {agent.topics.node_id}"
    assert not info.tts  # Home Assistant makes an entry either a satellite or services
    events = asyncio.run(_session(port, Ping(text="x").event(), until=["pong"]))
    assert Pong.from_event(events[-1]).text == "x"


def test_an_announcement_is_heard_after_a_chime_and_played_is_sent(
    start_agent: StartAgent,
) -> None:
    agent, port = _agent(start_agent)
    sent = chirp(1.5)
    events = asyncio.run(_session(port, *announcement(sent), until=["played"]))
    assert Played.is_type(events[-1].type), events[-1]
    (request_id,) = {str(e["id"]) for e in _wyoming_events(agent)}
    agent.watcher.wait_event(request_id, "finished")  # on its way over MQTT as played came
    ended = [e["event"] for e in agent.watcher.events(request_id)]
    assert ended == ["accepted", "started", "finished"], ended
    for event in agent.watcher.events(request_id):
        assert (event["source"], event["priority"]) == ("wyoming", "info"), event
    played = read_pcm(agent.capture)
    lag, correlation = located(played, sent)
    assert correlation > 0.95, correlation  # the announcement itself, as sent
    assert np.abs(played[:lag].astype(np.int32)).max() > 1000  # a chime before it


@pytest.mark.voice
def test_an_alarm_preempts_an_announcement_which_plays_again_after_it(
    start_agent: StartAgent, pulse: PulseNullSink
) -> None:
    agent, port = _agent(start_agent, paced=pulse)

    async def announce_then_alarm() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(RunSatellite().event())
            for event in announcement(chirp(20.0)):
                await client.write_event(event)
            await asyncio.to_thread(
                wait_until, lambda: bool(_started(agent)), timeout=DEADLINE, what="it plays"
            )
            body = {"id": "fire", "text": "Fire alarm in hall two.", "priority": "alarm"}
            agent.watcher.publish(agent.topics.speak, json.dumps(body).encode())
            return await _until(client, ["played"])

    events = asyncio.run(announce_then_alarm())
    assert Played.is_type(events[-1].type)
    (request_id,) = {str(e["id"]) for e in _wyoming_events(agent)}
    kinds = [e["event"] for e in agent.watcher.events(request_id)]
    assert kinds[:5] == ["accepted", "started", "preempted", "requeued", "started"], kinds
    agent.watcher.wait_event(request_id, "finished")  # `played` came as it was heard whole
    assert [e["event"] for e in agent.watcher.events("fire")][-1] == "finished"


def _started(agent: RunningAgent) -> list[dict[str, object]]:
    return [e for e in _wyoming_events(agent) if e["event"] == "started"]


@pytest.mark.parametrize(
    ("events", "code"),
    [
        ([AudioChunk(rate=RATE, width=2, channels=1, audio=b"\0\0").event()], "invalid_field"),
        ([AudioStart(rate=RATE, width=4, channels=1).event()], "unsupported_audio"),
        ([AudioStart(rate=2_000_000, width=2, channels=1).event()], "unsupported_audio"),
        ([AudioStart(rate=RATE, width=2, channels=9).event()], "unsupported_audio"),
        (
            [
                AudioStart(rate=RATE, width=2, channels=1).event(),
                AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0").event(),
            ],
            "unsupported_audio",
        ),
        (announcement(chirp(6.0))[:-1], "too_long"),  # over speak.max_audio_seconds (5 here)
        (
            [Event(type="audio-start", data={"width": 2, "channels": 1})],
            "invalid_field",
        ),
    ],
    ids=["chunk-first", "width", "rate", "channels", "format-change", "too-long", "bad-field"],
)
def test_bad_audio_gets_an_error_and_the_connection_goes_on(
    start_agent: StartAgent, events: list[Event], code: str
) -> None:
    agent, port = _agent(start_agent, max_audio_seconds=5.0)
    agent_events = len(agent.watcher.events())

    async def exchange() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            for event in events:
                await client.write_event(event)
            refused = await _until(client, ["error"])
            await client.write_event(AudioStop().event())  # what was gathered was dropped
            await client.write_event(Ping(text="after").event())
            return refused, await _until(client, ["pong"])

    refused, after = asyncio.run(exchange())
    assert Error.from_event(refused[-1]).code == code
    assert Pong.from_event(after[-1]).text == "after"
    assert not _wyoming_events(agent)  # nothing was queued
    assert len(agent.watcher.events()) == agent_events


def test_the_newest_connection_is_served_and_the_older_closed(start_agent: StartAgent) -> None:
    _, port = _agent(start_agent)

    async def two() -> tuple[Event | None, list[Event]]:
        async with AsyncTcpClient("127.0.0.1", port) as older:
            await older.write_event(RunSatellite().event())
            await older.write_event(Ping(text="old").event())
            await _until(older, ["pong"])
            async with AsyncTcpClient("127.0.0.1", port) as newer:
                await newer.write_event(Ping(text="new").event())
                answer = await _until(newer, ["pong"])
                gone = await asyncio.wait_for(older.read_event(), DEADLINE)
                return gone, answer

    gone, answer = asyncio.run(two())
    assert gone is None  # closed by the agent
    assert Pong.from_event(answer[-1]).text == "new"
