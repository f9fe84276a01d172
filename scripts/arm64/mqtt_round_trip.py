"""One MQTT round trip with everything of the device inside the arm64 root: Mosquitto and the
agent run there, `mosquitto_pub` there publishes the speak message; a paho client on the host
watches (a chroot shares the host's network, so the root's loopback is the host's).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Final

import paho.mqtt.client as mqtt
from chroot_session import Chroot, stopped_on_exit
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

HOST: Final = "127.0.0.1"
BROKER_TIMEOUT: Final = 120.0
"""Longest wait for the emulated Mosquitto to listen (seconds; measured well under 1 s)."""
ONLINE_TIMEOUT: Final = 1800.0
"""Longest wait for the agent's `online` (seconds): under emulation, ~100x slower than the
host, a first start may optimize and split the model (see docs/arm64.md for measured times)."""
FINISHED_TIMEOUT: Final = 1800.0
"""Longest wait from publication to the `finished` event (seconds)."""
STOP_TIMEOUT: Final = 300.0
"""Longest wait for the agent to stop after SIGTERM (seconds)."""
PUBLISH_TIMEOUT: Final = 120.0
"""Longest `mosquitto_pub` run (seconds)."""
_POLL: Final = 0.05
"""Polling interval of the waits (seconds)."""
_ENDINGS: Final = frozenset(
    {"finished", "failed", "rejected", "expired", "stopped", "acknowledged", "preempted"}
)
"""Events that end an announcement (README, Events)."""


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def broker_config(port: int) -> str:
    """A foreground Mosquitto on the loopback port, no persistence."""
    lines = [
        f"listener {port} {HOST}",
        "allow_anonymous true",
        "persistence false",
        "set_tcp_nodelay true",
        "log_dest stdout",
    ]
    return "\n".join(lines) + "\n"


def wait_for(
    condition: Callable[[], bool], timeout: float, what: str, alive: Callable[[], str | None]
) -> float:
    """Poll until condition holds; fail after timeout, or at once when `alive` reports a death.
    Returns the seconds waited."""
    start = time.monotonic()
    while not condition():
        death = alive()
        if death:
            raise RuntimeError(f"{death} while waiting for {what}")
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(_POLL)
    return time.monotonic() - start


class Watcher:
    """A host-side paho client that records every message under one topic filter."""

    def __init__(self, port: int, topic: str) -> None:
        self.messages: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self._client.on_message = self._on_message
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        self._client.connect(HOST, port)
        self._client.subscribe(topic, qos=1)
        self._client.loop_start()
        if not self._subscribed.wait(BROKER_TIMEOUT):
            raise TimeoutError("no SUBACK from the broker")

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((msg.topic, bytes(msg.payload)))

    def payloads(self, topic: str) -> list[bytes]:
        """Payloads seen on one topic, in order."""
        with self._lock:
            return [payload for t, payload in self.messages if t == topic]

    def close(self) -> None:
        """Disconnect."""
        self._client.loop_stop()
        self._client.disconnect()


@dataclass(frozen=True, slots=True)
class RoundTrip:
    """What one round trip showed."""

    events: list[dict[str, Any]]
    """The announcement's events, in order."""
    online_s: float
    """Agent start to its retained `online` (seconds)."""
    finished_s: float
    """Publication to the `finished` event (seconds)."""
    stop_s: float
    """SIGTERM to the agent's exit (seconds)."""


def round_trip(  # noqa: PLR0917 - the round trip's whole setting, each used once
    root: Chroot,
    voice_agent: PurePosixPath,
    config: PurePosixPath,
    port: int,
    node: str,
    message: dict[str, Any],
    log_dir: Path,
) -> RoundTrip:
    """Start the broker and the agent in the root, speak `message`, wait for `finished`, stop."""
    prefix = f"voice/{node}"
    broker_conf = config.parent / "mosquitto.conf"
    root.path(broker_conf).write_text(broker_config(port), encoding="utf-8")
    processes: list[subprocess.Popen[bytes]] = []
    with (
        (log_dir / "mosquitto.log").open("wb") as broker_log,
        (log_dir / "agent-run.log").open("wb") as agent_log,
        (log_dir / "round-trip.log").open("a", encoding="utf-8") as log,
        stopped_on_exit(processes),
    ):
        broker = root.popen(["/usr/sbin/mosquitto", "-c", broker_conf], broker_log)
        processes.append(broker)

        def dead() -> str | None:
            for name, process in (("mosquitto", broker), ("the agent", processes[-1])):
                if process.poll() is not None:
                    return f"{name} exited with {process.returncode} (logs in {log_dir})"
            return None

        wait_for(lambda: _accepts(port), BROKER_TIMEOUT, "mosquitto to listen", dead)
        watcher = Watcher(port, f"{prefix}/#")
        try:
            agent = root.popen([voice_agent, "run", "--config", config], agent_log)
            processes.append(agent)
            status = f"{prefix}/status"
            online_s = wait_for(
                lambda: b"online" in watcher.payloads(status), ONLINE_TIMEOUT, "online", dead
            )
            events: list[dict[str, Any]] = []

            def ended() -> bool:
                events[:] = [
                    e
                    for e in map(json.loads, watcher.payloads(f"{prefix}/events"))
                    if e.get("id") == message["id"]
                ]
                return any(e.get("event") in _ENDINGS for e in events)

            payload = json.dumps(message)
            publish = ["mosquitto_pub", "-h", HOST, "-p", str(port), "-q", "1"]
            root.run([*publish, "-t", f"{prefix}/speak", "-m", payload], log, PUBLISH_TIMEOUT)
            finished_s = wait_for(ended, FINISHED_TIMEOUT, f"the end of {message['id']}", dead)
            if events[-1].get("event") != "finished":
                raise RuntimeError(f"the announcement did not finish: {events}")
            stopping = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            code = agent.wait(STOP_TIMEOUT)
            stop_s = time.monotonic() - stopping
            if code != 0:
                raise RuntimeError(f"the agent exited with {code} after SIGTERM")
            wait_for(
                lambda: watcher.payloads(status)[-1:] == [b"offline"],
                BROKER_TIMEOUT,
                "offline",
                lambda: None,
            )
        finally:
            watcher.close()
        broker.send_signal(signal.SIGTERM)
        broker.wait(BROKER_TIMEOUT)
    return RoundTrip(events, online_s, finished_s, stop_s)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1):
            return True
    except OSError:
        return False
