"""Operator tool: build quantized / reduced-precision variants of a Piper voice and judge them.

`python -m tiers.quantize MODEL.onnx --out-dir DIR [--texts FILE] [--repeat N]` builds every
variant of tiers.variants (FP32 baseline, INT8 dynamic, INT8 static QDQ in several flavours, FP16),
then reports for each: file size, speed against FP32 measured in the same run (all variants'
runs interleaved sentence by sentence; median of per-round ratios), and the DTW-aligned log-mel
distance in dB (tiers.audio_distance) to the FP32 output with noise scales 0 on a fixed text
set. A variant is publishable only when it is at least MIN_SPEEDUP times faster and at most
MAX_DISTANCE_DB away. Writes DIR/quantize.json and DIR/quantize.md. A variant that fails to
build or run is reported with its error; the run goes on.

This module holds the text sets, the measurement (sessions, synthesis, interleaved timing),
the publish gate, the report writers and the CLI; metric functions are re-exported from
tiers.audio_distance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.core.tiers import MAX_DISTANCE_DB, MIN_SPEEDUP, is_publishable
from agent.speech.voice import SynthesisParams, Voice
from tiers.audio_distance import (
    F_MAX,
    FLOOR_DB,
    HOP,
    N_FFT,
    N_MELS,
    frame_distance_db,
    log_mel_db,
    log_mel_distance_db,
)
from tiers.variants import (
    BuildInputs,
    Variant,
    default_variants,
    make_feed,
    quiet_onnxruntime_tools,
)

__all__ = [
    "MAX_DISTANCE_DB",
    "MIN_SPEEDUP",
    "Report",
    "VariantResult",
    "frame_distance_db",
    "is_publishable",
    "log_mel_db",
    "log_mel_distance_db",
    "main",
    "run",
]

_LOGGER = logging.getLogger(__name__)

THREADS: Final = 2
DEFAULT_REPEAT: Final = 5
NOISE_SEED: Final = 1234
NOISELESS: Final = SynthesisParams(noise_scale=0.0, length_scale=1.0, noise_w=0.0)

EVALUATION_TEXTS: Final = (
    "The weather today is sunny with a light breeze from the west, and it should stay warm "
    "until the evening.",
    "Your timer for twelve minutes is done.",
    "Would you like me to read the message again?",
    "Warning! The front door has been open for more than five minutes.",
    "On March 3rd, 2024, the meeting starts at 9:45 in room 101.",
    "She sells seashells by the seashore, but only on Sundays.",
    "Okay.",
    "Turning off the living room lights and setting the thermostat to twenty-one degrees.",
)
CALIBRATION_TEXTS: Final = (
    "The quick brown fox jumps over the lazy dog.",
    "Please remind me to call my sister tomorrow at noon.",
    "How much does it cost to ship a package to Canada?",
    "Good morning! It is seven o'clock and the coffee is ready.",
    "The battery is low; please plug in the charger.",
    "I could not find any songs by that artist.",
)


@dataclass
class VariantResult:
    """Everything the report says about one variant."""

    name: str
    description: str
    file: str | None = None
    size_bytes: int | None = None
    build_seconds: float | None = None
    round_seconds: list[float] = field(default_factory=list)
    """Time to synthesize every evaluation sentence, once per timing round."""
    speedup: float | None = None
    """Median over rounds of FP32 time / this variant's time in the same round."""
    sentence_distances_db: list[float] = field(default_factory=list)
    distance_db: float | None = None
    """Mean of the per-sentence log-mel distances to the FP32 reference."""
    noisy_distance_db: float | None = None
    """The same at the voice's default noise scales, same seed as FP32 (not gated)."""
    publishable: bool = False
    error: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Report:
    """One run of the tool."""

    model: str
    model_sha256: str
    onnxruntime: str
    sample_rate: int
    texts: list[str]
    sentences: int
    audio_seconds: float
    repeat: int
    variants: list[VariantResult]
    reference_points: dict[str, float]
    run_seconds: float = 0.0
    gate: dict[str, float] = field(
        default_factory=lambda: {"min_speedup": MIN_SPEEDUP, "max_distance_db": MAX_DISTANCE_DB}
    )
    metric: str = (
        f"log-mel: Hann STFT n_fft {N_FFT}, hop {HOP}, {N_MELS} HTK mel bands 0-{F_MAX:.0f} Hz, "
        f"10*log10 power (window-sum scaled, full-scale sine = -6 dB), floor {FLOOR_DB:.0f} dB; "
        "distance: mean absolute dB difference over bands and steps of the DTW path "
        "(frame-wise Euclidean cost), averaged over sentences"
    )


