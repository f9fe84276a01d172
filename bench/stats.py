"""Measured samples, their statistics, the targets they are held to, and one report row each.

Every metric of the benchmark ends as an `Entry`: our samples, piper-tts's samples (when there
is a counterpart), the statistic compared (median or a percentile), the ratio ours / piper-tts
and a `Target` on the ratio or on our value. Samples are stored in the entry's display unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

_DIGITS: Final = 6


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (linear interpolation; q=50 is the median)."""
    return float(np.percentile(np.asarray(samples, dtype=np.float64), q))


def summary(samples: Sequence[float]) -> dict[str, Any]:
    """Raw samples with their count, median and spread, for results.json."""
    return {
        "samples": [round(s, _DIGITS) for s in samples],
        "n": len(samples),
        "median": round(percentile(samples, 50), _DIGITS),
        "p10": round(percentile(samples, 10), _DIGITS),
        "p90": round(percentile(samples, 90), _DIGITS),
        "p99": round(percentile(samples, 99), _DIGITS),
        "min": round(min(samples), _DIGITS),
        "max": round(max(samples), _DIGITS),
    }


@dataclass(frozen=True)
class Target:
    """A bound on the ratio ours / piper-tts, or on our own value when `on_ratio` is false."""

    bound: float
    at_most: bool
    on_ratio: bool = True

    def met(self, value: float) -> bool:
        """Whether value is on the right side of the bound."""
        return value <= self.bound if self.at_most else value >= self.bound

    def describe(self, unit: str) -> str:
        """E.g. `ratio <= 0.30` or `<= 10 ms`."""
        sign = "<=" if self.at_most else ">="
        if self.on_ratio:
            return f"ratio {sign} {self.bound:.2f}"
        return f"{sign} {format_value(self.bound, unit)}"


def format_value(value: float, unit: str) -> str:
    """A value with its unit, to the precision that the noise of these machines allows."""
    if unit == "x":
        return f"{value:.1f}x real time"
    if unit == "ms":
        return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "%":
        return f"{value:+.1f} %"
    return f"{value:.0f} {unit}"


@dataclass(frozen=True)
class Entry:
    """One compared metric: samples of both sides, the statistic, the ratio and the target."""

    key: str
    """Key in results.json, e.g. `warm_speed_long`."""
    label: str
    """Row label in REPORT.md."""
    unit: str
    ours: Sequence[float]
    piper: Sequence[float] | None = None
    q: float = 50.0
    """Percentile compared: 50 (the median) unless the target is on a tail."""
    target: Target | None = None

    @property
    def ours_value(self) -> float:
        """Our statistic."""
        return percentile(self.ours, self.q)

    @property
    def piper_value(self) -> float | None:
        """piper-tts's statistic, if it has a counterpart."""
        return None if self.piper is None else percentile(self.piper, self.q)

    @property
    def ratio(self) -> float | None:
        """Ours / piper-tts."""
        theirs = self.piper_value
        return None if theirs is None or theirs == 0 else self.ours_value / theirs

    @property
    def met(self) -> bool | None:
        """Whether the target is met (None: no target)."""
        if self.target is None:
            return None
        value = self.ratio if self.target.on_ratio else self.ours_value
        return value is not None and self.target.met(value)

    def to_json(self) -> dict[str, Any]:
        """Samples, statistics, ratio, target and pass/fail."""
        ratio = self.ratio
        piper_value = self.piper_value
        return {
            "label": self.label,
            "unit": self.unit,
            "statistic": "median" if self.q == 50 else f"p{self.q:g}",
            "ours": summary(self.ours),
            "piper": None if self.piper is None else summary(self.piper),
            "ours_value": round(self.ours_value, _DIGITS),
            "piper_value": None if piper_value is None else round(piper_value, _DIGITS),
            "ratio": None if ratio is None else round(ratio, 4),
            "target": None if self.target is None else self.target.describe(self.unit),
            "met": self.met,
        }

    def row(self) -> list[str]:
        """metric | ours | piper-tts | ratio | target | met?"""
        piper_value = self.piper_value
        ratio = self.ratio
        met = self.met
        return [
            self.label,
            format_value(self.ours_value, self.unit),
            "—" if piper_value is None else format_value(piper_value, self.unit),
            "—" if ratio is None else f"{ratio:.2f}",
            "—" if self.target is None else self.target.describe(self.unit),
            "—" if met is None else ("yes" if met else "**no**"),
        ]
