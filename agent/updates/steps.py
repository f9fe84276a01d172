"""How a step of the update worker ends early: a cancel (`Cancelled`, raised where the worker
looks), or the test hook that kills the process at a named step (`fault_point`)."""

from __future__ import annotations

import logging
import os
import signal
from typing import Final

_LOGGER = logging.getLogger(__name__)

FAULT_ENV: Final = "VOICE_AGENT_FAULT_AT"
"""Test hook: the agent kills itself (SIGKILL) when it reaches this step of an update."""


class Cancelled(Exception):  # noqa: N818 - control flow, not an error
    """The update under way was cancelled (a command, or the agent stopping)."""


def fault_point(step: str) -> None:
    """The test hook: SIGKILL this process at `step` when $VOICE_AGENT_FAULT_AT names it."""
    if os.environ.get(FAULT_ENV) == step:
        _LOGGER.warning("Fault injection: killed at %s", step)
        os.kill(os.getpid(), signal.SIGKILL)
