"""The Wyoming cases of issues 33 ("Alarms first, by construction") and 34 ("Trust at the new
edges"), each through the real edge: the `wyoming` library's client and framing against the
real agent (real voice), as a host on the LAN would send them, and after each the agent speaks
a control message published with `mosquitto_pub`, heard in the ALSA capture.

Hosts on the LAN are loopback addresses here (`127.0.0.1`, `127.0.0.2`, ...: a connection's
source is bound to each), all inside the default `wyoming.allow`."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.satellite import RunSatellite
from wyoming.snd import Played
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from harness import Broker, free_port, publish, read_pcm
from tests.conftest import RunningAgent, StartAgent
from tests.test_wyoming_announce import announcement, chirp

pytestmark = [pytest.mark.broker]

DEADLINE = 240.0
"""Seconds an exchange may take on a busy 2-core machine."""


def _agent(
    start_agent: StartAgent, speak: dict[str, object] | None = None, **wyoming: object
) -> tuple[RunningAgent, int, int]:
    """The agent with both Wyoming ports on free ports: (agent, TTS port, announce port)."""
    port, satellite = free_port(), free_port()
    sections: dict[str, dict[str, object]] = {
        "wyoming": {
            "enabled": True,
            "host": "127.0.0.1",
            "port": port,
            "satellite_port": satellite,
            **wyoming,
        },
        "speak": speak or {},
    }
    agent = start_agent(sections=sections)
    agent.wait_voice_ready()  # the Wyoming server is the engine's: its answers need the voice
    return agent, port, satellite


def heard_after(agent: RunningAgent, broker: Broker) -> float:
    """The control: a speak published with `mosquitto_pub` ends `finished` and is heard in the
    capture (new loud samples), the agent alive. Returns publish -> `started` (seconds)."""
    before = len(read_pcm(agent.capture))
    request = f"control-{uuid.uuid4().hex[:8]}"
    body = {"id": request, "text": "Control message.", "chime": False}
    sent = time.time()
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    event = agent.watcher.wait_end(request, DEADLINE)
    assert event["event"] == "finished", event
    heard = read_pcm(agent.capture)[before:].astype(np.int32)
    assert len(heard) > 0.3 * 22050
    assert np.abs(heard).max() > 1000
    assert agent.process.alive()
    started = [m for m in agent.watcher.snapshot() if _is_event(m.payload, request, "started")]
    return started[0].at - sent


def _is_event(payload: bytes, request: str, kind: str) -> bool:
    try:
        event = json.loads(payload)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("id") == request and event.get("event") == kind


async def _read_until(reader: asyncio.StreamReader, done: Callable[[Event], bool]) -> list[Event]:
    """Events read with the library's reader until `done` says so (or the connection ends)."""
    received: list[Event] = []
    while True:
        event = await asyncio.wait_for(async_read_event(reader), DEADLINE)
        if event is None:
            return received
        received.append(event)
        if done(event):
            return received


async def _one_shot(port: int, *events: Event, source: str = "127.0.0.1") -> list[Event]:
    """As Home Assistant's TTS does: send, then read until `audio-stop` (nothing after it)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        for event in events:
            await async_write_event(event, writer)
        return await _read_until(reader, lambda e: AudioStop.is_type(e.type))
    finally:
        writer.close()


def _codes(events: list[Event]) -> list[str | None]:
    return [Error.from_event(e).code for e in events if Error.is_type(e.type)]


def _audio(events: list[Event]) -> int:
    return sum(len(AudioChunk.from_event(e).audio) for e in events if AudioChunk.is_type(e.type))


def test_pathological_and_long_texts_hold_nothing_back(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Issue 33's Wyoming attacks at once, with texts up to 100,000 characters let in
    (`speak.max_text_chars`): a `synthesize` of 30,000 dots then `x` (21 s of the whole agent
    before), the same streamed, four clients with 99,990 characters without a sentence end
    (each phonemized whole before `max_seconds` refused it), and 200 bytes of dotted letters
    (espeak-ng crashed the process). Each is answered; an alarm published meanwhile is
    heard; the control message after."""
    agent, port, _ = _agent(start_agent, speak={"max_text_chars": 100_000})
    dots = "." * 30_000 + "x"
    long_text = ("word " * 19_998).strip()  # 99,989 characters, no sentence end
    results: dict[str, list[Event]] = {}

    async def stream() -> list[Event]:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, local_addr=("127.0.0.3", 0)
        )
        try:
            await async_write_event(SynthesizeStart().event(), writer)
            text = dots + " "
            for start in range(0, len(text), 1000):
                await async_write_event(
                    SynthesizeChunk(text=text[start : start + 1000]).event(), writer
                )
            await async_write_event(SynthesizeStop().event(), writer)
            return await _read_until(reader, lambda e: e.type == "synthesize-stopped")
        finally:
            writer.close()

    async def attack() -> None:
        named = {  # each from a host of its own, as separate clients would be
            "dots": _one_shot(port, Synthesize(text=dots).event(), source="127.0.0.2"),
            "stream": stream(),
            "crash": _one_shot(port, Synthesize(text="x." * 120).event(), source="127.0.0.4"),
            **{
                f"long{n}": _one_shot(
                    port, Synthesize(text=long_text).event(), source=f"127.0.0.{5 + n}"
                )
                for n in range(4)
            },
        }
        done = await asyncio.gather(*named.values())
        results.update(zip(named, done, strict=True))

    attacker = threading.Thread(target=lambda: asyncio.run(attack()), daemon=True)
    attacker.start()
    time.sleep(0.5)  # the attack under way
    body = {"id": "fire", "text": "Fire in hall two.", "priority": "critical"}
    sent = time.time()
    publish(broker, agent.topics.speak, json.dumps(body).encode())
    assert agent.watcher.wait_end("fire", DEADLINE)["event"] == "finished"
    started = next(
        m.at for m in agent.watcher.snapshot() if _is_event(m.payload, "fire", "started")
    )
    attacker.join(DEADLINE)
    assert not attacker.is_alive()
    print(f"alarm under the Wyoming attack: publish -> started {started - sent:.3f} s")
    assert AudioStop.is_type(results["dots"][-1].type)
    assert _codes(results["dots"]) == []  # its `x` is said
    assert results["stream"][-1].type == "synthesize-stopped"
    assert AudioStop.is_type(results["crash"][-1].type)  # answered: the agent is alive
    for n in range(4):
        events = results[f"long{n}"]
        assert _codes(events) == ["too_long"], events  # refused after ~2,700 phonemes
        assert AudioStop.is_type(events[-1].type)
    assert agent.process.alive()
    quiet = heard_after(agent, broker)
    print(f"control after it, quiet: publish -> started {quiet:.3f} s")


