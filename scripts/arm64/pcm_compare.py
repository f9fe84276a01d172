"""Sample-by-sample comparison of 16-bit mono PCM (WAV files and raw ALSA captures)."""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

PCM16 = npt.NDArray[np.int16]
MAX_LSB: Final = 2
"""Largest difference allowed between two renderings of the same text (16-bit steps): x86_64 and
aarch64 kernels of ONNX Runtime round floats differently (measured 1-2 steps at noise 0)."""


def read_wav(path: Path) -> tuple[int, PCM16]:
    """Sample rate and samples of a 16-bit mono WAV file."""
    with wave.open(str(path), "rb") as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            raise ValueError(f"{path}: expected 16-bit mono")
        return wav.getframerate(), np.frombuffer(wav.readframes(wav.getnframes()), "<i2")


def read_raw(path: Path) -> PCM16:
    """Samples of a raw 16-bit little-endian mono capture (ALSA `file` PCM, FORMAT=raw)."""
    return np.frombuffer(path.read_bytes(), "<i2")


@dataclass(frozen=True, slots=True)
class Comparison:
    """How two renderings differ."""

    name: str
    samples: tuple[int, int]
    max_diff: int
    """Largest absolute difference over the common length (16-bit steps)."""
    differing: int
    """Samples that differ at all, over the common length."""
    rms: float
    """RMS of the first rendering (16-bit steps): shows it is not silence."""

    @property
    def ok(self) -> bool:
        """Same length, within MAX_LSB everywhere, and not silent."""
        return self.samples[0] == self.samples[1] and self.max_diff <= MAX_LSB and self.rms > 0

    def line(self) -> str:
        """One line for the report."""
        verdict = "OK" if self.ok else "FAIL"
        return (
            f"{verdict} {self.name}: {self.samples[0]} vs {self.samples[1]} samples, "
            f"max |diff| {self.max_diff} LSB (allowed {MAX_LSB}), {self.differing} samples "
            f"differ, rms {self.rms:.0f}"
        )


def compare(name: str, first: PCM16, second: PCM16) -> Comparison:
    """Compare two renderings sample by sample (over their common length if they differ)."""
    common = min(len(first), len(second))
    diff = np.abs(first[:common].astype(np.int32) - second[:common].astype(np.int32))
    rms = float(np.sqrt(np.mean(first.astype(np.float64) ** 2))) if len(first) else 0.0
    return Comparison(
        name,
        (len(first), len(second)),
        int(diff.max()) if common else 0,
        int(np.count_nonzero(diff)),
        rms,
    )
