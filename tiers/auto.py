"""The node's INT8 tier, measured on its own CPU: the child process the agent starts
(`agent.speech.tier_build`), one kind of work per run, its memory leaving with it.

`python -m tiers.auto MODEL.onnx --out DIR --speed-only`
    FP32's speed on this CPU: seconds of speech per CPU second of this process (one
    intra-op thread), repeated rounds; writes DIR/speed.json.
`python -m tiers.auto MODEL.onnx --out DIR --variant VARIANT.onnx`
    Judge a variant (one the release carries): its distance to FP32 at the voice's default
    noise (both drawing the same noise) on the held-out evaluation sentences, its speed
    against FP32 by CPU time (one thread each, interleaved, median of the rounds' ratios),
    FP32's own speed from the same rounds; writes DIR/result.json.
`python -m tiers.auto MODEL.onnx --out DIR --build [--recipe FILE]`
    Build the variant here from a recipe (the default: `tiers.recipes.DEFAULT`, the
    selection made for the bundled voice), calibrating in a child of its own first (its peak
    leaves before the quantizer's begins), then judge it as above.

CPU time counts only this process's own work, so another process's load does not make FP32
look slower or the variant faster. The share of the machine other processes used meanwhile is
recorded (`busy_share`): the agent re-checks a busy measurement when the node is idle. The
agent applies the gate (`agent.core.tiers`). Exit status 0 when the result was written
(whatever the verdict), 1 when it could not be (the reason in the result's `error`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from agent.speech.voice import Voice
from agent.system import allocator
from tiers import recipes
from tiers import selective as sel
from tiers.quantize import CALIBRATION_TEXTS, EVALUATION_TEXTS, sentence_ids
from tiers.variants import BuildInputs, Scales, make_feed

RESULT: Final = "result.json"
SPEED: Final = "speed.json"
CALIBRATION: Final = "calibration.json"
RECIPE: Final = "recipe.json"
DEFAULT_REPEAT: Final = 3
SPEED_SENTENCES: Final = 4
"""FP32's speed alone is measured on the first evaluation sentences (~12 s of speech)."""


def _sha256(path: Path) -> str:
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def machine_load() -> tuple[int, int]:
    """(busy, total) CPU jiffies of the whole machine so far (`/proc/stat`)."""
    try:
        fields = Path("/proc/stat").read_text(encoding="ascii").splitlines()[0].split()[1:]
    except (OSError, IndexError):
        return 0, 0
    values = [int(v) for v in fields[:8]]
    return sum(values) - values[3] - values[4], sum(values)


class LoadWatch:
    """The share of the machine's CPU other processes used while a measurement ran."""

    def __init__(self) -> None:
        self._busy, self._total = machine_load()
        self._own = time.process_time()

    def share(self) -> float | None:
        """Other processes' share of every CPU's time since this watch began."""
        busy, total = machine_load()
        ticks = os.sysconf("SC_CLK_TCK")
        own = (time.process_time() - self._own) * ticks
        if total <= self._total:
            return None
        return max(0.0, (busy - self._busy - own) / (total - self._total))


def voice_scales(voice: Voice) -> Scales:
    """The voice's default scales (noise, length, noise width)."""
    defaults = voice.default_params
    return (defaults.noise_scale, defaults.length_scale, defaults.noise_w)


def speed_only(model: Path, repeat: int, work_dir: Path | None = None) -> dict[str, Any]:
    """FP32's speed on this CPU (see the module)."""
    voice = Voice.describe(model, None)
    scales = voice_scales(voice)
    sentences = sentence_ids(voice, EVALUATION_TEXTS)[:SPEED_SENTENCES]
    rounds: list[float] = []
    with tempfile.TemporaryDirectory(prefix=".speed-", dir=work_dir) as folder:
        fixed = sel.fixed_copy(model, Path(folder))  # weights mapped, not copied
        session = sel.open_session(fixed, threads=1, arena=False)
        session.run(None, make_feed(sentences[0], scales))  # warm: not timed
        watch = LoadWatch()
        for _ in range(repeat):
            started = time.process_time()
            samples = 0
            for ids in sentences:
                samples += int(np.asarray(session.run(None, make_feed(ids, scales))[0]).size)
            rounds.append(samples / voice.sample_rate / max(time.process_time() - started, 1e-6))
        busy = watch.share()
        del session
    return {
        "source_sha256": _sha256(model),
        "fp32_speed": statistics.median(rounds),
        "fp32_speed_rounds": rounds,
        "busy_share": busy,
        "measure": "seconds of speech per CPU second, one intra-op thread, median of rounds",
    }


