"""Real parts for integration tests: a Mosquitto broker, MQTT watchers and publishers, the agent
as a subprocess, and numbers about captured audio. No mocks."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import alsaaudio
import numpy as np
import numpy.typing as npt
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.player import Pcm

TIMEOUT: Final = 60.0
"""Upper bound for any wait in a test: slow machines pass, hangs fail."""
ROOT: Final = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> None:
    """Poll condition until true; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.02)


class Broker:
    """A real Mosquitto in the foreground on a free loopback port, with persistence."""

    def __init__(self, workdir: Path, tls: Pki | None = None) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.config = workdir / "mosquitto.conf"
        lines = [
            f"listener {self.port} {self.host}",
            "allow_anonymous true",
            "set_tcp_nodelay true",
            "persistence true",
            f"persistence_location {workdir}/",
            "autosave_interval 1",
            "autosave_on_changes true",  # with interval 1: every change saved (SIGKILL tests)
            "max_queued_messages 10000",
            "log_type all",
        ]
        if tls is not None:  # this listener speaks TLS only
            lines += [f"cafile {tls.ca}", f"certfile {tls.cert}", f"keyfile {tls.key}"]
        if os.geteuid() == 0:
            lines.append("user root")  # else it drops to `mosquitto` and cannot persist here
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.log = workdir / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait until the port accepts connections."""
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                ["mosquitto", "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(self._accepts, 10, "mosquitto to listen")

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop with a signal and wait for the process."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(sig)
            self._process.wait(10)
        self._process = None


@dataclass(frozen=True)
class Received:
    """One message seen by a Watcher."""

    topic: str
    payload: bytes
    retain: bool
    at: float = 0.0
    """time.time() when the watcher received it."""

    def json(self) -> dict[str, Any]:
        """The payload as a JSON object."""
        value = json.loads(self.payload)
        assert isinstance(value, dict)
        return value


def _no_delay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Watcher:
    """A real paho client that records every message on the given topic filters."""

    def __init__(
        self,
        broker: Broker,
        *topics: str,
        username: str | None = None,
        password: str | None = None,
        ca: Path | None = None,
        persistent: str | None = None,
    ) -> None:
        """Subscribe to `topics`; with `persistent` (a client id) the session outlives broker
        restarts (MQTT 5 session expiry), so nothing published meanwhile is missed."""
        self.broker = broker
        self.messages: list[Received] = []
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self._client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=persistent or "",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        self._client.on_message = self._on_message
        self._client.on_socket_open = _no_delay
        self._client.on_subscribe = lambda *_args: self._subscribed.set()
        if username is not None:
            self._client.username_pw_set(username, password)
        if ca is not None:
            self._client.tls_set(ca_certs=str(ca))
        properties = None
        if persistent is not None:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 600
        self._client.reconnect_delay_set(1, 2)
        # A session Mosquitto 2.0 keeps across restarts: clean start off from the first connect
        # (with clean start on, it does not persist the session, expiry or not).
        clean = persistent is None
        self._client.connect(broker.host, broker.port, clean_start=clean, properties=properties)
        self._client.subscribe([(t, 1) for t in topics])
        self._client.loop_start()
        assert self._subscribed.wait(10), "no SUBACK"

    def _on_message(self, _client: mqtt.Client, _userdata: Any, msg: mqtt.MQTTMessage) -> None:
        with self._lock:
            received = Received(msg.topic, bytes(msg.payload), bool(msg.retain), time.time())
            self.messages.append(received)

    def snapshot(self) -> list[Received]:
        """A copy of what arrived so far."""
        with self._lock:
            return list(self.messages)

    def clear(self) -> None:
        """Forget what arrived so far."""
        with self._lock:
            self.messages.clear()

    def events(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """Lifecycle events seen so far (optionally only those of one request id)."""
        found = [m.json() for m in self.snapshot() if m.topic.endswith("/events")]
        return [e for e in found if request_id is None or e["id"] == request_id]

    def wait_event(self, request_id: str, event: str, timeout: float = TIMEOUT) -> dict[str, Any]:
        """Wait for one event of a request id, and return it."""

        def found() -> list[dict[str, Any]]:
            return [e for e in self.events(request_id) if e["event"] == event]

        wait_until(lambda: bool(found()), timeout, f"{event} of {request_id}")
        return found()[0]

    def wait_payload(self, topic: str, payload: bytes, timeout: float = TIMEOUT) -> Received:
        """Wait for a message with exactly this payload on topic."""

        def found() -> list[Received]:
            return [m for m in self.snapshot() if m.topic == topic and m.payload == payload]

        wait_until(lambda: bool(found()), timeout, f"{payload!r} on {topic}")
        return found()[-1]

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> float:
        """Publish from this client (no process start in the way); returns time.time() before."""
        sent = time.time()
        self._client.publish(topic, payload, qos=qos).wait_for_publish(10)
        return sent

    def close(self) -> None:
        """Disconnect."""
        self._client.loop_stop()
        self._client.disconnect()


def publish(broker: Broker, topic: str, payload: bytes, qos: int = 1) -> None:
    """Publish with the real `mosquitto_pub` client (payload read raw from stdin)."""
    args = ["mosquitto_pub", "-h", broker.host, "-p", str(broker.port), "-t", topic, "-q", str(qos)]
    args += ["-s"] if payload else ["-n"]
    subprocess.run(args, input=payload, check=True, timeout=TIMEOUT)


class AgentProcess:
    """`python -m agent run` as a subprocess, as a user or systemd would start it."""

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None) -> None:
        self.config = config
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (returns at once; wait for `online` to know it is ready)."""
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "agent", "run", "--config", str(self.config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=ROOT,
            )

    def signal(self, sig: int) -> int:
        """Send a signal and wait for the exit; returns the exit code."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(sig)
        code = self._process.wait(TIMEOUT)
        self._process = None
        return code

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self._process is not None, "not started"
        return self._process.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._process is not None and self._process.poll() is None

    def output(self) -> str:
        """Everything it logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")


