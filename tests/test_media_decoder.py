"""The decoder child: the real `python -m agent.speech.media_child`, its limits as the kernel holds
them, and a child that overruns, dies, hangs, lies or is aborted: killed, replaced, the sound
refused with a reason, the next sound decoded by its successor."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.core.reasons import Reason
from agent.formats.media import MEDIA_REASONS, MediaError, decode_audio
from agent.speech.media_decoder import DecodeAbortedError, DecoderLimits, MediaDecoder
from harness import wait_until
from tests.media_files import decode_bomb, long_work, mp3_tone, wav_tone

RATE: Final = 22050
OPEN: Final = {"max_seconds": 10.0**6, "max_samples": 10**11}
"""Bounds opened so that `heavy` is decoded, to try the child's limits."""


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return decode_bomb()


@pytest.fixture(scope="module")
def heavy() -> bytes:
    return long_work()


@pytest.fixture
def decoder() -> Iterator[MediaDecoder]:
    started = MediaDecoder()
    started.start()
    yield started
    started.stop()


def cpu_seconds(pid: int) -> float:
    """User and system time of a process so far (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text(encoding="ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decoding(decoder: MediaDecoder, data: bytes) -> tuple[threading.Thread, list[object]]:
    """Decode `data` (bounds opened) on a thread; its outcome lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(decoder.decode(data, RATE, max_bytes=len(data), **OPEN))  # type: ignore[arg-type]
        except (MediaError, DecodeAbortedError) as err:
            outcome.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, outcome


def busy_child(decoder: MediaDecoder) -> int:
    """The child's pid once it is at work on the sound (its imports took ~0.3 s of CPU)."""
    wait_until(lambda: decoder.pid is not None, what="a child")
    pid = decoder.pid
    assert pid is not None
    wait_until(lambda: cpu_seconds(pid) > 0.6, what="the child at work")  # imports ~0.3 s
    return pid


def refused(decoder: MediaDecoder, data: bytes, **bounds: float) -> MediaError:
    with pytest.raises(MediaError) as caught:
        decoder.decode(data, RATE, max_bytes=max(len(data), 1), **bounds)  # type: ignore[arg-type]
    return caught.value


def test_the_child_decodes_what_the_agent_would_and_limits_itself(decoder: MediaDecoder) -> None:
    data = wav_tone(1.0, 44_100, 2)
    got = decoder.decode(data, RATE, max_bytes=len(data))
    want = decode_audio(data, RATE)
    np.testing.assert_array_equal(got.samples, want.samples)
    assert (got.source_format, got.source_rate, got.source_channels) == ("WAV", 44_100, 2)
    pid = decoder.pid
    assert pid is not None
    assert pid != os.getpid()
    limits = Path(f"/proc/{pid}/limits").read_text(encoding="ascii")
    print(limits)
    assert f"{DecoderLimits().memory_mb * 1024 * 1024}" in _limit(limits, "Max address space")
    assert _limit(limits, "Max file size").split()[:2] == ["0", "0"]
    assert _limit(limits, "Max core file size").split()[:2] == ["0", "0"]
    assert _limit(limits, "Max open files").split()[:2] == ["16", "16"]
    assert _limit(limits, "Max cpu time").split()[0] != "unlimited"  # set per sound
    niceness = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])
    assert niceness == os.nice(0) + DecoderLimits().niceness
    again = decoder.decode(data, RATE, max_bytes=len(data))
    assert decoder.pid == pid  # warm: the same child serves the next sound
    np.testing.assert_array_equal(again.samples, want.samples)


def test_the_child_starts_with_the_first_sound_and_ends_when_idle() -> None:
    decoder = MediaDecoder(DecoderLimits(idle_s=1.0))
    try:
        assert decoder.pid is None  # nothing fetched: no child
        data = wav_tone(0.2, 8000)
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.2)
        first = decoder.pid
        assert first is not None
        wait_until(lambda: decoder.pid is None, what="the idle child ended")
        wait_until(lambda: not Path(f"/proc/{first}").exists(), what="it reaped")
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.2)
        assert decoder.pid not in (None, first)  # the next sound started another
    finally:
        decoder.stop()


