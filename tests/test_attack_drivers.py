"""The instruments of issue 33 judged themselves: the attackers' payloads are what the issue
says, the hostile server accepts a real client and then misbehaves, the media server serves new
bytes for the same sound, the recording never places a sound before it was played, and "heard"
tells a sound with gaps from a sound cut short."""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import paho.mqtt.client as mqtt
import pytest
import soundfile as sf
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from harness import PulseNullSink, TimedRecording, first_match, heard_in_order, wait_until
from harness.attacks import (
    RATE,
    HostileMqttServer,
    MediaServer,
    alarm_chime,
    long_request,
    pathological_request,
)
from tests.hostile import (
    amplified_dcmd,
    below_alarms,
    flood_speak,
    hostile_speak_pool,
    long_unended_text,
    padded_flac,
    remaining_length,
)
from tests.media_files import flac_silence


def test_the_long_text_has_no_sentence_end_and_is_new_each_time() -> None:
    text = long_unended_text(99_990, seed=1)
    assert len(text) == 99_990
    assert not set(".!?;\n") & set(text)
    assert text != long_unended_text(99_990, seed=2)


def test_the_wyoming_requests_are_the_issues() -> None:
    synthesize, stream = pathological_request(0), pathological_request(1)
    assert [e.type for e in synthesize] == ["synthesize"]
    assert synthesize[0].data["text"] == "." * 30_000 + "x"
    assert stream[0].type == "synthesize-start"
    assert stream[-1].type == "synthesize-stop"
    assert "".join(e.data["text"] for e in stream[1:-1]) == "." * 30_000 + "x"
    assert len(pathological_request(2)[0].data["text"]) < 5000  # under speak.max_text_chars
    assert len(long_request(0)[0].data["text"]) == 99_990


def test_a_dcmd_writes_the_class_then_31_new_texts() -> None:
    metrics = amplified_dcmd(32, seed=7)
    assert len(metrics) == 32
    assert metrics[0] == ("Priority", "String", "chat")
    texts = [value for name, _, value in metrics[1:] if name == "Speak"]
    assert len(set(texts)) == 31
    assert 1000 < sum(len(n) + len(v) + 12 for n, _, v in metrics) < 1600  # about 1.3 KB


def test_floods_carry_no_alarm() -> None:
    assert json.loads(flood_speak(3, "chat"))["priority"] == "chat"
    assert not below_alarms(b'{"text": "x", "priority": " Critical "}')
    assert not below_alarms('\ufeff{"priority": "alarm"}'.encode())
    assert below_alarms(b'{"text": "x", "priority": "warning"}')
    for payload in hostile_speak_pool(200, seed=3):
        text = payload.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            continue
        if isinstance(value, dict):
            assert str(value.get("priority", "")).strip().lower() not in {"alarm", "critical"}


def test_a_padded_flac_has_the_same_samples_and_other_bytes() -> None:
    original = flac_silence(48_000, 2, 1.0)
    padded = padded_flac(original, 1234)
    assert padded != original
    assert len(padded) == len(original) + 4 + 1234
    a, rate_a = sf.read(io.BytesIO(original), dtype="int16")
    b, rate_b = sf.read(io.BytesIO(padded), dtype="int16")
    assert rate_a == rate_b
    assert np.array_equal(a, b)


def test_remaining_length_is_mqtts_variable_byte_integer() -> None:
    for value in (0, 127, 128, 16_383, 16_384, 268_435_455):
        encoded, decoded, shift = remaining_length(value), 0, 0
        for byte in encoded:
            decoded |= (byte & 0x7F) << shift
            shift += 7
        assert decoded == value
        assert len(encoded) <= 4


@pytest.mark.parametrize("mode", ["garbage", "huge", "drip"])
def test_the_hostile_server_accepts_a_real_client_then_misbehaves(mode: str) -> None:
    server = HostileMqttServer(modes=[mode], huge_bytes=1 << 20).start()
    connected = threading.Event()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)

    def on_connect(_c: mqtt.Client, _u: object, _f: object, code: object, _p: object) -> None:
        if code == 0:
            connected.set()

    client.on_connect = on_connect
    try:
        client.connect(server.host, server.port, keepalive=60)
        client.loop_start()
        assert connected.wait(30), "no CONNACK"
        wait_until(lambda: server.report().get(f"misbehaved: {mode}") == 1, 30, "misbehaviour")
        assert server.report()["connack v5"] == 1
    finally:
        client.loop_stop()
        client.disconnect()
        server.stop()


def test_the_media_server_serves_new_bytes_for_the_same_sound() -> None:
    media = MediaServer().start()
    try:
        first = urllib.request.urlopen(f"{media.url}heavy-1.flac", timeout=30).read()  # noqa: S310 - loopback
        second = urllib.request.urlopen(f"{media.url}heavy-2.flac", timeout=30).read()  # noqa: S310
        assert first != second
        assert sf.info(io.BytesIO(first)).channels == 8
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"{media.url}nothing", timeout=30)  # noqa: S310
        assert media.served["heavy"] == 2
    finally:
        media.stop()


def test_heard_tells_gaps_from_a_sound_cut_short() -> None:
    rng = np.random.default_rng(0)
    chime = alarm_chime("alarm")
    silence = [np.zeros(900, np.int16), np.zeros(400, np.int16)]
    gapped = np.concatenate(
        [chime[:4000], silence[0], chime[4000:12000], silence[1], chime[12000:]]
    )
    haystack = rng.normal(0, 200, 3 * RATE).astype(np.int16)
    haystack[RATE : RATE + len(gapped)] += gapped
    found, pieces, first = heard_in_order(haystack, chime, RATE // 10)
    assert found >= pieces - 1
    assert first is not None
    assert abs(first - RATE) < RATE // 10
    cut = rng.normal(0, 200, 3 * RATE).astype(np.int16)
    cut[RATE : RATE + len(chime) // 3] += chime[: len(chime) // 3]
    found, pieces, _ = heard_in_order(cut, chime, RATE // 10)
    assert found <= pieces // 2
    assert first_match(haystack, chime[:441], 0.9) is not None


def test_the_recording_never_places_a_sound_before_it_was_played(tmp_path: Path) -> None:
    sink = PulseNullSink(tmp_path / "pulse", f"rate={RATE} channels=1")
    sink.start()
    recording = TimedRecording(sink, RATE, tmp_path / "monitor.raw").start()
    try:
        chime = alarm_chime("critical")
        sound = tmp_path / "chime.raw"
        sound.write_bytes(np.concatenate([np.zeros(RATE // 2, np.int16), chime]).tobytes())
        env = {**os.environ, **sink.env(tmp_path / "written.raw")}
        command = ["aplay", "-q", "-D", "pulse", "-t", "raw", "-f", "S16_LE", "-c", "1"]
        spawned = time.perf_counter()
        subprocess.run([*command, "-r", str(RATE), str(sound)], env=env, check=True, timeout=60)
        time.sleep(0.5)
        start = recording.index_at(spawned)
        found = first_match(recording.samples(start), chime[:441], 0.9)
        assert found is not None, "the chime did not reach the recording"
        heard_at = recording.time_of(start + found[0])
        assert heard_at >= spawned + 0.5  # after aplay began, and its half second of silence
        assert heard_at < time.perf_counter()
    finally:
        recording.stop()
        sink.stop()
