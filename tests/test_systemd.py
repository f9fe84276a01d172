"""The systemd notify protocol, with a NOTIFY_SOCKET the test opens itself; the shipped unit,
checked and rated by systemd, and run the way it runs the agent (harness/unit.py: bubblewrap
for its mount namespace; its user, bounding set and seccomp filters applied in the process)."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.__main__ import ENGINE_NICE, SOUNDER_NICE
from agent.speech.decoder_parts import SPLIT_FORMAT
from agent.system.systemd import Notifier
from harness import ROOT, TIMEOUT, Broker, Watcher
from harness import unit as sandbox
from harness.processes import children, command_line, process_tree
from tests.conftest import StartAgent

pytestmark = pytest.mark.broker


def test_ready_watchdog_and_stopping_reach_the_service_manager(
    start_agent: StartAgent, tmp_path: Path, tiny_voice: Path
) -> None:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        manager.settimeout(15)
        agent = start_agent(
            voice=tiny_voice, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"}
        )
        seen: list[str] = []
        while seen.count("WATCHDOG=1") < 3:
            seen += manager.recv(4096).decode().split("\n")
        assert seen[0] == "READY=1"  # first, once alarms can be heard
        assert agent.process.signal(signal.SIGTERM) == 0
        while "STOPPING=1" not in seen:
            seen += manager.recv(4096).decode().split("\n")


def test_a_notify_socket_nobody_reads_never_holds_the_sender(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A manager that does not read: once the socket's queue is full (net.unix.max_dgram_qlen
    datagrams), each further notification is dropped and logged, and the sender (the sounder's
    alarm loop, sending WATCHDOG=1) goes on instead of waiting for the reader."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager:
        manager.bind(str(path))
        notifier = Notifier({"NOTIFY_SOCKET": str(path)})

        def send() -> None:
            for _ in range(50):
                notifier.notify("WATCHDOG=1")

        sender = threading.Thread(target=send)
        sender.start()
        sender.join(TIMEOUT)
        assert not sender.is_alive(), "a notification waited for the manager to read"
        assert "systemd notification failed" in caplog.text
        assert manager.recv(4096) == b"WATCHDOG=1"  # those the queue held were delivered


def test_without_a_notify_socket_nothing_happens() -> None:
    notifier = Notifier({})
    notifier.notify("READY=1")  # must not raise
    assert notifier.watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_interval is None


UNIT = ROOT / "config" / "voice-agent.service"
MAX_EXPOSURE = 2.1
"""The highest `systemd-analyze security` exposure the unit may have (0 safe, 10 exposed): 1.9
before the engine's own lower CPU priority (setpriority, counted as the whole of @resources)."""
MEDIA_CHILD = "agent.speech.media_child"
"""The decoder child's module, as its command line names it."""
NOBODY = 65534
"""The unit's user when the tests run as root (User=voice-agent does not exist here)."""


def unit_settings() -> dict[str, list[str]]:
    """The [Service] settings of the shipped unit (a key may repeat)."""
    return sandbox.unit_settings(UNIT)


def runnable_unit(directory: Path) -> Path:
    """The shipped unit with its ExecStart pointed at this install's console script (systemd's
    checks want the program to exist)."""
    script = Path(sys.executable).parent / "voice-agent"
    text = UNIT.read_text(encoding="utf-8")
    assert "ExecStart=/opt/voice-agent/venv/bin/voice-agent run\n" in text
    unit = directory / "voice-agent.service"
    unit.write_text(text.replace("/opt/voice-agent/venv/bin/voice-agent", str(script)))
    return unit


def test_the_shipped_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own check, on the unit as shipped: no error, no warning about it (an unknown
    setting or system call name would be one)."""
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(runnable_unit(tmp_path))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stderr
    assert "voice-agent.service" not in checked.stderr, checked.stderr


def test_systemd_analyze_security_rates_the_unit_at_most_2_1(tmp_path: Path) -> None:
    """`systemd-analyze security --offline=yes`: the overall exposure at most MAX_EXPOSURE (the
    unit shipped before this was 8.0 EXPOSED), and systemd's own threshold check agrees."""
    unit = runnable_unit(tmp_path)
    command = ["systemd-analyze", "security", "--offline=yes", "--no-pager"]
    rated = subprocess.run([*command, str(unit)], capture_output=True, text=True, check=False)
    found = re.search(r"Overall exposure level for voice-agent\.service: (\d+\.\d)", rated.stdout)
    assert found, rated.stdout + rated.stderr
    exposure = float(found.group(1))
    assert exposure <= MAX_EXPOSURE, rated.stdout
    threshold = [*command, f"--threshold={int(MAX_EXPOSURE * 10)}", str(unit)]
    assert subprocess.run(threshold, capture_output=True, check=False).returncode == 0
    print(f"systemd-analyze security: {exposure}")


