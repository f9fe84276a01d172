"""A real Home Assistant core for integration tests: installed once per release into a cached
venv, configured for MQTT discovery against the test broker, onboarded through its API, and read
through its REST and websocket APIs (states, entity and device registries, service calls, log).

`python -m harness.homeassistant install` builds the cached venv (the test module does it too);
`python -m harness.homeassistant show` prints what Home Assistant shows for an agent.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from websockets.sync.client import connect

from .agent import AgentProcess, agent_config, write_config
from .broker import Broker, free_port
from .cached_venv import put_in_place, run_step
from .mqtt import Watcher
from .wait import ROOT, TIMEOUT, wait_until

RELEASES: Final[tuple[tuple[tuple[int, int, int], str], ...]] = (
    ((3, 13, 0), "2025.4.4"),
    ((3, 12, 0), "2025.1.4"),
)
"""(oldest Python, newest Home Assistant release it installs), newest first. Measured
2026-12-01: releases from 2025.5 need Python >= 3.13.2 and from 2026.3 >= 3.14.2; pip's choice
for 3.13.0 is 2025.4.4 and for 3.12.1 2025.1.4. Add a row when the machines get a newer Python."""

CACHE: Final = ROOT / ".cache" / "homeassistant"
"""Where the venvs live, one folder per release and Python (git-ignored)."""

START_TIMEOUT: Final = 300.0
"""Seconds a start may take until the API answers and MQTT is connected (measured 13-17 s here;
generous for a 2-core machine shared with others)."""

DISCOVERY_PREFIX: Final = "homeassistant"
"""Home Assistant's default MQTT discovery prefix; its birth message goes to `<prefix>/status`."""

CONFIGURED: Final = (
    "http",
    "api",
    "websocket_api",
    "auth",
    "onboarding",
    "config",
    "mqtt",
    "notify",
    "text",
    "button",
    "number",
    "select",
    "sensor",
    "binary_sensor",
    "update",
    "event",
    "frontend",
)
"""The integrations the tests need (mqtt comes from its config entry, the rest from
configuration.yaml; the frontend for the device page's screenshot); Home Assistant adds its core
and default integrations itself."""

BY_CONFIG_FLOW: Final = ("wyoming",)
"""Integrations a test sets up through their config flow (never in configuration.yaml): their
requirements are installed with the venv, as Home Assistant would install them on first use."""

_ALWAYS_LOADED: Final = (
    "import json, os, homeassistant, homeassistant.bootstrap as b; print(json.dumps({"
    "'components': os.path.join(os.path.dirname(homeassistant.__file__), 'components'), "
    "'always': sorted(b.CORE_INTEGRATIONS | b.DEFAULT_INTEGRATIONS)}))"
)
"""Run by the venv's Python: where the manifests are, and what every start sets up."""

_LOG_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (?P<level>[A-Z]+) \((?P<thread>[^)]*)\) "
    r"\[(?P<logger>[^\]]+)\] (?P<message>.*)$"
)
"""A record's first line in Home Assistant's console log (`--log-no-color`)."""


# ---------------------------------------------------------------------------------------------
# Installation
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Installation:
    """A complete Home Assistant venv."""

    release: str
    venv: Path

    @property
    def python(self) -> Path:
        """The venv's interpreter (run `-m homeassistant`: the scripts' shebangs name the
        folder the venv was built in, before it was moved into place)."""
        return self.venv / "bin" / "python"