def read_pcm(path: Path) -> npt.NDArray[np.int16]:
    """16-bit little-endian mono samples from a raw capture file."""
    return np.frombuffer(path.read_bytes(), dtype="<i2").astype(np.int16)


def speech_stats(samples: npt.NDArray[np.int16], rate: int) -> dict[str, float]:
    """Duration, RMS level (dBFS) and the share of 20 ms frames louder than -45 dBFS."""
    audio = samples.astype(np.float64) / 32768.0
    frame = rate // 50
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    frame_db = 10 * np.log10(np.mean(frames**2, axis=1) + 1e-12)
    return {
        "seconds": len(audio) / rate,
        "rms_dbfs": float(10 * np.log10(np.mean(audio**2) + 1e-12)),
        "voiced_share": float(np.mean(frame_db > -45)) if len(frames) else 0.0,
    }


class PulseNullSink:
    """A PulseAudio server with a null sink: ALSA's `pulse` device then plays in real time.

    The ALSA config it writes defines `paced_capture`: a `file` PCM over `pulse` that also keeps
    every frame written in the file named by $CAPTURE_FILE (platform notes)."""

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.socket = workdir / "pulse.socket"
        self.script = workdir / "null.pa"
        self.script.write_text(
            "load-module module-null-sink sink_name=nullsink\n"
            f"load-module module-native-protocol-unix auth-anonymous=1 socket={self.socket}\n"
            "set-default-sink nullsink\n",
            encoding="utf-8",
        )
        self.xdg = workdir / "xdg"
        (self.xdg / "alsa").mkdir(parents=True, exist_ok=True)
        (self.xdg / "alsa" / "asoundrc").write_text(
            "pcm.paced_capture {\n"
            "    type file\n"
            '    slave.pcm "pulse"\n'
            '    file { @func getenv vars [ CAPTURE_FILE ] default "capture.raw" }\n'
            '    format "raw"\n'
            "}\n",
            encoding="utf-8",
        )
        self.log = workdir / "pulse.log"
        self._process: subprocess.Popen[bytes] | None = None

    def env(self, capture: Path) -> dict[str, str]:
        """Environment for a client that plays to `paced_capture` and captures to `capture`."""
        return {
            "PULSE_SERVER": f"unix:{self.socket}",
            "XDG_CONFIG_HOME": str(self.xdg),
            "CAPTURE_FILE": str(capture),
        }

    def start(self) -> None:
        """Start the server in the foreground and wait for its socket."""
        args = ["pulseaudio", "-n", "-F", str(self.script), "--exit-idle-time=-1"]
        args += ["--daemonize=no", "--use-pid-file=no", "--system=no", "--disallow-exit"]
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "HOME": str(self.xdg)},
            )
        wait_until(self.socket.exists, 15, "the PulseAudio socket")
        self._warm_up()

    def _warm_up(self) -> None:
        """Play a second of silence through ALSA's `pulse` device and wait for it: the
        first stream of a fresh server can stall for a second or more (seen in CI: a test's
        first 1.5 s of speech took that long to be consumed), which no test should measure."""
        env = {**os.environ, **self.env(self.socket.parent / "warm-up.raw")}
        command = ["aplay", "-q", "-D", "pulse", "-t", "raw", "-f", "S16_LE", "-r", "22050"]
        subprocess.run(
            [*command, "-c", "1", "-d", "1", "/dev/zero"], env=env, check=True, timeout=30
        )

    def stop(self) -> None:
        """Stop the server."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(10)


@dataclass(frozen=True)
class Pki:
    """A throwaway CA and a certificate for 127.0.0.1 / localhost signed by it."""

    ca: Path
    cert: Path
    key: Path


def make_pki(directory: Path, name: str = "test") -> Pki:
    """Generate a CA and a broker certificate with the `openssl` command (EC P-256)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca = directory / f"{name}-ca.key", directory / f"{name}-ca.pem"
    key, csr, cert = directory / f"{name}.key", directory / f"{name}.csr", directory / f"{name}.pem"
    ext = directory / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n", encoding="utf-8")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sign = ["-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial", "-days", "2"]
    commands = [
        ["openssl", "req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2"],
        ["openssl", "req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1"],
        [
            "openssl",
            "x509",
            "-req",
            "-in",
            str(csr),
            *sign,
            "-out",
            str(cert),
            "-extfile",
            str(ext),
        ],
    ]
    commands[0] += ["-subj", f"/CN={name} test CA"]
    for command in commands:
        subprocess.run(command, check=True, capture_output=True, timeout=TIMEOUT)
    for path in (key, cert, ca):
        path.chmod(0o644)  # readable by the broker, which may run as another user
    return Pki(ca, cert, key)


class FaultyPcm:
    """A real PCM with faults at given writes (1-based): `underrun` returns what pyalsaaudio
    returns after recovering one (-EPIPE), `lost` raises as a vanished device does."""

    def __init__(self, pcm: Pcm, faults: Mapping[int, str]) -> None:
        self._pcm, self._faults, self._writes = pcm, faults, 0

    def write(self, data: bytes) -> int:
        self._writes += 1
        fault = self._faults.get(self._writes)
        if fault == "underrun":
            return -errno.EPIPE
        if fault == "lost":
            raise alsaaudio.ALSAAudioError("No such device [hw:1,0]")
        return self._pcm.write(data)

    def drain(self) -> int:
        return self._pcm.drain()

    def close(self) -> None:
        self._pcm.close()