def test_the_clock_read_is_what_the_filter_lets_through_and_protect_clock_would_refuse() -> None:
    """The state's `clock` reads adjtimex(3), which glibc makes clock_adjtime: the unit's
    allow list holds it, and ProtectClock= (which refuses all of @clock) is not set."""
    settings = unit_settings()
    allowed = sandbox.allowed_syscalls(settings)
    assert allowed is not None
    assert {"clock_adjtime", "prlimit64", "clone", "execve", "socket", "mmap"} <= allowed
    assert not {"clock_settime", "settimeofday", "setuid", "mount", "setrlimit"} & allowed
    # of @resources only setpriority (the engine and the decoder child lower their priority)
    assert sandbox.syscall_group("@resources") & allowed == {"setpriority"}
    assert "ProtectClock" not in settings
    assert sandbox.syscall_group("@clock") >= {"clock_adjtime", "adjtimex"}


PROBE = """
import ctypes, json, mmap, os, socket, subprocess, sys
from agent.system.clock import clock_sync
found = {"uid": os.getuid(), "groups": os.getgroups()}
status = open("/proc/self/status").read()
found["bounding"] = status.split("CapBnd:")[1].split()[0]
found["no_new_privs"] = status.split("NoNewPrivs:")[1].split()[0]
def refused(action):
    try:
        action()
    except OSError as err:
        return err.errno
    return 0
found["packet"] = refused(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
found["inet"] = refused(lambda: socket.socket(socket.AF_INET6).close())
found["netlink"] = refused(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close())
wx = mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC
found["wx"] = refused(lambda: mmap.mmap(-1, 4096, prot=wx))
found["setuid"] = refused(lambda: os.setuid(0))
found["etc"] = refused(lambda: open("/etc/voice-agent-probe", "w"))
found["home"] = os.listdir("/root")
found["tmp"] = os.listdir("/tmp")
found["clock"] = clock_sync() is not None
found["child"] = subprocess.run([sys.executable, "-c", "pass"]).returncode
found["nice"] = refused(lambda: os.nice(1))
print(json.dumps(found))
"""


def run_sandboxed(
    program: list[str], env: dict[str, str], writable: list[Path], readable: list[Path]
) -> subprocess.CompletedProcess[str]:
    """Run to its end as the unit would (as NOBODY and the `audio` group when root), the
    install and `readable` read-only, `writable` read-write."""
    command = sandbox.sandbox_command(
        UNIT, program, writable=writable, readable=[*install_paths(), *readable], **user_ids()
    )
    return subprocess.run(
        command, env=env, capture_output=True, text=True, check=False, timeout=TIMEOUT, cwd="/"
    )


def install_paths() -> list[Path]:
    """What the install holds, wherever it is (a checkout under /tmp or /root included): the
    checkout with its venv, and the interpreter the venv was made from."""
    return [ROOT, Path(sys.base_prefix).resolve()]


def user_ids() -> dict[str, int]:
    """The unit's user for the sandbox (none to change unless root)."""
    return {"uid": NOBODY, "gid": NOBODY} if os.geteuid() == 0 else {}


def owned(*directories: Path) -> None:
    """Directories as systemd makes StateDirectory and CacheDirectory: the unit's user's."""
    for directory in directories:
        if os.geteuid() == 0:
            os.chown(directory, NOBODY, NOBODY)


def base_env() -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "PYTHONPATH": str(ROOT)}


