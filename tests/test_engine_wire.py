"""The wire between the sounder and the engine: frames bounded before they are read, every
field checked, a broken frame refused whole."""

from __future__ import annotations

import json
import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.core.messages import AudioStatus, Priority, UtteranceEnded, UtteranceStarted
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk
from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import FrameReader, WireError


def test_a_chunk_crosses_whole() -> None:
    chunk = Chunk(
        "fire",
        b"\x01\x00\xff\x7f" * 100,
        end=True,
        error=Reason.TOO_LONG,
        detail="over 120 s",
        info={"sentences": 2},
        volume=0.5,
        priority=Priority.CRITICAL,
        job=7,
        start_at=1_800_000_000.25,
    )
    (frame,) = FrameReader().feed(wire.chunk_frame("words", chunk))
    assert frame.kind == "words"
    assert wire.chunk_of(frame) == chunk


def test_reports_cross_whole() -> None:
    reader = FrameReader()
    started = UtteranceStarted("a", 3, 1700.5, 2.5)
    ended = UtteranceEnded("a", 1.25, Reason.AUDIO_ERROR, "gone", {"k": 1}, 3, 1701.0)
    data = wire.started_frame(started) + wire.ended_frame(ended)
    data += wire.audio_frame(AudioStatus(False, "unplugged"))
    frames = []
    for i in range(len(data)):  # byte by byte: frames are found however the stream is cut
        frames += reader.feed(data[i : i + 1])
    assert wire.started_of(frames[0]) == started
    assert wire.ended_of(frames[1]) == ended
    assert wire.audio_of(frames[2]) == AudioStatus(False, "unplugged")


def test_a_length_over_the_bounds_is_refused_before_anything_is_kept() -> None:
    reader = FrameReader()
    with pytest.raises(WireError, match="over the wire's bounds"):
        reader.feed(struct.pack(">II", 16, wire.MAX_BODY + 1))
    with pytest.raises(WireError):
        FrameReader().feed(struct.pack(">II", wire.MAX_HEADER + 1, 0))


@pytest.mark.parametrize(
    "header",
    [b"not json", b"[1, 2]", b'{"no": "kind"}', b'{"k": 5}', b"[" * 5000 + b"]" * 5000],
)
def test_a_header_that_is_no_object_with_a_kind_is_refused(header: bytes) -> None:
    with pytest.raises(WireError):
        FrameReader().feed(struct.pack(">II", len(header), 0) + header)


@pytest.mark.parametrize(
    "fields",
    [
        {"job": 1},  # no id
        {"id": "a", "job": -1},
        {"id": "a", "job": True},
        {"id": "a", "job": 1, "priority": 9},
        {"id": "a", "job": 1, "priority": 1, "volume": 2.0},
        {"id": "a", "job": 1, "priority": 1, "error": "no_such_reason"},
        {"id": "a", "job": 1, "priority": 1, "start_at": "soon"},
        {"id": "a", "job": 1, "priority": 1, "info": [1]},
        {"id": "x" * 5000, "job": 1, "priority": 1},
    ],
)
def test_a_chunk_with_a_field_out_of_its_rules_is_refused(fields: dict[str, object]) -> None:
    head = json.dumps({"k": "chunk", **fields}).encode()
    (frame,) = FrameReader().feed(struct.pack(">II", len(head), 2) + head + b"\x00\x00")
    with pytest.raises(WireError):
        wire.chunk_of(frame)


def test_pcm_of_an_odd_length_is_refused() -> None:
    (frame,) = FrameReader().feed(wire.encode("chunk", {"id": "a", "job": 1, "priority": 1}, b"x"))
    with pytest.raises(WireError, match="odd"):
        wire.chunk_of(frame)


@given(st.binary(max_size=600))
def test_any_bytes_give_frames_or_a_wire_error(data: bytes) -> None:
    try:
        frames = FrameReader().feed(data)
    except WireError:
        return
    for frame in frames:
        assert isinstance(frame.kind, str)


class _Device:
    """The sounder's player as the engine's lane reads it: its underrun count."""

    def __init__(self) -> None:
        self.underruns = 0
        self.volume = 1.0

    def put(self, chunk: Chunk) -> bool:
        return True

    def cut(self, job: int) -> None:
        return None


def test_the_sounders_underruns_reach_the_engines_state_before_the_event_after_them() -> None:
    """The device is the sounder's: its underruns are told to the engine (whose state and
    Sparkplug metric say them) before the next event of either lane, and to each new engine.
    The engine's side reads them off a real socket pair. (The state said 0 while the log
    counted 3: nothing told the engine.)"""
    from agent.sounder.engine_lane import EngineLane  # noqa: PLC0415
    from agent.speaker_link import SpeakerLink  # noqa: PLC0415
    from harness import wait_until  # noqa: PLC0415

    sent: list[bytes] = []
    device = _Device()
    lane = EngineLane(sent.append, lambda: 1)
    lane.player = device
    device.underruns = 2
    lane.report(
        UtteranceEnded("alarm", 1.0, None, "", {}, 5, 1700.0)
    )  # an alarm's: job of no engine
    lane.report(UtteranceStarted("next", (1 << 32) | 6, 1701.0, 0.0))
    frames = [f for data in sent for f in FrameReader().feed(data)]
    assert [(f.kind, f.header.get("count")) for f in frames] == [
        ("underruns", 2),
        ("started", None),
    ]
    sent.clear()
    lane.hello()  # a new engine knows none
    told = [f for data in sent for f in FrameReader().feed(data) if f.kind == "underruns"]
    assert [f.integer("count") for f in told] == [2]

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    engine = SpeakerLink(theirs, lambda _report: None)
    engine.start()
    try:
        assert engine.player.underruns == 0
        ours.sendall(wire.encode("underruns", {"count": 3}))
        wait_until(lambda: engine.player.underruns == 3, 30, "the count at the engine")
    finally:
        engine.close()
        ours.close()