def read_texts(path: Path | None) -> list[str]:
    """The evaluation texts: one per non-blank line of path, or the built-in set."""
    if path is None:
        return list(EVALUATION_TEXTS)
    texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [t for t in texts if t]


def sentence_ids(voice: Voice, texts: Sequence[str]) -> list[list[int]]:
    """Phoneme ids of every sentence of every text, in order."""
    return [ids for text in texts for ids in voice.sentence_ids(text)]


def open_session(path: Path) -> ort.InferenceSession:
    """A session like the agent's: 2 intra-op threads, sequential, ORT_ENABLE_ALL."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def synthesize(
    session: ort.InferenceSession, ids: Sequence[int], params: SynthesisParams = NOISELESS
) -> npt.NDArray[np.float32]:
    """One inference: phoneme ids to float samples."""
    scales = (params.noise_scale, params.length_scale, params.noise_w)
    output = session.run(None, make_feed(ids, scales))[0]
    return np.asarray(output, dtype=np.float32).reshape(-1)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc) else ''}"


def build(variant: Variant, inputs: BuildInputs, out_dir: Path) -> VariantResult:
    """Build one variant into out_dir; a failure is recorded in the result, not raised."""
    result = VariantResult(variant.name, variant.description)
    if variant.build is None:
        path = inputs.source
    else:
        path = out_dir / f"{inputs.source.stem}.{variant.name}.onnx"
        started = time.perf_counter()
        try:
            with quiet_onnxruntime_tools() as tally:
                try:
                    result.notes += variant.build(inputs, path)
                finally:
                    result.notes += tally.notes()
        except Exception as exc:  # noqa: BLE001 - any failure is this variant's result
            result.error = f"build failed: {_error(exc)}"
            _LOGGER.warning("%s: %s", variant.name, result.error)
            return result
        result.build_seconds = time.perf_counter() - started
    result.file = str(path)
    result.size_bytes = path.stat().st_size
    return result


@dataclass(frozen=True)
class References:
    """What every variant is compared with: FP32 outputs for the evaluation sentences."""

    sentences: list[list[int]]
    noiseless: list[npt.NDArray[np.float32]]
    """Through the agent's Voice, noise scales 0: the gated comparison."""
    noisy: list[npt.NDArray[np.float32]]
    """At the voice's default scales, RandomNormalLike seeded with NOISE_SEED (informational)."""
    noisy_params: SynthesisParams
    sample_rate: int


def distances_db(
    references: Sequence[npt.NDArray[np.float32]],
    outputs: Sequence[npt.NDArray[np.float32]],
    sample_rate: int,
) -> list[float]:
    """Log-mel distance of each output to its reference."""
    return [
        log_mel_distance_db(ref, out, sample_rate)
        for ref, out in zip(references, outputs, strict=True)
    ]


def sampled(
    session: ort.InferenceSession, sentences: Sequence[Sequence[int]], params: SynthesisParams
) -> list[npt.NDArray[np.float32]]:
    """Every sentence through a session."""
    return [synthesize(session, ids, params) for ids in sentences]


def seeded_session(path: Path, seed: int) -> ort.InferenceSession:
    """A session whose RandomNormalLike nodes start from this seed."""
    ort.set_seed(seed)
    return open_session(path)


def evaluate(result: VariantResult, refs: References) -> ort.InferenceSession | None:
    """Open the variant, synthesize every sentence with noise (seeded, first, so the draws
    match FP32's) and without, measure both distances; the runs also warm the session up.
    Returns the session for timing, or None after a failure."""
    if result.file is None:
        return None
    try:
        session = seeded_session(Path(result.file), NOISE_SEED)
        noisy = sampled(session, refs.sentences, refs.noisy_params)
        noiseless = sampled(session, refs.sentences, NOISELESS)
    except Exception as exc:  # noqa: BLE001 - any failure is this variant's result
        result.error = f"run failed: {_error(exc)}"
        _LOGGER.warning("%s: %s", result.name, result.error)
        return None
    result.sentence_distances_db = distances_db(refs.noiseless, noiseless, refs.sample_rate)
    result.distance_db = float(np.mean(result.sentence_distances_db))
    result.noisy_distance_db = float(np.mean(distances_db(refs.noisy, noisy, refs.sample_rate)))
    return session