def _limit(limits: str, name: str) -> str:
    line = next(line for line in limits.splitlines() if line.startswith(name))
    return line[len(name) :].strip()


def test_the_bomb_is_refused_from_its_header(decoder: MediaDecoder, bomb: bytes) -> None:
    err = refused(decoder, bomb)
    print(err)
    assert err.reason is Reason.TOO_LARGE
    assert "655350 Hz" in err.detail
    assert decoder.replaced == 0  # an answer, not a failure


def test_a_child_over_its_cpu_time_is_killed_replaced_and_the_sound_refused(
    heavy: bytes,
) -> None:
    # RLIMIT_CPU counts whole seconds: a bound of 0.5 s leaves the decode 0.5 to 1.5 s, so the
    # work must take well over that (`work_bomb`'s 0.45 s was decoded within it)
    decoder = MediaDecoder(DecoderLimits(cpu_seconds=0.5))
    try:
        decoder.start()
        first = decoder.pid
        err = refused(decoder, heavy, **OPEN)
        print(err)
        assert err.reason is Reason.TOO_LARGE
        assert "CPU" in err.detail
        assert decoder.replaced == 1
        assert decoder.pid not in (None, first)
        data = wav_tone(0.5, 8000)
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.5)
    finally:
        decoder.stop()


def test_a_child_out_of_memory_refuses_the_sound_and_is_replaced() -> None:
    probe = MediaDecoder()
    try:
        small = wav_tone(0.1, 8000)
        probe.decode(small, RATE, max_bytes=len(small))
        assert probe.pid is not None
        status = Path(f"/proc/{probe.pid}/status").read_text(encoding="ascii")
        ready_mb = int(status.split("VmPeak:")[1].split()[0]) // 1024
    finally:
        probe.stop()
    decoder = MediaDecoder(DecoderLimits(memory_mb=ready_mb + 30))  # 60 s at 48 kHz need ~60 MB
    try:
        data = wav_tone(59.0, 48_000, 2)
        with pytest.raises(MediaError) as caught:
            decoder.decode(data, 48_000, max_bytes=len(data))
        print(f"{ready_mb} MiB when ready; {caught.value}")
        assert caught.value.reason in {Reason.TOO_LARGE, Reason.UNSUPPORTED_AUDIO}
        wait_until(lambda: decoder.pid is not None, what="its successor")
        small = wav_tone(0.1, 8000)
        assert decoder.decode(small, RATE, max_bytes=len(small)).seconds == pytest.approx(0.1)
    finally:
        decoder.stop()


def test_a_child_that_hangs_is_killed_at_its_deadline() -> None:
    decoder = MediaDecoder(DecoderLimits(deadline_s=2.0))
    try:
        data = wav_tone(0.5, 8000)
        decoder.decode(data, RATE, max_bytes=len(data))  # warm
        pid = decoder.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # a decoder stuck in a loop that never yields
        err = refused(decoder, data)
        print(err)
        assert err.reason is Reason.TOO_LARGE
        assert "within 2 s" in err.detail
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.5)
    finally:
        decoder.stop()


def test_a_child_that_dies_refuses_the_sound_and_is_replaced(heavy: bytes) -> None:
    decoder = MediaDecoder()
    try:
        thread, outcome = decoding(decoder, heavy)
        pid = busy_child(decoder)
        os.kill(pid, signal.SIGSEGV)  # what a decoder bug does to its process
        thread.join(30)
        (err,) = outcome
        print(err)
        assert isinstance(err, MediaError)
        assert err.reason is Reason.UNSUPPORTED_AUDIO
        assert "SIGSEGV" in err.detail
        data = wav_tone(0.5, 8000)
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.5)
        assert decoder.pid != pid
    finally:
        decoder.stop()


