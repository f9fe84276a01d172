"""The user's two commands on a new Debian 12 root (`scripts/fresh_machine.sh --scenario run`,
`--scenario install`; tests/test_fresh_install.py runs both).

`run`: `make setup-run` (what `make run` does first), the packages and Python distributions it
installed listed, none a test package or of the dev extra; then `make run` comes online on its
own loopback Mosquitto and speaks what `mosquitto_pub` sends (heard in its capture file).

`install`: `make install` as root; the unit's command run as the unit would
(`scripts/run_unit.py`: its user, groups, directories, environment) with the installed
configuration pointed at a broker, speaking what `mosquitto_pub` sends in an ALSA capture, its
voice prepared at install (nothing analysed at start); `make install` again keeps the edited
configuration; `make uninstall` leaves nothing but the configuration.

Each check lands in the report's `checks` (name -> passed) with what it saw in `found`.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final, Protocol

REPO: Final = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.broker import Broker, free_port  # noqa: E402
from harness.mqtt import Watcher  # noqa: E402

NODE: Final = "fresh"
TEXT: Final = "The front door is open."
WAIT: Final = 900.0
"""Longest wait for the agent online or an announcement finished (seconds; a busy machine)."""
MAKE_TIMEOUT: Final = 3600.0
ONE_SECOND_OF_AUDIO: Final = 22050 * 2
"""Bytes of a second of the bundled voice's audio (16-bit mono, 22,050 Hz)."""
SKIPPED: Final = ("proc", "sys", "dev", "run", "tmp", "var/log", "var/cache/apt", "var/lib/apt")
"""Parts of the root a listing leaves out: mounts, logs and the package manager's own state."""


class Machine(Protocol):
    """What a scenario uses of `fresh_machine.FreshRoot`."""

    path: Path

    def run(
        self,
        args: list[str],
        log: IO[str],
        timeout: float,
        cwd: str = "/",
        env: dict[str, str] | None = None,
    ) -> None: ...

    def output(self, args: list[str], cwd: str = "/") -> str: ...

    def start(
        self, args: list[str], log: IO[str], cwd: str = "/", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]: ...


class StepRunner(Protocol):
    """What a scenario uses of `fresh_machine.Steps`."""

    def run(self, name: str, log: Path, action: Callable[[], None]) -> None: ...


Report = dict[str, Any]


def check(report: Report, name: str, passed: bool, found: object = None) -> None:
    """Record one check and what it saw."""
    report.setdefault("checks", {})[name] = bool(passed)
    if found is not None:
        report.setdefault("found", {})[name] = found
    print(f"    {'ok' if passed else 'FAILED'}: {name}" + ("" if passed else f" ({found})"))


def test_packages() -> set[str]:
    """The packages scripts/system-packages.txt lists for the tests only."""
    lines = (REPO / "scripts" / "system-packages.txt").read_text(encoding="utf-8").splitlines()
    fields = [line.split("#", 1)[0].split() for line in lines]
    return {f[0] for f in fields if f and f[1] == "test"}


def dev_distributions() -> set[str]:
    """The distributions the dev extra names (normalized: lower case, `-`)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = (
        re.split(r"[\s<>=!~\[;]", spec, maxsplit=1)[0]
        for spec in project["optional-dependencies"]["dev"]
    )
    return {normalized(name) for name in names}


def normalized(name: str) -> str:
    """A distribution's name as pip compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def packages(machine: Machine) -> set[str]:
    """The Debian packages installed in the root."""
    shown = machine.output(["dpkg-query", "-W", "-f=${Package} ${Status}\n"])
    return {line.split()[0] for line in shown.splitlines() if line.endswith("ok installed")}


def asked_for(machine: Machine) -> set[str]:
    """The packages installed by name (apt's "manual" ones), not as another's dependency."""
    return set(machine.output(["apt-mark", "showmanual"]).split())


