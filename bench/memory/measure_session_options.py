"""Measure ONNX Runtime session options on a Piper voice: load time and warm inference time.

Usage: .venv/bin/python bench/memory/measure_session_options.py [MODEL.onnx] [--repeat N]
Prints a Markdown table (medians, runs interleaved); docs/measurements.md records a run
and the choice made.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from agent.speech.voice import Voice, bundled_voice

TEXTS = {
    "short": "The front door is open.",
    "medium": "Warning: pump three pressure is high, please check the valve immediately.",
    "long": (
        "Attention please, the delivery van has arrived at the loading dock behind the north "
        "warehouse, and someone from receiving should come and sign for the pallets before "
        "the driver leaves for the next stop on the route this afternoon."
    ),
}
LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def options(threads: int, level: ort.GraphOptimizationLevel, save: str = "") -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = level
    if save:
        opts.optimized_model_filepath = save
    return opts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    model = args.model or bundled_voice()
    voice = Voice.load(model, threads=2, cache_dir=None)  # for phoneme ids only
    params = voice.default_params
    feeds: dict[str, dict[str, np.ndarray]] = {}
    for name, text in TEXTS.items():
        ids = voice.sentence_ids(text)[0]
        feeds[name] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(
                [0.0, params.length_scale, 0.0],
                dtype=np.float32,  # noise 0: same work each run
            ),
        }
    with tempfile.TemporaryDirectory() as tmp:
        saved = str(Path(tmp) / "extended.onnx")
        ort.InferenceSession(str(model), options(2, LEVELS["extended"], saved))
        variants = [
            (f"{threads} thr, {level}", str(model), threads, LEVELS[level])
            for threads in (1, 2)
            for level in LEVELS
        ]
        variants.append(("2 thr, saved extended copy + all", saved, 2, LEVELS["all"]))
        variants.append(("2 thr, saved extended copy + disable", saved, 2, LEVELS["disable"]))
        sessions: dict[str, ort.InferenceSession] = {}
        loads: dict[str, float] = {}
        for label, path, threads, level in variants:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                sessions[label] = ort.InferenceSession(path, options(threads, level))
                times.append(time.perf_counter() - start)
            loads[label] = statistics.median(times)
        runs: dict[str, dict[str, list[float]]] = {
            label: {name: [] for name in feeds} for label in sessions
        }
        for session in sessions.values():
            for feed in feeds.values():
                session.run(None, feed)  # warm-up
        for _ in range(args.repeat):  # interleaved, so drift on a shared machine hits all alike
            for label, session in sessions.items():
                for name, feed in feeds.items():
                    start = time.perf_counter()
                    session.run(None, feed)
                    runs[label][name].append(time.perf_counter() - start)
        header = " | ".join(
            f"{n} ({voice_seconds(voice, f):.1f} s audio)" for n, f in feeds.items()
        )
        print(f"| session | load s | {header} |")
        print("|---|---|" + "---|" * len(feeds))
        for label, by_text in runs.items():
            cells = " | ".join(f"{statistics.median(r):.3f}" for r in by_text.values())
            print(f"| {label} | {loads[label]:.2f} | {cells} |")


def voice_seconds(voice: Voice, feed: dict[str, np.ndarray]) -> float:
    ids = feed["input"][0].tolist()
    return len(voice.render(ids, voice.default_params)) / voice.sample_rate


if __name__ == "__main__":
    main()
