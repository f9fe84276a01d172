"""Audio as the player takes it: one announcement's 16-bit PCM in chunks, the last one closing
it. Plain bytes (no numpy), so the process that plays them starts lean.

Pure data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agent.core.messages import Priority
from agent.core.reasons import Reason

SAMPLE_BYTES: Final = 2
"""Bytes per sample of `Chunk.pcm` (16-bit, mono)."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Audio for one announcement; `end=True` closes it (with its error, if any)."""

    id: str
    pcm: bytes | None = None
    """Mono samples at the device's rate, 16-bit signed little-endian (made from numpy samples
    by `pcm.le_bytes`, from `array("h")` by `samples.pcm_of`)."""
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
