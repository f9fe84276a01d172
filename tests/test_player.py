"""The ALSA writer on real ALSA: the file PCM captures exactly what was played."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pytest

from agent.messages import Event, Reason, UtteranceEnded, UtteranceStarted
from agent.player import BUFFER_CHUNKS, Chunk, Player, alsa_opener
from tests.support import read_pcm

RATE = 22050


def tone(seconds: float, level: int = 8000) -> np.ndarray:
    n = int(RATE * seconds)
    return (np.sin(np.arange(n) * 2 * np.pi * 440 / RATE) * level).astype(np.int16)


def drain(events: queue.Queue[Event], count: int) -> list[Event]:
    return [events.get(timeout=10) for _ in range(count)]


def make_player(device: str, events: queue.Queue[Event]) -> Player:
    player = Player(alsa_opener(device, RATE, period_ms=20, periods=4), RATE, events.put)
    player.start()
    return player


def test_played_samples_are_exactly_the_chunks_in_order(tmp_path: Path) -> None:
    capture = tmp_path / "out.raw"
    events: queue.Queue[Event] = queue.Queue()
    player = make_player(f"file:FILE={capture},FORMAT=raw", events)
    a1, a2, b1 = tone(0.5), tone(0.33, 3000), tone(0.2, 12000)
    try:
        for chunk in (Chunk("a", a1), Chunk("a", a2), Chunk("a", end=True)):
            assert player.put(chunk)
        for chunk in (Chunk("b", b1), Chunk("b", end=True)):
            assert player.put(chunk)
        got = drain(events, 4)
    finally:
        player.stop()
    assert got == [
        UtteranceStarted("a"),
        UtteranceEnded("a", (len(a1) + len(a2)) / RATE),
        UtteranceStarted("b"),
        UtteranceEnded("b", len(b1) / RATE),
    ]
    assert np.array_equal(read_pcm(capture), np.concatenate([a1, a2, b1]))
    assert player.underruns == 0


def test_put_blocks_while_the_buffer_is_full_and_returns_false_on_stop() -> None:
    events: queue.Queue[Event] = queue.Queue()
    player = Player(alsa_opener("null", RATE, 20, 4), RATE, events.put)  # writer not started
    for _ in range(BUFFER_CHUNKS):
        assert player.put(Chunk("x", tone(0.01)))
    results: list[bool] = []
    blocked = threading.Thread(target=lambda: results.append(player.put(Chunk("x", tone(0.01)))))
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # a third chunk waits: the buffer holds two
    player.stop()
    blocked.join(5)
    assert results == [False]


def test_a_synthesis_error_after_some_audio_fails_the_utterance(tmp_path: Path) -> None:
    events: queue.Queue[Event] = queue.Queue()
    player = make_player(f"file:FILE={tmp_path / 'o.raw'},FORMAT=raw", events)
    try:
        player.put(Chunk("a", tone(0.1)))
        player.put(Chunk("a", end=True, error=Reason.SYNTHESIS_ERROR, detail="boom"))
        got = drain(events, 2)
    finally:
        player.stop()
    assert got == [UtteranceStarted("a"), UtteranceEnded("a", 0.1, Reason.SYNTHESIS_ERROR, "boom")]


@pytest.mark.allow_error_logs
def test_a_device_that_cannot_open_fails_each_utterance_and_the_player_goes_on() -> None:
    events: queue.Queue[Event] = queue.Queue()
    player = make_player("no_such_pcm_device", events)
    try:
        for request_id in ("a", "b"):
            player.put(Chunk(request_id, tone(0.1)))
            player.put(Chunk(request_id, end=True))
        got = drain(events, 2)
    finally:
        player.stop()
    for request_id, event in zip(("a", "b"), got, strict=True):
        assert isinstance(event, UtteranceEnded)
        assert (event.id, event.error) == (request_id, Reason.AUDIO_ERROR)
        assert "no_such_pcm_device" in event.detail
