"""The attacks of issue 33 ("Alarms first, by construction"), driven at full rate from outside
the agent through its real edges with real clients: the `wyoming` client library from several
source addresses, a Sparkplug B host (the SCADA stand-in, pysparkplug), paho on the node's own
speak topic at QoS 0 and QoS 1, a web server of sounds the node must fetch and decode, and a
hostile server first in `mqtt.hosts`. The payloads come from `tests/hostile.py`.

Every attack runs on its own threads from `start()` until `stop()` and counts what it sent and
what came back (`report()`); none touches the agent's code, so the same drivers judge today's
agent and whatever replaces it. `Barrage` runs several at once. `tests/test_alarm_under_fire.py`
and `bench/alarms.py` use them; `edge_sections` is the agent config that opens every edge they
attack.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import multiprocessing
import queue
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Self

import numpy as np
import numpy.typing as npt
import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from wyoming.client import AsyncClient
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop

from tests.hostile import (
    LONG_TEXT_CHARS,
    PUNCTUATION_RUNS,
    amplified_dcmd,
    chunks_of,
    connack,
    flood_speak,
    garbage,
    hostile_speak_pool,
    huge_publish_head,
    long_unended_text,
    padded_flac,
    pathological_texts,
)
from tests.media_files import decode_bomb, flac_silence, work_bomb

from .agent import AgentProcess, agent_config, write_config
from .audio import PulseNullSink, TimedRecording, first_match
from .broker import Broker, free_port
from .mqtt import Watcher
from .scada import ScadaError, ScadaHost, metric
from .wait import wait_until

PEERS: Final = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
"""Source addresses of the Wyoming attackers: all loopback on Linux, each a different peer to
the server (and inside the default `wyoming.allow`)."""

_READ_SECONDS: Final = 1.0
"""How long an attacker waits for one answer before it looks whether it should stop."""
_ANSWER_SECONDS: Final = 120.0
"""How long an attacker waits for the end of one answer before it gives up on it."""


@dataclass(frozen=True)
class Target:
    """The node under attack, as its outsiders know it."""

    node_id: str
    broker_host: str
    broker_port: int
    prefix: str = "voice"
    wyoming_host: str = "127.0.0.1"
    wyoming_port: int = 0
    """0: Wyoming is not attacked."""
    sparkplug_group: str = "fire"
    sparkplug_device: str = "speaker"

    @property
    def speak_topic(self) -> str:
        """The node's own speak topic."""
        return f"{self.prefix}/{self.node_id}/speak"


