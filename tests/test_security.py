"""TLS to the broker with a CA made in the test, refused logins with bounded retries, and the
maximum payload and packet sizes."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from harness import (
    AgentProcess,
    Broker,
    Pki,
    Watcher,
    agent_config,
    make_pki,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.broker


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki", "broker")


@pytest.fixture
def tls_broker(tmp_path: Path, pki: Pki) -> Iterator[Broker]:
    broker = Broker(tmp_path / "tls-broker", tls=pki)
    broker.start()
    yield broker
    broker.stop()


def agent(
    tmp_path: Path, broker: Broker, tiny_voice: Path, name: str, **mqtt: object
) -> AgentProcess:
    config = agent_config(broker, tmp_path, name, voice=tiny_voice, mqtt=mqtt)
    path = write_config(tmp_path / f"{name}.yaml", config)
    return AgentProcess(path, tmp_path / f"{name}.log")


def test_the_agent_connects_over_tls_with_the_right_ca(
    tmp_path: Path, tls_broker: Broker, pki: Pki, tiny_voice: Path
) -> None:
    process = agent(
        tmp_path, tls_broker, tiny_voice, "tls", tls={"enabled": True, "ca_file": str(pki.ca)}
    )
    watcher = Watcher(tls_broker, "voice/tls/#", ca=pki.ca)
    process.start()
    try:
        watcher.wait_payload("voice/tls/status", b"online")
        watcher.publish("voice/tls/speak", b'{"id": "t", "text": "Over TLS."}')
        watcher.wait_event("t", "finished")
    finally:
        process.signal(signal.SIGTERM)
        watcher.close()


def test_a_wrong_ca_is_refused_and_nothing_goes_in_plain_text(
    tmp_path: Path, tls_broker: Broker, tiny_voice: Path
) -> None:
    stranger = make_pki(tmp_path / "other", "stranger")
    process = agent(
        tmp_path,
        tls_broker,
        tiny_voice,
        "wrongca",
        tls={"enabled": True, "ca_file": str(stranger.ca)},
    )
    process.start()
    try:
        wait_until(
            lambda: process.output().count("CERTIFICATE_VERIFY_FAILED") >= 2 or not process.alive(),
            what="two refusals of the broker's certificate",
        )
        assert process.alive()
    finally:
        process.signal(signal.SIGTERM)
    broker_log = tls_broker.log.read_text(errors="replace")
    assert "voice-agent-wrongca" not in broker_log  # no CONNECT ever reached the broker
    assert "Connected to" not in process.output()


REFUSED = re.compile(
    r"^(\S+ \S+) WARNING (engine )?agent\.link\.mqtt\.link: Cannot connect .*"
    r"broker refused the connection",
    re.MULTILINE,
)
"""A refused attempt in the log, with its time, and whose session it was (the engine's lines
have its prefix; the sounder's do not)."""


def refusals(output: str) -> dict[str, list[datetime]]:
    """Each session's refused attempts, in order: the sounder's and the engine's."""
    found: dict[str, list[datetime]] = {"sounder": [], "engine": []}
    for stamp, engine in REFUSED.findall(output):
        at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        found["engine" if engine else "sounder"].append(at)
    return found


def test_a_wrong_password_is_retried_with_backoff_not_in_a_tight_loop(
    tmp_path: Path, tiny_voice: Path
) -> None:
    """Both sessions of the node (the sounder's and the engine's) are refused: each retries on
    its own backoff, counted over the 6 s from its own first refusal, never in a tight loop."""
    broker = Broker(tmp_path / "auth-broker")
    passwd = broker.workdir / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwd), "agent", "right"], check=True)
    passwd.chmod(0o644)
    text = broker.config.read_text().replace("allow_anonymous true", "allow_anonymous false")
    broker.config.write_text(text + f"password_file {passwd}\n")
    broker.start()
    secret = tmp_path / "pw"
    secret.write_text("wrong\n")
    process = agent(
        tmp_path, broker, tiny_voice, "badpw", username="agent", password_file=str(secret)
    )
    process.start()
    window = timedelta(seconds=6)
    try:
        # the engine starts seconds after the sounder (its imports): its first refusal is later
        wait_until(
            lambda: all(refusals(process.output()).values()) or not process.alive(),
            120,
            "a refusal of each session",
        )
        assert process.alive(), process.output()[-3000:]
        time.sleep(window.total_seconds() + 0.5)
        assert process.alive(), process.output()[-3000:]
        sessions = refusals(process.output())
    finally:
        process.signal(signal.SIGTERM)
        broker.stop()
    attempts = {
        name: sum(1 for at in times if at - times[0] <= window) for name, times in sessions.items()
    }
    print(f"refused attempts in the 6 s from each session's first: {attempts}")
    # reconnect_min 0.2 s doubling to a 2 s cap: about 6 attempts in 6 s, never hundreds
    for name, count in attempts.items():
        assert 3 <= count <= 12, (name, count)
