"""Audio as it travels from synthesis to the device: 16-bit PCM chunks of one announcement.

Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent.core.messages import Priority
from agent.core.reasons import Reason

PCM16 = npt.NDArray[np.int16]
"""Mono 16-bit samples at the device's rate."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Audio for one announcement; `end=True` closes it (with its error, if any)."""

    id: str
    pcm: PCM16 | None = None
    end: bool = False
    error: Reason | None = None
    detail: str = ""
    info: Mapping[str, object] = field(default_factory=dict)
    """With `end`: extra fields for the announcement's last event."""
    volume: float = 1.0
    """The requested volume (the global volume and the floor are applied at write time)."""
    priority: Priority = Priority.INFO
    job: int = 0
    """The activation token (see `messages.Synthesize.job`): cuts and reports name it."""
    start_at: float | None = None
    """The wall-clock instant (Unix seconds) the utterance's first sample should play: the
    player pads with silence to the exact frame (a timed request)."""
