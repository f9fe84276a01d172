"""Credentials: user name from the config, password from a file, against a broker needing both."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from harness import AgentProcess, Broker, Watcher, agent_config, wait_until, write_config

pytestmark = pytest.mark.broker


@pytest.fixture
def secured_broker(tmp_path: Path) -> Broker:
    broker = Broker(tmp_path / "secured")
    broker.require_login({"agent": "s3cret pass", "watcher": "w"})
    return broker


def agent_for(broker: Broker, tmp_path: Path, tiny_voice: Path, password: str) -> AgentProcess:
    secret = tmp_path / f"pw-{len(password)}"
    secret.write_text(password + "\nignored second line\n")
    mqtt = {"username": "agent", "password_file": str(secret)}
    config = agent_config(
        broker,
        tmp_path,
        "auth",
        voice=tiny_voice,
        mqtt={**mqtt, "reconnect_min": 0.1, "reconnect_max": 1.0},
        homeassistant={"discovery": True},
    )
    path = write_config(tmp_path / f"auth-{len(password)}.yaml", config)
    return AgentProcess(path, tmp_path / f"auth-{len(password)}.log")


def test_agent_logs_in_with_its_password_file_and_retries_when_refused(
    secured_broker: Broker, tmp_path: Path, tiny_voice: Path
) -> None:
    secured_broker.start()
    try:
        wrong = agent_for(secured_broker, tmp_path, tiny_voice, "wrong")
        wrong.start()
        wait_until(
            lambda: wrong.output().count("broker refused the connection") >= 2 or not wrong.alive(),
            what="two refusals",
        )
        assert wrong.alive(), wrong.output()
        assert wrong.signal(signal.SIGTERM) == 0

        right = agent_for(secured_broker, tmp_path, tiny_voice, "s3cret pass")
        right.start()
        watcher = Watcher(secured_broker, "voice/auth/status", username="watcher", password="w")
        try:
            watcher.wait_payload("voice/auth/status", b"online")
        finally:
            watcher.close()
            right.signal(signal.SIGTERM)
    finally:
        secured_broker.stop()
