"""The health check of a candidate voice model, run in its own process before a switch.

`python -m agent.speech.healthcheck MODEL [--reference OLD_MODEL] [--rate HZ] [--cache-dir
DIR]` loads the model, synthesizes fixed phrases with noise 0, and checks the audio is finite, not
silent and of a plausible length for the text, that the sample rate is the one the device is open
at, and that it is not much slower than the current model. It prints one JSON line and exits 0 when
healthy. A crash, a hang or a memory blow-up of a bad model stays in this process: the caller
limits its memory and time.

With `--cache-dir` (the agent's model cache) the candidate's split parts are built there (in
child processes, as at any first load) and both models are loaded from it, one after the other,
the first released before the second: the agent then loads the candidate from the cache
without building anything, and this process holds one voice at a time (docs/memory.md).
The candidate and its `.onnx.json` must be regular files, not links (a slot holds only what
the updater linked there from its verified downloads): a link is a problem, never followed.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import stat
import sys
import time
from pathlib import Path
from typing import Final

import numpy as np

from agent.speech.sessions import use_memory_arena
from agent.speech.voice import SynthesisParams, Voice

PHRASES: Final = (
    "Testing the new voice: one, two, three.",
    "Fire alarm in hall two. Please leave the building.",
)
SECONDS_PER_CHARACTER: Final = (0.015, 0.25)
"""Plausible speech length per character of text."""
SILENCE_DBFS: Final = -55.0
MAX_SLOWDOWN: Final = 3.0
"""The candidate may take at most this many times the current model's compute time..."""
SLOWDOWN_GRACE_SECONDS: Final = 0.25
"""...or at most this much longer in all (timing noise on models that take milliseconds)."""
TIMED_ROUNDS: Final = 3
"""The phrases are rendered once untimed (the audio checks), then this many times timed: the
compute time is the least CPU time (the process's, every thread) of a round. One wall-clock
round judged a copy of the current model 4.6x slower in a busy 512 MB group (CI, 2026-12-06)."""


def measure(
    model: Path, threads: int, cache_dir: Path | None = None
) -> tuple[int, float, float, list[str]]:
    """(sample rate, compute seconds, audio seconds, problems) for the fixed phrases: the
    compute seconds are the least CPU time of `TIMED_ROUNDS` rounds (a busy or short-of-memory
    machine stretches wall time, not CPU time); the voice is released when this returns."""
    voice = Voice.load(model, threads, cache_dir)
    voice.prewarm()
    params = SynthesisParams(0.0, voice.default_params.length_scale, 0.0)
    problems: list[str] = []
    audio_seconds = 0.0
    sentences = [voice.sentence_ids(phrase) for phrase in PHRASES]
    for phrase, ids_list in zip(PHRASES, sentences, strict=True):
        parts = [voice.render(ids, params) for ids in ids_list]
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        seconds = len(audio) / voice.sample_rate
        audio_seconds += seconds
        if not np.isfinite(audio).all():
            problems.append("non_finite_audio")
            continue
        level = 10 * np.log10(float(np.mean(audio.astype(np.float64) ** 2)) + 1e-12)
        if level < SILENCE_DBFS:
            problems.append(f"silent ({level:.0f} dBFS)")
        low, high = (len(phrase) * s for s in SECONDS_PER_CHARACTER)
        if not low <= seconds <= high:
            problems.append(f"implausible length {seconds:.2f} s for {len(phrase)} characters")
    rounds = []
    for _ in range(TIMED_ROUNDS if not problems else 0):
        began = time.process_time()
        for ids_list in sentences:
            for ids in ids_list:
                voice.render(ids, params)
        rounds.append(time.process_time() - began)
    return voice.sample_rate, min(rounds, default=0.0), audio_seconds, problems


def not_regular(model: Path) -> list[str]:
    """The candidate's files that are links or not regular files (lstat: never followed)."""
    problems = []
    for path in (model, Path(f"{model}.json")):
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:
            problems.append(f"{path.name} is missing")
            continue
        if stat.S_ISLNK(mode):
            problems.append(f"{path.name} is a symbolic link (refused, not followed)")
        elif not stat.S_ISREG(mode):
            problems.append(f"{path.name} is not a regular file")
    return problems


def main() -> int:
    """Check MODEL; print {"ok": ..., "problems": [...], ...}."""
    parser = argparse.ArgumentParser(description="Health check of a voice model.")
    parser.add_argument("model", type=Path)
    parser.add_argument("--reference", type=Path, default=None)
    parser.add_argument("--rate", type=int, default=None, help="the device's sample rate")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory-mb", type=int, default=None, help="address-space limit")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="the agent's model cache (cache.dir)"
    )
    args = parser.parse_args()
    use_memory_arena(False)  # a throwaway process: held to what one run needs (docs/memory.md)
    if args.memory_mb is not None:  # set here, not by the parent: it has threads (no preexec)
        limit = args.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    linked = not_regular(args.model)
    if linked:
        print(json.dumps({"ok": False, "problems": linked}))
        return 1
    rate, compute, audio, problems = measure(args.model, args.threads, args.cache_dir)
    gc.collect()  # the candidate's sessions are gone before the reference loads
    if args.rate is not None and rate != args.rate:
        problems.append(f"sample rate {rate} Hz, the device runs at {args.rate} Hz")
    report: dict[str, object] = {"rate": rate, "compute_s": compute, "audio_s": audio}
    if args.reference is not None and not problems:
        _, reference_compute, _, _ = measure(args.reference, args.threads, args.cache_dir)
        report["slowdown"] = compute / max(reference_compute, 1e-6)
        if compute > max(
            MAX_SLOWDOWN * reference_compute, reference_compute + SLOWDOWN_GRACE_SECONDS
        ):
            problems.append(f"{compute / reference_compute:.1f}x slower than the current model")
    report |= {"ok": not problems, "problems": problems}
    print(json.dumps(report))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