class Attack:
    """One attacker: `start()` runs it on its own threads until `stop()`; `report()` counts
    what it sent and what came back."""

    name = "attack"

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        """What went wrong on the attacker's side (the first few), for the report."""

    def count(self, what: str, by: int = 1) -> None:
        """Count something sent or seen (thread-safe)."""
        with self._lock:
            self.counts[what] += by

    def failed(self, what: str) -> None:
        """Keep an attacker-side failure (the first 20) and count it."""
        self.count("attacker_errors")
        with self._lock:
            if len(self.errors) < 20:
                self.errors.append(what)

    def workers(self) -> Sequence[Callable[[], None]]:
        """The loops to run, each on a thread, until `stopping` is set."""
        raise NotImplementedError

    def start(self) -> Self:
        """Start every worker on its own daemon thread."""
        for number, work in enumerate(self.workers()):
            thread = threading.Thread(
                target=self._guarded, args=(work,), name=f"{self.name}-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _guarded(self, work: Callable[[], None]) -> None:
        try:
            work()
        except Exception as err:  # noqa: BLE001 - an attacker that breaks says so in its report
            self.failed(f"{type(err).__name__}: {err}")

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the workers and wait for them (each finishes what it is sending)."""
        self.stopping.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.1, deadline - time.monotonic()))

    def report(self) -> dict[str, Any]:
        """What it sent and saw, by kind."""
        with self._lock:
            report: dict[str, Any] = dict(sorted(self.counts.items()))
            if self.errors:
                report["attacker_error_samples"] = list(self.errors[:5])
        return report


class Barrage(Attack):
    """Several attacks at once."""

    name = "all at once"

    def __init__(self, attacks: Iterable[Attack]) -> None:
        super().__init__()
        self.attacks = list(attacks)

    def start(self) -> Self:
        for attack in self.attacks:
            attack.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        for attack in self.attacks:
            attack.stopping.set()
        for attack in self.attacks:
            attack.stop(timeout)

    def report(self) -> dict[str, Any]:
        return {attack.name: attack.report() for attack in self.attacks}


# ---- Wyoming ---------------------------------------------------------------------------------


class PeerClient(AsyncClient):
    """The `wyoming` library's client over TCP from a chosen source address (the library's
    own TCP client always takes the default one)."""

    def __init__(self, host: str, port: int, source: str) -> None:
        super().__init__(connect_timeout=10.0, read_timeout=_READ_SECONDS)
        self.host, self.port, self.source = host, port, source

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, local_addr=(self.source, 0)),
            self.connect_timeout,
        )

    async def disconnect(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await writer.wait_closed()


WyomingRequest = Callable[[int], list[Event]]
"""The events of request number n (one `synthesize`, or a stream)."""


class WyomingAttack(Attack):
    """Clients from each of `peers`, each sending requests back to back on a new connection
    each (as Home Assistant does), reading every answer to its end."""

    def __init__(self, name: str, target: Target, peers: Sequence[str], request: WyomingRequest):
        super().__init__()
        self.name = name
        self.target, self.peers, self.request = target, peers, request

    def workers(self) -> Sequence[Callable[[], None]]:
        return [lambda: asyncio.run(self._all())]

    async def _all(self) -> None:
        await asyncio.gather(*(self._peer(peer, index) for index, peer in enumerate(self.peers)))

    async def _peer(self, peer: str, index: int) -> None:
        number = index
        while not self.stopping.is_set():
            client = PeerClient(self.target.wyoming_host, self.target.wyoming_port, peer)
            try:
                await client.connect()
            except (OSError, TimeoutError) as err:
                self.count("connect_failed")
                if self.counts["connect_failed"] <= 3:
                    self.failed(f"{peer}: {err}")
                await asyncio.sleep(0.2)
                continue
            try:
                await self._one(client, number)
            except (OSError, ConnectionError) as err:
                self.count(f"connection_lost ({type(err).__name__})")
            finally:
                await client.disconnect()
            number += len(self.peers)

    async def _one(self, client: PeerClient, number: int) -> None:
        events = self.request(number)
        for event in events:
            await client.write_event(event)
        self.count("requests")
        self.count("text_chars", sum(len(e.data.get("text", "")) for e in events))
        streaming = events[0].type == "synthesize-start"
        deadline = time.monotonic() + _ANSWER_SECONDS
        while time.monotonic() < deadline and not self.stopping.is_set():
            try:
                answer = await client.read_event()
            except TimeoutError:
                continue
            if answer is None:
                self.count("closed_by_server")
                return
            if answer.type == "audio-chunk":
                self.count("audio_chunks")
                continue
            if answer.type == "error":
                self.count(f"error {answer.data.get('code')}")
                if not streaming:
                    return
            if answer.type == ("synthesize-stopped" if streaming else "audio-stop"):
                self.count("answered")
                return
        self.count("answer_abandoned" if not self.stopping.is_set() else "stopped_mid_answer")


SHORT_PATHOLOGICAL: Final = tuple(t for t in pathological_texts(4_990).values() if len(t) < 5000)
"""`tests/hostile.py`'s pathological texts cut to just under `speak.max_text_chars` (5,000):
what passes every length bound and reaches the splitters and the phonemizer whole."""


def pathological_request(number: int) -> list[Event]:
    """Request n of the pathological texts, in turn: the issue's `synthesize` of 30,000 `.`
    then `x` (and the runs of other marks), the same as a stream chunk by chunk (1,000
    characters each), and one of `tests/hostile.py`'s pathological texts under the length
    bound."""
    text = PUNCTUATION_RUNS[(number // 3) % len(PUNCTUATION_RUNS)]
    if number % 3 == 0:
        return [Synthesize(text=text).event()]
    if number % 3 == 1:
        return _stream(text, 1000)
    return [Synthesize(text=SHORT_PATHOLOGICAL[(number // 3) % len(SHORT_PATHOLOGICAL)]).event()]


def long_request(number: int) -> list[Event]:
    """Request n of the issue's long text: 99,990 characters without a sentence end, new each
    time; every third one as a stream of 5,000-character chunks."""
    text = long_unended_text(LONG_TEXT_CHARS, seed=number)
    if number % 3 == 2:
        return _stream(text, 5000)
    return [Synthesize(text=text).event()]


def _stream(text: str, size: int) -> list[Event]:
    chunks = [SynthesizeChunk(text=piece).event() for piece in chunks_of(text, size)]
    return [SynthesizeStart().event(), *chunks, SynthesizeStop().event()]


def wyoming_pathological(target: Target, peers: Sequence[str] = PEERS[:2]) -> WyomingAttack:
    """The issue's 31 KB `synthesize` (and its streaming form) from each of `peers`."""
    return WyomingAttack("wyoming pathological texts", target, peers, pathological_request)


