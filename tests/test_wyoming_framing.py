"""Wyoming's framing from a host on the LAN (`tests/hostile.py`: `wyoming_frames`): the
framing reader on any bytes, and the real server (in this process, on the tiny voice, both
ports) answering every generated frame through a socket with events the `wyoming` library
reads, never an ERROR logged (conftest fails the test on one), and still serving after."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from wyoming.event import Event, async_read_event
from wyoming.info import Describe

from agent.core.reasons import Reason
from agent.link.wyoming.framing import LINE_LIMIT, UnreadableError, read_event
from agent.settings.declarations import AgentConfig
from agent.speech.phrase_cache import PhraseCache
from agent.speech.synthesizer import VoiceChoice
from agent.speech.urgent import UrgentGate
from agent.speech.voice import Voice
from agent.wyoming_service import Wyoming, build
from harness import free_port
from tests.hostile import wyoming_conversations, wyoming_frames

ANSWERS = frozenset(
    {"error", "info", "pong", "audio-start", "audio-chunk", "audio-stop", "synthesize-stopped"}
)
"""Every event type the server may answer with."""


def _events(raw: bytes) -> list[Event | UnreadableError | None]:
    """What the framing reader makes of bytes: events and errors, until the end (None) or an
    error that loses the framing."""

    async def read() -> list[Event | UnreadableError | None]:
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        reader.feed_data(raw)
        reader.feed_eof()
        out: list[Event | UnreadableError | None] = []
        while True:
            try:
                out.append(await read_event(reader))
            except UnreadableError as err:
                out.append(err)
                if err.lost:
                    return out
                continue
            if out[-1] is None:
                return out

    return asyncio.run(read())


@given(wyoming_frames())
@settings(max_examples=300)
def test_the_reader_takes_any_frame(frame: bytes) -> None:
    """Any frame: events, or an UnreadableError with one of the core's reasons and a short,
    printable detail (it goes to the log and to the client); nothing else is raised."""
    for read in _events(frame):
        if isinstance(read, UnreadableError):
            assert isinstance(read.reason, Reason)
            assert len(read.detail) <= 300
            assert read.detail.isprintable()
        else:
            assert read is None or isinstance(read, Event)


@pytest.mark.parametrize(
    ("raw", "reason", "lost"),
    [
        (b"[" * 5000 + b"\n", Reason.INVALID_JSON, True),
        (b'{"type": "ping", "payload_length": 1048577}\n', Reason.PAYLOAD_TOO_LARGE, True),
        (b'{"type": "ping", "data_length": 10000000000}\n', Reason.PAYLOAD_TOO_LARGE, True),
        (b'{"type": "ping", "data_length": 2}\n[]', Reason.INVALID_FIELD, False),
        (b'{"type": 5}\n', Reason.INVALID_FIELD, False),
        (b"x" * (LINE_LIMIT + 10) + b"\n", Reason.PAYLOAD_TOO_LARGE, True),
    ],
)
def test_framing_errors_say_why_and_whether_the_framing_is_lost(
    raw: bytes, reason: Reason, lost: bool
) -> None:
    async def read() -> UnreadableError:
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        reader.feed_data(raw)
        reader.feed_eof()
        with pytest.raises(UnreadableError) as caught:
            await read_event(reader)
        return caught.value

    err = asyncio.run(read())
    assert (err.reason, err.lost) == (reason, lost)


@pytest.fixture(scope="module")
def wyoming(tiny_voice: Path) -> Iterator[Wyoming]:
    """The node's Wyoming service on the tiny voice, both ports on loopback."""
    voice = Voice.load(tiny_voice, threads=1, cache_dir=None)
    config = AgentConfig()
    config = replace(
        config,
        wyoming=replace(
            config.wyoming,
            enabled=True,
            host="127.0.0.1",
            port=free_port(),
            satellite_port=free_port(),
            zeroconf=False,
            idle_seconds=20.0,
        ),
    )
    voices = {"default": VoiceChoice("default", voice, voice.default_params)}
    service = build(
        config,
        voices,
        PhraseCache(None, 10**8, 0),
        lambda: "0" * 32,
        lambda _request: None,
        gate=UrgentGate(),
    )
    service.server.start()
    service.renderer.start()
    service.server.start_rendering()
    yield service
    service.stop()


def _exchange(port: int, frame: bytes) -> list[Event]:
    """Send a frame, close the sending side, read every answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(frame)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk

    async def read() -> list[Event]:
        reader = asyncio.StreamReader(limit=2**22)
        reader.feed_data(answer)
        reader.feed_eof()
        events = []
        while (event := await async_read_event(reader)) is not None:
            events.append(event)
        return events

    return asyncio.run(read())


@given(wyoming_frames())
@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_server_answers_any_frame_on_both_ports(wyoming: Wyoming, frame: bytes) -> None:
    """Both ports, any frame: every answer is an event the library reads (an `error` for what
    could not be read or served), the server closes the connection when it is done, and no
    ERROR is logged."""
    for port in (wyoming.server.port, wyoming.server.satellite_port):
        assert port is not None
        answers = _exchange(port, frame)
        assert {e.type for e in answers} <= ANSWERS, [e.type for e in answers]


@given(wyoming_conversations)
@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_server_answers_events_in_any_order_on_both_ports(
    wyoming: Wyoming, conversation: bytes
) -> None:
    """Well-framed events of every type in any order (chunks before a start, audio without
    `audio-start`, a stream inside a stream, `run-satellite` on the TTS port): every answer an
    event the library reads, the connection closed when done, no ERROR logged, and the server
    still answers `describe` after."""
    for port in (wyoming.server.port, wyoming.server.satellite_port):
        assert port is not None
        answers = _exchange(port, conversation)
        assert {e.type for e in answers} <= ANSWERS, [e.type for e in answers]
    (info,) = _exchange(wyoming.server.port, b'{"type": "describe"}\n')
    assert info.type == "info"


def test_the_server_still_serves_after_hostile_frames(wyoming: Wyoming) -> None:
    answers = _exchange(wyoming.server.port, b"[" * 5000 + b"\n")
    assert [e.type for e in answers] == ["error"]
    (info,) = _exchange(wyoming.server.port, b'{"type": "describe"}\n')
    assert Describe.is_type("describe")
    assert info.type == "info"
    assert wyoming.server.clients == 0
