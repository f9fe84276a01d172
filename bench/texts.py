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
POWER_ON_PHRASE: Final = "Fire alarm in hall two. Leave the building now."
"""The bench's pinned alarm phrase (`cache.phrases`), heard from power-on."""
BENCH_SOUND: Final = "doorbell"
"""The name of the bench's sound file in `audio.media` (a stereo 44.1 kHz FLAC, `bench.run`)."""
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


def uncached_short(rng: random.Random, trial: int) -> str:
    """One short sentence (~1.5 s of audio) that begins with the trial number."""
    return f"Light {trial + 1} in the {rng.choice(_ROOMS)} is on."


def uncached_unpunctuated(rng: random.Random, trial: int) -> str:
    """One long sentence without a comma or any other clause mark (~7 s of audio): espeak-ng
    gives it as one clause, so only chunked decoding can make its first audio early."""
    room, other = rng.sample(_ROOMS, 2)
    return (
        f"Delivery number {trial + 1} has arrived at the loading dock behind the {room} so "
        f"please send someone from the {other} to sign for the pallets before the driver leaves "
        f"again on {rng.choice(_DAYS)}"
    )


FIRST_AUDIO_KINDS: Final = {
    "three_sentences": uncached_text,
    "short": uncached_short,
    "unpunctuated": uncached_unpunctuated,
}
"""The uncached texts whose first audio is measured, by kind."""

STORY: Final = (
    "Here is the long evening report for the whole house, read slowly from start to end. "
    "The living room is warm and the lights are dimmed, the kitchen is tidy, and the "
    "dishwasher finished its cycle a few minutes ago, so it can be emptied whenever you like. "
    "In the garden the sprinklers ran for twenty minutes, the gate is closed and locked, and "
    "the motion sensor by the shed saw nothing unusual since the afternoon. "
    "Upstairs, the bedroom windows are shut, the heating is set to eighteen degrees for the "
    "night, and the bathroom fan will switch itself off in about a quarter of an hour. "
    "The washing machine in the cellar is still running and will be done at a quarter past "
    "nine; remember to hang the laundry before you go to bed, or it will smell tomorrow. "
    "Tomorrow morning the alarm is set for half past six, the coffee machine will warm up at "
    "twenty past, and the forecast says light rain until ten, then sunshine with a cool wind "
    "from the north, so take a jacket if you cycle to work. "
    "The car is charged to eighty percent, which is enough for the trip to the coast on "
    "Saturday, and the tyre pressure was checked on Monday. "
    "That is all for tonight; sleep well, and I will wake you with the news in the morning."
)
"""About a minute of speech, streamed to a paced device to count underruns."""


def uncached_speed_text(name: str, trial: int) -> str:
    """A text as long as `SPEED_TEXTS[name]` (its words, in its sentences), every sentence
    carrying the trial's number, so that no phrase cache holds any of it."""
    number = trial + 101
    if name == "short":
        return f"The kitchen light {number} is still on."
    if name == "medium":
        return (
            f"The washing machine {number} has finished its cycle, "
            "and the laundry is ready to be hung up in the garden."
        )
    return (
        f"Good morning, it is {number} past seven on a cloudy Tuesday, and the outside "
        "temperature is eleven degrees with a light wind from the west. "
        f"Rain is expected from the early afternoon until {number} in the evening, so take an "
        "umbrella if you are going out, and bring the garden cushions inside before noon. "
        f"The recycling bins are collected today, and your meeting {number} starts at nine "
        "thirty."
    )
