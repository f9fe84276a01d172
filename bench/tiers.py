"""The INT8 tier on this CPU (`make bench`): two separate builds of the selective variant, each
judged against FP32, and the memory of each child a node runs.

`python -m bench.tiers --out-dir bench` runs, each in a process of its own:
1. `python -m tiers build` twice (calibration, each unit's sensitivity, the search, the
   held-out judgement): the gate's figures of each build, whether the two chose the same
   units and made the same file;
2. the node's own children on the bundled voice: FP32's speed (`--speed-only`), the judgement
   of the first build's variant (`--variant`, what a node does with a release's tier) and the
   on-device build from the default recipe (`--build`): each one's peak RSS and seconds.

Writes `tiers.json` (every figure) and `TIERS.md` (the table) into the out directory. Speeds are
CPU time of one thread (median of the rounds' ratios), so another process's load does not
enter them; the load average at start and end is recorded all the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from agent.core.tiers import MAX_DISTANCE_DB, MIN_SPEEDUP, is_publishable
from agent.speech.voice import bundled_voice

BUILDS: Final = 2


def _run(command: list[str], say: Any) -> tuple[int, float]:
    """Run a command (its output to ours); its exit status and wall seconds."""
    say("$ " + " ".join(command))
    started = time.perf_counter()
    done = subprocess.run(command, check=False)
    return done.returncode, time.perf_counter() - started


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def build_twice(model: Path, work: Path, repeat: int, say: Any) -> list[dict[str, Any]]:
    """Two separate builds of the operator's tool, each in its own process and folder."""
    builds = []
    for index in range(1, BUILDS + 1):
        out = work / f"build{index}"
        command = [sys.executable, "-m", "tiers", "build", str(model), "--out", str(out)]
        code, seconds = _run([*command, "--repeat", str(repeat)], say)
        result = _json(out / f"{model.stem}.int8.result.json")
        selection = _json(out / f"{model.stem}.int8.selection.json")
        builds.append(
            {
                "build": index,
                "exit": code,
                "wall_seconds": seconds,
                "variant": str(out / f"{model.stem}.int8.onnx"),
                "result": result,
                "selection": {
                    k: selection.get(k)
                    for k in ("chosen", "order", "sensitivity", "quantized_cost_share", "seconds")
                },
                "steps": len(selection.get("steps", [])),
            }
        )
    return builds


def node_children(model: Path, variant: Path, work: Path, say: Any) -> dict[str, Any]:
    """The children a node runs, each measured (its result carries its own peak RSS)."""
    found: dict[str, Any] = {}
    runs = {
        "speed_only": (["--speed-only"], "speed.json"),
        "judge_release_variant": (["--variant", str(variant)], "result.json"),
        "build_on_device": (["--build"], "result.json"),
    }
    for name, (arguments, written) in runs.items():
        out = work / name
        command = [sys.executable, "-m", "tiers.auto", str(model), "--out", str(out), *arguments]
        code, seconds = _run(command, say)
        found[name] = {"exit": code, "wall_seconds": seconds, "result": _json(out / written)}
    return found


def _cell(value: Any, fmt: str) -> str:
    return "—" if not isinstance(value, int | float) else format(value, fmt)