def distributions(machine: Machine, python: str) -> set[str]:
    """The Python distributions of a venv in the root."""
    listed = machine.output([python, "-m", "pip", "list", "--format=freeze"])
    return {normalized(line.split("==")[0]) for line in listed.splitlines() if "==" in line}


def answers(port: int) -> bool:
    """Whether something accepts connections on the loopback port."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[bytes]) -> None:
    """Wait for `condition` while `process` runs (AssertionError naming `what` otherwise)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"exited ({process.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {WAIT:.0f} s")
        time.sleep(0.2)


def elsewhere(port: int, logs: Path) -> Broker:
    """A broker started by someone else on a loopback port (for a Watcher)."""
    broker = Broker(logs / "elsewhere")  # not started: only its address is used
    broker.port = port
    return broker


def finished(watcher: Watcher) -> bool:
    """Whether an announcement has finished."""
    return any(event.get("event") == "finished" for event in watcher.events())


def speak_inside(machine: Machine, port: int, log: IO[str]) -> None:
    """The README's `mosquitto_pub` line, run in the root."""
    topic = f"voice/{NODE}/speak"
    publish = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(port), "-q", "1", "-t", topic]
    machine.run([*publish, "-m", TEXT], log, 60)


def run_scenario(
    machine: Machine, steps: StepRunner, logs: Path, clone: str, report: Report
) -> None:
    """`make setup-run`, what it installed, then `make run` speaking a `mosquitto_pub` message."""
    before = packages(machine)
    port = free_port()
    env = {"VOICE_AGENT_MQTT_PORT": str(port), "VOICE_AGENT_NODE_ID": NODE}
    log_path = logs / "make-run.log"
    with log_path.open("a", encoding="utf-8") as log:
        steps.run(
            "make setup-run (make run's set-up)",
            log_path,
            lambda: machine.run(["make", "setup-run"], log, MAKE_TIMEOUT, clone, env),
        )
        added = sorted(packages(machine) - before)
        report["make_run_installed_packages"] = added
        named = sorted(set(added) & asked_for(machine))
        report["make_run_installed_packages_by_name"] = named
        tests = sorted(set(named) & test_packages())
        check(report, "make run installs no test package", not tests, tests)
        venv = distributions(machine, f"{clone}/.venv/bin/python")
        report["make_run_installed_distributions"] = sorted(venv)
        dev = sorted(venv & dev_distributions())
        check(report, "make run installs nothing of the dev extra", not dev, dev)
        check(report, "make run installs the project", "voice-agent" in venv, sorted(venv))

        def speak() -> None:
            process = machine.start(["make", "run"], log, clone, env)
            try:
                wait_for(lambda: answers(port), "make run's loopback Mosquitto", process)
                watcher = Watcher(elsewhere(port, logs), f"voice/{NODE}/#")
                try:
                    watcher.wait_payload(f"voice/{NODE}/status", b"online", WAIT)
                    speak_inside(machine, port, log)
                    wait_for(lambda: finished(watcher), "finished event", process)
                    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in its terminal
                    watcher.wait_payload(f"voice/{NODE}/status", b"offline", 60)
                finally:
                    watcher.close()
            finally:
                if process.poll() is None:
                    try:
                        process.wait(60)
                    except subprocess.TimeoutExpired:
                        os.killpg(process.pid, signal.SIGKILL)
                        process.wait(60)
            captured = machine.path / clone.lstrip("/") / ".run" / "played.raw"
            size = captured.stat().st_size if captured.exists() else 0
            check(
                report, "make run speaks a mosquitto_pub message", size > ONE_SECOND_OF_AUDIO, size
            )

        steps.run("make run: online, speaks, stops", log_path, speak)


def listing(root: Path, clone: str) -> set[str]:
    """Every path in the root (relative), but for SKIPPED and the clone."""
    skipped = {*SKIPPED, clone.strip("/")}
    found: set[str] = set()
    for folder, subfolders, files in os.walk(root):
        relative = Path(folder).relative_to(root).as_posix()
        subfolders[:] = [
            d for d in subfolders if f"{relative}/{d}".removeprefix("./") not in skipped
        ]
        for name in [*subfolders, *files]:
            found.add(f"{relative}/{name}".removeprefix("./"))
    return found


