"""The agent as a subprocess, as a user or systemd starts it, and the one builder of its configs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from .broker import Broker
from .processes import children, command_line
from .wait import ROOT, TIMEOUT, wait_until

ENGINE_ENDED = re.compile(r"The engine \(pid (\d+)\) ended: (.+)")
"""The sounder's line when its engine child ends (and is started again after a backoff)."""


def agent_config(
    broker: Broker | None,
    workdir: Path,
    node_id: str,
    *,
    voice: Path | None = None,
    device: str = "null",
    **sections: Mapping[str, Any],
) -> dict[str, Any]:
    """An agent config for tests and benchmarks: the broker's address with short reconnect
    delays, `device` for audio, `voice` (None: the bundled one), cache and storage under
    `workdir`, Home Assistant discovery off; each of `sections` is merged over those defaults
    (e.g. `speak={"queue_size": 2000}`, `mqtt={"username": "a"}`)."""
    config: dict[str, Any] = {
        "node_id": node_id,
        "mqtt": {"reconnect_min": 0.2, "reconnect_max": 2.0},
        "audio": {"device": device},
        "tts": {"voice": str(voice) if voice else None},
        "cache": {"dir": str(workdir / "cache")},
        "storage": {"dir": str(workdir / "storage")},
        "homeassistant": {"discovery": False},
    }
    if broker is not None:
        config["mqtt"] |= {"host": broker.host, "port": broker.port}
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """Write a config as YAML (as an operator would) and return its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
    return path


class AgentProcess:
    """`python -m agent run` as a subprocess, as a user or systemd would start it."""

    def __init__(
        self, config: Path, log: Path, env: dict[str, str] | None = None, debug: bool = False
    ) -> None:
        self.config = config
        self.log = log
        self.env = {**os.environ, **(env or {})}
        self.debug = debug
        """Run with `--debug` (debug messages in the log)."""
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (returns at once; wait for `online` to know it is ready)."""
        self.start_command(
            [sys.executable, "-m", "agent", "run", "--config", str(self.config)]
            + (["--debug"] if self.debug else [])
        )

    def start_command(self, command: Sequence[str]) -> None:
        """Start it with this command line (an installed node's `voice-agent run --config
        FILE`, say), as `start` does."""
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
            )

    def signal(self, sig: int) -> int:
        """Send a signal and wait for the exit; returns the exit code."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(sig)
        code = self._process.wait(TIMEOUT)
        self._process = None
        return code

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self._process is not None, "not started"
        return self._process.pid

    def alive(self) -> bool:
        """Whether the process is still running."""
        return self._process is not None and self._process.poll() is None

    def output(self) -> str:
        """Everything it logged so far."""
        return self.log.read_text(encoding="utf-8", errors="replace")

    def engine_pid(self, timeout: float = TIMEOUT) -> int:
        """The engine: the sounder's child running `agent engine` (waits until there is one;
        a replaced engine has a new pid)."""
        found: list[int] = []

        def find() -> bool:
            found[:] = [pid for pid in children(self.pid) if "engine" in command_line(pid)[2:4]]
            return bool(found)

        wait_until(lambda: find() or not self.alive(), timeout, "the engine process")
        assert found, self.output()[-3000:]
        return found[0]

    def engine_ends(self) -> list[tuple[int, str]]:
        """Each end of an engine the sounder logged (pid, how: `killed by SIGKILL`,
        `exit status 3`...), in order, over every start of this process's log."""
        return [(int(pid), how) for pid, how in ENGINE_ENDED.findall(self.output())]

    def wait_engine_ends(self, count: int, timeout: float = 180.0) -> list[tuple[int, str]]:
        """Wait until the sounder logged `count` ends of its engine (the fault hooks' SIGKILL,
        a crash), the sounder itself alive; those ends."""
        wait_until(
            lambda: len(self.engine_ends()) >= count or not self.alive(),
            timeout,
            f"{count} end(s) of the engine",
        )
        assert self.alive(), self.output()[-3000:]
        return self.engine_ends()[:count]