def python_version(python: Path) -> tuple[int, int, int] | None:
    """The interpreter's version, or None if it does not run."""
    try:
        out = subprocess.run(
            [str(python), "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (int(out[0]), int(out[1]), int(out[2]))


def find_pythons() -> list[tuple[tuple[int, int, int], Path]]:
    """Pythons on this machine (pyenv's, /usr/bin's, /usr/local/bin's), newest first."""
    candidates = [*(Path.home() / ".pyenv" / "versions").glob("*/bin/python3")]
    for folder in (Path("/usr/bin"), Path("/usr/local/bin")):
        candidates += [p for p in folder.glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name)]
    found: dict[tuple[int, int, int], Path] = {}
    for path in candidates:
        version = python_version(path)
        if version is not None:
            found.setdefault(version, path)
    return sorted(found.items(), reverse=True)


def choose_release() -> tuple[str, Path, tuple[int, int, int]]:
    """The newest release in RELEASES that a Python here can run: (release, python, version)."""
    pythons = find_pythons()
    for oldest, release in RELEASES:
        for version, path in pythons:
            if version >= oldest:
                return release, path, version
    found = ", ".join(".".join(map(str, v)) for v, _ in pythons) or "none"
    raise RuntimeError(f"no Python here runs Home Assistant (found: {found}); see RELEASES")


def install(cache: Path = CACHE) -> Installation:
    """The venv of the newest Home Assistant a Python here can run, built on first use.

    Built in a temporary folder next to the cache entry and renamed into place when complete,
    under a lock, so a cached venv is always whole and two runs never build the same one."""
    release, python, version = choose_release()
    wanted = hashlib.sha256(" ".join((*CONFIGURED, *BY_CONFIG_FLOW)).encode()).hexdigest()[:8]
    key = f"{release}-py{'.'.join(map(str, version))}-{wanted}"  # a new integration: a new venv
    final = cache / key
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for stale in cache.glob(".build-*"):  # left by a build that was killed
            shutil.rmtree(stale, ignore_errors=True)
        if not (final / "installed.json").is_file():
            _build(release, python, final)
    return Installation(release, final / "venv")


def _build(release: str, python: Path, final: Path) -> None:
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f".build-{final.name}-", dir=final.parent))
    work.chmod(0o755)  # mkdtemp's 0700 would stay with the renamed venv
    log = work / "install.log"
    venv = work / "venv"
    try:
        run_step([str(python), "-m", "venv", str(venv)], log)
        inside = str(venv / "bin" / "python")
        run_step([inside, "-m", "pip", "install", "--disable-pip-version-check", "uv"], log)
        # uv, as Home Assistant installs its own requirements: pip took 5-6 min here, uv ~1.5.
        uv = [inside, "-m", "uv", "pip", "install", "--python", inside, "--compile-bytecode"]
        run_step([*uv, f"homeassistant=={release}"], log)
        facts = json.loads(run_step([inside, "-c", _ALWAYS_LOADED], log))
        components = Path(facts["components"])
        requirements = integration_requirements(
            components, [*facts["always"], *CONFIGURED, *BY_CONFIG_FLOW]
        )
        constraints = components.parent / "package_constraints.txt"
        run_step([*uv, "--constraint", str(constraints), *requirements], log)
        record = {
            "release": release,
            "python": str(python),
            "requirements": requirements,
            "seconds": round(time.monotonic() - started, 1),
        }
        put_in_place(work, final, record)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise


def integration_requirements(components: Path, domains: Sequence[str]) -> list[str]:
    """The pip requirements of `domains` and of every integration they depend on, read from
    their manifest.json (dependencies and after-dependencies, as Home Assistant gathers them)."""
    seen: set[str] = set()
    todo = list(domains)
    requirements: set[str] = set()
    while todo:
        domain = todo.pop()
        if domain in seen:
            continue
        seen.add(domain)
        manifest = json.loads((components / domain / "manifest.json").read_text("utf-8"))
        requirements.update(manifest.get("requirements", []))
        todo += manifest.get("dependencies", []) + manifest.get("after_dependencies", [])
    return sorted(requirements)


# ---------------------------------------------------------------------------------------------
# A running Home Assistant
# ---------------------------------------------------------------------------------------------


class ApiError(Exception):
    """Home Assistant answered an API call with an error."""


@dataclass(frozen=True)
class LogRecord:
    """One record of Home Assistant's log (continuation lines joined to `message`)."""

    level: str
    logger: str
    message: str