THE_AGENTS: Final = re.compile(
    r"voice|^opt/|^usr/local/(bin|sbin|lib)/|^etc/systemd/system/|^var/(lib|cache)/voice"
)
"""Where the install puts things, and any path named after the agent: what `make uninstall`
must remove (the configuration aside). Other new paths are the system packages' own, which
stay installed (certificates, alternatives' links, init scripts)."""


def owned_by(machine: Machine, names: set[str]) -> set[str]:
    """The paths the named packages installed (relative, as `listing` has them)."""
    if not names:
        return set()
    shown = machine.output(["dpkg-query", "-L", *sorted(names)])
    return {line.strip().lstrip("/") for line in shown.splitlines() if line.startswith("/")}


def install_scenario(
    machine: Machine, steps: StepRunner, logs: Path, clone: str, report: Report
) -> None:
    """`make install`, the unit's command speaking, `make install` again, `make uninstall`."""
    before_files = listing(machine.path, clone)
    before_packages = packages(machine)
    log_path = logs / "make-install.log"
    config = machine.path / "etc/voice-agent/agent.yaml"
    with log_path.open("a", encoding="utf-8") as log:

        def make(target: str) -> Callable[[], None]:
            return lambda: machine.run(["make", target], log, MAKE_TIMEOUT, clone)

        steps.run("make install", log_path, make("install"))
        installed(machine, report, before_packages)
        with tempfile.TemporaryDirectory() as temporary:
            broker = Broker(Path(temporary))
            broker.start()
            try:
                edited = (
                    f"node_id: {NODE}\nmqtt:\n  port: {broker.port}\n"
                    "audio:\n  device: file:FILE=/var/lib/voice-agent/played.raw,FORMAT=raw\n"
                )
                config.write_text(edited, encoding="utf-8")  # sudoedit, as the README says
                agent_log = logs / "unit-command.log"
                steps.run(
                    "the unit's command, as the unit runs it",
                    agent_log,
                    lambda: unit_speaks(machine, broker, clone, agent_log, log, report),
                )
            finally:
                broker.stop()
        steps.run("make install again (an upgrade)", log_path, make("install"))
        kept = config.read_text(encoding="utf-8") == edited
        check(report, "an upgrade keeps the configuration", kept)
        steps.run("make uninstall", log_path, make("uninstall"))
    new_packages = packages(machine) - before_packages
    left = listing(machine.path, clone) - before_files - owned_by(machine, new_packages)
    report["new_paths_after_uninstall"] = len(left)  # the packages' own (certificates, links...)
    agents = sorted(path for path in left if THE_AGENTS.search(path))
    expected = ["etc/voice-agent", "etc/voice-agent/agent.yaml"]
    check(report, "make uninstall leaves nothing but the configuration", agents == expected, agents)
    passwd = (machine.path / "etc/passwd").read_text(encoding="utf-8")
    check(report, "the service user is gone", "\nvoice-agent:" not in f"\n{passwd}")


def installed(machine: Machine, report: Report, before: set[str]) -> None:
    """What `make install` put in place."""
    root = machine.path
    added = sorted(packages(machine) - before)
    report["make_install_installed_packages"] = added
    named = sorted(set(added) & asked_for(machine))
    report["make_install_installed_packages_by_name"] = named
    tests = sorted(set(named) & test_packages())
    check(report, "make install installs no test package", not tests, tests)
    venv = distributions(machine, "/opt/voice-agent/venv/bin/python")
    report["make_install_installed_distributions"] = sorted(venv)
    dev = sorted(venv & dev_distributions())
    check(report, "the install's venv holds nothing of the dev extra", not dev, dev)
    check(report, "the configuration is written", (root / "etc/voice-agent/agent.yaml").is_file())
    on_path = machine.output(["voice-agent", "--version"]).strip()
    check(report, "voice-agent is on the PATH", on_path.startswith("voice-agent "), on_path)
    passwd = (root / "etc/passwd").read_text(encoding="utf-8")
    check(report, "the service user exists", "\nvoice-agent:" in f"\n{passwd}")
    models = root / "var/cache/voice-agent/models"
    prepared = sorted(path.name for path in models.glob("*.split*.json"))  # any split format
    check(report, "the voice is prepared at install", bool(prepared), prepared)


