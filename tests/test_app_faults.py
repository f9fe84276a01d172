"""The whole agent in-process, with faults injected around the real pyalsaaudio PCM: it keeps
serving, says the audio is unavailable meanwhile, and plays the next announcement."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import alsaaudio
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from agent.app import App
from agent.audio.device import Pcm, alsa_opener
from agent.core.messages import Action, Event, SpeakRequest, SynthesisDone
from agent.protocol import payloads
from agent.settings.loading import from_mapping
from agent.voices import load_voices
from harness import Broker, FaultyPcm, Watcher, agent_config, publish, wait_until

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


@pytest.mark.allow_error_logs("Audio device unavailable: No such device")
def test_device_loss_is_survived_reported_and_the_next_announcement_plays(
    broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    config = from_mapping(
        agent_config(broker, tmp_path, "faulty", voice=tiny_voice, homeassistant={}),
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


@pytest.mark.allow_error_logs(r"Handling \w+ failed; the loop goes on$")
@pytest.mark.parametrize("where", ["event", "synthesize", "report"])
def test_a_fault_while_handling_one_message_ends_that_message_not_the_agent(
    broker: Broker, tmp_path: Path, tiny_voice: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A handler that raises (a bug) while one delivery is handled: that delivery is rejected
    with reason `internal` and acknowledged, and the same process speaks the next one."""
    from agent import execution  # noqa: PLC0415 - the module whose collaborators break

    encode_event = payloads.encode_event

    def encode_breaking(*args: object, **kwargs: object) -> bytes:
        if args[1] == "boom" and args[2] == "accepted":
            raise RuntimeError("injected fault while encoding an event")
        return encode_event(*args, **kwargs)  # type: ignore[arg-type]

    if where == "event":
        monkeypatch.setattr(execution, "encode_event", encode_breaking)
    config = from_mapping(
        agent_config(
            broker,
            tmp_path,
            "guarded",
            voice=tiny_voice,
            device=f"file:FILE={tmp_path / 'c.raw'},FORMAT=raw",
        ),
        environ={},
    )
    app = App(config, load_voices(config))
    if where == "synthesize":
        submit = app._synthesizer.submit

        def submit_breaking(
            request: SpeakRequest, job: int = 0, start_at: float | None = None
        ) -> None:
            if request.id == "boom":
                raise RuntimeError("injected fault while handing over a request")
            submit(request, job, start_at)

        monkeypatch.setattr(app._synthesizer, "submit", submit_breaking)
    if where == "report":
        handle = app._core.handle

        def handle_breaking(event: Event, now: float, wall: float = 0.0) -> list[Action]:
            if isinstance(event, SynthesisDone) and event.id == "boom":
                raise RuntimeError("injected fault while handling a worker's report")
            return handle(event, now, wall)

        monkeypatch.setattr(app._core, "handle", handle_breaking)
    watcher = Watcher(broker, "voice/guarded/#")
    serving = threading.Thread(target=app.serve)
    serving.start()
    try:
        watcher.wait_payload("voice/guarded/status", b"online")
        publish(broker, "voice/guarded/speak", b'{"id": "boom", "text": "This one breaks."}')
        ended = watcher.wait_event("boom", "failed" if where == "report" else "rejected")
        assert ended["reason"] == "internal"
        publish(broker, "voice/guarded/speak", b'{"id": "after", "text": "Still speaking."}')
        watcher.wait_event("after", "finished")
        assert serving.is_alive()
    finally:
        app.request_stop()
        serving.join(30)
        watcher.close()
    assert not serving.is_alive()


CLASS = {True: "alarm", False: "info"}


def test_messages_that_find_the_inbox_full_are_answered_and_never_come_again(
    broker: Broker,
    tmp_path: Path,
    tiny_voice: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """QoS 1 deliveries beyond their source's budget are answered `rejected` `queue_full` and
    acknowledged at once: every message gets one answer, none is spoken twice, and the link
    neither reconnects to get them again nor changes its MQTT version; alarms among them get
    in (their own lane) and are spoken."""
    from agent import assembly  # noqa: PLC0415 - its budget is shrunk to force refusals

    monkeypatch.setattr(assembly, "SOURCE_SLOTS", -12)  # 16 in flight from the broker, room for 4
    caplog.set_level(logging.INFO, logger="agent.link")
    device = f"file:FILE={tmp_path / 'c.raw'},FORMAT=raw"
    config = from_mapping(
        agent_config(broker, tmp_path, "full", voice=tiny_voice, device=device), environ={}
    )
    app = App(config, load_voices(config))
    watcher = Watcher(broker, "voice/full/#")
    serving = threading.Thread(target=app.serve)
    serving.start()
    try:
        watcher.wait_payload("voice/full/status", b"online")
        ids = [f"f{n:02d}" for n in range(40)]
        alarms = {i for n, i in enumerate(ids) if n % 10 == 9}
        flood = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        flood.connect(broker.host, broker.port)
        flood.loop_start()
        sent = [
            flood.publish(
                "voice/full/speak",
                json.dumps(
                    {"id": i, "text": "Hi.", "priority": "alarm" if i in alarms else "info"}
                ),
                1,
            )
            for i in ids
        ]
        for info in sent:  # all at once, not one after another: the broker fills the window
            info.wait_for_publish(30)
        flood.loop_stop()
        flood.disconnect()

        def ends() -> dict[str, dict[str, Any]]:
            kinds = {"finished", "rejected"}
            return {e["id"]: e for e in watcher.events() if e["event"] in kinds}

        def suppressed() -> int:  # a flood's refusals beyond the burst: one summary
            return sum(e["count"] for e in watcher.events() if e["event"] == "suppressed")

        wait_until(lambda: len(ends()) + suppressed() >= len(ids), what="an answer each")
        refused = {i for i, e in ends().items() if e["event"] == "rejected"}
        assert refused or suppressed(), "the premise: some found the inbox full"
        assert {ends()[i]["reason"] for i in refused} <= {"queue_full"}
        assert not refused & alarms  # alarms have their own lane
        started = [(e["id"], e["ts"]) for e in watcher.events() if e["event"] == "started"]
        finished = [e["id"] for e in watcher.events() if e["event"] == "finished"]
        spoken = set(finished)
        assert len(finished) == len(spoken)  # each spoken once (a preempted one plays again)
        assert {i for i, _ in started} == spoken
        assert alarms <= spoken
        assert not spoken & refused
        assert len(spoken) + len(refused) + suppressed() == len(ids)  # one answer each
        print(f"{len(spoken)} spoken, {len(refused) + suppressed()} refused queue_full")
        assert "reconnecting" not in caplog.text
        assert caplog.text.count("Connected to") == 1
        assert "does not take MQTT 5" not in caplog.text
        watcher.publish("voice/full/speak", b'{"id": "control", "text": "All clear."}')
        watcher.wait_event("control", "finished")  # the node speaks on after the flood
    finally:
        app.request_stop()
        serving.join(30)
        watcher.close()