class HomeAssistant:
    """Home Assistant core as a foreground subprocess, connected to a test broker.

    The config folder is written on the first start (configuration.yaml and an MQTT config
    entry in `.storage`) and kept by `restart()`; the owner user is made through the onboarding
    API and a long-lived access token kept for the REST and websocket calls."""

    def __init__(self, installation: Installation, workdir: Path, broker: Broker) -> None:
        self.installation = installation
        self.broker = broker
        self.config_dir = workdir / "config"
        self.log = workdir / "homeassistant.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._token_file = workdir / "token"
        self._process: subprocess.Popen[bytes] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Start and return once the API answers, Home Assistant is running and its MQTT client
        has published its birth message (it is connected and subscribed to discovery)."""
        if not self.config_dir.exists():
            self.write_config()
        birth = Watcher(self.broker, f"{DISCOVERY_PREFIX}/status")
        try:
            command = [str(self.installation.python), "-m", "homeassistant"]
            command += ["--config", str(self.config_dir), "--skip-pip", "--log-no-color"]
            with self.log.open("ab") as log:
                self._process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, cwd=self.config_dir
                )
            wait_until(lambda: self._answers() or not self.alive(), timeout, "Home Assistant's API")
            self._check_alive()
            if not self._token_file.exists():
                self._onboard()
            wait_until(
                lambda: not self.alive() or self.api("GET", "/api/config")["state"] == "RUNNING",
                timeout,
                "Home Assistant to run",
            )
            self._check_alive()
            wait_until(
                lambda: not self.alive() or any(m.payload == b"online" for m in birth.snapshot()),
                timeout,
                "Home Assistant's MQTT birth message",
            )
            self._check_alive()
        finally:
            birth.close()

    def stop(self) -> None:
        """Stop as a service manager does (SIGTERM) and wait for the exit."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(TIMEOUT)
                raise AssertionError("Home Assistant did not stop within TIMEOUT") from None
        self._process = None

    def restart(self) -> None:
        """Stop and start again with the same config folder (.storage kept)."""
        self.stop()
        self.start()

    def alive(self) -> bool:
        """Whether the process runs."""
        return self._process is not None and self._process.poll() is None

    def _check_alive(self) -> None:
        assert self.alive(), f"Home Assistant exited:\n{self.output()[-4000:]}"

    def _answers(self) -> bool:
        """Whether its HTTP server answers (any status: once onboarding is done, its API is
        gone and the path is a 404)."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/onboarding", timeout=5):  # noqa: S310
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False

    def write_config(self) -> None:
        """configuration.yaml with only what the tests need, and the MQTT config entry (`start`
        writes them when missing; a test may write them first and add a domain)."""
        self.config_dir.mkdir(parents=True)
        config: dict[str, Any] = {
            "homeassistant": {
                "name": "voice-agent tests",
                "time_zone": "UTC",
                "unit_system": "metric",
                "latitude": 0.0,
                "longitude": 0.0,
                "elevation": 0,
                # where its media (a TTS proxy URL) is fetched from by ffmpeg: a Wyoming
                # satellite's announcement
                "internal_url": self.url,
            },
            "http": {"server_host": "127.0.0.1", "server_port": self.port},
            "logger": {"default": "info"},
            **{domain: None for domain in CONFIGURED if domain not in {"http", "mqtt"}},
        }
        (self.config_dir / "configuration.yaml").write_text(
            yaml.safe_dump(config, sort_keys=False), encoding="utf-8"
        )
        storage = self.config_dir / ".storage"
        storage.mkdir()
        (storage / "core.config_entries").write_text(
            json.dumps(self._config_entries(), indent=2), encoding="utf-8"
        )

    def _config_entries(self) -> dict[str, Any]:
        """The MQTT entry as the config flow stores it, at storage minor version 1: Home
        Assistant migrates it to its own format, so the file works across releases."""
        entry = {
            "entry_id": "voiceagenttestsmqtt0000000000000",
            "domain": "mqtt",
            "title": self.broker.host,
            "version": 1,
            "minor_version": 2,
            "source": "user",
            "unique_id": None,
            "data": {"broker": self.broker.host, "port": self.broker.port},
            "options": {
                "discovery": True,
                "discovery_prefix": DISCOVERY_PREFIX,
                "birth_message": {
                    "topic": f"{DISCOVERY_PREFIX}/status",
                    "payload": "online",
                    "qos": 0,
                    "retain": False,
                },
            },
        }
        return {
            "version": 1,
            "minor_version": 1,
            "key": "core.config_entries",
            "data": {"entries": [entry]},
        }

    def _onboard(self) -> None:
        """Make the owner user, exchange its auth code for a token, keep a long-lived one."""
        client_id = f"{self.url}/"
        user = {
            "client_id": client_id,
            "name": "Test Owner",
            "username": "owner",
            "password": "voice-agent-tests",
            "language": "en",
        }
        code = self._post_json("/api/onboarding/users", user)["auth_code"]
        form = {"grant_type": "authorization_code", "code": code, "client_id": client_id}
        request = urllib.request.Request(  # noqa: S310 - our own loopback server
            f"{self.url}/auth/token", data=urllib.parse.urlencode(form).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
            access = json.loads(response.read())["access_token"]
        for step, body in (
            ("core_config", {}),
            ("analytics", {}),
            (
                "integration",
                {"client_id": client_id, "redirect_uri": f"{client_id}?auth_callback=1"},
            ),
        ):  # the rest of onboarding, so the frontend opens its pages (not the onboarding's)
            self._post_json(f"/api/onboarding/{step}", body, access)
        command = {"type": "auth/long_lived_access_token", "client_name": "tests", "lifespan": 365}
        (token,) = self._websocket(access, [command])
        self._token_file.write_text(str(token), encoding="utf-8")

    # -- APIs ---------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        """The long-lived access token made at onboarding."""
        return self._token_file.read_text(encoding="utf-8")

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the REST API; the decoded JSON answer (ApiError on an error status)."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        request = urllib.request.Request(  # noqa: S310 - our own loopback server
            f"{self.url}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
                text = response.read()
        except urllib.error.HTTPError as error:
            raise ApiError(f"{method} {path}: {error.code} {error.read()!r}") from error
        return json.loads(text) if text else None

    def _post_json(self, path: str, body: Any, token: str | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(  # noqa: S310 - our own loopback server
            f"{self.url}{path}", data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:  # noqa: S310
            return json.loads(response.read())

    def websocket(self, *commands: dict[str, Any]) -> list[Any]:
        """Send websocket API commands on one connection; their results in order."""
        return self._websocket(self.token, commands)

    def _websocket(self, token: str, commands: Sequence[dict[str, Any]]) -> list[Any]:
        url = f"ws://127.0.0.1:{self.port}/api/websocket"
        with connect(url, open_timeout=TIMEOUT, max_size=64 * 2**20) as ws:
            assert json.loads(ws.recv(TIMEOUT))["type"] == "auth_required"
            ws.send(json.dumps({"type": "auth", "access_token": token}))
            answer = json.loads(ws.recv(TIMEOUT))
            if answer["type"] != "auth_ok":
                raise ApiError(f"websocket auth: {answer}")
            results = []
            for number, command in enumerate(commands, start=1):
                ws.send(json.dumps({**command, "id": number}))
                while (reply := json.loads(ws.recv(TIMEOUT))).get("id") != number:
                    pass  # not ours (no subscriptions are made, but be safe)
                if not reply.get("success"):
                    raise ApiError(f"{command['type']}: {reply.get('error')}")
                results.append(reply["result"])
            return results

    def states(self) -> list[dict[str, Any]]:
        """Every entity's state object."""
        found: list[dict[str, Any]] = self.api("GET", "/api/states")
        return found

    def state(self, entity_id: str) -> dict[str, Any] | None:
        """One entity's state object (state, attributes, ...), None if it has none."""
        try:
            found: dict[str, Any] = self.api("GET", f"/api/states/{entity_id}")
        except ApiError as error:
            if " 404 " in str(error):
                return None
            raise
        return found

    def wait_state(
        self,
        entity_id: str,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float = TIMEOUT,
        what: str = "",
    ) -> dict[str, Any]:
        """Poll an entity's state object until `predicate` holds; return it."""
        seen: list[dict[str, Any] | None] = [None]

        def holds() -> bool:
            seen[0] = self.state(entity_id)
            return seen[0] is not None and predicate(seen[0])

        try:
            wait_until(holds, timeout, what or f"the state of {entity_id}")
        except AssertionError as error:
            raise AssertionError(f"{error}; last state: {seen[0]}") from None
        assert seen[0] is not None
        return seen[0]

    def entity_registry(self) -> list[dict[str, Any]]:
        """Every entity registry entry, extended (with original_icon, device_class, ...)."""
        (entries,) = self.websocket({"type": "config/entity_registry/list"})
        if not entries:
            return []
        ids = [entry["entity_id"] for entry in entries]
        (extended,) = self.websocket(
            {"type": "config/entity_registry/get_entries", "entity_ids": ids}
        )
        return [entry for entry in extended.values() if entry is not None]

    def device_registry(self) -> list[dict[str, Any]]:
        """Every device registry entry."""
        (devices,) = self.websocket({"type": "config/device_registry/list"})
        return list(devices)

    def call_service(self, domain: str, service: str, data: dict[str, Any]) -> Any:
        """Call a service as the UI does (websocket `call_service`); a refusal is an ApiError
        with Home Assistant's message (the REST API answers most of them with a bare 500)."""
        command = {"type": "call_service", "domain": domain, "service": service}
        (result,) = self.websocket({**command, "service_data": data})
        return result

    # -- log ----------------------------------------------------------------------------------

    def output(self) -> str:
        """Everything it logged so far (all starts)."""
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def log_mark(self) -> int:
        """A position in the log, to read only what comes after it."""
        return len(self.output())

    def log_records(self, since: int = 0) -> list[LogRecord]:
        """The log's records after `since` (a log_mark)."""
        records: list[LogRecord] = []
        for line in self.output()[since:].splitlines():
            match = _LOG_RECORD.match(line)
            if match:
                records.append(LogRecord(match["level"], match["logger"], match["message"]))
            elif records:
                last = records[-1]
                records[-1] = LogRecord(last.level, last.logger, f"{last.message}\n{line}")
        return records

    def mqtt_problems(self, since: int = 0) -> list[LogRecord]:
        """Warnings and errors of the MQTT integration: a refused discovery config is logged
        there with the reason (e.g. "Error 'max text length must be <= 255' when processing MQTT
        discovery message ..."), and so are bad JSON and template errors of a state topic."""
        return [
            r
            for r in self.log_records(since)
            if r.level in {"WARNING", "ERROR", "CRITICAL"}
            and r.logger.startswith("homeassistant.components.mqtt")
        ]


