"""Speech as synthesis makes it: 16-bit samples (numpy), their little-endian bytes for the
player (`chunk.Chunk`), and the edges of speech at a break (its near-silence cut as the chunks
stream).

Pure data and arithmetic.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

PCM16 = npt.NDArray[np.int16]
"""Mono 16-bit samples at the device's rate."""

QUIET_DBFS: Final = -45.0
"""Speech begins at its first sample louder than this (magnitude, dB of full scale) and ends
at its last: what a break's silence is measured from (docs/sounds.md)."""
QUIET_LEVEL: Final = round(32767 * 10 ** (QUIET_DBFS / 20))
"""QUIET_DBFS as a 16-bit magnitude (184)."""
EDGE_SECONDS: Final = 0.005
"""Near-silence kept at a trimmed edge of speech, faded, so the cut does not click."""

_EMPTY: Final[PCM16] = np.zeros(0, dtype=np.int16)


def le_bytes(pcm: PCM16) -> bytes:
    """The samples as `Chunk.pcm` holds them: 16-bit signed little-endian, on any host (a
    big-endian one swaps them; a little-endian one copies them as they are)."""
    return pcm.astype("<i2", copy=False).tobytes()


def _loud(pcm: PCM16) -> npt.NDArray[np.intp]:
    return np.flatnonzero((pcm > QUIET_LEVEL) | (pcm < -QUIET_LEVEL))


def _faded(pcm: PCM16, edge: int, *, rising: bool) -> PCM16:
    """`pcm` (at most `edge` samples) as exactly `edge`, padded with zeros on its far side from
    the speech, and faded linearly towards them."""
    ramp = np.linspace(1.0, 0.0, edge, endpoint=False, dtype=np.float32)
    if rising:
        padded = np.concatenate([np.zeros(edge - len(pcm), np.int16), pcm])
        ramp = ramp[::-1]
    else:
        padded = np.concatenate([pcm, np.zeros(edge - len(pcm), np.int16)])
    out: PCM16 = np.round(padded * ramp).astype(np.int16)
    return out


class LeadTrim:
    """Speech after a break, chunk by chunk: its near-silence before the first loud sample cut
    to `edge` samples (faded in; zeros in front when it had fewer). Nothing after the first
    loud sample is touched."""

    def __init__(self, edge: int) -> None:
        self._edge = edge
        self._quiet = _EMPTY
        """The last quiet samples seen (at most `edge`), while no loud one came."""
        self._started = False

    def feed(self, pcm: PCM16) -> PCM16:
        """What of `pcm` plays now (nothing while it is all near-silence)."""
        if self._started:
            return pcm
        loud = _loud(pcm)
        if not loud.size:
            joined = np.concatenate([self._quiet, pcm])
            self._quiet = joined[max(0, len(joined) - self._edge) :]
            return _EMPTY
        self._started = True
        quiet = np.concatenate([self._quiet, pcm[: loud[0]]])
        lead = _faded(quiet[max(0, len(quiet) - self._edge) :], self._edge, rising=True)
        return np.concatenate([lead, pcm[loud[0] :]])


class TailTrim:
    """Speech before a break, chunk by chunk: its near-silence after the last loud sample cut
    to `edge` samples (faded out; zeros after it when it had fewer). Quiet samples are held
    back until a loud one follows, so only the end is cut, never a quiet stretch inside."""

    def __init__(self, edge: int) -> None:
        self._edge = edge
        self._held: list[PCM16] = []

    def feed(self, pcm: PCM16) -> PCM16:
        """What of `pcm` (and of the quiet held before it) plays now."""
        loud = _loud(pcm)
        if not loud.size:
            self._held.append(pcm)
            return _EMPTY
        last = int(loud[-1]) + 1
        out = np.concatenate([*self._held, pcm[:last]])
        self._held = [pcm[last:]]
        return out

    def end(self) -> PCM16:
        """The end of the speech: `edge` samples, what was held cut to them and faded out."""
        held = np.concatenate([_EMPTY, *self._held])
        self._held = []
        return _faded(held[: self._edge], self._edge, rising=False)
