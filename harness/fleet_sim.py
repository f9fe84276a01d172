"""Simulated nodes that speak the OTA contract (docs/updates.md), by the
thousand, for testing and measuring the operator's tool.

Each node is its own MQTT 5 connection (own client id, persistent session, Last Will `offline` on
`<prefix>/<node>/status`), like the agent: that is what makes a node go offline on its own. The
connections share one thread: paho clients driven by one `selectors` loop (paho's external event
loop API), not one network thread per client. A node subscribes to `<prefix>/<node>/ota`,
`<prefix>/all/ota` and `<prefix>/group/<g>/ota` for its `ota_groups`, publishes retained status
and state (the agent's fields, with the fleet fields: `ts`, `node`, `agent_version`,
`device_class`, `groups`, `ota_groups`, `last_update`), and answers offers with the update events
in order: `verifying`, `downloading` (0-100 in steps of 10), `installing`, `checking`, `switching`,
then `installed` or `failed` (a configured reason), `already_installed` for its release, `busy`
while one runs (the running offer delivered again is ignored), `rolled_back` for a rollback
command, `cancelled` for a cancel. Offers are verified with `agent.protocol.manifest` when trusted
keys are given (Ed25519: ~0.1 ms each), else only parsed. Nothing is downloaded: the phases are
timers.

    python -m harness.fleet_sim --broker 127.0.0.1:1883 --count 1000 --ready-file ready.json
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import heapq
import itertools
import json
import os
import queue
import random
import resource
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Protocol

import paho.mqtt.client as mqtt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.core.refusal import Refused
from agent.core.states import UpdatePhase, UpdateReason
from agent.protocol import manifest as manifests

from .broker import Broker

AGENT_VERSION: Final = "sim-1"
"""`agent_version` the simulated nodes report."""
SESSION_EXPIRY: Final = 3600
"""Seconds the broker keeps a simulated node's session (and its queued offers) while it is away."""
KEEPALIVE: Final = 30
"""MQTT keepalive of each simulated connection (seconds)."""
MISC_EVERY: Final = 1.0
"""Seconds between keepalive checks of all connections."""


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node."""

    node: str
    groups: tuple[str, ...] = ()
    ota_groups: tuple[str, ...] = ()
    device_class: str = "voice-agent"
    release: int = 0
    version: str | None = None
    """None: the first 12 hex digits of the model's sha256, as the agent reports release 0."""
    online: bool = True
    """False: announces itself, then its connection drops (the Last Will marks it offline)."""
    fail: str | None = None
    """A failure reason this node's updates end with (e.g. `health_check`)."""
    fail_release: int | None = None
    """Only offers of this release fail (None: every offer)."""
    fail_detail: str = "simulated failure"
    """The `detail` of those failures (free text, as a node may send any)."""
    mute: bool = False
    """Online but never answers an offer (a hung agent)."""


@dataclass(frozen=True)
class Behaviour:
    """Timing and failures shared by the simulated nodes."""

    step_seconds: float = 0.05
    """Each of verifying, installing, checking, switching takes this long."""
    download_seconds: float = 0.3
    """The download phase (progress 0-100 in steps of 10) takes this long."""
    failure_rate: float = 0.0
    """Share of updates that fail the health check at random (seeded per node and offer)."""
    seed: int = 1
    state_interval: float = 60.0
    """Seconds between retained state publications besides changes."""
    trusted_keys: tuple[str, ...] = ()
    """Base64 Ed25519 public keys: offers are verified when given, else only parsed."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Model:
    release: int
    version: str
    sha256: str


@dataclass
class SimNode:
    """A simulated node's own state (touched only on the loop thread)."""

    spec: NodeSpec
    client: mqtt.Client
    model: _Model
    previous: _Model | None = None
    alive: bool = True
    connected: bool = False
    ready: bool = False
    announced: bool = False
    running: str | None = None
    cancelled: bool = False
    last_update: dict[str, Any] | None = None
    offers: list[str] = field(default_factory=list)
    """Ids of every offer or command received, in order, redeliveries included."""
    started: float = field(default_factory=time.monotonic)


