"""The operator's tier builder: `python -m tiers build MODEL.onnx --out DIR`.

Builds the voice's selective INT8 variant off the device (tiers.selective: calibration once,
each unit's sensitivity, the search within the budget; or `--recipe FILE` / `--recipe default`
to build a known selection without the search), judges it on this CPU on the held-out
sentences (tiers.auto.judge: distance at the default noise, speed by CPU time), and writes
what a release carries as the model's `int8` tier (`ota manifest MODEL --tier DIR/...onnx`):

- `DIR/<model>.int8.onnx` and `DIR/<model>.int8.onnx.json` (the model's own JSON);
- `DIR/<model>.int8.result.json`: the figures on this CPU, the recipe, the CPU flags the
  variant relies on (`requires`) and the machine it was built on;
- `DIR/<model>.int8.selection.json`: what the search measured (not part of a release).

Exit status 0 when the variant passes the gate on this CPU, 1 when it was built but does not
pass (the files are written all the same), 2 when it could not be built.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

import onnxruntime as ort

from agent.core.tiers import is_publishable
from agent.speech.voice import Voice
from tiers import auto, recipes
from tiers import selective as sel
from tiers.quantize import CALIBRATION_TEXTS, sentence_ids
from tiers.variants import BuildInputs

TIER: Final = "int8"
VNNI_FLAGS: Final = ("avx512_vnni", "avx_vnni")
"""x86 CPUs whose u8 x s8 kernels add products in 32 bits (no saturation): what a variant
with 8-bit weights needs to compute what it was judged computing (tiers.selective)."""


def cpu_facts() -> dict[str, Any]:
    """The machine a variant is built and judged on."""
    flags: list[str] = []
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").split("\n"):
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features") and not flags:
                flags = value.split()
            if key.strip() == "model name" and not model:
                model = value.strip()
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")
    return {
        "machine": platform.machine(),
        "cpu": model,
        "int8_flags": [f for f in wanted if f in flags],
        "onnxruntime": ort.__version__,
    }


def requires(options: sel.Options, machine: str) -> list[str]:
    """The CPU flags an x86-64 node needs for this variant (none: any CPU)."""
    if options.reduce_range or machine not in ("x86_64", "AMD64"):
        return []
    return list(VNNI_FLAGS)


def build(args: argparse.Namespace) -> int:
    """The `build` command."""
    started = time.perf_counter()
    model: Path = args.model
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    voice = Voice.describe(model, None)
    scales = auto.voice_scales(voice)
    inputs = BuildInputs(model, sentence_ids(voice, CALIBRATION_TEXTS), scales)
    variant = out / f"{model.stem}.{TIER}.onnx"
    if args.recipe is None:
        options = sel.Options(reduce_range=args.reduce_range, calibration=args.calibration)
    else:
        recipe = dict(recipes.DEFAULT) if args.recipe == "default" else _recipe(args.recipe)
        if args.reduce_range:
            recipe["options"] = {**recipe.get("options", {}), "reduce_range": True}
        options = sel.options_of(recipe)
    with tempfile.TemporaryDirectory(prefix="tiers-") as work:
        cache = Path(work) / "calibration.json"
        sel.calibrate(inputs, cache, options)
        if args.recipe is None:
            judge = sel.Judge.of(
                model,
                sentence_ids(voice, sel.SELECTION_TEXTS),
                scales,
                voice.sample_rate,
                Path(work),
            )
            selection = sel.select(inputs, judge, cache, options, args.budget_db, print)
            recipe = selection.recipe()
            summary = asdict(selection)
            sel.write_json(out / f"{model.stem}.{TIER}.selection.json", summary)
        if not recipe.get("units"):
            print("no unit can be quantized within the budget", file=sys.stderr)
            return 2
        sel.build_recipe(model, recipe, cache, variant)
    shutil.copyfile(f"{model}.json", f"{variant}.json")
    judged = auto.judge(model, variant, args.repeat, out)
    facts = cpu_facts()
    result = {
        "tier": TIER,
        "requires": requires(options, str(facts["machine"])),
        "built_on": facts,
        "recipe": recipe,
        **{k: v for k, v in judged.items() if k not in ("file",)},
        "file": variant.name,
        "seconds": time.perf_counter() - started,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    passed = is_publishable(result.get("speedup"), result.get("distance_db"))
    result["passes_here"] = passed
    sel.write_json(out / f"{model.stem}.{TIER}.result.json", result)
    print(
        f"{variant}: {result.get('speedup', 0):.2f}x by CPU time, "
        f"{result.get('distance_db', float('nan')):.2f} dB at default noise (held-out); "
        f"{'passes' if passed else 'does not pass'} the gate on this CPU "
        f"({', '.join(facts['int8_flags']) or 'no int8 flags'})"
    )
    return 0 if passed else 1


def _recipe(path: str) -> dict[str, Any]:
    raw = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, dict) or not isinstance(raw.get("units"), list):
        raise SystemExit(f"{path}: not a recipe (expected an object with `units`)")
    return raw


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m tiers", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    building = commands.add_parser("build", help="build and judge the selective INT8 tier")
    building.add_argument("model", type=Path, help="Piper voice model.onnx (with its .json)")
    building.add_argument("--out", type=Path, required=True)
    building.add_argument(
        "--recipe", help="`default` or a recipe file: build that selection, no search"
    )
    building.add_argument(
        "--reduce-range",
        action="store_true",
        help="7-bit weights: for CPUs without VNNI (exact there; see docs/quantization.md)",
    )
    building.add_argument(
        "--calibration",
        choices=("percentile", "minmax"),
        default="percentile",
        help="activation ranges: a percentile of each tensor's histogram, or min/max",
    )
    building.add_argument("--budget-db", type=float, default=sel.BUDGET_DB)
    building.add_argument("--repeat", type=int, default=auto.DEFAULT_REPEAT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
