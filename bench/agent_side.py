"""The agent under test, driven only through its MQTT contract (README.md) and its process.

`python -m agent run --config FILE` runs as a subprocess (harness.AgentProcess) against a
real Mosquitto (harness.Broker); a `Probe` publishes speak messages and sees events and
status with arrival timestamps. Memory is read from /proc/<pid>/status.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import yaml

from bench.probe import Arrival, Probe
from harness import TIMEOUT, AgentProcess, Broker

NODE_ID: Final = "bench"
PREFIX: Final = "voice"
SPEAK_TOPIC: Final = f"{PREFIX}/{NODE_ID}/speak"
EVENTS_TOPIC: Final = f"{PREFIX}/{NODE_ID}/events"
STATUS_TOPIC: Final = f"{PREFIX}/{NODE_ID}/status"
STATE_TOPIC: Final = f"{PREFIX}/{NODE_ID}/state"
_ENDS: Final = frozenset({"failed", "rejected"})
_LOG_TAIL: Final = 3000


def write_config(
    directory: Path,
    broker: Broker,
    cache_dir: Path,
    device: str = "null",
    name: str = "agent.yaml",
    *,
    media: dict[str, str] | None = None,
    phrases: tuple[str, ...] = (),
) -> Path:
    """The agent's config: the given broker, an ALSA PCM (`null` unless given), a cache in
    cache_dir, the state published every second, sounds by name (`audio.media`), the FP32
    voice (`tts.tier: fp32`: the bench compares FP32 with piper-tts, and `auto` would build
    the INT8 variant in a child process on a busy machine, in the middle of the figures)."""
    config = {
        "node_id": NODE_ID,
        "mqtt": {
            "host": broker.host,
            "port": broker.port,
            "topic_prefix": PREFIX,
            "reconnect_max": 2.0,
        },
        "audio": {"device": device, "media": media or {}},
        "tts": {"tier": "fp32"},
        "cache": {"dir": str(cache_dir), "phrases": list(phrases)},
        "state": {"interval": 1},
    }
    path = directory / name
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@dataclass(frozen=True)
class SpeakTiming:
    """One announcement, seen from the publisher (seconds after the publish call)."""

    started: float
    finished: float
    audio_seconds: float


@dataclass(frozen=True)
class Memory:
    """A process's peak (VmHWM) and current (VmRSS) resident set, and its proportional set
    (Pss: shared pages divided among their users), in MB."""

    peak_mb: float
    rss_mb: float
    pss_mb: float

    @classmethod
    def from_kib(cls, peak: str, rss: str, pss: str) -> Memory:
        """From /proc values in KiB (`123 kB` or `123`)."""
        return cls(_kib_to_mb(peak), _kib_to_mb(rss), _kib_to_mb(pss))


def _kib_to_mb(value: str) -> float:
    return int(value.split(maxsplit=1)[0]) * 1024 / 1e6


def read_memory(pid: int | str) -> Memory:
    """VmHWM, VmRSS and Pss of a process (`self` for this one)."""
    fields: dict[str, str] = {}
    for name in ("status", "smaps_rollup"):
        for line in Path(f"/proc/{pid}/{name}").read_text(encoding="utf-8").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key, value)
    return Memory.from_kib(fields["VmHWM"], fields["VmRSS"], fields["Pss"])


def _epoch(stamp: str) -> float:
    """Epoch seconds of an event's `ts` (ISO 8601, UTC, `Z`)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _event(arrival: Arrival) -> dict[str, Any] | None:
    if arrival.topic != EVENTS_TOPIC:
        return None
    value = json.loads(arrival.payload)
    return value if isinstance(value, dict) else None


