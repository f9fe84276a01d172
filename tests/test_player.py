"""The ALSA writer on real ALSA: the file PCM captures exactly what was played. Faults are
injected by a wrapper around the real pyalsaaudio PCM."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import alsaaudio
import numpy as np
import pytest

from agent.audio.device import Pcm, PcmOpener, alsa_opener
from agent.audio.player import BUFFER_CHUNKS, Player
from agent.core.messages import (
    AudioStatus,
    Event,
    NormalPreempted,
    Priority,
    UtteranceEnded,
    UtteranceStarted,
)
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk
from harness import FaultyPcm, read_pcm, wait_until

RATE = 22050
PERIOD = RATE // 50  # 20 ms


def tone(seconds: float, level: int = 8000) -> np.ndarray:
    n = int(RATE * seconds)
    return (np.sin(np.arange(n) * 2 * np.pi * 440 / RATE) * level).astype(np.int16)


def le(samples: np.ndarray) -> bytes:
    """Samples as a chunk holds them: 16-bit little-endian bytes."""
    return samples.astype("<i2").tobytes()


def collect(events: queue.Queue[Event], count: int) -> list[Event]:
    return [events.get(timeout=10) for _ in range(count)]


def file_opener(capture: Path) -> PcmOpener:
    return alsa_opener(f"file:FILE={capture},FORMAT=raw", RATE, period_ms=20, periods=4)


@pytest.fixture
def events() -> queue.Queue[Event]:
    return queue.Queue()


MakePlayer = Callable[..., Player]
"""Makes a started Player on an opener (volume and floor optional); stopped after the test."""


@pytest.fixture
def make_player(events: queue.Queue[Event]) -> Iterator[MakePlayer]:
    started: list[Player] = []

    def make(opener: PcmOpener, volume: float = 1.0, floor: float = 0.0) -> Player:
        player = Player(opener, RATE, events.put, volume, floor)
        player.start()
        started.append(player)
        return player

    yield make
    for player in started:
        player.stop()


def test_played_samples_are_exactly_the_chunks_in_order(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    player = make_player(file_opener(capture))
    a1, a2, b1 = tone(0.5), tone(0.33, 3000), tone(0.2, 12000)
    for chunk in (Chunk("a", le(a1)), Chunk("a", le(a2)), Chunk("a", end=True)):
        assert player.put(chunk)
    for chunk in (Chunk("b", le(b1)), Chunk("b", end=True)):
        assert player.put(chunk)
    assert collect(events, 5) == [
        AudioStatus(True),
        UtteranceStarted("a"),
        UtteranceEnded("a", (len(a1) + len(a2)) / RATE),
        UtteranceStarted("b"),
        UtteranceEnded("b", len(b1) / RATE),
    ]
    assert np.array_equal(read_pcm(capture), np.concatenate([a1, a2, b1]))
    assert player.underruns == 0


def test_volume_requested_times_global_with_the_alarm_floor(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    player = make_player(file_opener(capture), volume=0.5, floor=0.4)
    sound = tone(0.1, 20000)
    player.put(Chunk("info", le(sound), volume=0.5, priority=Priority.INFO))
    player.put(Chunk("info", end=True))
    player.put(Chunk("alarm", le(sound), volume=0.1, priority=Priority.ALARM))
    player.put(Chunk("alarm", end=True))
    collect(events, 5)
    played = read_pcm(capture)
    quarter = np.round(sound.astype(np.float32) * 0.25).astype(np.int16)
    floored = np.round(sound.astype(np.float32) * 0.4).astype(np.int16)
    assert np.array_equal(played, np.concatenate([quarter, floored]))


def test_a_cut_fades_out_within_one_period_and_drops_the_rest(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    gate = threading.Event()
    _Gated.writes = 0  # not an earlier test's count (the device opens with the first chunk)

    def slow_open() -> tuple[Pcm, int]:
        pcm, period = file_opener(capture)()
        return _Gated(pcm, gate), period

    player = make_player(slow_open)
    long_tone = tone(2.0, 20000)
    player.put(Chunk("chat", le(long_tone), job=1))
    player.put(Chunk("chat", end=True, job=1))
    wait_until(lambda: _Gated.writes >= 3, 10, "three periods written")
    player.cut(1)
    gate.set()
    player.put(Chunk("next", le(tone(0.1)), job=2))
    player.put(Chunk("next", end=True, job=2))
    got = collect(events, 5)
    assert [type(e).__name__ for e in got] == [
        "AudioStatus",
        "UtteranceStarted",
        "UtteranceEnded",
        "UtteranceStarted",
        "UtteranceEnded",
    ]
    played = read_pcm(capture)
    chat_frames = len(played) - len(tone(0.1))
    assert chat_frames < len(long_tone) // 4  # most of the 2 s were dropped
    fade = played[chat_frames - PERIOD : chat_frames].astype(np.int32)
    assert abs(fade[-1]) < 200  # ends near silence: no click
    own_slope = np.max(np.abs(np.diff(long_tone.astype(np.int32))))
    jumps = np.abs(np.diff(played[:chat_frames].astype(np.int32)))
    assert np.max(jumps) <= own_slope + 2  # the cut adds no step larger than the tone's own


def test_a_cut_before_any_sample_plays_nothing(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    player = make_player(file_opener(capture))
    player.cut(7)
    player.put(Chunk("never", le(tone(0.5)), job=7))
    player.put(Chunk("never", end=True, job=7))
    assert collect(events, 2)[1] == UtteranceEnded("never", 0.0, job=7)
    assert len(read_pcm(capture)) == 0


def test_a_late_cut_of_an_earlier_activation_leaves_the_next_alone(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    player = make_player(file_opener(capture))
    sound = tone(0.2)
    player.put(Chunk("w", le(sound), job=1))
    player.put(Chunk("w", end=True, job=1))
    collect(events, 3)
    player.cut(1)  # too late for job 1: it ended
    player.put(Chunk("w", le(sound), job=2))  # the same announcement, played again
    player.put(Chunk("w", end=True, job=2))
    assert collect(events, 2) == [UtteranceStarted("w", 2), UtteranceEnded("w", 0.2, job=2)]
    assert len(read_pcm(capture)) == 2 * len(sound)


def test_put_blocks_while_the_buffer_is_full_and_returns_false_on_stop(
    events: queue.Queue[Event],
) -> None:
    player = Player(alsa_opener("null", RATE, 20, 4), RATE, events.put)  # writer not started
    for _ in range(BUFFER_CHUNKS):
        assert player.put(Chunk("x", le(tone(0.01))))
    results: list[bool] = []
    blocked = threading.Thread(
        target=lambda: results.append(player.put(Chunk("x", le(tone(0.01)))))
    )
    blocked.start()
    blocked.join(0.5)
    assert blocked.is_alive()  # a third chunk waits: the buffer holds two
    player.stop()
    blocked.join(5)
    assert results == [False]


def test_a_synthesis_error_after_some_audio_fails_the_announcement(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    player = make_player(file_opener(tmp_path / "o.raw"))
    player.put(Chunk("a", le(tone(0.1))))
    player.put(Chunk("a", end=True, error=Reason.SYNTHESIS_ERROR, detail="boom"))
    assert collect(events, 3)[1:] == [
        UtteranceStarted("a"),
        UtteranceEnded("a", 0.1, Reason.SYNTHESIS_ERROR, "boom"),
    ]


# ---- faults, injected around the real PCM ---------------------------------------------------


class _Gated:
    """The real PCM, whose writes wait at a gate after the third (so a test can act mid-play)."""

    writes = 0

    def __init__(self, pcm: Pcm, gate: threading.Event) -> None:
        self._pcm, self._gate = pcm, gate
        _Gated.writes = 0

    def write(self, data: bytes) -> int:
        _Gated.writes += 1
        if _Gated.writes > 3:
            self._gate.wait(10)
        return self._pcm.write(data)

    def drain(self) -> int:
        return self._pcm.drain()

    def close(self) -> None:
        self._pcm.close()


@pytest.mark.allow_error_logs("Audio device unavailable")
def test_an_underrun_is_recovered_and_counted(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"

    def opener() -> tuple[Pcm, int]:
        pcm, period = file_opener(capture)()
        return FaultyPcm(pcm, {3: "underrun"}), period

    player = make_player(opener)
    sound = tone(0.3)
    player.put(Chunk("a", le(sound)))
    player.put(Chunk("a", end=True))
    assert collect(events, 3)[2] == UtteranceEnded("a", len(sound) / RATE)
    assert player.underruns == 1
    assert np.array_equal(read_pcm(capture), sound)  # the rejected period was written again


@pytest.mark.allow_error_logs("Audio device unavailable")
def test_a_lost_device_fails_the_announcement_then_is_reopened(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    opened: list[int] = []

    def opener() -> tuple[Pcm, int]:
        pcm, period = file_opener(capture)()
        opened.append(1)
        return (FaultyPcm(pcm, {2: "lost"}) if len(opened) == 1 else pcm), period

    player = make_player(opener)
    player.put(Chunk("a", le(tone(0.3))))
    player.put(Chunk("a", end=True))
    got = collect(events, 4)
    assert got[0] == AudioStatus(True)
    assert got[2] == AudioStatus(False, "No such device [hw:1,0]")
    assert isinstance(got[3], UtteranceEnded)
    assert got[3].error == Reason.AUDIO_ERROR
    sound = tone(0.2)
    player.put(Chunk("b", le(sound)))
    player.put(Chunk("b", end=True))
    assert collect(events, 3) == [
        AudioStatus(True),
        UtteranceStarted("b"),
        UtteranceEnded("b", len(sound) / RATE),
    ]
    assert len(opened) == 2


@pytest.mark.allow_error_logs("Audio device unavailable")
def test_a_device_that_cannot_open_is_retried_until_it_can(
    tmp_path: Path, events: queue.Queue[Event], make_player: MakePlayer
) -> None:
    capture = tmp_path / "out.raw"
    attempts: list[int] = []

    def opener() -> tuple[Pcm, int]:
        attempts.append(1)
        if len(attempts) < 3:
            raise alsaaudio.ALSAAudioError("Device or resource busy [default]")
        return file_opener(capture)()

    player = make_player(opener)
    sound = tone(0.2)
    player.put(Chunk("a", le(sound)))
    player.put(Chunk("a", end=True))
    got = collect(events, 4)
    assert got == [
        AudioStatus(False, "Device or resource busy [default]"),
        AudioStatus(True),
        UtteranceStarted("a"),
        UtteranceEnded("a", len(sound) / RATE),
    ]
    assert len(attempts) == 3
    assert np.array_equal(read_pcm(capture), sound)


# ---- the two lanes: alarms first -------------------------------------------------------------

CHANCE_SECONDS = 0.3
"""How long a test leaves a wrong writer to take what it must not (a negative check: passing
never depends on speed, the writer takes a chunk within one poll, 50 ms)."""


@pytest.fixture
def urgent_events() -> queue.Queue[Event]:
    return queue.Queue()


@pytest.fixture
def two_lanes(
    events: queue.Queue[Event], urgent_events: queue.Queue[Event]
) -> Iterator[Callable[[PcmOpener], Player]]:
    """Makes a Player (not started) whose urgent lane reports to `urgent_events`."""
    made: list[Player] = []

    def make(opener: PcmOpener) -> Player:
        player = Player(opener, RATE, events.put, report_urgent=urgent_events.put)
        made.append(player)
        return player

    yield make
    for player in made:
        player.stop()


def until_ended(events: queue.Queue[Event]) -> list[Event]:
    """Events up to and including the next UtteranceEnded."""
    out = [events.get(timeout=10)]
    while not isinstance(out[-1], UtteranceEnded):
        out.append(events.get(timeout=10))
    return out


def drained(events: queue.Queue[Event]) -> list[Event]:
    out = []
    while not events.empty():
        out.append(events.get_nowait())
    return out


def test_an_urgent_chunk_overtakes_a_waiting_normal_one_each_lane_reporting_its_own(
    tmp_path: Path,
    events: queue.Queue[Event],
    urgent_events: queue.Queue[Event],
    two_lanes: Callable[[PcmOpener], Player],
) -> None:
    capture = tmp_path / "out.raw"
    player = two_lanes(file_opener(capture))
    chat, alarm = tone(0.3, 3000), tone(0.2, 12000)
    assert player.put(Chunk("chat", le(chat), job=1))
    assert player.put(Chunk("chat", end=True, job=1))
    assert player.put_urgent(Chunk("alarm", le(alarm), job=1, priority=Priority.ALARM))
    assert player.put_urgent(Chunk("alarm", end=True, job=1, priority=Priority.ALARM))
    player.start()  # both lanes full: the writer chooses
    assert collect(urgent_events, 3) == [
        AudioStatus(True),
        UtteranceStarted("alarm", 1),
        UtteranceEnded("alarm", len(alarm) / RATE, job=1),
    ]
    assert collect(events, 3) == [
        AudioStatus(True),  # the device's availability: to both
        UtteranceStarted("chat", 1),
        UtteranceEnded("chat", len(chat) / RATE, job=1),
    ]
    assert np.array_equal(read_pcm(capture), np.concatenate([alarm, chat]))


def test_a_preempted_utterance_fades_is_reported_once_and_the_rest_of_its_job_dropped(
    tmp_path: Path,
    events: queue.Queue[Event],
    urgent_events: queue.Queue[Event],
    two_lanes: Callable[[PcmOpener], Player],
) -> None:
    capture = tmp_path / "out.raw"
    gate = threading.Event()
    _Gated.writes = 0  # not an earlier test's count (the device opens with the first chunk)

    def gated_open() -> tuple[Pcm, int]:
        pcm, period = file_opener(capture)()
        return _Gated(pcm, gate), period

    player = two_lanes(gated_open)
    player.start()
    chat, alarm, after = tone(2.0, 20000), tone(0.2, 12000), tone(0.1)
    player.put(Chunk("chat", le(chat), job=4))
    wait_until(lambda: _Gated.writes >= 3, 10, "three periods of the chat written")
    player.put_urgent(Chunk("alarm", le(alarm), job=1))
    player.put_urgent(Chunk("alarm", end=True, job=1))
    player.preempt_normal("alarm")
    player.preempt_normal("alarm")  # once is enough: reported once
    gate.set()
    assert player.put(Chunk("chat", le(chat), job=4))  # the rest of the job: dropped
    assert player.put(Chunk("chat", end=True, job=4))  # its end too, and not reported
    assert player.put(Chunk("after", le(after), job=5))
    assert player.put(Chunk("after", end=True, job=5))
    assert collect(events, 5) == [
        AudioStatus(True),
        UtteranceStarted("chat", 4),
        NormalPreempted("chat", 4, "alarm"),
        UtteranceStarted("after", 5),
        UtteranceEnded("after", len(after) / RATE, job=5),
    ]
    assert collect(urgent_events, 3)[1:] == [
        UtteranceStarted("alarm", 1),
        UtteranceEnded("alarm", len(alarm) / RATE, job=1),
    ]
    assert drained(events) == []
    played = read_pcm(capture)
    heard = len(played) - len(alarm) - len(after)
    assert heard < len(chat) // 4  # the chat was cut within periods
    assert abs(int(played[heard - 1])) < 200  # faded to near silence: no click
    assert np.array_equal(played[heard:], np.concatenate([alarm, after]))


def test_an_utterance_preempted_while_it_waits_in_the_buffer_is_reported_and_never_heard(
    tmp_path: Path, events: queue.Queue[Event], two_lanes: Callable[[PcmOpener], Player]
) -> None:
    capture = tmp_path / "out.raw"
    player = two_lanes(file_opener(capture))
    player.preempt_normal("nothing")  # nothing current: nothing happens
    assert player.put(Chunk("waiting", le(tone(0.5)), job=2))
    assert player.put(Chunk("waiting", end=True, job=2))
    player.preempt_normal("alarm")
    assert events.get(timeout=10) == NormalPreempted("waiting", 2, "alarm")
    player.start()
    sound = tone(0.1)
    assert player.put(Chunk("next", le(sound), job=3))
    assert player.put(Chunk("next", end=True, job=3))
    assert collect(events, 3) == [
        AudioStatus(True),
        UtteranceStarted("next", 3),
        UtteranceEnded("next", len(sound) / RATE, job=3),
    ]
    assert np.array_equal(read_pcm(capture), sound)


def test_a_held_normal_lane_waits_while_the_urgent_lane_plays(
    tmp_path: Path,
    events: queue.Queue[Event],
    urgent_events: queue.Queue[Event],
    two_lanes: Callable[[PcmOpener], Player],
) -> None:
    capture = tmp_path / "out.raw"
    player = two_lanes(file_opener(capture))
    player.hold_normal(True)
    player.start()
    chat, alarm = tone(0.2, 3000), tone(0.2, 12000)
    assert player.put(Chunk("chat", le(chat), job=1))
    assert player.put(Chunk("chat", end=True, job=1))
    assert player.put_urgent(Chunk("alarm", le(alarm), job=1))
    assert player.put_urgent(Chunk("alarm", end=True, job=1))
    assert collect(urgent_events, 3)[2] == UtteranceEnded("alarm", len(alarm) / RATE, job=1)
    time.sleep(CHANCE_SECONDS)  # the writer is free: a wrong one takes the chat now
    assert drained(events) == [AudioStatus(True)]
    player.hold_normal(False)
    assert collect(events, 2) == [
        UtteranceStarted("chat", 1),
        UtteranceEnded("chat", len(chat) / RATE, job=1),
    ]
    assert np.array_equal(read_pcm(capture), np.concatenate([alarm, chat]))


def test_an_open_urgent_utterance_keeps_the_normal_lane_waiting_between_its_chunks(
    tmp_path: Path,
    events: queue.Queue[Event],
    urgent_events: queue.Queue[Event],
    two_lanes: Callable[[PcmOpener], Player],
) -> None:
    """The chime of an alarm, then its words later (synthesized elsewhere): nothing of the
    normal lane plays between them."""
    capture = tmp_path / "out.raw"
    player = two_lanes(file_opener(capture))
    chime, words, chat = tone(0.2, 12000), tone(0.3, 9000), tone(0.2, 3000)
    assert player.put_urgent(Chunk("alarm", le(chime), job=1))
    assert player.put(Chunk("chat", le(chat), job=1))
    assert player.put(Chunk("chat", end=True, job=1))
    player.start()
    assert collect(urgent_events, 2)[1] == UtteranceStarted("alarm", 1)
    time.sleep(CHANCE_SECONDS)  # the alarm's next chunk is late: a wrong writer takes the chat
    assert drained(events) == [AudioStatus(True)]
    assert player.put_urgent(Chunk("alarm", le(words), job=1))
    assert player.put_urgent(Chunk("alarm", end=True, job=1))
    assert urgent_events.get(timeout=10) == UtteranceEnded(
        "alarm", (len(chime) + len(words)) / RATE, job=1
    )
    assert collect(events, 2) == [
        UtteranceStarted("chat", 1),
        UtteranceEnded("chat", len(chat) / RATE, job=1),
    ]
    assert np.array_equal(read_pcm(capture), np.concatenate([chime, words, chat]))


@pytest.mark.parametrize("urgent", [False, True])
def test_a_cut_names_a_job_of_one_lane_only(
    tmp_path: Path,
    events: queue.Queue[Event],
    urgent_events: queue.Queue[Event],
    two_lanes: Callable[[PcmOpener], Player],
    urgent: bool,
) -> None:
    """Both owners count their jobs from 1: a cut of job 1 on one lane leaves the other's
    job 1 whole."""
    capture = tmp_path / "out.raw"
    player = two_lanes(file_opener(capture))
    chat, alarm = tone(0.3, 3000), tone(0.2, 12000)
    assert player.put(Chunk("chat", le(chat), job=1))
    assert player.put(Chunk("chat", end=True, job=1))
    assert player.put_urgent(Chunk("alarm", le(alarm), job=1))
    assert player.put_urgent(Chunk("alarm", end=True, job=1))
    if urgent:
        player.cut_urgent(1)
    else:
        player.cut(1)
    player.start()
    alarm_ended, chat_ended = until_ended(urgent_events)[-1], until_ended(events)[-1]
    if urgent:
        assert alarm_ended == UtteranceEnded("alarm", 0.0, job=1)
        assert chat_ended == UtteranceEnded("chat", len(chat) / RATE, job=1)
        assert np.array_equal(read_pcm(capture), chat)
    else:
        assert alarm_ended == UtteranceEnded("alarm", len(alarm) / RATE, job=1)
        assert chat_ended == UtteranceEnded("chat", 0.0, job=1)
        assert np.array_equal(read_pcm(capture), alarm)


def test_put_urgent_blocks_while_its_own_buffer_is_full(events: queue.Queue[Event]) -> None:
    player = Player(alsa_opener("null", RATE, 20, 4), RATE, events.put)  # writer not started
    for _ in range(BUFFER_CHUNKS):
        assert player.put(Chunk("x", le(tone(0.01))))
    for _ in range(BUFFER_CHUNKS):
        assert player.put_urgent(Chunk("u", le(tone(0.01))))  # the normal lane's being full
    results: list[bool] = []
    blocked = threading.Thread(target=lambda: results.append(player.put_urgent(Chunk("u"))))
    blocked.start()
    blocked.join(CHANCE_SECONDS)
    assert blocked.is_alive()
    player.stop()
    blocked.join(5)
    assert results == [False]