def markdown(report: dict[str, Any]) -> str:
    """The human report."""
    lines = [
        "# The INT8 tier on this CPU",
        "",
        f"- Machine: {report['cpu']} ({report['machine']}), {os.cpu_count()} CPUs, int8 "
        f"instructions: {', '.join(report['int8_flags']) or 'none'}; load average at start "
        f"{report['load_start']}, at end {report['load_end']}",
        f"- Run: {report['started']}, {report['seconds']:.0f} s; onnxruntime "
        f"{report['onnxruntime']}; voice {report['model']}",
        f"- Gate: speedup ≥ {MIN_SPEEDUP}x by CPU time (one thread, median of rounds) and "
        f"distance ≤ {MAX_DISTANCE_DB} dB at the voice's default noise (same draws) on the "
        "held-out sentences",
        "",
        "| build | units quantized | MACs quantized | distance dB (worst) | at noise 0 dB "
        "| speedup, CPU time (rounds) | wall | passes | build s | peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for build in report["builds"]:
        result, selection = build["result"], build["selection"]
        rounds = ", ".join(f"{r:.2f}" for r in result.get("speedup_rounds", []))
        worst = max(result.get("sentence_distances_db", [0.0]) or [0.0])
        lines.append(
            f"| {build['build']} | {len(selection.get('chosen') or [])} | "
            f"{_cell(selection.get('quantized_cost_share'), '.0%')} | "
            f"{_cell(result.get('distance_db'), '.2f')} ({worst:.2f}) | "
            f"{_cell(result.get('noiseless_distance_db'), '.2f')} | "
            f"{_cell(result.get('speedup'), '.2f')}x ({rounds}) | "
            f"{_cell(result.get('wall_speedup'), '.2f')}x | "
            f"{'**yes**' if build['passes'] else 'no'} | {build['wall_seconds']:.0f} | "
            f"{_cell(result.get('peak_rss_mb'), '.0f')} |"
        )
    same = report["same_selection"]
    lines += [
        "",
        f"Both builds chose the same units: {'yes' if same else '**no**'}; the same file: "
        f"{'yes' if report['same_file'] else 'no'}.",
        "",
        "| the node's child | seconds | peak RSS MB | figures |",
        "|---|---|---|---|",
    ]
    for name, child in report["children"].items():
        result = child["result"]
        figures = []
        if "fp32_speed" in result:
            figures.append(f"FP32 {result['fp32_speed']:.1f} s of speech per CPU second")
        if "speedup" in result:
            figures.append(f"{result['speedup']:.2f}x, {result.get('distance_db', 0):.2f} dB")
        if "calibration_peak_rss_mb" in result:
            figures.append(f"calibration child {result['calibration_peak_rss_mb']:.0f} MB")
        if "error" in result:
            figures.append(f"error: {result['error']}")
        lines.append(
            f"| {name} | {child['wall_seconds']:.0f} | "
            f"{_cell(result.get('peak_rss_mb'), '.0f')} | {'; '.join(figures)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.tiers", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("bench"))
    parser.add_argument("--repeat", type=int, default=5, help="timing rounds per judgement")
    args = parser.parse_args(argv)

    def say(text: str) -> None:
        print(f"[bench.tiers] {text}", flush=True)

    import onnxruntime as ort  # noqa: PLC0415 - the children load it; this only names it

    from tiers.__main__ import cpu_facts  # noqa: PLC0415

    started = time.perf_counter()
    model = bundled_voice()
    facts = cpu_facts()
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": model.name,
        "machine": platform.machine(),
        "cpu": facts["cpu"],
        "int8_flags": facts["int8_flags"],
        "onnxruntime": ort.__version__,
        "load_start": [round(v, 2) for v in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as folder:
        work = Path(folder)
        builds = build_twice(model, work, args.repeat, say)
        for build in builds:
            result = build["result"]
            build["passes"] = is_publishable(result.get("speedup"), result.get("distance_db"))
        chosen = [b["selection"].get("chosen") for b in builds]
        digests = [b["result"].get("sha256") for b in builds]
        report["builds"] = builds
        report["same_selection"] = bool(chosen[0]) and all(c == chosen[0] for c in chosen)
        report["same_file"] = bool(digests[0]) and all(d == digests[0] for d in digests)
        report["children"] = node_children(model, Path(builds[0]["variant"]), work, say)
    report["load_end"] = [round(v, 2) for v in os.getloadavg()]
    report["seconds"] = time.perf_counter() - started
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "tiers.json").write_text(json.dumps(report, indent=1) + "\n", "utf-8")
    (args.out_dir / "TIERS.md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))
    return 0 if all(b["passes"] for b in report["builds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