class AgentUnderTest:
    """One agent process with the probe that talks to it."""

    def __init__(
        self, config: Path, log: Path, probe: Probe, env: dict[str, str] | None = None
    ) -> None:
        self._process = AgentProcess(config, log, env)
        self._probe = probe

    def start(self) -> float:
        """Spawn it and wait for a live `online` status; returns spawn-to-online seconds."""
        since = self._probe.mark()
        spawned = time.perf_counter()
        self._process.start()
        online = self._wait(
            lambda a: a.topic == STATUS_TOPIC and a.payload == b"online", since, "online"
        )
        return online.at - spawned

    def stop(self) -> None:
        """SIGTERM and wait for the exit (no-op when not running)."""
        if self._process.alive():
            self._process.signal(signal.SIGTERM)

    def speak(
        self, text: str | None, request_id: str, timeout: float = TIMEOUT, **fields: Any
    ) -> SpeakTiming:
        """Publish a JSON speak message (text and other fields); wait for `started` and
        `finished`."""
        since = self._probe.mark()
        body = {"id": request_id, **fields} | ({} if text is None else {"text": text})
        payload = json.dumps(body).encode()
        sent = self._probe.publish(SPEAK_TOPIC, payload)
        started = self._wait_event(request_id, "started", since)
        finished = self._wait_event(request_id, "finished", since, timeout)
        audio = float((_event(finished) or {}).get("audio_seconds", 0.0))
        return SpeakTiming(started.at - sent, finished.at - sent, audio)

    def state(self) -> dict[str, Any]:
        """The next state the agent publishes (it does every second: `write_config`)."""
        since = self._probe.mark()
        arrival = self._wait(lambda a: a.topic == STATE_TOPIC, since, "a state")
        value = json.loads(arrival.payload)
        if not isinstance(value, dict):
            raise RuntimeError(f"the agent's state is not an object: {value!r}")
        return value

    def wait_phrases(self) -> None:
        """Wait until the configured phrases are in the cache (the agent's log says so)."""
        deadline = time.monotonic() + TIMEOUT
        while "Phrase cache ready" not in self._process.output():
            if time.monotonic() > deadline or not self._process.alive():
                raise RuntimeError("the phrases were not cached")
            time.sleep(0.05)

    def publish_alarm(self, text: str, request_id: str) -> None:
        """A critical announcement, published at QoS 1 (queued while the agent is down)."""
        body = {"id": request_id, "text": text, "priority": "critical"}
        self._probe.publish(SPEAK_TOPIC, json.dumps(body).encode())

    def start_until_heard(self, request_id: str) -> tuple[float, float, float]:
        """Spawn it with `request_id` waiting for it; seconds from the spawn to the request's
        first sample (the `started` event's own `ts`, taken by the audio writer), to `online`
        and to the first state that says the voice has loaded."""
        since = self._probe.mark()
        spawned_wall = time.time()
        spawned = time.perf_counter()
        self._process.start()
        online = self._wait(
            lambda a: a.topic == STATUS_TOPIC and a.payload == b"online", since, "online"
        )
        started = _event(self._wait_event(request_id, "started", since)) or {}
        loaded = self._wait(
            lambda a: a.topic == STATE_TOPIC and b'"voice_loading": false' in a.payload,
            since,
            "the voice loaded",
        )
        first = _epoch(str(started["ts"])) - spawned_wall
        return first, online.at - spawned, loaded.at - spawned

    def memory(self) -> Memory:
        """The agent process's VmHWM, VmRSS and Pss now."""
        return read_memory(self._process.pid)

    @property
    def pid(self) -> int:
        """The process `voice-agent run` started (the root of the node's processes)."""
        return int(self._process.pid)

    def _wait_event(
        self, request_id: str, name: str, since: int, timeout: float = TIMEOUT
    ) -> Arrival:
        def match(arrival: Arrival) -> bool:
            event = _event(arrival)
            return (
                event is not None
                and event.get("id") == request_id
                and event.get("event") in {name} | _ENDS
            )

        arrival = self._wait(match, since, f"{name} of {request_id}", timeout)
        event = _event(arrival) or {}
        if event.get("event") in _ENDS:
            raise RuntimeError(f"the agent did not speak {request_id}: {event}")
        return arrival

    def _wait(
        self, match: Callable[[Arrival], bool], since: int, what: str, timeout: float = TIMEOUT
    ) -> Arrival:
        try:
            return self._probe.wait_for(match, since, timeout, lambda: not self._process.alive())
        except TimeoutError as err:
            tail = self._process.output()[-_LOG_TAIL:]
            raise RuntimeError(f"no {what} from the agent; its log ends:\n{tail}") from err