class SimFleet:
    """Many simulated nodes on one broker, run by one background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        specs: Iterable[NodeSpec],
        behaviour: Behaviour | None = None,
        prefix: str = "voice",
    ) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.behaviour = behaviour or Behaviour()
        self._trusted = {
            manifests.key_id(k): k
            for k in (manifests.public_key_from_text(t) for t in self.behaviour.trusted_keys)
        }
        self._selector = selectors.DefaultSelector()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._counter = itertools.count()
        self._commands: queue.Queue[Callable[[], None]] = queue.Queue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.nodes: dict[str, SimNode] = {}
        for spec in specs:
            self.nodes[spec.node] = self._make_node(spec)
        self._thread = threading.Thread(target=self._run, name="fleet-sim", daemon=True)
        self.errors: list[str] = []

    # ---- public API (any thread) -------------------------------------------------------------

    def start(self) -> SimFleet:
        """Connect every node (in the background); see `wait_ready`."""
        _raise_fd_limit(3 * len(self.nodes) + 64)
        self._thread.start()
        self._call(self._connect_all)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until every online node is subscribed and announced, and every offline one has
        announced itself and dropped its connection."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            if time.monotonic() > deadline:
                missing = [n.spec.node for n in self.nodes.values() if not self._node_ready(n)]
                raise TimeoutError(f"simulated nodes not ready: {missing[:10]} ({len(missing)})")
            if self.errors:
                raise RuntimeError(self.errors[0])
            time.sleep(0.05)

    def ready(self) -> bool:
        """Whether `wait_ready` would return."""
        with self._lock:
            return all(self._node_ready(n) for n in self.nodes.values())

    def kill(self, node: str) -> None:
        """Drop a node's connection without DISCONNECT: the broker publishes its Last Will."""
        self._call(lambda: self._kill(self.nodes[node]))

    def revive(self, node: str) -> None:
        """Bring a killed node back (it reconnects to its persistent session)."""
        self._call(lambda: self._revive(self.nodes[node]))

    def offers(self, node: str) -> list[str]:
        """Ids of every offer or command the node received (redeliveries included)."""
        with self._lock:
            return list(self.nodes[node].offers)

    def release(self, node: str) -> int:
        """The release the node runs."""
        with self._lock:
            return self.nodes[node].model.release

    def stop(self) -> None:
        """Disconnect every node cleanly (status `offline`) and end the thread."""
        if self._thread.is_alive():
            self._call(self._disconnect_all)
            deadline = time.monotonic() + 10
            while self._thread.is_alive() and time.monotonic() < deadline:
                self._thread.join(0.1)
        self._stop.set()
        self._thread.join(5)
        self._wake_r.close()
        self._wake_w.close()

    def _call(self, command: Callable[[], None]) -> None:
        self._commands.put(command)
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"x")

    # ---- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        next_misc = time.monotonic() + MISC_EVERY
        while not self._stop.is_set():
            now = time.monotonic()
            timeout = min(next_misc, self._timers[0][0] if self._timers else now + 0.5) - now
            for key, mask in self._selector.select(max(0.0, timeout)):
                if key.data is None:
                    self._drain_commands()
                    continue
                self._service(key.data, mask)
            now = time.monotonic()
            while self._timers and self._timers[0][0] <= now:
                _, _, action = heapq.heappop(self._timers)
                self._guard(action)
            if now >= next_misc:
                next_misc = now + MISC_EVERY
                for node in list(self.nodes.values()):
                    if node.client.socket() is not None:
                        self._guard(node.client.loop_misc)

    def _guard(self, action: Callable[[], object]) -> None:
        try:
            action()
        except Exception as err:  # noqa: BLE001 - one node's error must not stop the others
            self.errors.append(f"{type(err).__name__}: {err}")

    def _drain_commands(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while self._wake_r.recv(4096):
                pass
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            self._guard(command)

    def _service(self, node: SimNode, mask: int) -> None:
        client = node.client
        if mask & selectors.EVENT_READ:
            rc = client.loop_read(max_packets=10)
            if rc not in {MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_AGAIN}:
                return
        if mask & selectors.EVENT_WRITE and client.socket() is not None:
            client.loop_write()

    def _at(self, delay: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._counter), action))

    # ---- connections -------------------------------------------------------------------------

    def _make_node(self, spec: NodeSpec) -> SimNode:
        sha = _sha(f"sim-model-r{spec.release}")
        model = _Model(spec.release, spec.version or sha[:12], sha)
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"voice-agent-{spec.node}",
            protocol=MQTTProtocolVersion.MQTTv5,
        )
        node = SimNode(spec, client, model)
        client.user_data_set(node)
        status = f"{self.prefix}/{spec.node}/status"
        client.will_set(status, b"offline", qos=1, retain=True)
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        client.on_connect = lambda c, u, f, r, p: self._on_connect(node, r)
        client.on_disconnect = lambda c, u, f, r, p: self._on_disconnect(node)
        client.on_subscribe = lambda c, u, m, r, p: self._on_subscribed(node)
        client.on_message = lambda c, u, m: self._guard(lambda: self._on_message(node, m))
        return node

    def _on_socket_open(self, _client: mqtt.Client, node: SimNode, sock: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, node)

    def _on_socket_close(self, _client: mqtt.Client, _userdata: Any, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)

    def _on_register_write(self, _client: mqtt.Client, node: SimNode, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            events = selectors.EVENT_READ | selectors.EVENT_WRITE
            self._selector.modify(sock, events, node)

    def _on_unregister_write(self, _client: mqtt.Client, node: SimNode, sock: Any) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.modify(sock, selectors.EVENT_READ, node)

    def _connect_all(self) -> None:
        for node in self.nodes.values():
            self._connect(node, first=True)

    def _connect(self, node: SimNode, first: bool = False) -> None:
        if not node.alive or self._stop.is_set():
            return
        properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        properties.SessionExpiryInterval = SESSION_EXPIRY
        try:
            if first:
                node.client.connect(
                    self.host, self.port, KEEPALIVE, clean_start=False, properties=properties
                )
            else:
                node.client.reconnect()
        except OSError:
            self._at(random.uniform(0.5, 2.0), lambda: self._connect(node))

    def _on_connect(self, node: SimNode, reason: Any) -> None:
        if getattr(reason, "is_failure", False):
            self.errors.append(f"{node.spec.node}: connection refused: {reason}")
            return
        node.connected = True
        node.started = time.monotonic()
        topics = [f"{self.prefix}/{node.spec.node}/ota", f"{self.prefix}/all/ota"]
        topics += [f"{self.prefix}/group/{g}/ota" for g in node.spec.ota_groups]
        node.client.subscribe([(t, 1) for t in topics])

    def _on_subscribed(self, node: SimNode) -> None:
        node.client.publish(f"{self.prefix}/{node.spec.node}/status", b"online", 1, retain=True)
        info = self._publish_state(node)
        if not node.announced:
            node.announced = True
            self._at(self.behaviour.state_interval * random.random(), lambda: self._tick(node))
        if node.spec.online:
            with self._lock:
                node.ready = True
            return
        self._when_published(info, lambda: self._kill(node, initial=True))

    def _when_published(self, info: mqtt.MQTTMessageInfo, action: Callable[[], None]) -> None:
        if info.is_published():
            action()
        else:
            self._at(0.02, lambda: self._when_published(info, action))

    def _tick(self, node: SimNode) -> None:
        if node.connected:
            self._publish_state(node)
        self._at(self.behaviour.state_interval, lambda: self._tick(node))

    def _on_disconnect(self, node: SimNode) -> None:
        node.connected = False
        if node.alive and not self._stop.is_set():
            self._at(random.uniform(0.5, 2.0), lambda: self._connect(node))

    def _kill(self, node: SimNode, initial: bool = False) -> None:
        node.alive = False
        node.connected = False
        sock = node.client.socket()
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # EOF: loop_read closes it, the broker sends LWT
        if initial:
            with self._lock:
                node.ready = True

    def _revive(self, node: SimNode) -> None:
        node.alive = True
        self._connect(node)

    def _disconnect_all(self) -> None:
        for node in self.nodes.values():
            if node.connected:
                status = f"{self.prefix}/{node.spec.node}/status"
                node.client.publish(status, b"offline", 1, retain=True)
                node.alive = False
                node.client.disconnect()
        self._at(0.5, self._stop.set)

    def _node_ready(self, node: SimNode) -> bool:
        return node.ready

    # ---- the node's contract -----------------------------------------------------------------

    def _publish_state(self, node: SimNode) -> mqtt.MQTTMessageInfo:
        spec, model = node.spec, node.model
        state = {
            "ts": _now_iso(),
            "node": spec.node,
            "agent_version": AGENT_VERSION,
            "device_class": spec.device_class,
            "groups": list(spec.groups),
            "ota_groups": list(spec.ota_groups),
            "audio": "available",
            "volume": 1.0,
            "voice": "default",
            "queue_depth": 0,
            "underruns": 0,
            "model": "sim-voice",
            "model_version": model.version,
            "model_sha256": model.sha256,
            "model_release": model.release,
            "last_update": node.last_update,
            "uptime_s": round(time.monotonic() - node.started),
        }
        topic = f"{self.prefix}/{spec.node}/state"
        return node.client.publish(topic, json.dumps(state), 1, retain=True)

    def _event(self, node: SimNode, offer: str, state: UpdatePhase, **details: Any) -> None:
        body = {"id": offer, "event": "update", "ts": _now_iso(), "node": node.spec.node}
        body["state"] = str(state)
        body.update({k: v for k, v in details.items() if v is not None})
        node.client.publish(f"{self.prefix}/{node.spec.node}/events", json.dumps(body), 1)

    def _final(self, node: SimNode, offer: str, state: UpdatePhase, **details: Any) -> None:
        self._event(node, offer, state, **details)
        node.last_update = {
            "id": offer,
            "state": str(state),
            "reason": details.get("reason"),
            "release": details.get("release"),
            "ts": _now_iso(),
        }
        if node.running == offer:
            node.running = None
        self._publish_state(node)

    def _on_message(self, node: SimNode, message: mqtt.MQTTMessage) -> None:
        try:
            body = json.loads(message.payload)
        except ValueError:
            body = None
        offer = body.get("id") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(offer, str) or not offer:
            self._final(node, "malformed", UpdatePhase.FAILED, reason="malformed")
            return
        with self._lock:
            node.offers.append(offer)
        if node.spec.mute:
            return
        if body.get("cancel") is True:
            if node.running is not None:
                node.cancelled = True
            return
        if offer == node.running:
            return  # the running offer delivered again
        if node.running is not None:
            self._event(node, offer, UpdatePhase.BUSY, reason="already_in_progress")
            return
        if body.get("rollback") is True:
            self._rollback(node, offer)
            return
        self._offer(node, offer, body)

    def _rollback(self, node: SimNode, offer: str) -> None:
        if node.previous is None:
            self._final(node, offer, UpdatePhase.FAILED, reason="nothing_to_roll_back")
            return
        node.model, node.previous = node.previous, node.model
        self._final(node, offer, UpdatePhase.ROLLED_BACK, release=node.model.release)

    def _offer(self, node: SimNode, offer: str, body: Mapping[str, Any]) -> None:
        parsed = self._manifest(body.get("manifest"))
        if isinstance(parsed, Refused):
            self._final(node, offer, UpdatePhase.FAILED, reason=parsed.reason, detail=parsed.detail)
            return
        release, version, sha = parsed
        node.running = offer
        node.cancelled = False
        self._event(node, offer, UpdatePhase.VERIFYING, release=release, version=version)
        if release == node.model.release:
            self._final(node, offer, UpdatePhase.ALREADY_INSTALLED, release=release)
            return
        if release < node.model.release:
            self._final(node, offer, UpdatePhase.FAILED, reason="downgrade", release=release)
            return
        spec, how = node.spec, self.behaviour
        fails = spec.fail if spec.fail_release in {None, release} else None
        rng = random.Random(f"{how.seed}/{spec.node}/{offer}")
        if fails is None and rng.random() < how.failure_rate:
            fails = "health_check"
        steps: list[tuple[float, UpdatePhase, dict[str, Any]]] = []
        at = how.step_seconds
        for percent in range(0, 101, 10):
            steps.append((at, UpdatePhase.DOWNLOADING, {"progress": percent}))
            at += how.download_seconds / 10
        for phase in (UpdatePhase.INSTALLING, UpdatePhase.CHECKING):
            steps.append((at, phase, {}))
            at += how.step_seconds
        if fails is None:
            steps.append((at, UpdatePhase.SWITCHING, {}))
            at += how.step_seconds
        new = _Model(release, version, sha)
        for delay, phase, extra in steps:
            step = self._step(
                node, offer, phase=phase, release=release, version=version, extra=extra
            )
            self._at(delay, step)
        self._at(at, lambda: self._finish(node, offer, new, fails))

    def _step(
        self,
        node: SimNode,
        offer: str,
        *,
        phase: UpdatePhase,
        release: int,
        version: str,
        extra: dict[str, Any],
    ) -> Callable[[], None]:
        def step() -> None:
            if node.running == offer and not node.cancelled and node.connected:
                self._event(node, offer, phase, release=release, version=version, **extra)

        return step

    def _finish(self, node: SimNode, offer: str, new: _Model, fails: str | None) -> None:
        if node.running != offer:
            return
        if not node.connected:  # offline mid-update: the result waits for the connection
            self._at(0.2, lambda: self._finish(node, offer, new, fails))
            return
        if node.cancelled:
            self._final(node, offer, UpdatePhase.CANCELLED)
        elif fails is not None:
            detail = node.spec.fail_detail
            self._final(node, offer, UpdatePhase.FAILED, reason=fails, detail=detail)
        else:
            node.previous, node.model = node.model, new
            self._final(node, offer, UpdatePhase.INSTALLED, release=new.release)

    def _manifest(self, raw: Any) -> tuple[int, str, str] | Refused[UpdateReason]:
        """(release, version, model sha256) of an offered envelope."""
        if not isinstance(raw, dict):
            return Refused(
                UpdateReason.MALFORMED, "no inline manifest (the simulator fetches none)"
            )
        envelope = json.dumps(raw).encode()
        if self._trusted:
            checked = manifests.verify(envelope, self._trusted)
            if isinstance(checked, Refused):
                return checked
            return checked.release, checked.version, checked.model.sha256
        try:
            body = json.loads(base64.b64decode(raw["manifest"]))
            model = next(f for f in body["files"] if str(f["path"]).endswith(".onnx"))
            return int(body["release"]), str(body["version"]), str(model["sha256"])
        except (ValueError, KeyError, TypeError, StopIteration) as err:
            return Refused(UpdateReason.MALFORMED, f"manifest: {err}"[:200])


def _raise_fd_limit(wanted: int) -> None:
    """Each connection takes three descriptors (its socket and paho's wake-up pair)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, target), hard))


def fleet_broker(
    workdir: Path, extra: Iterable[str] = (), *, save_every_change: bool = False
) -> Broker:
    """A harness Broker set up for a fleet: `max_queued_messages` 100000 and, unless
    `save_every_change`, persistence saved every 60 s instead of at every change (with
    `autosave_on_changes`, Mosquitto writes its whole database, every persistent session
    included, at each change: measured, a PUBACK then waited up to 1.5 s with 100 sessions).
    `extra` lines are appended (bridges, listeners). Not started."""
    _raise_fd_limit(8192)  # Mosquitto inherits it: a descriptor per connection
    broker = Broker(workdir)
    lines = broker.config.read_text(encoding="utf-8").splitlines()
    replaced = {"max_queued_messages": "max_queued_messages 100000"}
    if not save_every_change:
        replaced |= {
            "autosave_on_changes": "autosave_on_changes false",
            "autosave_interval": "autosave_interval 60",
        }
    lines = [replaced.get(line.split(" ")[0], line) for line in lines]
    broker.config.write_text("\n".join([*lines, *extra]) + "\n", encoding="utf-8")
    return broker


def release_envelope(directory: Path, key: Ed25519PrivateKey, number: int) -> Path:
    """A signed release of a stand-in model (the simulator downloads nothing); its path."""
    from ota import release  # noqa: PLC0415 - only the tests and the bench sign releases

    directory.mkdir(parents=True, exist_ok=True)
    model = directory / f"sim-voice-r{number}.onnx"
    model.write_bytes(f"stand-in model, release {number}".encode())
    Path(f"{model}.json").write_text('{"audio": {"sample_rate": 22050}}', encoding="utf-8")
    body = release.build_manifest(model, number, f"{number}.0")
    path = directory / f"r{number}.signed.json"
    path.write_bytes(release.sign(body, [key]))
    return path


class Address(Protocol):
    """Anything with a broker's host and port (a harness Broker)."""

    host: str
    port: int


def tool(broker: Address, command: str, *args: str) -> list[str]:
    """The command line of `python -m ota COMMAND ... --broker` for this broker."""
    return [sys.executable, "-m", "ota", command, *args, "--broker", f"{broker.host}:{broker.port}"]


def fleet_specs(
    count: int,
    *,
    start: int = 0,
    offline_every: int = 0,
    classes: tuple[str, ...] = ("voice-agent",),
    rings: int = 4,
    fail_every: int = 0,
    fail_release: int | None = None,
) -> list[NodeSpec]:
    """A fleet `sim0000`...: ota groups `ring0`..`ring<rings-1>` round robin, speak group by
    tens (`room<i//10>`), device classes round robin; every `offline_every`-th node offline and
    every `fail_every`-th failing its health check (0: none)."""
    specs = []
    for i in range(start, start + count):
        specs.append(
            NodeSpec(
                node=f"sim{i:04d}",
                groups=(f"room{i // 10}",),
                ota_groups=(f"ring{i % rings}",) if rings else (),
                device_class=classes[i % len(classes)],
                online=not (offline_every and i % offline_every == offline_every - 1),
                fail="health_check" if fail_every and i % fail_every == fail_every - 1 else None,
                fail_release=fail_release,
            )
        )
    return specs


def public_key_text(key: Ed25519PublicKey) -> str:
    """The base64 text of a public key (as `ota.trusted_keys` takes it)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat  # noqa: PLC0415

    return base64.b64encode(key.public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def main(argv: list[str] | None = None) -> int:
    """Run simulated nodes until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m harness.fleet_sim", description=__doc__)
    parser.add_argument("--broker", default="127.0.0.1:1883")
    parser.add_argument("--prefix", default="voice")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--start", type=int, default=0, help="index of the first node")
    parser.add_argument("--offline-every", type=int, default=0)
    parser.add_argument("--fail-every", type=int, default=0)
    parser.add_argument("--fail-release", type=int, default=None)
    parser.add_argument("--classes", default="voice-agent")
    parser.add_argument("--rings", type=int, default=4)
    parser.add_argument("--failure-rate", type=float, default=0.0)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--download-seconds", type=float, default=0.3)
    parser.add_argument("--state-interval", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trusted-key", action="append", default=[])
    parser.add_argument("--ready-file", type=Path, default=None)
    parser.add_argument("--record", type=Path, default=None, help="offers received, at exit")
    args = parser.parse_args(argv)
    host, _, port = args.broker.rpartition(":")
    specs = fleet_specs(
        args.count,
        start=args.start,
        offline_every=args.offline_every,
        classes=tuple(args.classes.split(",")),
        rings=args.rings,
        fail_every=args.fail_every,
        fail_release=args.fail_release,
    )
    behaviour = Behaviour(
        step_seconds=args.step_seconds,
        download_seconds=args.download_seconds,
        failure_rate=args.failure_rate,
        seed=args.seed,
        state_interval=args.state_interval,
        trusted_keys=tuple(args.trusted_key),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    sim = SimFleet(host or "127.0.0.1", int(port), specs, behaviour, args.prefix).start()
    began = time.monotonic()
    sim.wait_ready(timeout=300)
    if args.ready_file is not None:
        ready = {"nodes": len(specs), "seconds": time.monotonic() - began, "pid": os.getpid()}
        temporary = args.ready_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(ready), encoding="utf-8")
        temporary.rename(args.ready_file)
    stop.wait()
    if args.record is not None:
        offers = {name: sim.offers(name) for name in sim.nodes}
        args.record.write_text(json.dumps({"offers": offers, "errors": sim.errors}), "utf-8")
    sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
