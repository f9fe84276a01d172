"""What the benchmark says: fixed texts of three lengths, a cached phrase, and uncached texts.

Each uncached text is three sentences that start with a number unique in the run, so that no
phrase or clause cache can serve any part of it.
"""

from __future__ import annotations

import random
from typing import Final

SPEED_TEXTS: Final = {
    "short": "The kitchen light is still on.",
    "medium": (
        "The washing machine has finished its cycle, "
        "and the laundry is ready to be hung up in the garden."
    ),
    "long": (
        "Good morning, it is a quarter past seven on a cloudy Tuesday, and the outside "
        "temperature is eleven degrees with a light wind from the west. "
        "Rain is expected from the early afternoon until late in the evening, so take an "
        "umbrella if you are going out, and bring the garden cushions inside before noon. "
        "The recycling bins are collected today, and your first meeting starts at nine thirty."
    ),
}
"""Short (~1.5 s of audio), medium (~5 s) and long (~20 s, one sentence of ~8 s) texts."""

CACHED_PHRASE: Final = "The front door is open."
"""The phrase spoken once as a warm-up, then repeatedly to measure cached latency."""

COLD_START_SENTENCE: Final = SPEED_TEXTS["short"]
"""What the piper-tts cold-start child synthesizes before it reports."""

_ROOMS: Final = ("kitchen", "garage", "hallway", "bedroom", "office", "cellar", "attic", "porch")
_THINGS: Final = ("smoke alarm", "water heater", "back gate", "freezer", "heat pump", "skylight")
_DAYS: Final = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def uncached_text(rng: random.Random, trial: int) -> str:
    """Three sentences of ~2-3 s of audio each; the first begins with the trial number."""
    room, other = rng.sample(_ROOMS, 2)
    return (
        f"Update {trial + 1}: the {room} is at {rng.randint(12, 31)} degrees. "
        f"The {rng.choice(_THINGS)} in the {other} should be checked before {rng.choice(_DAYS)}. "
        f"The battery of the door lock is at {rng.randint(5, 95)} percent."
    )
