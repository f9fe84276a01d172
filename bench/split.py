"""Measurements behind the split and the streaming decoder (docs/measurements.md, "Split
decoder", "Streaming decoder").

1. The split parts run whole against the whole model (noise 0): largest sample difference.
2. Streamed decoding against whole decoding, in runs of several sizes: largest difference, SNR.
3. The decoder's levers: CPU time and wall time of decoding the long text's clause groups
   (their latents computed once), whole, in chunks with context (the decoder before), and
   streamed in runs of 32 and 128 frames by rewrites that carry 1, 2 or all 3 upsampling stages
   in states; each with the pool's threads spinning (ONNX Runtime's default) or blocking (the
   agent's). Runs interleaved, alternating order; medians and minima.

Usage: `python -m bench.split [--reps 7] [--threads 2]` (several minutes: it builds the rewrites).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from agent.formats.chunking import decoder_runs
from agent.speech import split_graph
from agent.speech.decoder_parts import StreamSpec, decode_frames, encode, flow_until
from agent.speech.sessions import NO_SPINNING, save_optimized
from agent.speech.stream_graph import stream_decoder
from agent.speech.voice import FramePlan, SynthesisParams, Voice, bundled_voice
from bench.texts import SPEED_TEXTS, uncached_unpunctuated

NOISELESS = SynthesisParams(0.0, 1.0, 0.0)
SENTENCES = (
    "Ready.",
    "The kitchen light is still on.",
    "Warning: pump three pressure is high; check the valve, then call the engineer on duty.",
    SPEED_TEXTS["long"],
    uncached_unpunctuated(random.Random(1), 0),  # noqa: S311 - varied words, not secrets
)
RUN_SIZES = (13, 1, 32, 128)
"""Runs of the streamed decoding compared with whole decoding (the first run is at least the
voice's `first`)."""
CONTEXT_FRAMES = 12
"""The decoder's context frames on each side when chunks are decoded with context."""

Decode = Callable[[np.ndarray], None]


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


def streamed(split: Voice) -> None:
    """2. Streamed decoding in runs of each size against whole decoding."""
    print("## 2. streamed decoding, in runs of n frames, against whole decoding (noise 0)")
    parts = split._engine.parts
    assert parts is not None  # noqa: S101 - the bundled voice splits
    for size in RUN_SIZES:
        worst, snrs = 0.0, []
        for text in SENTENCES:
            for ids in split.sentence_ids(text):
                reference = split.render(ids, NOISELESS, FramePlan.whole())
                latent = encode(parts, ids, (0.0, 1.0, 0.0), None, None)
                pieces = [
                    decode_frames(parts, latent, run, None)
                    for run in _runs(latent.frames, size, parts.stream)
                ]
                audio = np.concatenate(pieces)
                worst = max(worst, float(np.abs(audio - reference).max()))
                snrs.append(snr_db(reference, audio))
        print(f"runs of {size:3d}: max |difference| {worst:.2g}, SNR >= {min(snrs):.0f} dB")


def _runs(frames: int, size: int, spec: StreamSpec | None) -> list[range]:
    first = 0 if spec is None else spec.first
    return decoder_runs(range(frames), size, first=first)


def _session(path: Path, threads: int, spinning: bool) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if not spinning:
        options.add_session_config_entry(*NO_SPINNING)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def rewrites(work: Path, threads: int) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The decoder part and its streaming rewrites with 1, 2 and 3 stateful upsampling stages,
    each optimized as the build optimizes it: {name: (model, spec)}."""
    whole = work / "model.onnx"
    split_graph.externalize(bundled_voice(), whole)
    split_graph.split_model(whole)
    decoder = onnx.load(str(work / "decoder.onnx"), load_external_data=False)
    z = decoder.graph.input[0].name
    built: dict[str, tuple[Path, dict[str, Any]]] = {}
    optimized = work / "decoder-opt.onnx"
    save_optimized(str(work / "decoder.onnx"), optimized, threads)
    built["decoder"] = (optimized, {})
    for stages in (1, 2, 3):
        model, spec = stream_decoder(decoder, z, "output", stages)
        plain = work / f"stream{stages}.onnx"
        onnx.save_model(model, str(plain))
        target = work / f"stream{stages}-opt.onnx"
        save_optimized(str(plain), target, threads)
        built[f"u{stages}"] = (target, spec)
    return built


def levers(split: Voice, work: Path, reps: int, threads: int) -> None:
    """3. The decoder's CPU and wall time, by way of decoding."""
    print(f"## 3. decoding the long text's clause groups, {threads} threads: CPU and wall ms")
    parts = split._engine.parts
    assert parts is not None  # noqa: S101 - the bundled voice splits
    latents = []
    for ids in split.sentence_ids(SPEED_TEXTS["long"]):
        latent = encode(parts, ids, (0.667, 1.0, 0.8), None, None)
        latents.append(np.ascontiguousarray(flow_until(parts, latent, latent.frames, None)))
    built = rewrites(work, threads)
    ways: dict[str, Decode] = {}
    for spinning in (True, False):
        threads_wait = "spinning" if spinning else "blocking"
        decoder = _session(built["decoder"][0], threads, spinning)
        ways[f"whole, {threads_wait}"] = _whole(decoder)
        ways[f"context, 128-frame chunks, {threads_wait}"] = _with_context(decoder, 128)
        for name in ("u1", "u2", "u3"):
            path, spec = built[name]
            session = _session(path, threads, spinning)
            for size in (32, 128):
                label = f"streamed {name}, {size}-frame runs, {threads_wait}"
                ways[label] = _streamed(session, spec, size)
    for way in ways.values():  # warm-up: first runs on new shapes are slower
        for z in latents:
            way(z)
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    wall: dict[str, list[float]] = {name: [] for name in ways}
    for rep in range(reps):
        order = list(ways) if rep % 2 else list(ways)[::-1]
        for name in order:
            time.sleep(0.05)
            began, used = time.perf_counter(), time.process_time()
            for z in latents:
                ways[name](z)
            cpu[name].append(time.process_time() - used)
            wall[name].append(time.perf_counter() - began)
    base = statistics.median(cpu["whole, spinning"])
    for name in ways:
        median, seconds = statistics.median(cpu[name]), statistics.median(wall[name])
        print(
            f"{name:44s} CPU {median * 1000:5.0f} (min {min(cpu[name]) * 1000:5.0f}, "
            f"{(median / base - 1) * 100:+5.1f} %), wall {seconds * 1000:5.0f}"
        )


def _whole(session: ort.InferenceSession) -> Decode:
    name = session.get_inputs()[0].name

    def decode(z: np.ndarray) -> None:
        session.run(None, {name: z})

    return decode


def _with_context(session: ort.InferenceSession, size: int) -> Decode:
    name = session.get_inputs()[0].name

    def decode(z: np.ndarray) -> None:
        frames = z.shape[-1]
        for run in decoder_runs(range(frames), size, first=32):
            begin, end = max(0, run.start - CONTEXT_FRAMES), min(frames, run.stop + CONTEXT_FRAMES)
            session.run(None, {name: np.ascontiguousarray(z[:, :, begin:end])})

    return decode


def _streamed(session: ort.InferenceSession, spec: dict[str, Any], size: int) -> Decode:
    states = spec["states"]
    names = [spec["output"], *(state["next"] for state in states.values())]

    def decode(z: np.ndarray) -> None:
        frames = z.shape[-1]
        carried = {n: np.zeros((*s["lead"], s["initial"]), np.float32) for n, s in states.items()}
        for run in decoder_runs(range(frames), size, first=spec["first"]):
            last = run.stop == frames
            feed = {
                spec["z"]: np.ascontiguousarray(z[:, :, run.start : run.stop]),
                spec["end"]: np.zeros(1 if last else 0, np.float32),
                **carried,
            }
            outputs = session.run(names, feed)
            carried = dict(zip(states, outputs[1:], strict=True))

    return decode


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and print them."""
    parser = argparse.ArgumentParser(prog="python -m bench.split", description=__doc__)
    parser.add_argument("--reps", type=int, default=7, help="interleaved repetitions")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="voice-agent-split-") as tmp:
        split = Voice.load(bundled_voice(), threads=args.threads, cache_dir=Path(tmp))
        whole = Voice.load(bundled_voice(), threads=args.threads, cache_dir=Path(tmp), split=False)
        equivalence(split, whole)
        streamed(split)
        del whole
        work = Path(tmp) / "rewrites"
        work.mkdir()
        levers(split, work, args.reps, args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
