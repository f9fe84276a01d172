"""Which precision the default voice runs at (`tts.tier`), and the gate a variant must pass.
Pure: the figures come from the voice edge (`speech.tier_build`) and the child that measures,
judges or builds (`python -m tiers.auto`).

`auto` keeps FP32 where one CPU of the node makes at least `tts.tier_min_speed` seconds of
speech per second of CPU time; below it the variants the installed release carries (else one
built here, where memory allows) are judged on this CPU against the FP32 voice, and the fastest
that passes both halves of the gate (fast enough, close enough) is used. `int8` does the same
whatever the speed and asks only closeness; `fp32` never.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

TIER_SETTINGS: Final = ("auto", "fp32", "int8")
MIN_SPEEDUP: Final = 1.3
"""The gate: the INT8 variant at least this many times faster than FP32 on the same CPU..."""
MAX_DISTANCE_DB: Final = 2.0
"""... and its audio at most this far from FP32's (DTW-aligned log-mel distance at the voice's
default noise, both drawing the same noise, on held-out sentences)."""
MEASURED_BY: Final = "CPU time of one thread, median of rounds"
"""How the speeds are measured (the state says it): a busy CPU cannot slow CPU time."""


def is_publishable(
    speedup: float | None,
    distance_db: float | None,
    min_speedup: float = MIN_SPEEDUP,
    max_distance_db: float = MAX_DISTANCE_DB,
) -> bool:
    """The publish gate: fast enough AND close enough; anything unmeasured fails."""
    if speedup is None or distance_db is None:
        return False
    if not (math.isfinite(speedup) and math.isfinite(distance_db)):
        return False
    return speedup >= min_speedup and distance_db <= max_distance_db


def wants_int8(setting: str, fp32_speed: float | None, min_speed: float) -> bool:
    """Whether an INT8 variant is looked for: forced, or `auto` with FP32 below `min_speed`
    (seconds of speech per CPU second; unmeasured: FP32 kept)."""
    if setting == "int8":
        return True
    return setting == "auto" and fp32_speed is not None and fp32_speed < min_speed


def passes(setting: str, speedup: float | None, distance_db: float | None) -> bool:
    """Whether a built variant is used: the whole gate for `auto`, closeness alone for a forced
    `int8`."""
    if setting == "int8":
        close = distance_db is not None and math.isfinite(distance_db)
        return close and distance_db <= MAX_DISTANCE_DB  # type: ignore[operator]
    return is_publishable(speedup, distance_db)


@dataclass(frozen=True, slots=True)
class TierState:
    """What the node says about its tier (the state's `tier`)."""

    setting: str
    used: str = "fp32"
    fp32_speed: float | None = None
    """FP32 synthesis speed measured at start (times real time)."""
    min_speed: float = 0.0
    int8: str = "not needed"
    """The INT8 variant: waiting for the voice (at start, until it has loaded and been
    measured), not needed, building, passed, refused (why), failed (why)."""
    speedup: float | None = None
    """INT8 over FP32 on this CPU by CPU time, as the gate measured it."""
    distance_db: float | None = None
    source: str | None = None
    """Where the variant judged came from: `release` (carried, signed) or `built` here."""
    busy_share: float | None = None
    """The share of the CPUs other processes took while the figures were measured."""
    notes: tuple[str, ...] = ()
    """Variants not judged, and why (a release's tier this CPU cannot run, a damaged file)."""

    @property
    def working(self) -> bool:
        """Whether the tier's worker has something to do (measure, judge, build)."""
        return self.int8 in ("measuring", "building")

    def as_json(self) -> dict[str, object]:
        """The state's `tier` object."""
        return {
            "setting": self.setting,
            "used": self.used,
            "fp32_speed": None if self.fp32_speed is None else round(self.fp32_speed, 2),
            "min_speed": self.min_speed,
            "int8": self.int8,
            "int8_speedup": None if self.speedup is None else round(self.speedup, 3),
            "int8_distance_db": None if self.distance_db is None else round(self.distance_db, 3),
            "int8_source": self.source,
            "busy_share": None if self.busy_share is None else round(self.busy_share, 2),
            "measured_by": MEASURED_BY,
            "notes": list(self.notes),
        }


def best(
    setting: str, judged: list[tuple[str, float | None, float | None]]
) -> tuple[str, float | None, float | None] | None:
    """Of (name, speedup, distance) judged on this CPU, the one to use: the fastest that
    passes (ties: the closest, then the name), None when none passes."""
    passing = [j for j in judged if passes(setting, j[1], j[2])]
    if not passing:
        return None
    return min(passing, key=lambda j: (-(j[1] or 0.0), j[2] or 0.0, j[0]))


def verdict(setting: str, speedup: float | None, distance_db: float | None) -> str:
    """Why a built variant is used or not, in a few words."""
    if passes(setting, speedup, distance_db):
        return "passed"
    if distance_db is None or not math.isfinite(distance_db) or distance_db > MAX_DISTANCE_DB:
        shown = "unmeasured" if distance_db is None else f"{distance_db:.2f} dB"
        return f"refused: {shown} from FP32 (at most {MAX_DISTANCE_DB} dB)"
    shown = "unmeasured" if speedup is None else f"{speedup:.2f}x"
    return f"refused: {shown} FP32's speed (at least {MIN_SPEEDUP}x)"
