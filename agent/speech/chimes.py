"""Pre-announce chimes: built-in generated tones, or sound files named in the config.

Every chime is made once at start, at the voice's sample rate, as 16-bit mono. Built-in tones
have a 5 ms fade at each note's ends (no clicks) and a level near speech (peak -14 dBFS).
Chime files are decoded by the decoder the composition root passes (the decoder child), never
in the agent's own process; one that cannot be decoded is left out, logged, and the classes
that named it keep their built-in chime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np

from agent.core.messages import Priority, SpeakRequest
from agent.formats.media import MAX_AUDIO_BYTES, MediaError, decode_audio
from agent.formats.pcm import PCM16

_LOGGER = logging.getLogger(__name__)

Decode = Callable[[bytes, int], PCM16]
"""A sound file's bytes to mono 16-bit PCM at a rate; raises MediaError."""

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


def load_sound(path: Path, rate: int, decode: Decode | None = None) -> PCM16:
    """A sound file (WAV of any sample format, FLAC, Ogg, MP3) as mono 16-bit PCM at `rate`
    (by `decode`; here, without one). Raises MediaError and OSError."""
    with path.open("rb") as file:
        data = file.read(MAX_AUDIO_BYTES + 1)  # more is refused by its size
    if decode is None:
        return decode_audio(data, rate).samples
    return decode(data, rate)


def chime_bank(
    files: Mapping[str, Path], rate: int, decode: Decode | None = None
) -> dict[str, PCM16]:
    """Every chime by name: the built-ins, then the configured files (which may replace them;
    one that cannot be read or decoded is left out, with an error logged)."""
    bank = {name: render_notes(notes, rate) for name, notes in BUILTIN.items()}
    for name, path in files.items():
        try:
            bank[name] = load_sound(path, rate, decode)
        except (MediaError, OSError) as err:
            _LOGGER.error("Chime %r (%s) left out: %s", name, path, err)
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
    defaults: Mapping[Priority, str] = field(default_factory=dict)
    """Each class's built-in chime, if its own is missing from the bank."""

    def for_request(self, request: SpeakRequest) -> PCM16 | None:
        """The samples to play before this request's speech, if any (a class whose chime was
        left out keeps its built-in one)."""
        match request.chime:
            case False:
                return None
            case None:
                name = self.by_class.get(request.priority, "")
            case True:
                name = self.by_class.get(request.priority, self.fallback)
            case str(named):
                name = named
        chime = self.bank.get(name)
        if chime is None and name and not isinstance(request.chime, str):  # its file left out
            chime = self.bank.get(self.defaults.get(request.priority, ""))
        return chime
