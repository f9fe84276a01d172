"""The five measurements, each ours against piper-tts on the same voice, in the same run.

Trials of the two sides are interleaved and alternate which goes first, so that drift in the
load of a shared machine falls on both. Each function returns `Entry`s for the report table and
details for results.json.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from bench.agent_side import AgentUnderTest
from bench.stats import Entry, Target, percentile
from bench.synth import ChildRun, Synth
from bench.texts import CACHED_PHRASE, SPEED_TEXTS, uncached_text

OURS: Final = "ours"
PIPER: Final = "piper"
MS: Final = 1000.0

Say = Callable[[str], None]
"""Prints a progress line."""


@dataclass(frozen=True)
class Plan:
    """Repetitions of each measurement."""

    speed_reps: int
    ttfa_trials: int
    cached_messages: int
    cold_starts: int


FULL: Final = Plan(speed_reps=9, ttfa_trials=15, cached_messages=300, cold_starts=7)
QUICK: Final = Plan(speed_reps=3, ttfa_trials=3, cached_messages=40, cold_starts=2)


@dataclass
class Measured:
    """Rows for the report and anything else worth keeping."""

    entries: list[Entry]
    details: dict[str, Any] = field(default_factory=dict)


def sides(trial: int) -> tuple[str, str]:
    """Which side goes first in a trial: alternating."""
    return (OURS, PIPER) if trial % 2 == 0 else (PIPER, OURS)


def warm_speed(ours: Synth, piper: Synth, reps: int, say: Say) -> Measured:
    """1. Seconds of audio per second of compute, warm, in process, on short/medium/long texts."""
    synths = {OURS: ours, PIPER: piper}
    for text in SPEED_TEXTS.values():
        for synth in synths.values():
            synth(text)  # warm-up: first runs on new shapes are slower
    speed: dict[str, dict[str, list[float]]] = {n: {OURS: [], PIPER: []} for n in SPEED_TEXTS}
    audio: dict[str, list[float]] = {name: [] for name in SPEED_TEXTS}
    for rep in range(reps):
        for name, text in SPEED_TEXTS.items():
            for side in sides(rep):
                timing = synths[side](text)
                speed[name][side].append(timing.speed)
                audio[name].append(timing.audio)
        say(f"warm speed: repetition {rep + 1}/{reps}")
    entries = [
        Entry(
            key=f"warm_speed_{name}",
            label=f"warm synthesis speed, {name} text (~{percentile(audio[name], 50):.1f} s audio)",
            unit="x",
            ours=speed[name][OURS],
            piper=speed[name][PIPER],
            target=Target(1.15, at_most=False),
        )
        for name in SPEED_TEXTS
    ]
    return Measured(entries, {"audio_seconds": audio})


def first_audio(agent: AgentUnderTest, piper: Synth, trials: int, tag: str, say: Say) -> Measured:
    """2. Time to first audio of uncached three-sentence texts: ours through MQTT, piper in process.

    Ours is publish → `started`; the next trial begins after `finished`, so that the agent's
    synthesis of later sentences does not overlap piper-tts's trial.
    """
    rng = random.Random()  # noqa: S311 - varied words, not secrets
    agent.speak(uncached_text(rng, trials), f"{tag}-ttfa-warmup")
    texts = [uncached_text(rng, trial) for trial in range(trials)]
    ours_ms: list[float] = []
    whole_ms: list[float] = []
    first_ms: list[float] = []
    for trial, text in enumerate(texts):
        for side in sides(trial):
            if side == OURS:
                ours_ms.append(agent.speak(text, f"{tag}-ttfa-{trial}").started * MS)
            else:
                timing = piper(text)
                whole_ms.append(timing.total * MS)
                first_ms.append(timing.first * MS)
        say(f"first audio: trial {trial + 1}/{trials}")
    label = "time to first audio, uncached 3 sentences (ours: publish → started)"
    entries = [
        Entry(
            "ttfa_vs_piper_whole_text",
            f"{label}; piper-tts: whole text",
            "ms",
            ours_ms,
            whole_ms,
            target=Target(0.3, at_most=True),
        ),
        Entry(
            "ttfa_vs_piper_first_sentence",
            f"{label}; piper-tts: first sentence",
            "ms",
            ours_ms,
            first_ms,
        ),
    ]
    return Measured(entries, {"texts": texts})


def cached_latency(agent: AgentUnderTest, messages: int, tag: str, say: Say) -> Measured:
    """3. Publish → `started` of a phrase spoken once before, one message at a time."""
    agent.speak(CACHED_PHRASE, f"{tag}-cached-warmup")
    samples: list[float] = []
    for index in range(messages):
        samples.append(agent.speak(CACHED_PHRASE, f"{tag}-cached-{index}").started * MS)
        if (index + 1) % max(1, messages // 4) == 0:
            say(f"cached latency: {index + 1}/{messages} messages")
    label = "cached phrase, publish → started"
    entries = [
        Entry(
            f"cached_latency_p{q:g}",
            f"{label}, p{q:g}",
            "ms",
            samples,
            q=q,
            target=Target(bound, at_most=True, on_ratio=False),
        )
        for q, bound in ((50.0, 10.0), (99.0, 30.0))
    ]
    return Measured(entries, {"phrase": CACHED_PHRASE})


def cold_start(
    ours: Callable[[], float], piper: Callable[[], float], starts: int, say: Say
) -> Measured:
    """4. Spawn → ready: the agent's retained `online`, piper-tts's child synthesizing a sentence.

    The first start of each side is a warm-up (optimized-model cache, page cache) and not kept.
    """
    runs = {OURS: ours, PIPER: piper}
    samples: dict[str, list[float]] = {OURS: [], PIPER: []}
    for trial in range(starts + 1):
        for side in sides(trial):
            seconds = runs[side]()
            if trial > 0:
                samples[side].append(seconds)
        say(f"cold start: {'warm-up' if trial == 0 else f'{trial}/{starts}'} done")
    entry = Entry(
        "cold_start",
        "cold start: spawn → `online` (piper-tts: spawn → first sentence synthesized)",
        "s",
        samples[OURS],
        samples[PIPER],
        target=Target(0.6, at_most=True),
    )
    return Measured([entry])


def memory(
    agent: AgentUnderTest,
    piper_child: Callable[[Sequence[str]], ChildRun],
    spoken: Sequence[str],
    tag: str,
) -> Measured:
    """5. VmHWM and VmRSS of the agent after the workload, and of piper-tts on the same texts."""
    for name, text in SPEED_TEXTS.items():
        agent.speak(text, f"{tag}-workload-{name}")
    ours = agent.memory()
    theirs = piper_child([*spoken, *SPEED_TEXTS.values()]).memory
    entries = [
        Entry(
            "peak_rss",
            "peak RSS after the workload incl. the long text (VmHWM)",
            "MB",
            [ours.peak_mb],
            [theirs.peak_mb],
            target=Target(1.0, at_most=True),
        ),
        Entry("steady_rss", "RSS after the workload (VmRSS)", "MB", [ours.rss_mb], [theirs.rss_mb]),
    ]
    return Measured(entries)
