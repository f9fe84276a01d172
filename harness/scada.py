"""A SCADA stand-in for the Sparkplug B tests: a primary host application built on pysparkplug
(Apache-2.0), not on the agent's code, so the agent's edge node is judged by someone else's
reading of Sparkplug B 3.0.

pysparkplug needs paho-mqtt < 2 and the project has 2.x, so the stand-in runs as a child process
(`harness/scada_host.py`) in its own venv, built once per machine under `.cache/scada-venv/`,
keyed by the pinned versions and the Python. The tests drive it with `ScadaHost`: it starts the
child, sends it commands and keeps what it reports, one JSON line each way.

A decoded message (`ScadaHost.messages()`) is a dict:

    {"kind": "message", "topic": "spBv1.0/plant/DDATA/kitchen/voice", "qos": 0, "retain": False,
     "received": 1764740000.123,            # the host's time.time() on arrival
     "length": 42,                          # bytes of payload
     "type": "DDATA",                       # from the topic (None if it has no known type)
     "group": "plant", "edge": "kitchen", "device": "voice", "host_id": None,
     "decoded": True, "error": None,
     "timestamp": 1764740000120, "seq": 3,  # of the payload, None when absent
     "metrics": [{"name": "Speak", "alias": 1, "datatype": "String", "datatype_id": 12,
                  "value": "Hello", "timestamp": 1764740000119, "is_null": False,
                  "is_historical": False, "is_transient": False,
                  "wire_name": None, "wire_datatype": None,   # as sent (here: alias only)
                  "properties": {...}, "metadata": {...}}],   # only when present
     "bdSeq": 0}                            # NBIRTH and NDEATH only

Names and datatypes a message gave only by alias are resolved from the birth, as pysparkplug
does (`wire_name`/`wire_datatype` show what was sent). Values: bytes as hex, DateTime as epoch
milliseconds, arrays as lists. STATE messages have `online` and `timestamp`, no metrics. Bytes
that do not decode have `"decoded": False`, the `error`, `raw_hex` (the first 512 bytes) and
`protobuf` (what protobuf alone made of them, or None).

`python -m harness.scada install` builds (or finds) the venv and says how long it took.

`harness/scada_host.py` is not type-checked with the project (`# mypy: ignore-errors`); it is
checked in the stand-in's venv with: `.venv/bin/mypy --strict --python-executable
.cache/scada-venv/<key>/venv/bin/python --ignore-missing-imports harness/scada_host.py` after
removing that first line from a copy.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Self

from .cached_venv import put_in_place, run_step
from .wait import ROOT, TIMEOUT

PYSPARKPLUG: Final = "0.6.1"
PAHO_MQTT: Final = "1.6.1"
PROTOBUF: Final = "7.36.2"
REQUIREMENTS: Final = (
    f"pysparkplug=={PYSPARKPLUG}",
    f"paho-mqtt=={PAHO_MQTT}",
    f"protobuf=={PROTOBUF}",
)
"""The stand-in's venv. pysparkplug 0.6.1 asks for paho-mqtt < 2 and protobuf >= 5.28.2; these
are what pip chose on 2026-12-03 (protobuf the same as the project's), pinned."""

CACHE: Final = ROOT / ".cache" / "scada-venv"
"""Where the venvs live, one folder per pinned set and Python (git-ignored)."""

SCRIPT: Final = Path(__file__).resolve().with_name("scada_host.py")
"""The child: the host application (and an edge node for the stand-in's own tests)."""

Decoded = dict[str, Any]
"""A message as the host decoded it (the module's docstring shows the keys)."""


# ---------------------------------------------------------------------------------------------
# The venv
# ---------------------------------------------------------------------------------------------


def venv_key() -> str:
    """The cache entry's name: the pins and this Python's version."""
    python = ".".join(map(str, sys.version_info[:3]))
    return f"pysparkplug-{PYSPARKPLUG}-paho-mqtt-{PAHO_MQTT}-protobuf-{PROTOBUF}-py{python}"


def install(cache: Path = CACHE) -> Path:
    """The stand-in venv's Python, the venv built on first use.

    Built in a temporary folder next to the cache entry and renamed into place when complete,
    under a lock, so a cached venv is always whole and two workers never build the same one."""
    final = cache / venv_key()
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cache.glob(".build-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        if not (final / "installed.json").is_file():
            _build(final)
    return final / "venv" / "bin" / "python"


_VERSIONS: Final = (
    "import importlib.metadata as m, json; print(json.dumps({d: m.version(d) for d in "
    "('pysparkplug', 'paho-mqtt', 'protobuf')}))"
)


def _build(final: Path) -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".build-{final.name}-", dir=final.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would stay with the renamed venv
    log = work / "install.log"
    venv = work / "venv"
    try:
        run_step([sys.executable, "-m", "venv", str(venv)], log)
        inside = str(venv / "bin" / "python")
        pip = [inside, "-m", "pip", "install", "--disable-pip-version-check", "--no-input"]
        run_step([*pip, *REQUIREMENTS], log)
        versions = json.loads(run_step([inside, "-c", _VERSIONS], log))
        wanted = {"pysparkplug": PYSPARKPLUG, "paho-mqtt": PAHO_MQTT, "protobuf": PROTOBUF}
        if versions != wanted:
            raise RuntimeError(f"the stand-in venv has {versions}, not {wanted}")
        record = {
            "requirements": list(REQUIREMENTS),
            "python": sys.executable,
            "versions": versions,
            "seconds": round(time.monotonic() - started, 1),
        }
        put_in_place(work, final, record)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


# ---------------------------------------------------------------------------------------------
# Metrics for commands
# ---------------------------------------------------------------------------------------------


def metric(key: str | int, datatype: str, value: Any, **extra: Any) -> dict[str, Any]:
    """A metric for `dcmd`/`ncmd`/`publish`: by name (a str) or alias (an int), with its
    datatype (`"String"`, `"Boolean"`, `"Float"`, `"Double"`, `"Int64"`... in any case) and a
    JSON value (hex for bytes, epoch milliseconds for DateTime, lists for arrays); `extra` may
    add `timestamp`, `is_null`, `alias` (beside a name), `properties` (for `publish`)."""
    named = {"alias": key} if isinstance(key, int) else {"name": key}
    return {**named, "datatype": datatype, "value": value, **extra}


def values(message: Decoded) -> dict[str, Any]:
    """A decoded message's metric values by (resolved) name, an alias-only metric pysparkplug
    could not name by its alias as `#<alias>`."""
    return {
        (m["name"] if m["name"] is not None else f"#{m['alias']}"): m["value"]
        for m in message.get("metrics", [])
    }


class ScadaError(RuntimeError):
    """The stand-in refused a command, or died."""


# ---------------------------------------------------------------------------------------------
# The child process
# ---------------------------------------------------------------------------------------------


class _Child:
    """`scada_host.py` in the stand-in's venv: commands to its stdin, its events kept."""

    def __init__(self, arguments: list[str], log: Path | None, password: str | None) -> None:
        self._arguments = arguments
        self.log = (
            log if log is not None else Path(tempfile.mkstemp(prefix="scada-", suffix=".log")[1])
        )
        self._password = password
        self._process: subprocess.Popen[str] | None = None
        self._events: list[dict[str, Any]] = []
        self._replies: dict[int, dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._ids = 0
        self._reader: threading.Thread | None = None

    def _spawn(self) -> None:
        if self._process is not None:
            raise ScadaError("already started")
        python = install()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("PYTHONPATH", None)  # nothing of the project's venv in the stand-in's
        if self._password is not None:
            env["SCADA_PASSWORD"] = self._password
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as err:
            self._process = subprocess.Popen(
                [str(python), str(SCRIPT), *self._arguments],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                bufsize=1,
                env=env,
                cwd=SCRIPT.parent,
            )
        self._reader = threading.Thread(target=self._read, name="scada-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"kind": "unreadable", "line": line}
            if not isinstance(event, dict):
                event = {"kind": "unreadable", "line": line}
            with self._changed:
                self._events.append(event)
                if event.get("kind") == "reply" and isinstance(event.get("id"), int):
                    self._replies[event["id"]] = event
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        """The child's process id."""
        if self._process is None:
            raise ScadaError("not started")
        return self._process.pid

    def alive(self) -> bool:
        """Whether the child still runs."""
        return self._process is not None and self._process.poll() is None

    def events(self) -> list[dict[str, Any]]:
        """Everything the child reported so far (messages, connections, replies), in order."""
        with self._changed:
            return list(self._events)

    def output(self) -> str:
        """The child's stderr (Python warnings, tracebacks; paho's log with `debug`)."""
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def _describe(self) -> str:
        state = "running" if self.alive() else f"exited ({self._process and self._process.poll()})"
        return f"the stand-in is {state}; its stderr ends:\n{self.output()[-3000:]}"

    def _send(self, request: Mapping[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None or not self.alive():
            raise ScadaError(f"cannot send {request.get('op')}: {self._describe()}")
        process.stdin.write(json.dumps(request) + "\n")
        process.stdin.flush()

    def request(self, op: str, timeout: float = TIMEOUT, **fields: Any) -> Any:
        """Send a command and wait for its answer: its result, or ScadaError."""
        with self._changed:
            self._ids += 1
            number = self._ids
        self._send({"op": op, "id": number, **fields})
        deadline = time.monotonic() + timeout
        with self._changed:
            while number not in self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self.alive():
                    raise ScadaError(f"no answer to {op} in {timeout} s: {self._describe()}")
                self._changed.wait(min(left, 0.5))
            reply = self._replies.pop(number)
        if not reply.get("ok"):
            raise ScadaError(f"{op} refused: {reply.get('error')}")
        return reply.get("result")

    def wait_event(
        self, predicate: Callable[[dict[str, Any]], bool], what: str, timeout: float = TIMEOUT
    ) -> dict[str, Any]:
        """The first event (of any kind) that satisfies predicate, waiting for it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for event in self._events:
                    if predicate(event):
                        return event
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
                if not self.alive():
                    raise AssertionError(f"waiting for {what}: {self._describe()}")
                self._changed.wait(min(left, 0.5))

    def stop(self, timeout: float = TIMEOUT) -> int | None:
        """Ask it to end gracefully and wait; killed if it does not. Its exit status."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(OSError, ValueError):  # its stdin already closed
                self._send({"op": "stop"})
                assert process.stdin is not None
                process.stdin.close()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self._join()
        return process.returncode

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill it (SIGKILL: no DISCONNECT, the broker delivers its will) and wait."""
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            process.wait(TIMEOUT)
        self._join()

    def _join(self) -> None:
        if self._reader is not None:
            self._reader.join(TIMEOUT)
        process = self._process
        if process is not None:
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError, ValueError):
                    if stream is not None:
                        stream.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _connection(
    broker_host: str,
    broker_port: int,
    *,
    username: str | None,
    client_id: str | None,
    keepalive: int,
    debug: bool,
) -> list[str]:
    arguments = ["--broker-host", broker_host, "--broker-port", str(broker_port)]
    arguments += ["--keepalive", str(keepalive)]
    if username is not None:
        arguments += ["--username", username]
    if client_id is not None:
        arguments += ["--client-id", client_id]
    if debug:
        arguments.append("--debug")
    return arguments


# ---------------------------------------------------------------------------------------------
# The host application
# ---------------------------------------------------------------------------------------------


class ScadaHost(_Child):
    """A Sparkplug B 3.0 primary host application (pysparkplug, MQTT 3.1.1, clean session) on
    a broker: its STATE birth and death certificates, every message under `spBv1.0/` decoded,
    and commands (DCMD, NCMD, STATE, any publication) on request."""

    def __init__(
        self,
        broker_host: str,
        broker_port: int,
        host_id: str,
        *,
        username: str | None = None,
        password: str | None = None,
        client_id: str | None = None,
        keepalive: int = 10,
        log: Path | None = None,
        debug: bool = False,
        watch: bool = True,
    ) -> None:
        """`host_id` is the primary host application id (the STATE topic's last level);
        `watch=False` reads only its own STATE (a host that only commands, at full rate);
        `keepalive` in seconds (the broker sends the will this much after the host goes quiet,
        at once when its process dies); `log` receives the child's stderr (`debug`: paho's
        log too)."""
        connection = _connection(
            broker_host,
            broker_port,
            username=username,
            client_id=client_id,
            keepalive=keepalive,
            debug=debug,
        )
        arguments = ["host", *connection, "--host-id", host_id]
        if not watch:  # its own STATE only: nothing else decoded, reported or kept
            arguments += ["--subscribe", f"spBv1.0/STATE/{host_id}"]
        super().__init__(arguments, log, password)
        self.host_id = host_id
        self.state_topic = f"spBv1.0/STATE/{host_id}"

    def start(self, wait: bool = True, timeout: float = TIMEOUT) -> Self:
        """Start the child; with `wait`, until the host has read its own STATE birth back from
        the broker (connected, subscribed, birth published)."""
        self._spawn()
        if wait:
            self.wait_online(timeout)
        return self

    def wait_online(self, timeout: float = TIMEOUT, births: int = 1) -> Decoded:
        """Wait until the host has published `births` STATE births (one per connection) and the
        latest came back to it from the broker; that STATE message."""

        def online(message: Decoded) -> bool:
            stamps = self.birth_timestamps()
            return (
                len(stamps) >= births
                and message["topic"] == self.state_topic
                and message.get("online") is True
                and message.get("timestamp") == stamps[-1]
            )

        return self.wait_for(online, f"STATE birth {births} of {self.host_id}", timeout)

    def birth_timestamps(self) -> list[int]:
        """The timestamps of the STATE births the host published, one per connection (each is
        the timestamp of the will it connected with)."""
        return [
            int(e["timestamp"])
            for e in self.events()
            if e.get("kind") == "state_published" and e.get("birth")
        ]

    def connections(self) -> list[dict[str, Any]]:
        """Its `connected` and `disconnected` events (with paho's rc), in order."""
        return [e for e in self.events() if e.get("kind") in {"connected", "disconnected"}]

    def messages(
        self,
        type: str | None = None,
        *,
        group: str | None = None,
        edge: str | None = None,
        device: str | None = None,
        since: int = 0,
    ) -> list[Decoded]:
        """A snapshot of the decoded messages in arrival order (those from index `since`, see
        `mark`), optionally only of one message type, group, edge node, device."""
        found = [e for e in self.events() if e.get("kind") == "message"][since:]
        wanted = {"type": type, "group": group, "edge": edge, "device": device}
        return [m for m in found if all(v is None or m.get(k) == v for k, v in wanted.items())]

    def mark(self) -> int:
        """The number of messages so far: pass as `since` to look only at later ones."""
        return len(self.messages())

    def wait_for(
        self,
        predicate: Callable[[Decoded], bool],
        what: str,
        timeout: float = TIMEOUT,
        since: int = 0,
    ) -> Decoded:
        """The first decoded message (from index `since`) for which predicate holds, waiting
        for it; on timeout an AssertionError that lists the last messages seen."""
        deadline = time.monotonic() + timeout
        while True:
            for message in self.messages(since=since):
                if predicate(message):
                    return message
            if time.monotonic() > deadline or not self.alive():
                seen = [
                    (m["type"], m["topic"], m["decoded"], m.get("error"))
                    for m in self.messages(since=since)[-12:]
                ]
                state = "" if self.alive() else f"; {self._describe()}"
                raise AssertionError(
                    f"timed out after {timeout} s waiting for {what}; last messages: {seen}{state}"
                )
            with self._changed:
                self._changed.wait(0.2)

    def dcmd(
        self,
        group: str,
        edge: str,
        device: str,
        metrics: Sequence[Mapping[str, Any]],
        *,
        datatypes: bool = True,
        timestamp: int | None = None,
    ) -> dict[str, Any]:
        """Publish a DCMD (QoS 0, not retained) to an edge node's device, each metric by name
        or alias (see `metric`); `datatypes=False` leaves them out of the wire (Sparkplug 3.0:
        they SHOULD NOT be sent in commands; the edge node knows them from its birth). The
        answer: `topic`, `timestamp` and the `payload_hex` sent."""
        result: dict[str, Any] = self.request(
            "dcmd",
            group=group,
            edge=edge,
            device=device,
            metrics=list(metrics),
            datatypes=datatypes,
            timestamp=timestamp,
        )
        return result

    def ncmd(
        self,
        group: str,
        edge: str,
        metrics: Sequence[Mapping[str, Any]],
        *,
        datatypes: bool = True,
        timestamp: int | None = None,
    ) -> dict[str, Any]:
        """Publish an NCMD (QoS 0) to an edge node, as `dcmd` does."""
        result: dict[str, Any] = self.request(
            "ncmd",
            group=group,
            edge=edge,
            metrics=list(metrics),
            datatypes=datatypes,
            timestamp=timestamp,
        )
        return result

    def rebirth(self, group: str, edge: str) -> dict[str, Any]:
        """NCMD `Node Control/Rebirth` = true."""
        return self.ncmd(group, edge, [metric("Node Control/Rebirth", "Boolean", True)])

    def next_server(self, group: str, edge: str) -> dict[str, Any]:
        """NCMD `Node Control/Next Server` = true."""
        return self.ncmd(group, edge, [metric("Node Control/Next Server", "Boolean", True)])

    def state(self, online: bool, timestamp: int | None = None) -> dict[str, Any]:
        """Publish the host's STATE again (retained, QoS 1, acknowledged before this returns),
        with `timestamp` or now. The will stays as it was at connect."""
        result: dict[str, Any] = self.request("state", online=online, timestamp=timestamp)
        return result

    def publish(
        self,
        topic: str,
        payload: bytes | Mapping[str, Any],
        qos: int = 0,
        retain: bool = False,
    ) -> dict[str, Any]:
        """Publish from the host's session: raw bytes, or a Sparkplug payload built from
        `{"timestamp"?, "seq"?, "metrics": [metric(...), ...], "datatypes"?: bool}` (a metric
        may carry `properties`: `{key: {"type": "String", "value": ...}}`; `"timestamp": None`
        leaves the payload's out). QoS 1 and 2 are acknowledged before this returns."""
        fields: dict[str, Any] = {"topic": topic, "qos": qos, "retain": retain}
        if isinstance(payload, bytes | bytearray):
            fields["payload_hex"] = bytes(payload).hex()
        else:
            fields["payload"] = dict(payload)
        result: dict[str, Any] = self.request("publish", **fields)
        return result


# ---------------------------------------------------------------------------------------------
# An edge node of pysparkplug's (for the stand-in's own tests)
# ---------------------------------------------------------------------------------------------


class StandinEdge(_Child):
    """pysparkplug's EdgeNode with one Device, in the stand-in's venv: births on connect, every
    DCMD echoed back as DDATA (a metric named only by alias comes back by alias only, without
    datatype), every NCMD as NDATA. Default metrics: the node's `Node Control/Rebirth` (alias
    101) and `Node Control/Next Server` (102), Boolean; the device's `Speak` (1), `Priority`
    (2), String; `Stop` (3), `Acknowledge` (4), Boolean; `Volume` (5), Float."""

    def __init__(
        self,
        broker_host: str,
        broker_port: int,
        group: str,
        edge: str,
        device: str,
        *,
        keepalive: int = 5,
        node_metrics: Sequence[Mapping[str, Any]] | None = None,
        device_metrics: Sequence[Mapping[str, Any]] | None = None,
        username: str | None = None,
        password: str | None = None,
        client_id: str | None = None,
        log: Path | None = None,
        debug: bool = False,
    ) -> None:
        """Metrics as for `metric` (each with a name, and an alias if it should have one)."""
        arguments = ["edge"]
        arguments += _connection(
            broker_host,
            broker_port,
            username=username,
            client_id=client_id,
            keepalive=keepalive,
            debug=debug,
        )
        arguments += ["--group", group, "--edge", edge, "--device", device]
        if node_metrics is not None:
            arguments += ["--node-metrics", json.dumps(list(node_metrics))]
        if device_metrics is not None:
            arguments += ["--device-metrics", json.dumps(list(device_metrics))]
        super().__init__(arguments, log, password)
        self.group, self.edge, self.device = group, edge, device

    def start(self, timeout: float = TIMEOUT) -> Self:
        """Start it and wait until pysparkplug's connect() returned (the births follow)."""
        self._spawn()
        self.wait_event(lambda e: e.get("kind") == "edge_started", "the edge to start", timeout)
        return self

    def commands(self) -> list[dict[str, Any]]:
        """The commands it received (`type`: DCMD or NCMD, `metrics`), in order."""
        return [e for e in self.events() if e.get("kind") == "edge_command"]

    def errors(self) -> list[str]:
        """What it could not do with a command."""
        return [str(e["error"]) for e in self.events() if e.get("kind") == "edge_error"]

    def ddata(self, metrics: Sequence[Mapping[str, Any]]) -> None:
        """Publish DDATA through pysparkplug's `update_device` (names and datatypes as born)."""
        self.request("ddata", metrics=list(metrics))


@contextlib.contextmanager
def running_host(
    broker_host: str, broker_port: int, host_id: str, **options: Any
) -> Iterator[ScadaHost]:
    """A started ScadaHost, stopped (gracefully) on the way out."""
    host = ScadaHost(broker_host, broker_port, host_id, **options)
    try:
        yield host.start()
    finally:
        host.stop()


def main(argv: Sequence[str]) -> int:
    """`install`: build (or find) the cached venv and say where it is and what it took."""
    if list(argv) != ["install"]:
        print("usage: python -m harness.scada install", file=sys.stderr)
        return 2
    started = time.monotonic()
    python = install()
    record = json.loads((python.parent.parent.parent / "installed.json").read_text("utf-8"))
    print(
        f"SCADA stand-in venv {python.parent.parent} ({', '.join(REQUIREMENTS)}; built in "
        f"{record['seconds']} s; this call {time.monotonic() - started:.1f} s)"
    )
    return 0


__all__ = [
    "CACHE",
    "REQUIREMENTS",
    "Decoded",
    "ScadaError",
    "ScadaHost",
    "StandinEdge",
    "install",
    "metric",
    "running_host",
    "values",
]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