def test_an_aborted_decode_ends_at_once_and_the_next_is_decoded(heavy: bytes) -> None:
    decoder = MediaDecoder()
    try:
        thread, outcome = decoding(decoder, heavy)
        pid = busy_child(decoder)
        began = time.monotonic()
        decoder.abort()
        thread.join(30)
        print(f"aborted after {time.monotonic() - began:.3f} s")
        assert outcome
        assert isinstance(outcome[0], DecodeAbortedError)
        data = wav_tone(0.5, 8000)
        assert decoder.decode(data, RATE, max_bytes=len(data)).seconds == pytest.approx(0.5)
        assert decoder.pid != pid
        assert decoder.replaced == 1
    finally:
        decoder.stop()


LIARS: Final = {
    "garbage_json": b"sys.stdout.buffer.write(frame(b'not json'))",
    "a_list": b"sys.stdout.buffer.write(frame(b'[1, 2]'))",
    "no_reason": b'sys.stdout.buffer.write(frame(b\'{"ok": false, "reason": "pwned"}\'))',
    "too_many_samples": b'sys.stdout.buffer.write(frame(b\'{"ok": true, "samples": 10**9}\'))',
    "huge_frame": b"sys.stdout.buffer.write(struct.pack('<I', 2**31))",
    "fewer_samples": (
        b'sys.stdout.buffer.write(frame(b\'{"ok": true, "samples": 100}\') + frame(bytes(10)))'
    ),
    "bool_samples": b'sys.stdout.buffer.write(frame(b\'{"ok": true, "samples": true}\'))',
    "exits": b"sys.exit(0)",
}
"""A child that answers something that is no answer (what a compromised decoder could send)."""


@pytest.mark.parametrize("case", sorted(LIARS))
def test_a_child_that_answers_nonsense_is_not_believed(case: str) -> None:
    script = (
        "import struct, sys\n"
        "def frame(b): return struct.pack('<I', len(b)) + b\n"
        "sys.stdout.buffer.write(frame(b'{\"ready\": true}')); sys.stdout.buffer.flush()\n"
        "n = struct.unpack('<I', sys.stdin.buffer.read(4))[0]; sys.stdin.buffer.read(n)\n"
        "n = struct.unpack('<I', sys.stdin.buffer.read(4))[0]; sys.stdin.buffer.read(n)\n"
        + LIARS[case].decode()
        + "\nsys.stdout.buffer.flush()\nimport time; time.sleep(30)\n"
    )
    decoder = MediaDecoder(DecoderLimits(deadline_s=10), [sys.executable, "-c", script])
    try:
        data = wav_tone(0.5, 8000)
        err = refused(decoder, data)
        print(f"{case}: {err}")
        assert err.reason is Reason.UNSUPPORTED_AUDIO
        assert "pwned" not in err.detail
        assert decoder.replaced == 1
    finally:
        decoder.stop()


SAMPLES: Final = {
    "wav": wav_tone(0.2, 16_000),
    "mp3": mp3_tone(0.3, 16_000, 1),
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(SAMPLES)),
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), min_size=1, max_size=8),
    st.integers(1, 100),
)
def test_mutated_files_through_the_child_decode_or_are_refused(
    kind: str, changes: list[tuple[int, int]], keep_percent: int
) -> None:
    data = bytearray(SAMPLES[kind])
    for position, value in changes:
        data[position % len(data)] = value
    data = data[: max(1, len(data) * keep_percent // 100)]
    decoder = _shared_decoder()
    try:
        decoded = decoder.decode(bytes(data), RATE, max_bytes=len(data), max_seconds=30)
    except MediaError as err:
        assert err.reason in MEDIA_REASONS  # noqa: PT017 - either outcome is right
        return
    assert decoded.samples.dtype == np.int16
    assert decoded.seconds <= 30 + 0.01


_SHARED: list[MediaDecoder] = []


def _shared_decoder() -> MediaDecoder:
    """One decoder for every example (a child is warm between them; it ends with the run)."""
    if not _SHARED:
        _SHARED.append(MediaDecoder())
    return _SHARED[0]


@pytest.fixture(scope="module", autouse=True)
def _stop_shared() -> Iterator[None]:
    yield
    for decoder in _SHARED:
        decoder.stop()
