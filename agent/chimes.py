"""Pre-announce chimes: built-in generated tones, or sound files named in the config.

Every chime is made once at start, at the voice's sample rate, as 16-bit mono. Built-in tones
have a 5 ms fade at each note's ends (no clicks) and a level near speech (peak -14 dBFS).
Allowed imports: stdlib, numpy, `media`, `messages`, `pcm`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np

from .media import decode_file
from .messages import Priority, SpeakRequest
from .pcm import PCM16

_PEAK: Final = 0.2
_EDGE_SECONDS: Final = 0.005

Note = tuple[float, float]
"""(frequency in Hz, or 0 for a rest; duration in seconds)."""

BUILTIN: Final[Mapping[str, tuple[Note, ...]]] = {
    "alert": ((1319.0, 0.12), (0.0, 0.06)) * 3,  # three quick high beeps: critical
    "alarm": ((880.0, 0.22), (660.0, 0.22)) * 2,  # two-tone, twice: alarm
    "attention": ((784.0, 0.18), (523.0, 0.30)),  # falling pair: warning
    "ding": ((1047.0, 0.35),),  # one soft note: info on request
}
"""Built-in chimes by name."""


def render_notes(notes: tuple[Note, ...], rate: int) -> PCM16:
    """A sequence of sine notes and rests, each note faded in and out."""
    parts = []
    for frequency, seconds in notes:
        n = round(rate * seconds)
        if frequency <= 0:
            parts.append(np.zeros(n, dtype=np.float32))
            continue
        t = np.arange(n, dtype=np.float32) / rate
        tone = np.sin(2 * np.pi * frequency * t) * _PEAK
        edge = min(round(rate * _EDGE_SECONDS), n // 2)
        ramp = np.linspace(0.0, 1.0, edge, dtype=np.float32)
        tone[:edge] *= ramp
        tone[n - edge :] *= ramp[::-1]
        parts.append(tone.astype(np.float32))
    parts.append(np.zeros(round(rate * 0.12), dtype=np.float32))  # a breath before speech
    return np.round(np.concatenate(parts) * 32767).astype(np.int16)


def load_sound(path: Path, rate: int) -> PCM16:
    """A sound file (WAV of any sample format, FLAC, Ogg, MP3) as mono 16-bit PCM at `rate`."""
    return decode_file(path, rate).samples


def chime_bank(files: Mapping[str, Path], rate: int) -> dict[str, PCM16]:
    """Every chime by name: the built-ins, then the configured files (which may replace them)."""
    bank = {name: render_notes(notes, rate) for name, notes in BUILTIN.items()}
    bank.update({name: load_sound(path, rate) for name, path in files.items()})
    return bank


@dataclass(frozen=True, slots=True)
class ChimePlan:
    """Which chime goes before which announcement."""

    bank: Mapping[str, PCM16]
    """Every chime by name."""
    by_class: Mapping[Priority, str]
    """The chime of each class that has one (`chime: true`)."""
    fallback: str = "ding"
    """The chime for `chime: true` in a class without one."""

    def for_request(self, request: SpeakRequest) -> PCM16 | None:
        """The samples to play before this request's speech, if any."""
        match request.chime:
            case False:
                return None
            case None:
                name = self.by_class.get(request.priority, "")
            case True:
                name = self.by_class.get(request.priority, self.fallback)
            case str(named):
                name = named
        return self.bank.get(name)
