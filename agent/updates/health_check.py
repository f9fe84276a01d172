"""The health check of a candidate model: `python -m agent.speech.healthcheck` in a process group
of its own (memory and time limited: it limits its own memory, the updater its time), its verdict
read from its last JSON line. A timeout, a cancel or a stop kills the group (the check and the
build processes it started).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from agent.core.refusal import Refused
from agent.core.states import UpdateReason
from agent.settings.declarations import OtaConfig
from agent.updates.steps import Cancelled

CHECK_ENVIRONMENT: Final = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc settings of the health check (and the build processes it starts) unless the agent's
environment sets them: the agent's own (`allocator`, set there with mallopt, which a child does
not inherit). Measured: the check's peak 181 MB with them, 227 without (docs/memory.md)."""


class HealthCheck:
    """Checks candidate models for one device rate, against the model speaking now."""

    def __init__(
        self,
        config: OtaConfig,
        rate: int,
        threads: int,
        cache_dir: Path | None,
        cancel: threading.Event,
    ) -> None:
        """`cache_dir`: where the check builds the candidate's parts (None: a temporary
        directory); `cancel`: set to kill a check under way (Cancelled)."""
        self._config = config
        self._rate = rate
        self._threads = threads
        self._cache_dir = cache_dir
        self._cancel = cancel

    def run(self, model: Path, reference: Path) -> None:
        """Check `model` against `reference`; Refused (`health_check`) with its problems, or
        Cancelled."""
        command = [
            sys.executable,
            "-m",
            "agent.speech.healthcheck",
            str(model),
            "--rate",
            str(self._rate),
        ]
        command += ["--reference", str(reference), "--threads", str(self._threads)]
        command += ["--memory-mb", str(self._config.health_memory_mb)]  # it limits itself
        if self._cache_dir is not None:
            command += ["--cache-dir", str(self._cache_dir)]
        returncode, stdout, stderr = self._run(command)
        verdict = _last_json(stdout)
        if returncode != 0 or not verdict.get("ok"):
            problems = verdict.get("problems") or [_exit_reason(returncode, stderr)]
            raise Refused(UpdateReason.HEALTH_CHECK, "; ".join(str(p) for p in problems)[:300])

    def _run(self, command: list[str]) -> tuple[int, str, str]:
        """Run the health check in a process group of its own; a timeout, a cancel or a stop
        kills the group (the check and the build processes it started)."""
        deadline = time.monotonic() + self._config.health_timeout
        environment = {**CHECK_ENVIRONMENT, **os.environ}
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            start_new_session=True,
        ) as child:
            while True:
                try:
                    stdout, stderr = child.communicate(timeout=0.25)
                    return child.returncode, stdout, stderr
                except subprocess.TimeoutExpired as err:
                    cancelled, late = self._cancel.is_set(), time.monotonic() > deadline
                    if not (cancelled or late):
                        continue
                    os.killpg(child.pid, signal.SIGKILL)  # not reaped yet: the group is its own
                    child.communicate()
                    if cancelled:
                        raise Cancelled from err
                    raise Refused(
                        UpdateReason.HEALTH_CHECK, f"no answer in {self._config.health_timeout:g} s"
                    ) from err


def _exit_reason(code: int, stderr: str) -> str:
    """Why the health check process ended without a verdict: its signal or its last words."""
    if code < 0:
        return f"the check process was killed by {signal.Signals(-code).name}"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return f"the check process failed (exit code {code}): {lines[-1] if lines else 'no output'}"


def _last_json(text: str) -> Mapping[str, Any]:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            value = json.loads(line)
            if isinstance(value, dict):
                return value
    return {}
