"""Fixtures: a real broker per test, the tiny and the real voice, the agent as a subprocess."""

from __future__ import annotations

import logging
import re
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from agent.protocol.topics import Topics
from harness import (
    AgentProcess,
    Broker,
    PulseNullSink,
    Watcher,
    agent_config,
    wait_until,
    write_config,
)
from tests.tiny_voice import write_tiny_voice

# Tests judge behaviour, never speed: no property test fails because one example was slow on a
# busy machine (Hypothesis's 200 ms deadline did, on a fresh-clone `make test`). Each test's own
# `@settings` inherits this profile for what it does not set.
settings.register_profile("behaviour", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("behaviour")


@pytest.fixture(autouse=True)
def _espeak_voice_set_again() -> Iterator[None]:
    """Tests set espeak-ng's voice outside the agent's `Voice` (piper's own phonemizer, a test
    of the remembered voice): each test starts with none remembered, as a node's process does."""
    _forget_espeak_voice()
    yield
    _forget_espeak_voice()


def _forget_espeak_voice() -> None:
    """Where a test loaded the voice module (never loaded for this alone: some tests check
    what a process imports)."""
    voice = sys.modules.get("agent.speech.voice")
    if voice is not None:
        voice.forget_espeak_voice()


@pytest.fixture(autouse=True)
def _fail_on_error_logs(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> Iterator[None]:
    """A supervisor that logs and swallows an error must not hide a bug: every ERROR record
    fails the test, but those its `allow_error_logs` marker names."""
    yield
    errors = [r.getMessage() for r in caplog.get_records("call") if r.levelno >= logging.ERROR]
    unexpected = unexpected_errors(request, errors)
    assert not unexpected, f"errors were logged: {unexpected}"


def unexpected_errors(request: pytest.FixtureRequest, errors: list[str]) -> list[str]:
    """The errors that no pattern of the test's `allow_error_logs` markers matches (regular
    expressions, searched; a test that expects errors says which)."""
    patterns = [p for mark in request.node.iter_markers("allow_error_logs") for p in mark.args]
    if any(not isinstance(p, str) for p in patterns):
        raise TypeError("allow_error_logs takes regular expressions")
    if request.node.get_closest_marker("allow_error_logs") and not patterns:
        raise TypeError("allow_error_logs needs the errors it allows: say which")
    return [e for e in errors if not any(re.search(p, e) for p in patterns)]


FAILED_LOG_LINES = 80
"""Lines of each agent's log printed when its test failed (CI keeps only what pytest prints)."""
PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the test item (`item.stash[PHASE_REPORTS]`), for fixtures
    that say more about a failed test at their teardown."""
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[report.when] = report
    return report


def call_failed(request: pytest.FixtureRequest) -> bool:
    """Whether the requesting test's own call failed (at a fixture's teardown)."""
    reports = request.node.stash.get(PHASE_REPORTS, {})
    return "call" in reports and reports["call"].failed


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers this conftest uses."""
    config.addinivalue_line(
        "markers",
        "allow_error_logs(*patterns): ERROR log records the test expects, each matched by one of"
        " the regular expressions",
    )


@pytest.fixture(scope="session")
def tiny_voice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated Piper-format voice with the real inputs and outputs (fast unit tests)."""
    return write_tiny_voice(tmp_path_factory.mktemp("tiny_voice"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the session: the real voice's optimized model is built once."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def pulse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PulseNullSink]:
    """A PulseAudio null sink behind ALSA's `pulse` device: playback paced in real time."""
    server = PulseNullSink(tmp_path_factory.mktemp("pulse"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A real Mosquitto on a free loopback port, stopped after the test."""
    server = Broker(tmp_path / "broker")
    server.start()
    yield server
    server.stop()


@dataclass
class RunningAgent:
    """An agent subprocess with what a test needs around it."""

    process: AgentProcess
    topics: Topics
    capture: Path
    watcher: Watcher

    def wait_online(self) -> None:
        """Wait until the retained status says online (after any earlier offline)."""
        status = self.topics.status

        def online() -> bool:
            mine = [m.payload for m in self.watcher.snapshot() if m.topic == status]
            return bool(mine) and mine[-1] == b"online"

        # two processes start (the sounder, then its engine, whose session online waits for)
        wait_until(lambda: online() or not self.process.alive(), 180, what="online status")
        assert self.process.alive(), self.process.output()

    def wait_voice_ready(self, timeout: float = 600) -> None:
        """Wait until the engine's voice is loaded (its log says so; the state's `voice_ready`
        follows): before it, an alarm that needs synthesis is said with the generic alarm
        phrase first, and other requests wait (a new cache: a minute of graph analysis)."""
        wait_until(lambda: "prewarmed in" in self.process.output(), timeout, what="the voice")


StartAgent = Callable[..., RunningAgent]


@pytest.fixture
def start_agent(
    broker: Broker, tmp_path: Path, cache_dir: Path, request: pytest.FixtureRequest
) -> Iterator[StartAgent]:
    """Start the real agent (real voice unless `voice` is given) against the test's broker."""
    started: list[RunningAgent] = []

    def start(  # noqa: PLR0917 - a test names what it needs
        voice: Path | None = None,
        node_id: str | None = None,
        voices: dict[str, str] | None = None,
        paced: PulseNullSink | None = None,
        audio: dict[str, Any] | None = None,
        sections: dict[str, dict[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
        debug: bool = False,
        **speak: Any,
    ) -> RunningAgent:
        node_id = node_id or f"t{uuid.uuid4().hex[:8]}"
        capture = tmp_path / f"{node_id}-{len(started)}.raw"
        device = "paced_capture" if paced else f"file:FILE={capture},FORMAT=raw"
        extra = {**(sections or {})}
        extra["audio"] = {**extra.get("audio", {}), **(audio or {})}
        extra["speak"] = {**extra.get("speak", {}), **speak}
        # FP32 unless a test asks: a busy machine must not start an INT8 build (tests/test_tier.py)
        extra["tts"] = {"voices": voices or {}, "tier": "fp32", **extra.get("tts", {})}
        extra["cache"] = {"dir": str(cache_dir), **extra.get("cache", {})}
        # Many agents at once on one machine: no fixed announce port, no zeroconf on the LAN
        extra["wyoming"] = {"satellite_port": 0, "zeroconf": False, **extra.get("wyoming", {})}
        config = agent_config(broker, tmp_path, node_id, voice=voice, device=device, **extra)
        path = write_config(tmp_path / f"{node_id}-{len(started)}.yaml", config)
        topics = Topics("voice", node_id)
        watcher = Watcher(broker, f"voice/{node_id}/#")
        log = tmp_path / f"{node_id}-{len(started)}.log"
        environment = {**(paced.env(capture) if paced else {}), **(env or {})}
        process = AgentProcess(path, log, environment, debug=debug)
        agent = RunningAgent(process, topics, capture, watcher)
        agent.process.start()
        started.append(agent)
        if wait:
            agent.wait_online()
        return agent

    yield start
    for agent in started:
        if agent.process.alive():
            agent.process.signal(signal.SIGTERM)
        agent.watcher.close()
    if call_failed(request):  # what the agents said last: all CI keeps of them
        for agent in started:
            lines = agent.process.output().splitlines()[-FAILED_LOG_LINES:]
            print(f"\n--- the last {len(lines)} lines of {agent.process.log}:", *lines, sep="\n")
    for agent in started:  # an agent that logged an error failed, even if it carried on
        errors = [line for line in agent.process.output().splitlines() if " ERROR " in line]
        unexpected = unexpected_errors(request, errors)
        assert not unexpected, unexpected
