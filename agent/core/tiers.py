"""Which precision the default voice runs at (`tts.tier`), and the gate a variant must pass.
Pure: the figures come from the voice edge (`speech.tier_build`) and the child that builds and
judges the variant (`python -m tiers.auto`).

`auto` keeps FP32 where the node synthesizes at least `tts.tier_min_speed` times faster than
real time; below it the INT8 variant is built, judged on this CPU against the FP32 voice, and
used if it passes both halves of the gate (fast enough, close enough). `int8` builds it whatever
the speed and uses it when it is close enough (the speed half is not asked for); `fp32` never.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

TIER_SETTINGS: Final = ("auto", "fp32", "int8")
MIN_SPEEDUP: Final = 1.3
"""The gate: the INT8 variant at least this many times faster than FP32 on the same CPU..."""
MAX_DISTANCE_DB: Final = 2.0
"""... and its audio at most this far from FP32's (DTW-aligned log-mel distance, noise 0)."""


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
    """Whether the INT8 variant is built: forced, or `auto` with FP32 below `min_speed`
    (times real time; unmeasured: FP32 kept)."""
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
    """INT8 over FP32 on this CPU, as the gate measured it."""
    distance_db: float | None = None

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
        }


def verdict(setting: str, speedup: float | None, distance_db: float | None) -> str:
    """Why a built variant is used or not, in a few words."""
    if passes(setting, speedup, distance_db):
        return "passed"
    if distance_db is None or not math.isfinite(distance_db) or distance_db > MAX_DISTANCE_DB:
        shown = "unmeasured" if distance_db is None else f"{distance_db:.2f} dB"
        return f"refused: {shown} from FP32 (at most {MAX_DISTANCE_DB} dB)"
    shown = "unmeasured" if speedup is None else f"{speedup:.2f}x"
    return f"refused: {shown} FP32's speed (at least {MIN_SPEEDUP}x)"
