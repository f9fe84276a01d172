"""The systemd notify protocol, with a NOTIFY_SOCKET the test opens itself; the shipped unit,
checked by systemd and run the way it runs the agent."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from agent.systemd import Notifier
from harness import ROOT, Broker, Watcher
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
        assert seen[0] == "READY=1"  # first, once the voice is prewarmed
        assert agent.process.signal(signal.SIGTERM) == 0
        while "STOPPING=1" not in seen:
            seen += manager.recv(4096).decode().split("\n")


def test_without_a_notify_socket_nothing_happens() -> None:
    notifier = Notifier({})
    notifier.notify("READY=1")  # must not raise
    assert notifier.watchdog_interval is None
    assert Notifier({"WATCHDOG_USEC": "30000000"}).watchdog_interval == 15.0
    assert Notifier({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}).watchdog_interval is None


UNIT = ROOT / "config" / "voice-agent.service"


def unit_settings() -> dict[str, list[str]]:
    """The [Service] settings of the shipped unit (a key may repeat)."""
    settings: dict[str, list[str]] = {}
    section = ""
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_the_shipped_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    """systemd's own check, on the unit as shipped (its ExecStart pointed at this install's
    console script, which the check wants to exist)."""
    script = Path(sys.executable).parent / "voice-agent"
    text = UNIT.read_text(encoding="utf-8")
    assert "ExecStart=/opt/voice-agent/venv/bin/voice-agent run\n" in text
    unit = tmp_path / "voice-agent.service"
    unit.write_text(text.replace("/opt/voice-agent/venv/bin/voice-agent", str(script)))
    checked = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
    assert "voice-agent.service" not in checked.stderr, checked.stderr  # no warning about it


def test_the_agent_runs_with_what_the_unit_gives_it_and_nothing_else_writable(
    broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    """As the unit runs it (ProtectSystem=strict, PrivateTmp): the whole file system read-only
    (bubblewrap, as the unit's namespace), a private /tmp, $STATE_DIRECTORY and
    $CACHE_DIRECTORY its only writable places, the unit's UMask and environment, no config file
    (the unit names none; the environment gives the broker). It comes online, speaks, and its
    journal, split model and phrase cache land where the unit says, private."""
    settings = unit_settings()
    assert settings["StateDirectory"] == ["voice-agent"]
    assert settings["CacheDirectory"] == ["voice-agent"]
    assert settings["ProtectSystem"] == ["strict"]
    state, cache, shared = tmp_path / "var-lib", tmp_path / "var-cache", tmp_path / "opt"
    for directory in (state, cache, shared):
        directory.mkdir(mode=0o700)
    voice = shared / "tiny.onnx"  # the model, read-only as /opt holds it
    shutil.copy(tiny_voice, voice)
    shutil.copy(f"{tiny_voice}.json", f"{voice}.json")
    environment = dict(value.split("=", 1) for value in settings.get("Environment", []))
    env = {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        "STATE_DIRECTORY": str(state),
        "CACHE_DIRECTORY": str(cache),
        "PYTHONPATH": str(ROOT),
        "VOICE_AGENT_NODE_ID": "unit",
        "VOICE_AGENT_MQTT_HOST": broker.host,
        "VOICE_AGENT_MQTT_PORT": str(broker.port),
        "VOICE_AGENT_AUDIO_DEVICE": f"file:FILE={state}/played.raw,FORMAT=raw",
        "VOICE_AGENT_TTS_VOICE": str(voice),
        **environment,
    }
    script = Path(sys.executable).parent / "voice-agent"
    command = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    command += ["--tmpfs", "/tmp", "--die-with-parent"]
    command += ["--bind", str(state), str(state), "--bind", str(cache), str(cache)]
    command += ["--ro-bind", str(shared), str(shared)]
    command += ["sh", "-c", f'umask {settings["UMask"][0]} && exec "$0" run', str(script)]
    watcher = Watcher(broker, "voice/unit/#")
    log_path = tmp_path / "unit.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/")
        try:
            watcher.wait_payload("voice/unit/status", b"online")
            watcher.publish("voice/unit/speak", b'{"id": "unit", "text": "Started by the unit."}')
            watcher.wait_event("unit", "finished")
        finally:
            for agent in children(process.pid):  # systemd's SIGTERM goes to the agent itself
                os.kill(agent, signal.SIGTERM)
            process.wait(60)
            watcher.close()
    output = log_path.read_text(encoding="utf-8", errors="replace")
    assert process.returncode == 0, output  # bwrap exits with the agent's code
    assert (state / "journal-unit.sqlite3").stat().st_mode & 0o777 == 0o600
    assert list((cache / "phrases").rglob("*.pcm"))  # the phrase cache where the unit says
    assert list((cache / "models").glob("*.split2.json"))  # and the voice's split
    private = [p for p in (*state.rglob("*"), *cache.rglob("*")) if p.is_file()]
    assert all(p.stat().st_mode & 0o077 == 0 for p in private), [
        oct(p.stat().st_mode) for p in private
    ]
    assert " ERROR " not in output, output


def children(pid: int) -> list[int]:
    """The processes that `pid` started."""
    listed = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii")
    return [int(child) for child in listed.split()]
