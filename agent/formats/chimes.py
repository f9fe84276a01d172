"""Pre-announce chimes, the pure part: the built-in tones and their rendering, and which chime
goes before which announcement. No numpy: the process that plays alarms starts without it.

Built-in tones are rendered at the voice's sample rate as 16-bit little-endian mono bytes (what
`Chunk.pcm` holds), with a 5 ms fade at each note's ends (no clicks) and a level near speech
(peak -14 dBFS). The arithmetic is numpy's float32 one, rounding included (round half to even),
so the samples are those the agent made with numpy before (within one LSB where the sine of a
float32 differs in its last bit).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from agent.core.messages import Priority, SpeakRequest
from agent.formats.samples import f32, pcm_of, ramp, rounded

_PEAK: Final = 0.2
_EDGE_SECONDS: Final = 0.005
_BREATH_SECONDS: Final = 0.12
"""Silence after a chime, before the speech."""

Note = tuple[float, float]
"""(frequency in Hz, or 0 for a rest; duration in seconds)."""

BUILTIN: Final[Mapping[str, tuple[Note, ...]]] = {
    "alert": ((1319.0, 0.12), (0.0, 0.06)) * 3,  # three quick high beeps: critical
    "alarm": ((880.0, 0.22), (660.0, 0.22)) * 2,  # two-tone, twice: alarm
    "attention": ((784.0, 0.18), (523.0, 0.30)),  # falling pair: warning
    "ding": ((1047.0, 0.35),),  # one soft note: info on request
}
"""Built-in chimes by name."""


def render_notes(notes: tuple[Note, ...], rate: int) -> bytes:
    """A sequence of sine notes and rests, each note faded in and out, then a breath of
    silence: 16-bit little-endian mono samples at `rate`."""
    out = array("f")
    (peak,) = f32([_PEAK])
    for frequency, seconds in notes:
        n = round(rate * seconds)
        if frequency <= 0:
            out.extend(f32(bytes(4 * n)))
            continue
        (omega,) = f32([2 * math.pi * frequency])
        phase = f32([omega * t for t in f32([i / rate for i in range(n)])])
        tone = f32([math.sin(x) * peak for x in phase])
        edge = min(round(rate * _EDGE_SECONDS), n // 2)
        fade = f32(ramp(0.0, 1.0, edge))
        tone[:edge] = f32([s * g for s, g in zip(tone[:edge], fade, strict=True)])
        tone[n - edge :] = f32([s * g for s, g in zip(tone[n - edge :], fade[::-1], strict=True)])
        out.extend(tone)
    out.extend(f32(bytes(4 * round(rate * _BREATH_SECONDS))))
    return pcm_of(rounded(f32([v * 32767 for v in out])))


@dataclass(frozen=True, slots=True)
class ChimePlan:
    """Which chime goes before which announcement."""

    bank: Mapping[str, bytes]
    """Every chime by name (16-bit little-endian mono samples at the device's rate)."""
    by_class: Mapping[Priority, str]
    """The chime of each class that has one (`chime: true`)."""
    fallback: str = "ding"
    """The chime for `chime: true` in a class without one."""
    defaults: Mapping[Priority, str] = field(default_factory=dict)
    """Each class's built-in chime, if its own is missing from the bank."""

    def for_request(self, request: SpeakRequest) -> bytes | None:
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
