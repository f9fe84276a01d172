"""The whole agent in-process, with faults injected around the real pyalsaaudio PCM: it keeps
serving, says the audio is unavailable meanwhile, and plays the next announcement."""

from __future__ import annotations

import threading
from pathlib import Path

import alsaaudio
import pytest

from agent.app import App, load_voices
from agent.config import from_mapping
from agent.player import Pcm, alsa_opener
from tests.support import Broker, FaultyPcm, Watcher, publish

pytestmark = pytest.mark.broker


class FlakyDevice:
    """Opens the real file PCM. The first PCM underruns once and is then lost mid-play; the
    next two opens fail as a busy device would; after that it works."""

    def __init__(self, capture: Path) -> None:
        self._open = alsa_opener(f"file:FILE={capture},FORMAT=raw", 22050, 10, 4)
        self.opens = 0

    def __call__(self) -> tuple[Pcm, int]:
        self.opens += 1
        if self.opens in (2, 3):
            raise alsaaudio.ALSAAudioError("Device or resource busy [hw:1,0]")
        pcm, period = self._open()
        return (FaultyPcm(pcm, {5: "underrun", 12: "lost"}) if self.opens == 1 else pcm), period


@pytest.mark.allow_error_logs
def test_device_loss_is_survived_reported_and_the_next_announcement_plays(
    broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    config = from_mapping(
        {
            "node_id": "faulty",
            "mqtt": {"host": broker.host, "port": broker.port},
            "tts": {"voice": str(tiny_voice)},
            "cache": {"dir": str(tmp_path / "cache")},
            "storage": {"dir": str(tmp_path / "storage")},
        },
        environ={},
    )
    device = FlakyDevice(tmp_path / "capture.raw")
    app = App(config, load_voices(config), open_pcm=device)
    watcher = Watcher(broker, "voice/faulty/#")
    serving = threading.Thread(target=app.serve)
    serving.start()
    try:
        watcher.wait_payload("voice/faulty/status", b"online")
        publish(
            broker, "voice/faulty/speak", b'{"id": "a", "text": "The pump in hall two failed."}'
        )
        failed = watcher.wait_event("a", "failed")
        assert failed["reason"] == "audio_error"

        publish(broker, "voice/faulty/speak", b'{"id": "b", "text": "Second message."}')
        watcher.wait_event("b", "finished")
        states = [m.json() for m in watcher.snapshot() if m.topic == "voice/faulty/state"]
        audio = [s["audio"] for s in states]
        assert "unavailable" in audio
        assert audio[-1] == "available"
        assert states[-1]["underruns"] == 1
        assert device.opens == 4  # lost, busy twice, then open again
    finally:
        app.request_stop()
        serving.join(15)
        watcher.close()
    assert not serving.is_alive()
