"""16-bit samples without numpy: their byte order on the way to the device, and the float32
arithmetic numpy did on them, value for value (so a lean process plays the same bytes).

`Chunk.pcm` is 16-bit signed little-endian; `array("h")` holds samples in the host's order.
Float32 rounding is to nearest, ties to even, as numpy's; `round()` rounds half to even, as
`np.round`. Pure arithmetic.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from typing import Final

_SWAP: Final = array("h", [1]).tobytes() != b"\x01\x00"
"""A big-endian host: samples are swapped on their way in and out."""


def samples_of(pcm: bytes) -> array[int]:
    """Little-endian 16-bit PCM as samples (host order), to compute with."""
    samples = array("h", pcm)
    if _SWAP:
        samples.byteswap()
    return samples


def pcm_of(samples: array[int]) -> bytes:
    """Samples (host order) as 16-bit little-endian PCM."""
    if not _SWAP:
        return samples.tobytes()
    swapped = array("h", samples)
    swapped.byteswap()
    return swapped.tobytes()


def f32(values: Iterable[float]) -> array[float]:
    """The values rounded to float32, as numpy's float32 arrays hold them."""
    return array("f", values)


def ramp(start: float, stop: float, count: int) -> list[float]:
    """`count` values from `start` to `stop` inclusive, evenly spaced: numpy's `linspace`, value
    for value (float64)."""
    if count <= 1:
        return [float(start)] * count
    step = (stop - start) / (count - 1)
    values = [i * step + start for i in range(count)]
    values[-1] = float(stop)
    return values


def rounded(values: Iterable[float]) -> array[int]:
    """Values within the 16-bit range as samples, rounded half to even (`np.round`)."""
    return array("h", [round(v) for v in values])
