"""Waiting in tests and benchmarks: on a condition, with a generous deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

TIMEOUT: Final = 60.0
"""Upper bound for any wait in a test: slow machines pass, hangs fail."""
ROOT: Final = Path(__file__).resolve().parent.parent
"""The project folder."""


def wait_until(condition: Callable[[], bool], timeout: float = TIMEOUT, what: str = "") -> None:
    """Poll condition until true; fail the test after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")
        time.sleep(0.02)
