"""The node's own INT8 tier (`tts.tier`): build the INT8 variant of a voice and judge it on this
CPU, in a process of its own that the agent starts (`agent.speech.tier_build`).

`python -m tiers.auto MODEL.onnx --out DIR [--repeat N] [--calibration FILE]` builds the variant
the quantization tool found best (`VARIANT`, docs/quantization.md) into DIR, measures its
distance to the FP32 model's audio (noise 0, the evaluation sentences) and its speed against
FP32 (interleaved rounds), and writes DIR/result.json: the variant's file and sha256, speedup,
distance, the source model's sha256, the peak RSS and the seconds it took. The agent applies the
gate (`agent.core.tiers`). The model is never split here (the agent splits the variant when it
loads it, in its own lean build); the peak is ONNX Runtime's calibration (~620 MB on the
bundled voice: `agent.speech.tier_build.BUILD_MEMORY_MB`). Exit status 0 when result.json was
written (whatever the verdict), 1 when the variant could not be built or measured (the reason
in result.json's `error`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from agent.speech.voice import Voice
from agent.system import allocator
from tiers.quantize import (
    CALIBRATION_TEXTS,
    EVALUATION_TEXTS,
    NOISELESS,
    THREADS,
    build,
    distances_db,
    open_session,
    read_texts,
    sampled,
    select_variants,
    sentence_ids,
    speedup,
    time_rounds,
)
from tiers.variants import BuildInputs

VARIANT: Final = "int8-static-conv-u8-keep-last-stage"
RESULT: Final = "result.json"
DEFAULT_REPEAT: Final = 3


def _sha256(path: Path) -> str:
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def build_and_measure(
    model: Path,
    out_dir: Path,
    repeat: int = DEFAULT_REPEAT,
    calibration: Sequence[str] = CALIBRATION_TEXTS,
    calibration_scales: tuple[float, float, float] | None = None,
) -> dict[str, Any]:
    """Build the variant into out_dir and measure it against the model (see the module)."""
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    fp32 = Voice.load(model, threads=THREADS, cache_dir=None, split=False)
    defaults = fp32.default_params
    scales = calibration_scales or (defaults.noise_scale, defaults.length_scale, defaults.noise_w)
    inputs = BuildInputs(model, sentence_ids(fp32, calibration), scales)
    result: dict[str, Any] = {"variant": VARIANT, "source_sha256": _sha256(model)}
    variant = select_variants(VARIANT)[1]
    built = build(variant, inputs, out_dir)
    result["build_seconds"] = built.build_seconds
    if built.error is not None or built.file is None:
        result["error"] = built.error or "no file"
        return result
    path = Path(built.file)
    path.with_name(f"{path.name}.json").write_bytes(Path(f"{model}.json").read_bytes())
    result |= measure(fp32, model, path, repeat)
    result["seconds"] = time.perf_counter() - started
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return result


def measure(fp32: Voice, model: Path, variant: Path, repeat: int) -> dict[str, Any]:
    """A variant's distance to the model's audio (noise 0) and its speed against it
    (interleaved rounds) on the evaluation sentences; `error` instead where it fails to run."""
    sentences = sentence_ids(fp32, EVALUATION_TEXTS)
    try:
        sessions = {"fp32": open_session(model), "int8": open_session(variant)}
        references = sampled(sessions["fp32"], sentences, NOISELESS)
        outputs = sampled(sessions["int8"], sentences, NOISELESS)
        distance = float(np.mean(distances_db(references, outputs, fp32.sample_rate)))
        del references, outputs
        times = time_rounds(sessions, sentences, repeat)
    except Exception as exc:  # noqa: BLE001 - any failure is the variant's result
        return {"error": f"run failed: {type(exc).__name__}: {str(exc)[:300]}"}
    return {
        "file": str(variant),
        "sha256": _sha256(variant),
        "distance_db": distance if np.isfinite(distance) else None,
        "speedup": speedup(times["fp32"], times["int8"]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiers.auto", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    parser.add_argument("--calibration", type=Path, help="calibration texts, one per line")
    args = parser.parse_args(argv)
    allocator.tune()
    texts = read_texts(args.calibration) if args.calibration else list(CALIBRATION_TEXTS)
    result = build_and_measure(args.model, args.out, args.repeat, texts)
    (args.out / RESULT).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