# ---------------------------------------------------------------------------------------------
# What Home Assistant shows
# ---------------------------------------------------------------------------------------------


def entity_ids(ha: HomeAssistant, unique_id_prefix: str) -> dict[str, str]:
    """Entity id per unique id (without the prefix) of the entities whose unique id starts with
    the prefix (the agent's are `voice_agent_<node_id>_<object_id>`)."""
    return {
        str(entry["unique_id"]).removeprefix(unique_id_prefix): entry["entity_id"]
        for entry in ha.entity_registry()
        if str(entry["unique_id"]).startswith(unique_id_prefix)
    }


def device_entities(ha: HomeAssistant, unique_id_prefix: str) -> list[dict[str, Any]]:
    """Per entity whose unique id starts with the prefix: what Home Assistant shows about it
    (entity_id, name, state, unit, icon, category, device_class), in entity_id order."""
    states = {s["entity_id"]: s for s in ha.states()}
    rows = []
    for entry in ha.entity_registry():
        if not str(entry["unique_id"]).startswith(unique_id_prefix):
            continue
        state = states.get(entry["entity_id"], {"state": None, "attributes": {}})
        attributes = state["attributes"]
        rows.append(
            {
                "entity_id": entry["entity_id"],
                "name": attributes.get("friendly_name"),
                "state": state["state"],
                "unit": attributes.get("unit_of_measurement"),
                "icon": entry["icon"] or entry["original_icon"] or attributes.get("icon"),
                "category": entry["entity_category"],
                "device_class": entry["device_class"] or entry["original_device_class"],
            }
        )
    return sorted(rows, key=lambda row: str(row["entity_id"]))


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows of `device_entities` as a Markdown table (empty cells for None)."""
    if not rows:
        return ""
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = ("" if row[c] is None else str(row[c]).replace("|", "\\|") for c in columns)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


@contextlib.contextmanager
def running(installation: Installation, workdir: Path, broker: Broker) -> Iterator[HomeAssistant]:
    """A started Home Assistant, stopped on the way out."""
    ha = HomeAssistant(installation, workdir, broker)
    try:
        ha.start()
        yield ha
    finally:
        ha.stop()


def show_node(voice: Path | None, node_id: str = "kitchen") -> str:
    """What Home Assistant shows for an agent (bundled voice unless `voice`) after it said one
    sentence: a Markdown table, from a broker, Home Assistant and agent started for it."""
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(temporary)
        broker = Broker(workdir / "broker")
        broker.start()
        configs = Watcher(broker, f"{DISCOVERY_PREFIX}/+/{node_id}/+/config")
        try:
            with running(install(), workdir / "ha", broker) as ha:
                sections: dict[str, Any] = {"homeassistant": {"discovery": True}}
                config = agent_config(broker, workdir / "agent", node_id, voice=voice, **sections)
                path = write_config(workdir / "agent.yaml", config)
                agent = AgentProcess(path, workdir / "agent.log")
                agent.start()
                try:
                    return _show(ha, configs, f"voice_agent_{node_id}_")
                finally:
                    agent.signal(signal.SIGTERM)
        finally:
            configs.close()
            broker.stop()


def _show(ha: HomeAssistant, configs: Watcher, prefix: str) -> str:
    def rows() -> list[dict[str, Any]]:
        return device_entities(ha, prefix)

    wait_until(lambda: len(configs.snapshot()) > 0 and len(rows()) == len(configs.snapshot()))
    wait_until(lambda: all(r["state"] != "unavailable" for r in rows()), what="available")
    made = entity_ids(ha, prefix)
    ha.call_service("text", "set_value", {"entity_id": made["say"], "value": "Hello."})
    ttfa = made["time_to_first_audio"]
    ha.wait_state(ttfa, lambda s: s["state"] not in {"unknown", "unavailable"})
    return markdown_table(rows())


def main(argv: Sequence[str]) -> int:
    """`install`: build (or find) the cached venv; `show [--voice PATH]`: the entity table."""
    parser = argparse.ArgumentParser(prog="python -m harness.homeassistant")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("install", help="build (or find) the cached Home Assistant venv")
    show = commands.add_parser("show", help="what Home Assistant shows for an agent (Markdown)")
    show.add_argument("--voice", type=Path, help="a Piper voice (default: the bundled one)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.command == "show":
        print(show_node(args.voice), end="")
        return 0
    installation = install()
    record = json.loads((installation.venv.parent / "installed.json").read_text("utf-8"))
    print(
        f"Home Assistant {installation.release} in {installation.venv} "
        f"(built in {record['seconds']} s; this call {time.monotonic() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