def time_rounds(
    sessions: dict[str, ort.InferenceSession], sentences: Sequence[Sequence[int]], repeat: int
) -> dict[str, list[float]]:
    """Seconds each session takes for all sentences, once per round. Interleaved finely: each
    sentence goes through every session before the next sentence, in an order that rotates, so
    a burst of load from other work hits all variants alike rather than one of them."""
    names = list(sessions)
    times: dict[str, list[float]] = {name: [0.0] * repeat for name in names}
    for round_index in range(repeat):
        for sentence_index, ids in enumerate(sentences):
            shift = (round_index + sentence_index) % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.perf_counter()
                synthesize(sessions[name], ids)
                times[name][round_index] += time.perf_counter() - started
    return times


def speedup(baseline: Sequence[float], variant: Sequence[float]) -> float:
    """Median over rounds of baseline time / variant time (rounds paired)."""
    return statistics.median(b / v for b, v in zip(baseline, variant, strict=True))


def reference_points(model: Path, refs: References) -> dict[str, float]:
    """How far FP32 is from itself: sampling noise against none, and another seed."""
    other_seed = sampled(seeded_session(model, NOISE_SEED + 1), refs.sentences, refs.noisy_params)
    return {
        "fp32_default_noise_vs_noise0_db": float(
            np.mean(distances_db(refs.noiseless, refs.noisy, refs.sample_rate))
        ),
        "fp32_other_seed_at_default_noise_db": float(
            np.mean(distances_db(refs.noisy, other_seed, refs.sample_rate))
        ),
    }


def run(
    model: Path,
    out_dir: Path,
    texts: Sequence[str] | None = None,
    repeat: int = DEFAULT_REPEAT,
    variants: Sequence[Variant] | None = None,
) -> Report:
    """Build, measure and report every variant; writes quantize.json and quantize.md."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = list(variants) if variants is not None else default_variants()
    if not chosen or chosen[0].build is not None:
        raise ValueError("the first variant must be the FP32 baseline (no builder)")
    texts = list(texts) if texts is not None else list(EVALUATION_TEXTS)
    voice = Voice.load(model, threads=THREADS, cache_dir=None)
    sentences = sentence_ids(voice, texts)
    if not sentences:
        raise ValueError("the texts give no sentences to synthesize")
    defaults = voice.default_params
    refs = References(
        sentences=sentences,
        noiseless=[voice.render(ids, NOISELESS) for ids in sentences],
        noisy=sampled(seeded_session(model, NOISE_SEED), sentences, defaults),
        noisy_params=defaults,
        sample_rate=voice.sample_rate,
    )
    inputs = BuildInputs(
        source=model,
        calibration_ids=sentence_ids(voice, CALIBRATION_TEXTS),
        calibration_scales=(defaults.noise_scale, defaults.length_scale, defaults.noise_w),
    )
    results = []
    for variant in chosen:
        _LOGGER.info("Building %s", variant.name)
        results.append(build(variant, inputs, out_dir))
    sessions = {}
    for result in results:
        _LOGGER.info("Evaluating %s", result.name)
        session = evaluate(result, refs)
        if session is not None:
            sessions[result.name] = session
    baseline = results[0].name
    if baseline in sessions:
        _LOGGER.info("Timing %d variants, %d interleaved rounds", len(sessions), repeat)
        times = time_rounds(sessions, sentences, repeat)
        for result in results:
            if result.name in times:
                result.round_seconds = times[result.name]
                result.speedup = speedup(times[baseline], times[result.name])
    for result in results[1:]:
        result.publishable = is_publishable(result.speedup, result.distance_db)
    report = Report(
        model=str(model),
        model_sha256=hashlib.sha256(model.read_bytes()).hexdigest(),
        onnxruntime=ort.__version__,
        sample_rate=voice.sample_rate,
        texts=list(texts),
        sentences=len(sentences),
        audio_seconds=sum(len(r) for r in refs.noiseless) / voice.sample_rate,
        repeat=repeat,
        variants=results,
        reference_points=reference_points(model, refs),
    )
    report.run_seconds = time.perf_counter() - started
    write_reports(report, out_dir)
    return report


def report_dict(report: Report) -> dict[str, Any]:
    """The JSON form of a report."""
    return asdict(report)


def _cell(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def table_row(result: VariantResult, baseline: str) -> str:
    """One markdown table row: variant | size MB | speed vs FP32 | distance dB | publishable."""
    size = _cell(None if result.size_bytes is None else result.size_bytes / 1e6, ".1f")
    speed = "—"
    if result.speedup is not None:
        speed = f"{result.speedup:.2f}x ({statistics.median(result.round_seconds):.3g} s)"
    distance = "—"
    if result.distance_db is not None:
        distance = f"{result.distance_db:.2f} (max {max(result.sentence_distances_db):.2f})"
    if result.name == baseline:
        verdict = "baseline"
    elif result.error:
        verdict = "no (error)"
    else:
        verdict = "**yes**" if result.publishable else "no"
    return f"| {result.name} | {size} | {speed} | {distance} | {verdict} |"


def noise_lines(report: Report) -> list[str]:
    """The informational (not gated) comparisons at the voice's default noise scales."""
    points = report.reference_points
    noisy = ", ".join(
        f"{r.name} {r.noisy_distance_db:.2f}"
        for r in report.variants
        if r.noisy_distance_db is not None
    )
    return [
        "How far FP32 is from itself: with its default sampling noise vs noise 0 "
        f"{points['fp32_default_noise_vs_noise0_db']:.2f} dB; at default noise, one seed vs "
        f"another {points['fp32_other_seed_at_default_noise_db']:.2f} dB.",
        "",
        f"Not gated: distance in dB to FP32 at the default noise scales (seed {NOISE_SEED} for "
        f"both): {noisy}.",
    ]


