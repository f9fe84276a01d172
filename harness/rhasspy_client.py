"""A Rhasspy-side Hermes client, run by the rhasspy-hermes venv's python (see `rhasspy.py`).

It builds every message with rhasspy-hermes' own classes, publishes it with the paho-mqtt that
rhasspy-hermes pins (QoS 0 and MQTT 3.1.1, as Rhasspy's services do), and parses every reply with
the library's class for its topic. It never imports the agent or the rest of the harness (they
need another paho). Protocol, one JSON object a line:

- stdin, one command a line: `{"seq": N, "type": "TtsSay", "fields": {...}, "topic_args": {...}}`
  (`fields` are the class's own keyword arguments; `AudioPlayBytes` takes `wav_b64` instead).
  End of input: disconnect and exit.
- stdout: `{"event": "ready"}` once subscribed; `{"event": "published", "seq", "topic",
  "payload" (the JSON object sent, null for binary), "size", "at"}` for each command, or
  `{"event": "failed", "seq", "error"}`; `{"event": "received", "topic", "type", "message"
  (the parsed message's `to_dict()`), "payload" (the JSON as sent), "error", "at"}` for each reply.
"""

from __future__ import annotations

import base64
import importlib
import json
import sys
import threading
import time
import warnings
from typing import Any, Final

warnings.simplefilter("ignore", DeprecationWarning)  # rhasspyhermes imports audioop

# Imported by name: this script runs with paho-mqtt 1.5.0 and rhasspy-hermes from their own venv,
# while the type checker sees the project's paho 2 (another API) and no rhasspy-hermes.
mqtt: Any = importlib.import_module("paho.mqtt.client")
tts: Any = importlib.import_module("rhasspyhermes.tts")
audioserver: Any = importlib.import_module("rhasspyhermes.audioserver")

SENT: Final[dict[str, Any]] = {
    "TtsSay": tts.TtsSay,
    "GetVoices": tts.GetVoices,
    "AudioPlayBytes": audioserver.AudioPlayBytes,
    "AudioToggleOn": audioserver.AudioToggleOn,
    "AudioToggleOff": audioserver.AudioToggleOff,
    "AudioSetVolume": audioserver.AudioSetVolume,
}
"""The messages a test may send, by class name."""
REPLIES: Final[tuple[Any, ...]] = (
    tts.TtsSayFinished,
    tts.TtsError,
    tts.Voices,
    audioserver.AudioPlayFinished,
    audioserver.AudioPlayError,
)
"""The messages an audio server and a TTS service answer with (what Rhasspy listens for)."""
CONNECT_TIMEOUT: Final = 30.0
"""Longest wait for the broker's CONNACK and SUBACK (seconds)."""

_output = threading.Lock()


def emit(record: dict[str, Any]) -> None:
    """One JSON line on stdout (from the MQTT thread and the main thread alike)."""
    with _output:
        sys.stdout.write(json.dumps(record) + "\n")
        sys.stdout.flush()


def reply_topics() -> list[str]:
    """Topic filters of the replies, as the library names them (any site)."""
    return [kind.topic(site_id="+") for kind in REPLIES]


def parse(topic: str, payload: bytes) -> dict[str, Any]:
    """A received reply as the library reads it (its class chosen by topic)."""
    record: dict[str, Any] = {"event": "received", "topic": topic, "at": time.time()}
    record |= {"type": None, "message": None, "payload": None, "error": None}
    try:
        record["payload"] = json.loads(payload)
        kind = next(kind for kind in REPLIES if kind.is_topic(topic))
        record["type"] = kind.__name__
        record["message"] = kind.from_dict(record["payload"]).to_dict()
    except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
        record["error"] = f"{type(err).__name__}: {err}"
    return record


def build(command: dict[str, Any]) -> tuple[str, bytes, Any]:
    """The topic, payload and JSON object (None for binary) of a command's message."""
    kind = SENT[command["type"]]
    if kind is audioserver.AudioPlayBytes:
        message = kind(wav_bytes=base64.b64decode(command["wav_b64"]))
    else:
        message = kind(**command.get("fields", {}))
    topic = message.topic(**command.get("topic_args", {}))
    payload = message.payload()
    if isinstance(payload, str):
        return topic, payload.encode("utf-8"), json.loads(payload)
    return topic, payload, None


def main() -> int:
    """Connect, subscribe, then publish each command read from stdin until end of input."""
    host, port = sys.argv[1], int(sys.argv[2])
    subscribed, connected = threading.Event(), threading.Event()
    client = mqtt.Client(clean_session=True, protocol=mqtt.MQTTv311)
    client.on_connect = lambda *_args: connected.set()
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_message = lambda _client, _userdata, msg: emit(parse(msg.topic, msg.payload))
    client.connect(host, port)
    client.loop_start()
    if not connected.wait(CONNECT_TIMEOUT):
        raise SystemExit("no CONNACK from the broker")
    client.subscribe([(topic, 0) for topic in reply_topics()])
    if not subscribed.wait(CONNECT_TIMEOUT):
        raise SystemExit("no SUBACK from the broker")
    emit({"event": "ready"})
    for line in sys.stdin:
        command = json.loads(line)
        try:
            topic, payload, body = build(command)
            at = time.time()
            client.publish(topic, payload, qos=command.get("qos", 0)).wait_for_publish()
        except Exception as err:  # noqa: BLE001 - reported to the test, which fails on it
            emit({"event": "failed", "seq": command["seq"], "error": f"{err!r}"})
            continue
        published = {"event": "published", "seq": command["seq"], "topic": topic}
        emit(published | {"payload": body, "size": len(payload), "at": at})
    client.disconnect()
    client.loop_stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