def judge(model: Path, variant: Path, repeat: int, work_dir: Path | None = None) -> dict[str, Any]:
    """A variant's distance and speed against FP32 on this CPU (see the module); the
    seed-fixed copies it runs are written in `work_dir` (on the node: the cache's tier
    folder, on disk: a /tmp in memory would count against the board's memory)."""
    started = time.perf_counter()
    voice = Voice.describe(model, None)
    scales = voice_scales(voice)
    sentences = sentence_ids(voice, EVALUATION_TEXTS)
    result: dict[str, Any] = {
        "source_sha256": _sha256(model),
        "file": str(variant),
        "sha256": _sha256(variant),
    }
    try:
        with tempfile.TemporaryDirectory(prefix=".judge-", dir=work_dir) as folder:
            work = Path(folder)
            held_out = sel.Judge.of(
                model, sentences, scales, voice.sample_rate, work, threads=1, arena=False
            )
            noisy, noiseless = held_out.distances(variant)
            del held_out
            # the speed of copies whose weights are mapped, not copied (the same compute)
            fp32, int8 = sel.fixed_copy(model, work), sel.fixed_copy(variant, work)
            watch = LoadWatch()
            speed = sel.cpu_speed(fp32, int8, sentences, scales, repeat)
            busy = watch.share()
    except Exception as exc:  # noqa: BLE001 - any failure is the variant's result
        result["error"] = f"run failed: {type(exc).__name__}: {str(exc)[:300]}"
        return result
    distance = float(np.mean(noisy))
    audio = speed["audio_samples"] / voice.sample_rate
    result |= {
        "distance_db": distance if np.isfinite(distance) else None,
        "sentence_distances_db": noisy,
        "noiseless_distance_db": float(np.mean(noiseless)),
        "speedup": speed["speedup"],
        "speedup_rounds": speed["speedup_rounds"],
        "wall_speedup": speed["wall_speedup"],
        "fp32_speed": audio / max(statistics.median(speed["fp32_cpu_seconds"]), 1e-6),
        "int8_speed": audio / max(statistics.median(speed["int8_cpu_seconds"]), 1e-6),
        "busy_share": busy,
        "measure": "distance: default noise, same draws, held-out sentences; speed: CPU time, "
        "one intra-op thread, interleaved, median of the rounds' ratios",
        "judge_seconds": time.perf_counter() - started,
    }
    return result


def calibrate_only(
    model: Path, out: Path, calibration: Sequence[str], recipe: dict[str, Any]
) -> None:
    """The activation ranges of every quantizable unit, as the recipe calibrates them, kept in
    out/calibration.json."""
    voice = Voice.describe(model, None)
    inputs = BuildInputs(model, sentence_ids(voice, calibration), voice_scales(voice))
    sel.calibrate(inputs, out / CALIBRATION, sel.options_of(recipe))


def build_here(model: Path, out: Path, recipe: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Calibrate (in a child), build the recipe's variant into out, then judge it."""
    started = time.perf_counter()
    cache = out / CALIBRATION
    out.mkdir(parents=True, exist_ok=True)
    (out / RECIPE).write_text(json.dumps(recipe), encoding="utf-8")
    command = [sys.executable, "-m", "tiers.auto", str(model), "--out", str(out), "--calibrate"]
    command += ["--recipe", str(out / RECIPE)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not cache.is_file():
        tail = (done.stderr or "").strip().splitlines()[-1:] or ["no ranges"]
        return {"source_sha256": _sha256(model), "error": f"calibration failed: {tail[0][:200]}"}
    calibration_peak = float(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024
    variant = out / f"{model.stem}.int8.onnx"
    built = time.perf_counter()
    try:
        missing = sel.build_recipe(model, recipe, cache, variant)
    except Exception as exc:  # noqa: BLE001 - any failure is the build's result
        return {"source_sha256": _sha256(model), "error": f"build failed: {exc!r}"[:300]}
    finally:
        cache.unlink(missing_ok=True)
    Path(f"{variant}.json").write_bytes(Path(f"{model}.json").read_bytes())
    build_seconds = time.perf_counter() - built
    result = judge(model, variant, repeat, out)
    result |= {
        "recipe": recipe,
        "recipe_units_missing": missing,
        "build_seconds": build_seconds,
        "calibration_peak_rss_mb": calibration_peak,
        "seconds": time.perf_counter() - started,
    }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The child's command line (see the module)."""
    parser = argparse.ArgumentParser(prog="python -m tiers.auto", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    work = parser.add_mutually_exclusive_group(required=True)
    work.add_argument("--speed-only", action="store_true")
    work.add_argument("--variant", type=Path)
    work.add_argument("--build", action="store_true")
    work.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--recipe", type=Path, help="a recipe.json (`python -m tiers build`)")
    parser.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    args = parser.parse_args(argv)
    allocator.tune()
    args.out.mkdir(parents=True, exist_ok=True)
    recipe = recipes.DEFAULT
    if args.recipe is not None:
        recipe = json.loads(args.recipe.read_text(encoding="utf-8"))
    if args.calibrate:
        calibrate_only(args.model, args.out, CALIBRATION_TEXTS, recipe)
        return 0
    if args.speed_only:
        name, result = SPEED, speed_only(args.model, args.repeat, args.out)
    elif args.variant is not None:
        name, result = RESULT, judge(args.model, args.variant, args.repeat, args.out)
    else:
        name, result = RESULT, build_here(args.model, args.out, recipe, args.repeat)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (args.out / name).write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