def markdown(report: Report) -> str:
    """The human report: the table, then what each variant is and what happened."""
    baseline = report.variants[0].name
    lines = [
        "# Voice quantization report",
        "",
        f"Model `{report.model}` (sha256 `{report.model_sha256[:16]}…`), onnxruntime "
        f"{report.onnxruntime}, {THREADS} intra-op threads, ORT_ENABLE_ALL. {report.sentences} "
        f"sentences ({report.audio_seconds:.1f} s of FP32 audio), noise scales 0, "
        f"{report.repeat} interleaved timing rounds; run took {report.run_seconds:.0f} s.",
        "",
        f"Publishable = speedup ≥ {MIN_SPEEDUP}x AND distance ≤ {MAX_DISTANCE_DB} dB. Speed: "
        "every sentence runs through all variants (rotating order) before the next sentence; "
        "median over rounds of (FP32 time / variant time) in the same round, with the median "
        "time for all sentences in brackets. Distance: mean over sentences (worst sentence in "
        "brackets).",
        "",
        "| variant | size MB | speed vs FP32 | log-mel distance dB | publishable |",
        "|---|---|---|---|---|",
        *(table_row(r, baseline) for r in report.variants),
        "",
        *noise_lines(report),
        "",
        f"Metric: {report.metric}.",
        "",
        "## Variants",
        "",
    ]
    for result in report.variants:
        lines.append(f"- **{result.name}**: {result.description}.")
        if result.error:
            lines.append(f"  - error: {result.error}")
        lines += [f"  - {note}" for note in result.notes]
    publishable = [r.name for r in report.variants if r.publishable]
    lines += [
        "",
        "Publishable: " + (", ".join(publishable) if publishable else "none; keep FP32."),
        "",
    ]
    return "\n".join(lines)


def write_reports(report: Report, out_dir: Path) -> None:
    """DIR/quantize.json and DIR/quantize.md."""
    (out_dir / "quantize.json").write_text(
        json.dumps(report_dict(report), indent=2) + "\n", encoding="utf-8"
    )
    (out_dir / "quantize.md").write_text(markdown(report), encoding="utf-8")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        prog="python -m tiers.quantize", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("model", type=Path, help="Piper voice model.onnx (with model.onnx.json)")
    parser.add_argument("--out-dir", type=Path, required=True, help="variants and reports")
    parser.add_argument("--texts", type=Path, help="evaluation texts, one per line")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT, help="timing rounds")
    parser.add_argument(
        "--variants", help="comma-separated subset of variant names (fp32 is always included)"
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return args


def select_variants(names: str | None) -> list[Variant]:
    """All variants, or the baseline plus the named ones (unknown names are an error)."""
    variants = default_variants()
    if names is None:
        return variants
    wanted = {n.strip() for n in names.split(",") if n.strip()}
    unknown = wanted - {v.name for v in variants}
    if unknown:
        raise ValueError(f"unknown variants: {', '.join(sorted(unknown))}")
    return [v for i, v in enumerate(variants) if i == 0 or v.name in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the process exit status."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        variants = select_variants(args.variants)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run(args.model, args.out_dir, read_texts(args.texts), args.repeat, variants)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