TIMEOUT_STOP_S: Final = 15.0
"""The unit's TimeoutStopSec=: what systemd waits after SIGTERM before SIGKILL."""


def service_processes(machine: Machine) -> list[int]:
    """The running processes of the service user in the root (the unit's control group,
    here). One that ended after its parent is this PID namespace's to reap, as init
    (systemd) reaps it on a real machine: it is reaped, not counted."""
    passwd = (machine.path / "etc/passwd").read_text(encoding="utf-8").splitlines()
    uids = [line.split(":")[2] for line in passwd if line.startswith("voice-agent:")]
    if not uids:
        return []
    found = []
    for status in (machine.path / "proc").glob("[0-9]*/status"):
        try:
            lines = status.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue  # ended meanwhile
        real = next((line.split()[1] for line in lines if line.startswith("Uid:")), None)
        state = next((line.split()[1] for line in lines if line.startswith("State:")), "")
        if real != uids[0]:
            continue
        pid = int(status.parent.name)
        if state == "Z":  # ended; orphaned to this namespace's init (this process) to reap
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            continue
        found.append(pid)
    return found


def stop_as_systemd(machine: Machine, process: subprocess.Popen[bytes]) -> list[str]:
    """`systemctl stop` with the unit's KillMode=control-group: SIGTERM to every process of
    the unit at once, SIGKILL to what is left after TimeoutStopSec=; the command lines of the
    processes that had to be killed."""
    for pid in service_processes(machine):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + TIMEOUT_STOP_S
    while time.monotonic() < deadline and (process.poll() is None or service_processes(machine)):
        time.sleep(0.2)
    killed = []
    for pid in service_processes(machine):
        with contextlib.suppress(OSError):
            command = (machine.path / f"proc/{pid}/cmdline").read_bytes()
            killed.append(command.replace(b"\0", b" ").decode(errors="replace").strip())
            os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait(60)
    return killed


def unit_speaks(  # noqa: PLR0917 - the scenario's parts
    machine: Machine, broker: Broker, clone: str, agent_log: Path, log: IO[str], report: Report
) -> None:
    """The unit's command as the unit runs it speaks a `mosquitto_pub` message and stops on
    SIGTERM (systemctl stop), its voice found prepared."""
    unit = "/etc/systemd/system/voice-agent.service"
    with agent_log.open("a", encoding="utf-8") as output:
        watcher = Watcher(broker, f"voice/{NODE}/#")
        process = machine.start(["python3", "scripts/run_unit.py", unit], output, clone)
        try:
            watcher.wait_payload(f"voice/{NODE}/status", b"online", WAIT)
            speak_inside(machine, broker.port, log)
            wait_for(lambda: finished(watcher), "finished event", process)
            killed = stop_as_systemd(machine, process)
            check(report, "the unit's command stops cleanly", process.returncode == 0)
            check(report, "the service stops within TimeoutStopSec", not killed, killed)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait(60)
            watcher.close()
    captured = machine.path / "var/lib/voice-agent/played.raw"
    size = captured.stat().st_size if captured.exists() else 0
    spoke = size > ONE_SECOND_OF_AUDIO
    check(report, "the unit's command speaks a mosquitto_pub message", spoke, size)
    text = agent_log.read_text(encoding="utf-8", errors="replace")
    check(report, "nothing is analysed at the service's start", "analysed" not in text)