def test_one_peer_cannot_take_the_slots_of_either_port(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Issue 34: 16 connections from one peer, kept alive by ping, made both ports `busy` for
    everyone. Now each port has its own slots, at most `wyoming.max_clients_per_peer` (8) per
    address: the ninth connection of the peer is refused `busy`, and another host (and the
    same one on the announce port) is served while the 16 stay open."""
    agent, port, satellite = _agent(start_agent)

    async def run() -> tuple[list[list[Event]], Event, Event, Event]:
        opened = []
        answers = []
        for n in range(16):  # accepted in this order: the first eight are served
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            opened.append(writer)
            if n < 8:  # kept alive by ping
                await async_write_event(Ping(text="keep").event(), writer)
                answers.append(await _read_until(reader, lambda e: e.type == "pong"))
            else:  # refused: an `error`, then closed (nothing written: no reset)
                answers.append(await _read_until(reader, lambda _e: False))
        try:
            other = await _describe(port, "127.0.0.2")
            announce = await _describe(satellite, "127.0.0.1")
            again = await _describe(port, "127.0.0.3")
        finally:
            for writer in opened:
                writer.close()
        return answers, other, announce, again

    answers, other, announce, again = asyncio.run(run())
    kinds = [a[-1].type for a in answers]
    assert kinds == ["pong"] * 8 + ["error"] * 8, kinds
    assert {Error.from_event(a[-1]).code for a in answers[8:]} == {"busy"}
    assert Info.is_type(other.type)
    assert Info.is_type(announce.type)
    assert Info.is_type(again.type)
    heard_after(agent, broker)


async def _describe(port: int, source: str) -> Event:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    try:
        await async_write_event(Describe().event(), writer)
        (event,) = await _read_until(reader, lambda _e: True)
        return event
    finally:
        writer.close()


def test_the_announce_target_stays_with_the_address_that_holds_it(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Issue 34: any allowed peer could take Home Assistant's announce connection (the newest
    was served). Now another address is refused `busy` while the target is held, and the held
    connection goes on: its pings are answered and its announcement is played."""
    agent, _, satellite = _agent(start_agent)

    async def run() -> tuple[list[Event], list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", satellite) as home_assistant:
            await home_assistant.write_event(RunSatellite().event())
            await home_assistant.write_event(Ping(text="held").event())
            while (event := await home_assistant.read_event()) is not None:
                if Pong.is_type(event.type):
                    break
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", satellite, local_addr=("127.0.0.2", 0)
            )
            intruder = await _read_until(reader, lambda _e: False)  # refused at once: closed
            writer.close()
            await home_assistant.write_event(Ping(text="still").event())
            for event in announcement(chirp(1.0)):
                await home_assistant.write_event(event)
            held: list[Event] = []
            while (
                event := await asyncio.wait_for(home_assistant.read_event(), DEADLINE)
            ) is not None:
                held.append(event)
                if Played.is_type(event.type):
                    break
            return intruder, held, []

    intruder, held, _ = asyncio.run(run())
    assert [e.type for e in intruder] == ["error"], intruder
    assert Error.from_event(intruder[0]).code == "busy"
    assert any(Pong.is_type(e.type) and Pong.from_event(e).text == "still" for e in held)
    assert Played.is_type(held[-1].type)
    heard_after(agent, broker)


def test_an_over_long_request_says_why_before_audio_stop(
    start_agent: StartAgent, broker: Broker
) -> None:
    """Issue 34: the `error too_long` of an over-long sentence came after `audio-stop`, which
    Home Assistant's one-shot client never reads past (an empty WAV, no reason). Now the
    `error` comes first, read by the same one-shot loop; and `text_format: ssml` is refused
    `unsupported`, as documented."""
    agent, port, _ = _agent(start_agent, speak={"max_audio_seconds": 5})
    text = "The pump in hall three has stopped, leave the hall now. " * 8  # ~25 s of speech
    events = asyncio.run(_one_shot(port, Synthesize(text=text).event()))
    assert [e.type for e in events] == ["audio-start", "error", "audio-stop"], events
    assert _codes(events) == ["too_long"]
    ssml = Synthesize(text="<speak>Hello.</speak>", text_format="ssml").event()
    reader_events = asyncio.run(_first_answer(port, ssml))
    assert _codes(reader_events) == ["unsupported"]
    heard_after(agent, broker)


async def _first_answer(port: int, event: Event) -> list[Event]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await async_write_event(event, writer)
        return await _read_until(reader, lambda _e: True)
    finally:
        writer.close()