def wyoming_long(target: Target, peers: Sequence[str] = PEERS) -> WyomingAttack:
    """The issue's 99,990-character texts without a sentence end, four peers at once."""
    return WyomingAttack("wyoming long texts", target, peers, long_request)


# ---- Sparkplug -------------------------------------------------------------------------------


class SparkplugAmplification(Attack):
    """DCMDs from a Sparkplug host, back to back: bursts of `dcmds`, each with `writes`
    writes (`Priority` = chat, then `Speak`s of new texts), about 1.3 KB each."""

    name = "sparkplug amplification"

    def __init__(self, target: Target, host: ScadaHost, dcmds: int = 600, writes: int = 32):
        super().__init__()
        self.target, self.host, self.dcmds, self.writes = target, host, dcmds, writes

    def workers(self) -> Sequence[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            for _ in range(self.dcmds):
                if self.stopping.is_set():
                    return
                metrics = [
                    metric(name, kind, value)
                    for name, kind, value in amplified_dcmd(self.writes, seed=number)
                ]
                try:
                    sent = self.host.dcmd(
                        self.target.sparkplug_group,
                        self.target.node_id,
                        self.target.sparkplug_device,
                        metrics,
                        datatypes=False,  # Sparkplug 3.0: commands by name, no datatypes
                    )
                except ScadaError as err:  # the host's session dropped: it reconnects
                    self.count("refused_by_host")
                    if self.counts["refused_by_host"] <= 3:
                        self.failed(str(err))
                    time.sleep(0.5)
                    continue
                self.count("dcmds")
                self.count("writes", len(metrics))
                self.count("payload_bytes", len(str(sent.get("payload_hex", ""))) // 2)
                number += 1
            self.count("bursts")


# ---- MQTT floods on the node's own topic -----------------------------------------------------


def _no_delay(_client: mqtt.Client, _userdata: Any, sock: Any) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def attacker_client(target: Target, name: str) -> mqtt.Client:
    """A paho MQTT 5 client of an attacker, connected (network loop running)."""
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=f"attacker-{name}-{time.monotonic_ns() % 10**9}",
        protocol=MQTTProtocolVersion.MQTTv5,
    )
    client.on_socket_open = _no_delay
    client.max_inflight_messages_set(1000)
    client.max_queued_messages_set(5000)
    connected = threading.Event()
    client.on_connect = lambda *_args: connected.set()
    client.connect(target.broker_host, target.broker_port)
    client.loop_start()
    if not connected.wait(10):
        client.loop_stop()
        raise ConnectionError(f"the {name} attacker could not connect to the broker")
    return client


class SpeakFlood(Attack):
    """Speaks on the node's own topic at full rate at one QoS: new texts of the classes below
    the alarms, and one in `hostile_every` a hostile payload of `tests/hostile.py` (malformed,
    over-long, any field of any type). `per_round` messages (the issue: 19,200), then the next
    round."""

    def __init__(
        self, target: Target, qos: int, per_round: int = 19_200, hostile_every: int = 8
    ) -> None:
        super().__init__()
        self.name = f"QoS {qos} flood"
        self.target, self.qos, self.per_round, self.hostile_every = (
            target,
            qos,
            per_round,
            hostile_every,
        )
        self.pool = hostile_speak_pool(400, seed=qos)

    def workers(self) -> Sequence[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        client = attacker_client(self.target, f"qos{self.qos}")
        classes = ("chat", "info", "warning")
        number = 0
        try:
            while not self.stopping.is_set():
                for _ in range(self.per_round):
                    if self.stopping.is_set():
                        return
                    if self.hostile_every and number % self.hostile_every == 0:
                        payload = self.pool[number // self.hostile_every % len(self.pool)]
                        kind = "hostile"
                    else:
                        payload = flood_speak(number, classes[number % len(classes)])
                        kind = "speaks"
                    self._publish(client, payload, kind)
                    number += 1
                self.count("rounds")
        finally:
            client.loop_stop()
            client.disconnect()

    def _publish(self, client: mqtt.Client, payload: bytes, kind: str) -> None:
        while not self.stopping.is_set():
            info = client.publish(self.target.speak_topic, payload, qos=self.qos)
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self.count(kind)
                if self.counts[kind] % 500 == 0:  # paho's own queue stays bounded
                    with contextlib.suppress(RuntimeError, ValueError):
                        info.wait_for_publish(10)
                return
            if info.rc == MQTTErrorCode.MQTT_ERR_QUEUE_SIZE:
                time.sleep(0.005)
                continue
            self.count(f"publish_failed {mqtt.error_string(info.rc)}")
            time.sleep(0.05)
            return


# ---- media the node must fetch and decode ----------------------------------------------------


class MediaServer:
    """A web server of sounds for the node to fetch and decode (name it in
    `audio.media_hosts`): `/heavy-N.flac` 60 s of 7.1 at 48 kHz (within every bound, ~0.9 s of
    decoding, other bytes for every N so no cache serves it), `/bomb-N.flac` the issue's decode
    bomb (60 s of 8 channels at 655,350 Hz), `/work-N.flac` over the work bound, `/garbage-N.wav`
    random bytes named as a WAV."""

    def __init__(self) -> None:
        self.port = free_port()
        heavy, bomb, work = flac_silence(48_000, 8, 59.9), decode_bomb(), work_bomb()
        served: Counter[str] = Counter()
        self.served = served

        def body(path: str) -> bytes | None:
            kind, _, rest = path.strip("/").partition("-")
            number = int(rest.split(".")[0]) if rest.split(".")[0].isdigit() else 0
            match kind:
                case "heavy":
                    return padded_flac(heavy, 16 + number)
                case "bomb":
                    return padded_flac(bomb, 16 + number)
                case "work":
                    return padded_flac(work, 16 + number)
                case "garbage":
                    return garbage(50_000, number)
            return None

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = body(self.path)
                if data is None:
                    self.send_error(404)
                    return
                served[self.path.strip("/").partition("-")[0]] += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The server's base URL."""
        return f"http://127.0.0.1:{self.port}/"

    @property
    def host(self) -> str:
        """Its entry for `audio.media_hosts`."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._http.shutdown()
        self._http.server_close()


class MediaFlood(Attack):
    """Speaks naming sounds on the media server, published at QoS 1 back to back: heavy
    sounds before and after the text, decode bombs, sounds over the work bound, garbage."""

    name = "media decoding"

    def __init__(self, target: Target, media_url: str) -> None:
        super().__init__()
        self.target, self.media_url = target, media_url

    def workers(self) -> Sequence[Callable[[], None]]:
        return [self._run]

    def _run(self) -> None:
        client = attacker_client(self.target, "media")
        kinds = ("heavy", "heavy", "bomb", "work", "garbage")
        number = 0
        try:
            while not self.stopping.is_set():
                kind = kinds[number % len(kinds)]
                sound = f"{self.media_url}{kind}-{number}.{'wav' if kind == 'garbage' else 'flac'}"
                field = "sound_after" if number % 3 == 1 else "sound"
                body = {"id": f"media-{number}", "text": f"Sound {number}.", field: sound}
                body["priority"] = ("chat", "info", "warning")[number % 3]
                info = client.publish(self.target.speak_topic, _json(body), qos=1)
                if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                    with contextlib.suppress(RuntimeError, ValueError):
                        info.wait_for_publish(10)
                    self.count(f"speaks with {kind}")
                else:
                    self.count(f"publish_failed {mqtt.error_string(info.rc)}")
                    time.sleep(0.05)
                number += 1
        finally:
            client.loop_stop()
            client.disconnect()


def _json(value: Mapping[str, Any]) -> bytes:
    import json  # noqa: PLC0415 - only here

    return json.dumps(value).encode()


# ---- a hostile server first in mqtt.hosts ----------------------------------------------------

MODES: Final = ("huge", "drip", "garbage")


class HostileMqttServer(Attack):
    """A TCP server for the first place of `mqtt.hosts`: it reads a CONNECT, accepts it with
    the CONNACK of its protocol version, and then misbehaves, each connection the next way of
    `modes`: `huge` a PUBLISH announcing 256 MiB, `huge_bytes` of it sent at full rate and the
    rest never; `drip` the same PUBLISH one byte a second; `garbage` random bytes that are no
    packet. Whatever the client sends is read and dropped. It drives nothing itself: it bites
    whenever a session of the node connects to it (at start, and after a lost connection)."""

    name = "hostile server in mqtt.hosts"

    def __init__(
        self, modes: Sequence[str] = MODES, huge_bytes: int = 64 * 2**20, topic: str = "voice/x"
    ) -> None:
        super().__init__()
        self.modes, self.huge_bytes, self.topic = tuple(modes), huge_bytes, topic
        self.host, self.port = "127.0.0.1", free_port()
        self._listener = socket.create_server((self.host, self.port))
        self._listener.settimeout(_READ_SECONDS)
        self._connections = 0

    @property
    def entry(self) -> dict[str, Any]:
        """Its entry for `mqtt.hosts`."""
        return {"host": self.host, "port": self.port}

    def workers(self) -> Sequence[Callable[[], None]]:
        return [self._accept]

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            mode = self.modes[self._connections % len(self.modes)]
            self._connections += 1
            threading.Thread(target=self._serve, args=(client, mode), daemon=True).start()

    def _serve(self, client: socket.socket, mode: str) -> None:
        self.count("connections")
        try:
            level = _read_connect(client)
            if level is None:
                self.count("closed_before_connect")
                return
            client.sendall(connack(level))
            self.count(f"connack v{level}")
            threading.Thread(target=_drain, args=(client,), daemon=True).start()
            self.count(f"misbehaved: {mode}")
            began = time.monotonic()
            self._misbehave(client, mode, level)
            self.count(f"seconds held ({mode})", round(time.monotonic() - began))
        except OSError:
            self.count(f"client left ({mode})")
        finally:
            with contextlib.suppress(OSError):
                client.close()

    def _misbehave(self, client: socket.socket, mode: str, level: int) -> None:
        if mode == "garbage":
            client.sendall(garbage(65_536, self._connections))
        else:
            client.sendall(huge_publish_head(self.topic, level=level))
        if mode == "huge":
            block, sent = bytes(65_536), 0
            while sent < self.huge_bytes and not self.stopping.is_set():
                client.sendall(block)
                sent += len(block)
            self.count("huge_bytes_sent", sent)
        while not self.stopping.is_set():  # then hold the connection
            if mode == "drip":
                client.sendall(b"\x00")
            time.sleep(1.0)
            if _closed(client):
                return

    def stop(self, timeout: float = 30.0) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        super().stop(timeout)


def _read_connect(sock: socket.socket) -> int | None:
    """Read one whole CONNECT packet; its protocol level (4: 3.1.1, 5: MQTT 5), or None."""
    sock.settimeout(10.0)
    head = _recv(sock, 2)
    if head is None or head[0] >> 4 != 1:
        return None
    length, shift, byte = 0, 0, head[1]
    while True:
        length |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        more = _recv(sock, 1)
        if more is None:
            return None
        byte, shift = more[0], shift + 7
    body = _recv(sock, length)
    sock.settimeout(None)
    return None if body is None or len(body) < 7 else body[6]


def _recv(sock: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            return None
        data += piece
    return data


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while sock.recv(65_536):
            pass


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed (a zero-byte peek without blocking)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# ---- the node's config for all of the above --------------------------------------------------


def edge_sections(
    target: Target,
    *,
    broker: tuple[str, int],
    hostile: HostileMqttServer | None = None,
    media: MediaServer | None = None,
) -> dict[str, dict[str, Any]]:
    """Config sections that open every edge these attacks drive: Wyoming on the target's port
    (every loopback peer allowed, no announce port, no zeroconf), the Sparkplug edge node,
    sounds from the media server, and `mqtt.hosts` with the hostile server first and the real
    broker second (or the broker alone). Synthesis noise 0: the words of an alarm are the same
    samples every time, so a test finds them in a capture."""
    servers = [hostile.entry] if hostile is not None else []
    servers.append({"host": broker[0], "port": broker[1]})
    sections: dict[str, dict[str, Any]] = {
        "mqtt": {"hosts": servers},
        "tts": {"noise_scale": 0.0, "noise_w": 0.0},
        "sparkplug": {
            "enabled": True,
            "group_id": target.sparkplug_group,
            "device_id": target.sparkplug_device,
        },
    }
    if target.wyoming_port:
        sections["wyoming"] = {
            "enabled": True,
            "host": target.wyoming_host,
            "port": target.wyoming_port,
            "allow": ["127.0.0.0/8"],
            "satellite_port": 0,
            "zeroconf": False,
        }
    if media is not None:
        sections["audio"] = {"media_hosts": [media.host]}
    return sections


@dataclass
class Arsenal:
    """What the drivers need besides the target: the media server's URL, and a Sparkplug host
    (a SCADA stand-in that only commands: `ScadaHost(watch=False)`), started on first use."""

    target: Target
    media_url: str
    work: Path
    host: ScadaHost | None = None

    def scada(self) -> ScadaHost:
        if self.host is None:
            self.host = ScadaHost(
                self.target.broker_host,
                self.target.broker_port,
                f"attacker-{self.target.node_id}",
                log=self.work / "scada-attacker.log",
                watch=False,
            ).start()
        return self.host

    def close(self) -> None:
        if self.host is not None:
            self.host.stop()


DRIVERS: Final[dict[str, Callable[[Arsenal], Attack]]] = {
    "wyoming pathological texts": lambda arms: wyoming_pathological(arms.target),
    "wyoming long texts": lambda arms: wyoming_long(arms.target),
    "sparkplug amplification": lambda arms: SparkplugAmplification(arms.target, arms.scada()),
    "QoS 0 flood": lambda arms: SpeakFlood(arms.target, qos=0),
    "QoS 1 flood": lambda arms: SpeakFlood(arms.target, qos=1),
    "media decoding": lambda arms: MediaFlood(arms.target, arms.media_url),
}
"""Every attack of the issue that drives traffic, by name (the hostile server is passive: it
is put in the node's `mqtt.hosts` and started before the node)."""


class Salvo:
    """Attacks by name (`DRIVERS`), run in a child process of their own: the attackers' Python
    (floods at full rate, Wyoming clients) never holds this process's interpreter lock, so the
    clocks of a test or a benchmark (publish times, the recording's timeline) stay true."""

    def __init__(self, target: Target, names: Sequence[str], media_url: str, work: Path):
        unknown = set(names) - set(DRIVERS)
        if unknown:
            raise ValueError(f"no such attacks: {sorted(unknown)}")
        self.args = (target, tuple(names), media_url, work)
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._answers: multiprocessing.Queue[tuple[str, Any]] = context.Queue()
        self._process = context.Process(
            target=_salvo_child, args=(self.args, self._stop, self._answers), daemon=True
        )
        self.reported: dict[str, Any] = {}

    def start(self, timeout: float = 120.0) -> Self:
        """Start the child and wait until every attack runs."""
        self._process.start()
        kind, value = self._answers.get(timeout=timeout)
        if kind != "started":
            raise RuntimeError(f"the attacks did not start: {value}")
        return self

    def stop(self, timeout: float = 120.0) -> dict[str, Any]:
        """Stop every attack; what each sent and saw."""
        if self.reported or not self._process.is_alive():
            return self.reported
        self._stop.set()
        try:
            kind, value = self._answers.get(timeout=timeout)
            self.reported = value if kind == "report" else {"error": value}
        except queue.Empty:
            self.reported = {"error": "no report from the attacks"}
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
        return self.reported


def _salvo_child(
    spec: tuple[Target, tuple[str, ...], str, Path],
    stop: threading.Event,
    answers: multiprocessing.Queue[tuple[str, Any]],
) -> None:
    target, names, media_url, work = spec
    arsenal = Arsenal(target, media_url, work)
    try:
        barrage = Barrage(DRIVERS[name](arsenal) for name in names).start()
    except Exception as err:  # noqa: BLE001 - the parent says what failed
        answers.put(("failed", f"{type(err).__name__}: {err}"))
        arsenal.close()
        return
    answers.put(("started", None))
    stop.wait()
    barrage.stop()
    answers.put(("report", barrage.report()))
    arsenal.close()


# ---- the range: a node with every edge open, its attackers, what reaches its sound server -----

RATE: Final = 22_050
"""The bundled voice's rate: the sound server runs at it (mono), so nothing is resampled and a
chime or a voice's samples reach the recording as the node made them (up to gain)."""

ALARM_CHIMES: Final = {"critical": "alert", "alarm": "alarm"}
"""The built-in chime each alarm class plays by default (`audio.chimes`, docs/sounds.md)."""


def alarm_chime(priority: str) -> npt.NDArray[np.int16]:
    """The samples of an alarm class's default chime at RATE, as the node renders it."""
    from agent.formats.chimes import BUILTIN, render_notes  # noqa: PLC0415 - the one place

    chime = np.frombuffer(render_notes(BUILTIN[ALARM_CHIMES[priority]], RATE), "<i2")
    chime = chime.astype(np.int16)
    return chime[: int(np.flatnonzero(chime)[-1]) + 1]  # without the breath before speech


class FiringRange:
    """Everything around a node under attack: a real Mosquitto, a PulseAudio null sink at RATE
    (mono) behind ALSA's `pulse` device with a timed recording of its monitor (what reaches the
    sound server, on its own timeline), the media server, and (with `hostile`) the hostile
    server first in `mqtt.hosts`. `start_agent` starts the node (the bundled voice unless
    `voice`) with every edge open, playing to `paced_capture`; `salvo` makes the attacks, run
    from a process of their own. The watcher sees the node's events and status only (not its
    speak topic, which the floods fill)."""

    def __init__(
        self,
        work: Path,
        *,
        cache_dir: Path | None = None,
        voice: Path | None = None,
        node_id: str = "fire",
    ) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.cache_dir = cache_dir or work / "cache"
        self.voice = voice
        self.node_id = node_id
        self._stack = contextlib.ExitStack()
        self.broker = Broker(work / "broker")
        self.sink = PulseNullSink(work / "pulse", f"rate={RATE} channels=1")
        self.recording = TimedRecording(self.sink, RATE, work / "monitor.raw")
        self.media = MediaServer()
        self.target = Target(node_id, self.broker.host, self.broker.port, wyoming_port=free_port())
        self.watcher: Watcher | None = None
        self.agent: AgentProcess | None = None
        self.hostile: HostileMqttServer | None = None
        self._starts = 0

    def start(self) -> Self:
        """Start the broker, the sound server and its recording, the media server, the
        watcher."""
        self.broker.start()
        self._stack.callback(self.broker.stop)
        self.sink.start()
        self._stack.callback(self.sink.stop)
        self.recording.start()
        self._stack.callback(self.recording.stop)
        self.media.start()
        self._stack.callback(self.media.stop)
        topics = [f"{self.target.prefix}/{self.node_id}/{leaf}" for leaf in ("events", "status")]
        self.watcher = Watcher(self.broker, *topics)
        self._stack.callback(self.watcher.close)
        return self

    def salvo(self, names: Sequence[str] = tuple(DRIVERS)) -> Salvo:
        """The attacks named (default: every one that drives traffic), not started."""
        salvo = Salvo(self.target, names, self.media.url, self.work)
        self._stack.callback(salvo.stop)
        return salvo

    def config(self, *, hostile: bool, **sections: Mapping[str, Any]) -> dict[str, Any]:
        """The node's config: every edge open (`edge_sections`), the hostile server first in
        `mqtt.hosts` with `hostile` (a new one, started), `sections` merged over it."""
        self.hostile = None
        if hostile:
            self.hostile = HostileMqttServer(topic=self.target.speak_topic).start()
            self._stack.callback(self.hostile.stop)
        edges = edge_sections(
            self.target,
            broker=(self.broker.host, self.broker.port),
            hostile=self.hostile,
            media=self.media,
        )
        for name, values in sections.items():
            edges[name] = {**edges.get(name, {}), **values}
        home = self.work / f"node-home-{self._starts + 1}"  # a new journal for each start
        config = agent_config(None, home, self.node_id, voice=self.voice, device="paced_capture")
        for name, values in edges.items():
            config[name] = {**config.get(name, {}), **values}
        config["cache"] = {**config.get("cache", {}), "dir": str(self.cache_dir)}
        config["state"] = {"interval": 1}
        return config

    def start_agent(
        self, config: Mapping[str, Any], *, wait: bool = True, command: Sequence[str] = ()
    ) -> AgentProcess:
        """Start the node with `config` (as `python -m agent run`, or `command` + `--config
        FILE`); with `wait`, until its status says online."""
        self._starts += 1
        path = write_config(self.work / f"node-{self._starts}.yaml", config)
        env = self.sink.env(self.work / f"written-{self._starts}.raw")
        self.agent = AgentProcess(path, self.work / f"node-{self._starts}.log", env)
        if command:
            self.agent.start_command([*command, "--config", str(path)])
        else:
            self.agent.start()
        if wait:
            self.wait_online()
        return self.agent

    def wait_online(self, timeout: float = 300.0) -> None:
        """Wait for an `online` status published after the last start."""
        assert self.watcher is not None
        assert self.agent is not None
        status = f"voice/{self.node_id}/status"
        agent, seen = self.agent, len(self.watcher.snapshot())

        def online() -> bool:
            later = self.watcher.snapshot()[seen:] if self.watcher else []
            return any(m.topic == status and m.payload == b"online" for m in later)

        try:
            wait_until(lambda: online() or not agent.alive(), timeout, "the node online")
        except AssertionError as err:
            raise AssertionError(f"{err}; its log ends:\n{agent.output()[-3000:]}") from None
        if not agent.alive():
            raise RuntimeError(f"the node exited; its log ends:\n{agent.output()[-3000:]}")

    def stop_agent(self) -> None:
        """SIGTERM the node and wait for its exit."""
        if self.agent is not None and self.agent.alive():
            self.agent.signal(signal.SIGTERM)

    def close(self) -> None:
        """Stop the node and everything the range started."""
        self.stop_agent()
        self._stack.close()


def first_heard(
    recording: TimedRecording, needle: npt.NDArray[np.int16], since: float, threshold: float = 0.9
) -> tuple[float, float] | None:
    """When `needle` is first heard in the recording after perf_counter time `since` (less
    0.1 s: a sample is never placed early), as a perf_counter time on the sound server's
    timeline, with the correlation there; None if not (yet) heard."""
    start = max(0, recording.index_at(since) - RATE // 10)
    found = first_match(recording.samples(start), needle, threshold)
    if found is None:
        return None
    return recording.time_of(start + found[0]), found[1]


ONSET_SAMPLES: Final = RATE // 50
"""The first 20 ms of a chime (one ALSA period at the default geometry): what is looked for to
place a chime's first sample, so that a chime cut into pieces by underruns is still placed."""
