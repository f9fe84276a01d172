"""The sounder's start from power-on (issue 33): `voice-agent run` imports what its alarm path
needs and nothing else (the engine's parsers, paho's proxy helpers and the process helpers of a
library lookup load later or never), and the engine starts only once the alarm lane has taken
what waited in its session: its start (a process, its imports, its discovery) never comes
before the alarms of a power-on. Timing goals live in `make bench` (bench/ALARMS.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import ROOT, Broker, publish, wait_until
from tests.conftest import StartAgent

NOT_BEFORE_AN_ALARM = (
    "agent.protocol.routes",  # the engine's route table: Hermes, OTA, every input type
    "agent.protocol.inputs",
    "agent.protocol.manifest",
    "agent.protocol.hermes",
    "http.client",  # paho's urllib.request (a PySocks proxy only), deferred
    "email.parser",
    "ctypes.util",  # find_library runs ldconfig; the allocator needs no lookup
    "tenacity",  # the engine keeper's backoff: imported when the engine starts
    "importlib.resources",  # the bundled voice found without its package API
    "zipfile",
)
"""Modules the sounder's start must not load before its first alarm."""


def _run(code: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
    )
    return done.stdout.strip()


def test_the_sounders_start_imports_nothing_its_alarm_path_does_not_use(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from agent.system import allocator\n"
        "allocator.tune()\n"
        "import os\n"
        "from pathlib import Path\n"
        "from agent.__main__ import sounder\n"
        "from agent.settings.loading import from_mapping\n"
        "sounder()\n"
        "from agent.sounder.main import Sounder\n"  # made as `run` makes it (bundled voice)
        "config = from_mapping({'audio': {'device': 'null'}, 'cache': {'dir': os.environ['D']},"
        " 'storage': {'dir': os.environ['D']}}, 'test')\n"
        "Sounder(config, ['true'], os.environ)\n"
        f"print(sorted(set({NOT_BEFORE_AN_ALARM!r}) & set(sys.modules)))\n"
    )
    assert _run(code, {"D": str(tmp_path)}) == "[]"


def test_a_deferred_module_is_the_real_one_from_its_first_use() -> None:
    code = (
        "import sys\n"
        "from agent.sounder.deferred_imports import defer\n"
        "print(defer(('urllib.request', 'sys')))\n"  # sys: imported already, left alone
        "import urllib.request\n"  # the import statement alone does not load it
        "print('http.client' in sys.modules)\n"
        "from urllib.request import getproxies\n"  # the first read does
        "print('http.client' in sys.modules, type(sys.modules['urllib.request']).__name__)\n"
        "print(callable(getproxies), urllib.request.getproxies is getproxies)\n"
        "try:\n"
        "    urllib.request.no_such_name\n"
        "except AttributeError:\n"
        "    print('AttributeError')\n"
    )
    assert _run(code).splitlines() == [
        "['urllib.request']",
        "False",
        "True module",
        "True True",
        "AttributeError",
    ]


@pytest.mark.broker
@pytest.mark.voice
def test_the_engine_starts_after_the_alarm_that_waited_in_the_session(
    start_agent: StartAgent, broker: Broker
) -> None:
    agent = start_agent()  # its sessions exist from now on
    assert agent.process.signal(signal.SIGTERM) == 0
    earlier = len(agent.process.output().splitlines())  # the first start's lines
    request_id = uuid.uuid4().hex
    body = {"id": request_id, "text": "Gas alarm in the boiler room.", "priority": "critical"}
    publish(broker, agent.topics.speak, json.dumps(body).encode())  # waits in the session
    agent.process.start()
    agent.wait_online()
    wait_until(lambda: "Engine starting" in agent.process.output(), what="the engine's start")
    lines = agent.process.output().splitlines()[earlier:]
    accepted = next(i for i, line in enumerate(lines) if f"{request_id} accepted" in line)
    started = next(i for i, line in enumerate(lines) if f"{request_id} started" in line)
    engine = next(i for i, line in enumerate(lines) if "Engine starting" in line)
    first_engine_line = next(i for i, line in enumerate(lines) if " engine " in line)
    assert accepted < started < engine < first_engine_line, lines[: first_engine_line + 1]
