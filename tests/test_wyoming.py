"""The Wyoming TTS server, through the `wyoming` client library against the real agent (real
voice): describe, synthesize, the streaming form, many clients, a client that stalls, hostile
events, and the allowlist."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from agent.settings.loading import load
from harness import Broker, PulseNullSink, free_port, publish, read_pcm, same_speech, wait_until
from tests.conftest import RunningAgent, StartAgent

DEADLINE = 240.0
"""Seconds a whole exchange may take on a busy 2-core machine."""


def _agent(
    start_agent: StartAgent,
    paced: PulseNullSink | None = None,
    speak: dict[str, object] | None = None,
    **wyoming: object,
) -> tuple[RunningAgent, int]:
    port = free_port()
    sections: dict[str, dict[str, object]] = {
        "wyoming": {"enabled": True, "host": "127.0.0.1", "port": port, **wyoming},
        "state": {"interval": 1},
        "speak": speak or {},
    }
    agent = start_agent(sections=sections, paced=paced)
    agent.wait_voice_ready()  # the Wyoming server is the engine's: its answers need the voice
    return agent, port


async def _exchange(port: int, *events: Event) -> list[Event]:
    """Send events, read until audio-stop or synthesize-stopped (or an error)."""
    received: list[Event] = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        streaming = any(SynthesizeStart.is_type(e.type) for e in events)
        while True:
            event = await asyncio.wait_for(client.read_event(), DEADLINE)
            assert event is not None, "connection closed early"
            received.append(event)
            if Error.is_type(event.type):
                return received
            if streaming and SynthesizeStopped.is_type(event.type):
                return received
            if not streaming and AudioStop.is_type(event.type):
                return received


def _pcm(events: list[Event]) -> np.ndarray:
    audio = b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))
    return np.frombuffer(audio, dtype=np.int16)


def test_describe_lists_the_nodes_voices_with_streaming(start_agent: StartAgent) -> None:
    _, port = _agent(start_agent)

    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Describe().event())
            event = await asyncio.wait_for(client.read_event(), DEADLINE)
            assert event is not None
            assert Info.is_type(event.type)
            return Info.from_event(event)

    info = asyncio.run(describe())
    (program,) = info.tts
    assert program.supports_synthesize_streaming is True
    assert program.installed is True
    names = [v.name for v in program.voices]
    assert names[0] == "default"
    assert "en_US" in program.voices[0].languages


def test_synthesize_returns_the_same_speech_the_node_says(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent, port = _agent(start_agent)
    text = "The front door is open."
    events = asyncio.run(_exchange(port, Synthesize(text=text).event()))
    start = AudioStart.from_event(events[0])
    assert AudioStart.is_type(events[0].type)
    assert start.rate == 22050
    assert start.width == 2
    wyoming_pcm = _pcm(events)
    assert len(wyoming_pcm) > 0.8 * 22050  # about a second and a half of speech

    request = uuid.uuid4().hex
    body = {"id": request, "text": text, "chime": False}
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    agent.watcher.wait_event(request, "finished")
    said = read_pcm(agent.capture)
    # The same voice, text and parameters: the same speech (the phrase cache may serve either)
    correlation = same_speech(wyoming_pcm, said)
    assert correlation > 0.9, correlation
    # the state counts the render (published again as the node spoke)
    wait_until(lambda: (_wyoming_state(agent) or {}).get("renders") == 1, what="renders 1")
    assert _wyoming_state(agent) == {
        "clients": 0,
        "renders": 1,
        "rendering": False,
        "waiting_for_alarm": False,
        "announce_connected": None,  # no announce target here (conftest: satellite_port 0)
    }


def _wyoming_state(agent: RunningAgent) -> dict[str, object] | None:
    states = _wyoming_states(agent)
    return states[-1] if states else None


def _wyoming_states(agent: RunningAgent) -> list[dict[str, object]]:
    """The state's `wyoming` of every state published so far."""
    states = [m for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
    return [json.loads(m.payload)["wyoming"] for m in states]


ALARM = " ".join(f"Alarm, the pump in hall {n} has stopped, leave the hall now." for n in range(8))
"""An alarm of about 25 seconds: it plays in real time behind PulseAudio's null sink."""


def test_a_render_waits_while_the_node_says_an_alarm(
    start_agent: StartAgent, broker: Broker, pulse: PulseNullSink
) -> None:
    """The engine's synthesizer holds the urgent gate through an alarm's words (their synthesis
    and their hand-over to the player, paced in real time here): a Wyoming render sends no
    audio while the state says it waits for the alarm (it may have begun before the engine
    took the alarm: the sounder's chime says `started` first); once the alarm is over the
    render is whole."""
    agent, port = _agent(start_agent, paced=pulse)
    publish(
        broker,
        agent.topics.speak,
        json.dumps({"id": "fire", "text": ALARM, "priority": "alarm"}).encode(),
    )
    agent.watcher.wait_event("fire", "started")
    audio: list[float] = []
    """When each of the render's audio chunks arrived (time.time())."""
    rendered: list[list[Event]] = []

    def client() -> None:
        async def run() -> list[Event]:
            received: list[Event] = []
            async with AsyncTcpClient("127.0.0.1", port) as connection:
                await connection.write_event(Synthesize(text="The kettle has boiled.").event())
                while True:
                    event = await asyncio.wait_for(connection.read_event(), DEADLINE)
                    assert event is not None, "connection closed early"
                    if AudioChunk.is_type(event.type):
                        audio.append(time.time())
                    received.append(event)
                    if AudioStop.is_type(event.type) or Error.is_type(event.type):
                        return received

        rendered.append(asyncio.run(run()))

    thread = threading.Thread(target=client, daemon=True)
    thread.start()

    def waits() -> list[float]:
        """When each state saying the render waits for the alarm arrived."""
        states = [m for m in agent.watcher.snapshot() if m.topic == agent.topics.state]
        return [m.at for m in states if json.loads(m.payload)["wyoming"]["waiting_for_alarm"]]

    wait_until(lambda: bool(waits()), DEADLINE, "a state saying the render waits for the alarm")
    first = waits()[0]
    wait_until(lambda: waits()[-1] >= first + 2, DEADLINE, "the render waiting 2 s on")
    assert agent.watcher.events("fire")[-1]["event"] != "finished"  # still playing
    held = [t for t in audio if first + 0.5 < t < waits()[-1]]
    assert not held, "render audio while it waited for the alarm"
    finished = agent.watcher.wait_event("fire", "finished", timeout=DEADLINE)
    assert finished["event"] == "finished"
    thread.join(DEADLINE)
    assert not thread.is_alive()
    (events,) = rendered
    assert not any(Error.is_type(e.type) for e in events), events[-1]
    assert len(_pcm(events)) > 22050  # the whole sentence, after the alarm
    wait_until(
        lambda: (_wyoming_state(agent) or {}).get("waiting_for_alarm") is False,
        timeout=DEADLINE,
        what="the state no longer waiting",
    )


def test_an_unknown_voice_gets_an_error_and_the_connection_goes_on(
    start_agent: StartAgent,
) -> None:
    _, port = _agent(start_agent)

    async def run() -> tuple[Event, list[Event]]:
        async with AsyncTcpClient("127.0.0.1", port) as client:
            bad = Synthesize(text="Hello.", voice=SynthesizeVoice(name="../../etc/passwd"))
            await client.write_event(bad.event())
            error = await asyncio.wait_for(client.read_event(), DEADLINE)
            assert error is not None
            await client.write_event(Synthesize(text="Still here.").event())
            rest: list[Event] = []
            while True:
                event = await asyncio.wait_for(client.read_event(), DEADLINE)
                assert event is not None
                rest.append(event)
                if AudioStop.is_type(event.type):
                    return error, rest

    error, rest = asyncio.run(run())
    assert Error.is_type(error.type)
    assert Error.from_event(error).code == "unknown_voice"
    assert len(_pcm(rest)) > 0


@pytest.mark.slow  # 10 minutes of speech synthesized: `make test-slow`
def test_a_long_streamed_text_is_spoken_while_it_arrives(start_agent: StartAgent) -> None:
    _, port = _agent(start_agent)
    sentence = "The pump in hall three is running at normal speed today"
    words = [f"{sentence} {n}." for n in range(200)]  # 2,200 words in 200 sentences
    first_audio: list[float] = []

    async def run() -> list[Event]:
        received: list[Event] = []
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(SynthesizeStart().event())

            async def send() -> None:
                for text in words:
                    await client.write_event(SynthesizeChunk(text=text + " ").event())
                await client.write_event(SynthesizeStop().event())

            sender = asyncio.create_task(send())
            while True:
                event = await asyncio.wait_for(client.read_event(), DEADLINE)
                assert event is not None
                if AudioChunk.is_type(event.type) and not first_audio:
                    first_audio.append(time.monotonic())
                received.append(event)
                if SynthesizeStopped.is_type(event.type) or Error.is_type(event.type):
                    break
            await sender
        return received

    received = asyncio.run(run())
    assert not any(Error.is_type(e.type) for e in received), received[-1]
    starts = sum(AudioStart.is_type(e.type) for e in received)
    stops = sum(AudioStop.is_type(e.type) for e in received)
    assert starts == stops == 200
    seconds = len(_pcm(received)) / 22050
    assert seconds > 200 * 2.0  # every sentence said (about 3 s each)


def test_ten_clients_at_once_each_get_their_own_speech(start_agent: StartAgent) -> None:
    _, port = _agent(start_agent, max_clients_per_peer=10)  # ten from one address

    async def run() -> list[list[Event]]:
        texts = [f"Client number {n} asks for its own words." for n in range(10)]
        return await asyncio.gather(*(_exchange(port, Synthesize(text=t).event()) for t in texts))

    results = asyncio.run(run())
    assert all(not any(Error.is_type(e.type) for e in r) for r in results)
    lengths = [len(_pcm(r)) for r in results]
    assert all(n > 22050 for n in lengths), lengths


def test_a_client_that_stops_reading_is_dropped_and_others_are_served(
    start_agent: StartAgent,
) -> None:
    agent, port = _agent(start_agent, write_seconds=2.0)
    stalled = socket.create_connection(("127.0.0.1", port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    long_text = " ".join(f"Sentence number {n} is long enough to matter." for n in range(300))
    stalled.sendall(_line(Synthesize(text=long_text).event()))
    # Never read: the server must drop it and serve the next client all the same.
    events = asyncio.run(_exchange(port, Synthesize(text="I am served.").event()))
    assert len(_pcm(events)) > 0
    wait_until(
        lambda: "dropped" in agent.process.output(),
        timeout=DEADLINE,
        what="the stalled client dropped",
    )
    stalled.close()
    assert agent.process.alive()


HOSTILE_FRAMES = [
    (b'{"type": "synthesize", "payload_length": 999999999999}\n', "payload_too_large"),
    (b'{"type": "synthesize", "data_length": 99999999}\n', "payload_too_large"),
    (b"x" * 200_000 + b"\n", "payload_too_large"),  # a header line over 64 KiB
    (b"not json\n", "invalid_json"),
    (b"[" * 5000 + b"\n", "invalid_json"),  # was a RecursionError traceback at ERROR
    (b'{"type": "synthesize", "data": {"text": "' + b"a" * 60_000 + b'"}}\n', "text_too_long"),
    (b'{"type": "synthesize", "data_length": -1}\n', "invalid_field"),
    (b'{"type": "synthesize", "data_length": true}\n', "invalid_field"),
    (b'{"type": "synthesize", "a": 1, "a": 2}\n', "invalid_json"),  # a key given twice
    (b'{"type": "synthesize", "data": {"text": "\xff"}}\n', "invalid_utf8"),
]
"""Hostile framings through a raw socket, and the code of the `error` each is answered with."""


def test_every_hostile_framing_is_answered_and_the_agent_speaks_on(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Each framing error gets an `error` event with the core's reason before the connection
    closes (the bounds come from the header: nothing announced is read), no ERROR is logged
    (conftest's teardown), and the node speaks a control message after them all."""
    agent, port = _agent(start_agent)
    for raw, code in HOSTILE_FRAMES:
        with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
            sock.sendall(raw)
            sock.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        errors = [json.loads(line) for line in answer.splitlines() if line.startswith(b"{")]
        assert errors, (raw[:60], answer[:200])
        assert errors[0]["type"] == "error", errors
        data = json.loads(answer.split(b"\n", 1)[1][: errors[0]["data_length"]])
        assert data["code"] == code, (raw[:60], data)
    events = asyncio.run(_exchange(port, Synthesize(text="Still serving.").event()))
    assert len(_pcm(events)) > 0
    heard_after(agent, broker)


def heard_after(agent: RunningAgent, broker: Broker) -> None:
    """The control: a speak published with `mosquitto_pub` ends `finished` and is heard in the
    capture (new loud samples), the agent alive."""
    before = len(read_pcm(agent.capture))
    request = f"control-{uuid.uuid4().hex[:8]}"
    body = {"id": request, "text": "Control message.", "chime": False}
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    event = agent.watcher.wait_end(request)
    assert event["event"] == "finished", event
    heard = read_pcm(agent.capture)[before:].astype(np.int32)
    assert len(heard) > 0.3 * 22050
    assert np.abs(heard).max() > 1000
    assert agent.process.alive()


CHUNK_OF_A_LIST = b'{"type": "synthesize-chunk", "data": {"text": []}}\n'


WRONG_SHAPES = [
    (b"[1]\n", "invalid_json"),  # JSON, but no object
    (b'{"data": {}}\n', "invalid_field"),  # no type
    (b'{"type": "synthesize", "data_length": "5"}\n', "invalid_field"),
    (b'{"type": "synthesize", "data_length": 3}\n[1]', "invalid_field"),  # data no object
    (b'{"type": "synthesize", "data": null}\n', "invalid_field"),
    (b'{"type": "synthesize", "data": {"text": 5}}\n', "invalid_field"),
    (b'{"type": "synthesize-start"}\n' + CHUNK_OF_A_LIST, "invalid_field"),
    (b'{"type": "synthesize", "data": {"text": "\\ud800 hello"}}\n', "invalid_utf8"),
    (
        b'{"type": "synthesize", "data": {"text": "<speak>Hi</speak>", "text_format": "ssml"}}\n',
        "unsupported",
    ),
    (
        b'{"type": "synthesize", "data": {"text": "Hi", "voice": {"name": 5}}}\n',
        "invalid_field",
    ),
    (
        b'{"type": "synthesize", "data": {"text": "Hi", "voice": {"language": "xx"}}}\n',
        "unknown_language",
    ),
    (
        b'{"type": "synthesize", "data": {"text": "Hi", "voice": {"name": "default",'
        b' "speaker": "nobody"}}}\n',
        "unknown_speaker",
    ),
    (b'{"type": "synthesize", "data": {"text": " \\u200b "}}\n', "empty_text"),
    (b'{"type": "synthesize-chunk", "data": {"text": "Hi. "}}\n', "invalid_field"),
]
"""Events of the wrong shape or kind, and the code of the `error` each is answered with."""


def test_every_event_of_the_wrong_shape_is_answered_with_an_error(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Each answered with `error` and the core's reason; the connection (or, where the framing
    is lost, the server) goes on, no ERROR is logged, and the control message is heard."""
    agent, port = _agent(start_agent)

    async def run(raw: bytes) -> Event:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        await writer.drain()
        try:
            while True:
                event = await asyncio.wait_for(async_read_event(reader), DEADLINE)
                assert event is not None, "closed without an error event"
                if Error.is_type(event.type):
                    return event
        finally:
            writer.close()

    codes = [Error.from_event(asyncio.run(run(raw))).code for raw, _ in WRONG_SHAPES]
    assert codes == [code for _, code in WRONG_SHAPES]
    events = asyncio.run(_exchange(port, Synthesize(text="Still serving.").event()))
    assert len(_pcm(events)) > 0
    heard_after(agent, broker)


@pytest.mark.allow_error_logs(r"Wyoming: cannot listen: .*wyoming\.port")
def test_a_port_that_cannot_be_bound_stops_the_start_in_one_line(
    start_agent: StartAgent,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sections = {"wyoming": {"enabled": True, "host": "127.0.0.1", "port": port}}
        agent = start_agent(sections=sections, wait=False)
        wait_until(lambda: not agent.process.alive(), what="the agent to stop")
    assert agent.process.signal(signal.SIGTERM) == 1  # already ended: its exit code
    out = agent.process.output()
    assert f"Wyoming: cannot listen: [Errno 98] wyoming.port 127.0.0.1:{port}" in out
    assert "Traceback" not in out


def test_a_text_over_the_speak_cap_gets_an_error(start_agent: StartAgent) -> None:
    """A Wyoming text is bounded as a speak text is: `speak.max_text_chars`."""
    _, port = _agent(start_agent, speak={"max_text_chars": 100})
    events = asyncio.run(_exchange(port, Synthesize(text="word " * 50).event()))
    assert Error.is_type(events[-1].type)
    assert Error.from_event(events[-1]).code == "text_too_long"


def test_a_client_outside_the_allowlist_is_closed(start_agent: StartAgent) -> None:
    agent, port = _agent(start_agent, allow=["192.0.2.0/24"])
    with socket.create_connection(("127.0.0.1", port), timeout=DEADLINE) as sock:
        sock.sendall(_line(Describe().event()))
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:  # closed with the request unread
            answer = b""
        assert answer == b""  # closed without an answer
    assert "not in wyoming.allow" in agent.process.output()


def _line(event: Event) -> bytes:
    header: dict[str, object] = {"type": event.type, "version": "1.10.2"}
    if event.data:
        header["data"] = event.data
    return json.dumps(header).encode() + b"\n"


@pytest.mark.parametrize("bad", [["not-a-network"], ["10.0.0.0/8", "300.1.1.1"]])
def test_a_bad_allowlist_fails_at_start(bad: list[str], tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"wyoming": {"enabled": True, "allow": bad}}))
    with pytest.raises(Exception, match=r"wyoming\.allow"):
        load(path)
