"""`make run` as the README has a user run it (`scripts/run.sh`, the target's script): against a
broker that answers, and with none (it starts a loopback Mosquitto of its own); the agent comes
online, speaks what `mosquitto_pub` sends, and says `offline` when the script is stopped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import Broker, Watcher, agent_config, publish, read_pcm, wait_until, write_config
from harness.wait import ROOT, TIMEOUT

pytestmark = pytest.mark.broker


@pytest.fixture
def run_script(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Scripts started by a test, stopped (their process group) after it."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(TIMEOUT)


def start_run(config: Path, log: Path, started: list[subprocess.Popen[bytes]]) -> None:
    with log.open("ab") as out:
        started.append(
            subprocess.Popen(
                ["bash", "scripts/run.sh"],
                cwd=ROOT,
                env={**os.environ, "VOICE_AGENT_CONFIG": str(config)},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: the test stops it as Ctrl-C would
            )
        )


def speaks_and_stops(
    broker: Broker, node: str, capture: Path, process: subprocess.Popen[bytes], log: Path
) -> None:
    wait_until(lambda: _answers(broker.port) or process.poll() is not None, TIMEOUT, "a broker")
    assert process.poll() is None, log.read_text(errors="replace")
    watcher = Watcher(broker, f"voice/{node}/#")
    try:

        def online() -> bool:
            return any(m.payload == b"online" for m in watcher.snapshot())

        wait_until(lambda: online() or process.poll() is not None, TIMEOUT * 3, "the agent online")
        assert process.poll() is None, log.read_text(errors="replace")
        publish(broker, f"voice/{node}/speak", b"The front door is open.")
        finished = watcher.wait_event(_accepted_id(watcher), "finished")
        assert finished["audio_seconds"] > 0.3
        assert len(read_pcm(capture)) > 0.3 * 22050  # the tiny voice's rate
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C in the terminal
        assert process.wait(TIMEOUT) == 0, log.read_text(errors="replace")
        watcher.wait_payload(f"voice/{node}/status", b"offline")
    finally:
        watcher.close()


def _accepted_id(watcher: Watcher) -> str:
    """The id the agent gave the plain-text message (its `accepted` event)."""

    def accepted() -> list[dict[str, object]]:
        return [e for e in watcher.events() if e["event"] == "accepted"]

    wait_until(lambda: bool(accepted()), TIMEOUT, "an accepted event")
    (event,) = accepted()
    return str(event["id"])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def run_against(
    broker: Broker, node: str, voice: Path, folder: Path, started: list[subprocess.Popen[bytes]]
) -> str:
    """Start `make run`'s script for a node of `broker` (started or not), check that it speaks
    and stops; what it printed."""
    capture = folder / "played.raw"
    device = f"file:FILE={capture},FORMAT=raw"
    config = write_config(
        folder / "agent.yaml", agent_config(broker, folder, node, voice=voice, device=device)
    )
    log = folder / "run.log"
    start_run(config, log, started)
    speaks_and_stops(broker, node, capture, started[-1], log)
    return log.read_text()


def test_make_run_uses_the_broker_that_answers(
    broker: Broker, tiny_voice: Path, tmp_path: Path, run_script: list[subprocess.Popen[bytes]]
) -> None:
    printed = run_against(broker, "runs", tiny_voice, tmp_path, run_script)
    assert f"Using the broker at 127.0.0.1:{broker.port}." in printed


def test_make_run_starts_a_loopback_broker_when_none_answers(
    tiny_voice: Path, tmp_path: Path, run_script: list[subprocess.Popen[bytes]]
) -> None:
    absent = Broker(tmp_path / "absent")  # a free port, nothing started on it: the script's own
    printed = run_against(absent, "alone", tiny_voice, tmp_path, run_script)
    assert "starting a loopback Mosquitto" in printed
    wait_until(lambda: not _answers(absent.port), TIMEOUT, "its Mosquitto stopped with it")