def test_the_sandbox_holds_what_the_unit_says(tmp_path: Path) -> None:
    """The emulation itself, so that the run below means something: no capability, no new
    privileges, the unit's user and `audio`; packet sockets and writable-executable memory
    refused, the clock read and a child process allowed; / read-only, no home, a private /tmp."""
    done = run_sandboxed([sys.executable, "-c", PROBE], base_env(), [], [])
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["bounding"] == "0000000000000000"
    assert found["no_new_privs"] == "1"
    if os.geteuid() == 0:
        assert found["uid"] == NOBODY
        assert found["groups"] == [grp.getgrnam("audio").gr_gid]
    assert found["packet"] == errno.EAFNOSUPPORT
    assert found["inet"] == found["netlink"] == 0
    assert found["wx"] == found["setuid"] == errno.EPERM
    assert found["etc"] in (errno.EROFS, errno.EACCES)
    assert found["home"] in ([], [".pyenv"])  # only the interpreter's folder, bound back
    tmp = Path("/tmp")  # the sandbox's private /tmp
    bound_back = {p.relative_to(tmp).parts[0] for p in install_paths() if tmp in p.parents}
    assert set(found["tmp"]) == bound_back  # empty, but for an install that lives there
    assert found["clock"] is True
    assert found["child"] == 0
    assert found["nice"] == 0  # lowering its own priority: the engine and the decoder child do


LOWER = """
import logging, os
from agent.__main__ import lower_priority
logging.basicConfig()
before = os.getpriority(os.PRIO_PROCESS, 0)
lower_priority()
print(os.getpriority(os.PRIO_PROCESS, 0) - before)
"""


def test_an_engine_refused_a_lower_priority_says_so_and_runs_on(tmp_path: Path) -> None:
    """Under a unit whose filter refuses setpriority (the shipped one before it kept it, where
    every engine died at its start and was started again forever), the engine's priority stays
    the sounder's, with a warning that names the fix; under the shipped unit it is lowered."""
    older = tmp_path / "older.service"
    text = UNIT.read_text(encoding="utf-8")
    kept = "SystemCallFilter=clock_adjtime clock_adjtime64 setpriority\n"
    assert kept in text
    older.write_text(text.replace(kept, "SystemCallFilter=clock_adjtime clock_adjtime64\n"))
    for unit, lowered in ((older, 0), (UNIT, ENGINE_NICE)):
        command = sandbox.sandbox_command(
            unit,
            [sys.executable, "-c", LOWER],
            writable=[],
            readable=[*install_paths(), tmp_path],
            **user_ids(),
        )
        done = subprocess.run(
            command, env=base_env(), capture_output=True, text=True, check=False, timeout=TIMEOUT
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout.split()[-1]) == lowered, done.stderr
        assert ("cannot lower its CPU priority" in done.stderr) == (not lowered), done.stderr


