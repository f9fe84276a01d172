"""Measure the pauses where a sentence is split at clause joins, against whole-sentence speech.

Usage: .venv/bin/python bench/memory/measure_clause_joins.py [--budget N]
For each test sentence (noise scales 0, the bundled voice) it synthesizes the sentence whole and
in clause groups (as the agent streams it), and prints: the silence at each join (end of one
group plus start of the next; 10 ms frames under -45 dBFS), the pauses of 150 ms or more inside
the whole and the streamed sentence, and both durations.
"""

from __future__ import annotations

import argparse

import numpy as np
import numpy.typing as npt

from agent.formats.chunking import group_clauses
from agent.speech.voice import SynthesisParams, Voice, bundled_voice

SENTENCES = [
    "Attention please, the delivery van has arrived at the loading dock, and someone from "
    "receiving should come and sign for the pallets.",
    "Warning: pump three pressure is high; please check the valve, then call the supervisor.",
    "The front door is open, the garage door is open, and the kitchen window is open.",
    "If the alarm sounds again — even briefly — leave the building by the nearest exit.",
]


def gaps_ms(audio: npt.NDArray[np.float32], rate: int) -> list[int]:
    """Lengths of the silent stretches inside the audio (leading/trailing silence excluded)."""
    frame = rate // 100
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    silent = 10 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12) < -45
    voiced = np.flatnonzero(~silent)
    if len(voiced) == 0:
        return []
    inner = silent[voiced[0] : voiced[-1] + 1]
    runs, count = [], 0
    for quiet in inner:
        if quiet:
            count += 1
        elif count:
            runs.append(count * 10)
            count = 0
    return [r for r in runs if r >= 40]


def edge_silence_ms(audio: npt.NDArray[np.float32], rate: int) -> tuple[int, int]:
    """Silent milliseconds at the start and at the end of the audio."""
    frame = rate // 100
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    silent = 10 * np.log10(np.mean(frames.astype(np.float64) ** 2, axis=1) + 1e-12) < -45
    voiced = np.flatnonzero(~silent)
    if len(voiced) == 0:
        return len(silent) * 10, 0
    return int(voiced[0]) * 10, int(len(silent) - 1 - voiced[-1]) * 10


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=int, default=40)
    args = parser.parse_args()
    voice = Voice.load(bundled_voice(), threads=2, cache_dir=None)
    params = SynthesisParams(0.0, voice.default_params.length_scale, 0.0)
    print(
        "| sentence | chunks | join pauses ms | whole: pauses >= 150 ms "
        "| streamed: pauses >= 150 ms | whole s | streamed s |"
    )
    print("|---|---|---|---|---|---|---|")
    for text in SENTENCES:
        (sentence,) = voice.sentences(text)
        whole = voice.render(voice.ids(sentence), params)
        groups = group_clauses([len(c) for c in sentence], args.budget)
        parts = [voice.render(voice.ids(sentence[g.start : g.stop]), params) for g in groups]
        streamed = np.concatenate(parts)
        rate = voice.sample_rate
        edges = [edge_silence_ms(part, rate) for part in parts]
        joins = [edges[k][1] + edges[k + 1][0] for k in range(len(parts) - 1)]
        long_whole = [g for g in gaps_ms(whole, rate) if g >= 150]
        long_streamed = [g for g in gaps_ms(streamed, rate) if g >= 150]
        print(
            f"| {text[:38]}… | {len(groups)} | {joins} | {long_whole} | {long_streamed} | "
            f"{len(whole) / rate:.2f} | {len(streamed) / rate:.2f} |"
        )


if __name__ == "__main__":
    main()
