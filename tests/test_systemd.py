"""The systemd notify protocol, with a NOTIFY_SOCKET the test opens itself."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from agent.systemd import Notifier
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