def test_the_agent_runs_with_what_the_unit_gives_it_and_nothing_else_writable(
    broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    """As the unit runs it: the whole file system read-only, no home, a private /tmp (the
    checkout bound back wherever it lives, /tmp included: it stands for /opt/voice-agent),
    $STATE_DIRECTORY and $CACHE_DIRECTORY its only writable places, the unit's user, UMask,
    environment, capabilities (none) and system-call filters, no config file (the environment
    gives the broker). It sends READY=1 and watchdog pings to the notify socket, comes online,
    speaks, reads the clock; its journal, split model (built by child processes with CPU
    limits) and phrase cache land where the unit says, private. Then the health check a model
    update runs (a child process that limits its own address space and loads the model) passes
    under the same sandbox."""
    settings = unit_settings()
    assert settings["StateDirectory"] == ["voice-agent"]
    assert settings["CacheDirectory"] == ["voice-agent"]
    assert settings["ProtectSystem"] == ["strict"]
    state, cache, shared = tmp_path / "var-lib", tmp_path / "var-cache", tmp_path / "opt"
    run = tmp_path / "run"
    for directory in (state, cache, shared, run):
        directory.mkdir(mode=0o700)
    owned(state, cache)
    shared.chmod(0o755)  # the install: root's, readable by all
    voice = shared / "tiny.onnx"  # the model, read-only as /opt holds it
    shutil.copy(tiny_voice, voice)
    shutil.copy(f"{tiny_voice}.json", f"{voice}.json")
    run.chmod(0o755)
    notify_path = run / "notify"
    environment = dict(value.split("=", 1) for value in settings.get("Environment", []))
    env = {
        **base_env(),
        "STATE_DIRECTORY": str(state),
        "CACHE_DIRECTORY": str(cache),
        "NOTIFY_SOCKET": str(notify_path),
        "WATCHDOG_USEC": "2000000",
        "VOICE_AGENT_NODE_ID": "unit",
        "VOICE_AGENT_MQTT_HOST": broker.host,
        "VOICE_AGENT_MQTT_PORT": str(broker.port),
        "VOICE_AGENT_AUDIO_DEVICE": f"file:FILE={state}/played.raw,FORMAT=raw",
        "VOICE_AGENT_TTS_VOICE": str(voice),
        **environment,
    }
    script = Path(sys.executable).parent / "voice-agent"
    command = sandbox.sandbox_command(
        UNIT,
        [str(script), "run"],
        writable=[state, cache],
        readable=[*install_paths(), shared, run],
        **user_ids(),
    )
    watcher = Watcher(broker, "voice/unit/#")
    log_path = tmp_path / "unit.log"
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as manager,
        log_path.open("wb") as log,
    ):
        manager.bind(str(notify_path))
        notify_path.chmod(0o777)  # as systemd's own notify socket: any service may send
        manager.settimeout(TIMEOUT)
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/")
        engine = 0
        try:
            watcher.wait_payload("voice/unit/status", b"online")
            watcher.publish("voice/unit/speak", b'{"id": "unit", "text": "Started by the unit."}')
            watcher.wait_event("unit", "finished")  # said by the engine
            (sounder,) = children(process.pid)
            (engine,) = children(sounder)  # started by a thread of the sounder's
            assert os.getpriority(os.PRIO_PROCESS, sounder) == SOUNDER_NICE  # the unit's Nice=
            niceness = os.getpriority(os.PRIO_PROCESS, engine)
            assert niceness == os.getpriority(os.PRIO_PROCESS, sounder) + ENGINE_NICE
            # no sound fetched: no decoder child (it starts with the first sound, docs/memory.md);
            # its nice() is the engine's setpriority, allowed above; +10 in test_media_decoder
            assert not [p for p in children(engine) if MEDIA_CHILD in command_line(p)]
            seen: list[str] = []
            while "READY=1" not in seen or "WATCHDOG=1" not in seen:
                seen += manager.recv(4096).decode().split("\n")
        finally:
            stopped = stop_unit(process)
            watcher.close()
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert stopped, f"no end within {STOP_SECONDS} s of SIGTERM (then killed): {output}"
    assert process.returncode == 0, output  # bwrap exits with the agent's code
    assert not Path(f"/proc/{engine}").exists(), "the engine outlived the sounder"
    states = [m.json() for m in watcher.snapshot() if m.topic == "voice/unit/state"]
    assert states, output
    assert isinstance(states[-1]["clock"], dict), states[-1]  # read, not "unknown"
    journal = state / "journal-unit.sqlite3"
    assert journal.stat().st_mode & 0o777 == 0o600
    assert journal.stat().st_uid == user_ids().get("uid", os.getuid())
    assert list((cache / "phrases").rglob("*.pcm"))  # the phrase cache where the unit says
    assert list((cache / "models").glob(f"*.split{SPLIT_FORMAT}.json"))  # and the voice's split
    private = [p for p in (*state.rglob("*"), *cache.rglob("*")) if p.is_file()]
    assert all(p.stat().st_mode & 0o077 == 0 for p in private), [
        oct(p.stat().st_mode) for p in private
    ]
    assert " ERROR " not in output, output

    check = [
        sys.executable,
        "-m",
        "agent.speech.healthcheck",
        str(voice),
        "--reference",
        str(voice),
    ]
    check += ["--rate", "22050", "--memory-mb", "1024", "--cache-dir", str(cache)]
    checked = run_sandboxed(check, env, [state, cache], [shared])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout.splitlines()[-1])["ok"] is True, checked.stdout


STOP_SECONDS = 60
"""How long the sandboxed agent may take to end after SIGTERM (the unit's TimeoutStopSec is 15;
this is a busy shared machine)."""


def stop_unit(process: subprocess.Popen[bytes]) -> bool:
    """SIGTERM to the agent, as systemd's stop sends it (to the agent, not to bubblewrap), and
    its end awaited; False when it had to be killed (nothing is left running either way)."""
    for agent in children(process.pid):
        os.kill(agent, signal.SIGTERM)
    try:
        process.wait(STOP_SECONDS)
    except subprocess.TimeoutExpired:
        for pid in reversed(process_tree(process.pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        return False
    return True
