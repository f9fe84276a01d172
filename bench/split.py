"""Measurements behind the split decoder (docs/measurements.md, "Split decoder").

1. The split parts run whole against the whole model (noise 0): largest sample difference.
2. Chunked decoding against whole decoding for decoder and flow contexts around the measured
   reach: largest difference and SNR.
3. Chunk plans (first chunk, growth, largest chunk): total compute against decoding each clause
   group whole, and first audio, in process (medians and minima of interleaved runs).

Usage: `python -m bench.split [--reps 9]` (about two minutes).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agent.speech.voice import FramePlan, SynthesisParams, Voice, bundled_voice
from bench import synth
from bench.texts import SPEED_TEXTS, uncached_text, uncached_unpunctuated

NOISELESS = SynthesisParams(0.0, 1.0, 0.0)
SENTENCES = (
    "Ready.",
    "The kitchen light is still on.",
    "Warning: pump three pressure is high; check the valve, then call the engineer on duty.",
    SPEED_TEXTS["long"],
    uncached_unpunctuated(random.Random(1), 0),  # noqa: S311 - varied words, not secrets
)
CONTEXTS: tuple[tuple[int, int], ...] = ((8, 33), (9, 33), (10, 33), (11, 33), (12, 33))
CONTEXTS += ((16, 33), (12, 16), (12, 24), (12, 28), (12, 32))
"""(decoder, flow) context frames tried."""
PLANS = {  # first frames, growth, largest chunk
    "32, x4, 256 (chosen)": (32, 4, 256),
    "32, x4, 512": (32, 4, 512),
    "32, x2, 256": (32, 2, 256),
    "16, x4, 256": (16, 4, 256),
    "48, x4, 256": (48, 4, 256),
    "32, x4, 128": (32, 4, 128),
}


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """Signal to difference ratio in dB (inf when equal)."""
    noise = float(np.sum((reference.astype(np.float64) - other) ** 2))
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(signal / noise)


def equivalence(split: Voice, whole: Voice) -> None:
    """1. Parts run whole against the whole model."""
    print("## 1. parts run whole against the whole model (noise 0)")
    for text in SENTENCES:
        for ids in split.sentence_ids(text):
            ours = split.render(ids, NOISELESS, FramePlan.whole())
            theirs = whole.render(ids, NOISELESS)
            print(f"{len(ours) / 22050:5.2f} s: max |difference| {np.abs(ours - theirs).max():.3g}")


def contexts(split: Voice) -> None:
    """2. Chunked against whole decoding, by context."""
    print("## 2. chunked decoding (every 32 frames, flow head) against whole, by context")
    ids = split.sentence_ids(SENTENCES[-1])[0]
    reference = split.render(ids, NOISELESS, FramePlan.whole())
    for decoder, flow in CONTEXTS:
        shaped = split.with_context(decoder, flow)
        audio = shaped.render(ids, NOISELESS, FramePlan(32, 32, 1))
        print(
            f"decoder context {decoder:2d}, flow {flow:2d}: max |difference| "
            f"{np.abs(audio - reference).max():.2g}, SNR {snr_db(reference, audio):.0f} dB"
        )


def plans(split: Voice, whole: Voice, reps: int) -> None:
    """3. Chunk plans: compute overhead and first audio."""
    print("## 3. chunk plans: total compute against whole clause groups, first audio (ms)")
    rng = random.Random(8)  # noqa: S311 - varied words, not secrets
    kinds = {
        "3 sentences": [uncached_text(rng, n) for n in range(3)],
        "long text": [SPEED_TEXTS["long"]],
        "unpunctuated": [uncached_unpunctuated(rng, n) for n in range(2)],
    }
    for kind, texts in kinds.items():
        runs: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in ["whole", *PLANS]}
        for rep in range(reps + 1):
            names = list(runs) if rep % 2 else list(runs)[::-1]
            for name in names:
                totals = [_timed(whole if name == "whole" else split, t, name) for t in texts]
                if rep:  # the first round warms up
                    runs[name][0].append(sum(total for total, _ in totals))
                    runs[name][1].append(statistics.mean(first for _, first in totals))
        base, base_min = statistics.median(runs["whole"][0]), min(runs["whole"][0])
        first = statistics.median(runs["whole"][1]) * 1000
        print(
            f"### {kind}: whole groups {base * 1000:.0f} ms "
            f"(min {base_min * 1000:.0f}), first {first:.0f}"
        )
        for name in PLANS:
            total, first_audio = runs[name]
            print(
                f"{name:22s} total {(statistics.median(total) / base - 1) * 100:+5.1f} % "
                f"(min {(min(total) / base_min - 1) * 100:+5.1f} %), "
                f"first {statistics.median(first_audio) * 1000:.0f}"
            )


def _timed(voice: Voice, text: str, plan: str) -> tuple[float, float]:
    began = time.perf_counter()
    first = None
    chunks = synth.agent_chunks(voice, text, voice.default_params, PLANS.get(plan, synth.PLAN))
    for _ in chunks:
        first = first or time.perf_counter() - began
    return time.perf_counter() - began, first or 0.0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.split", description=__doc__)
    parser.add_argument("--reps", type=int, default=9, help="interleaved repetitions")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="voice-agent-split-") as tmp:
        split = Voice.load(bundled_voice(), threads=2, cache_dir=Path(tmp))
        whole = Voice.load(bundled_voice(), threads=2, cache_dir=Path(tmp), split=False)
        equivalence(split, whole)
        contexts(split)
        plans(split, whole, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
