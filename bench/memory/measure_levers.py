"""Speed and memory together (issue 24): each lever in a fresh process, against piper-tts.

For each variant a child process sets it (ONNX Runtime arena per part, arena shrinkage after
each run, glibc's thresholds, the largest decoder chunk, the decoder's context), loads the
bundled voice from a warm model cache, prewarms, and then:
- memory: peak RSS (VmHWM, reset after the prewarm) over the bench's long text streamed as the
  agent streams it (`bench.synth.agent_chunks`), and RSS after it and after a trim;
- speed: the bench's warm synthesis (`Voice.synthesize`) of the short, medium and long texts
  interleaved with piper-tts's in the same process (piper-tts loaded after the memory phase),
  median of `--reps` runs each: the ratio ours / piper-tts of audio seconds per compute second.

`.venv/bin/python bench/memory/measure_levers.py --reps 7` prints a Markdown table (and writes
`.cache/memory/levers.json`); `--only a,b` runs the variants whose names contain a or b.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
VARIANTS: Final[dict[str, dict[str, Any]]] = {
    "now (arena on, 128 frames, context 12)": {},
    "arena on, shrink after each run": {"shrink": True},
    "arena on, 256 frames": {"frames": 256},
    "arena on, 256 frames, shrink": {"frames": 256, "shrink": True},
    "arena off decoder, heap (mmap 32 MiB)": {"arena_off": ["decoder"], "mmap": 32 << 20},
    "arena off decoder, heap, 256 frames": {
        "arena_off": ["decoder"],
        "mmap": 32 << 20,
        "frames": 256,
    },
    "arena off all, heap (mmap 32 MiB)": {
        "arena_off": ["prior", "flow", "decoder"],
        "mmap": 32 << 20,
    },
    "arena off all, mmap 64 KiB (low_memory)": {
        "arena_off": ["prior", "flow", "decoder"],
        "mmap": 64 << 10,
    },
    "decoder context 10": {"context": 10},
    "arena on, shrink, mmap 1 MiB": {"shrink": True, "mmap": 1 << 20},
    "arena on, shrink, mmap 1 MiB, 64 frames": {"shrink": True, "mmap": 1 << 20, "frames": 64},
    "arena on, shrink, mmap 1 MiB, 64 frames, context 10": {
        "shrink": True,
        "mmap": 1 << 20,
        "frames": 64,
        "context": 10,
    },
}


def _status(key: str) -> float:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5", encoding="ascii")


def child(spec: dict[str, Any], reps: int, cache: Path) -> dict[str, Any]:  # noqa: PLR0915
    """One variant, in this process."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-8, 2)  # M_ARENA_MAX, as the agent sets it
    if "mmap" in spec:
        libc.mallopt(-3, int(spec["mmap"]))  # M_MMAP_THRESHOLD (fixes the trim threshold too)
    import onnxruntime as ort  # noqa: PLC0415

    from agent.formats import chunking  # noqa: PLC0415
    from agent.speech import sessions, voice  # noqa: PLC0415

    frames = int(spec.get("frames", chunking.MAX_FRAMES))
    original_options = sessions.session_options
    arena_off = set(spec.get("arena_off", ()))
    model = _bundled()
    loaded = voice.Voice.load(model, threads=2, cache_dir=cache)
    parts = loaded._engine.parts
    if parts is None:
        raise RuntimeError("the voice did not split")
    if arena_off:
        # Rebuild the named parts' sessions with the arena off (same cached files).
        for name in arena_off:
            session: ort.InferenceSession = getattr(parts, name)
            path = session._model_path
            opts = original_options(2, ort.GraphOptimizationLevel.ORT_DISABLE_ALL, True)
            opts.enable_cpu_mem_arena = False
            object.__setattr__(parts, name, ort.InferenceSession(path, opts, sessions.PROVIDERS))
            del session
    if "context" in spec:
        loaded = loaded.with_context(int(spec["context"]), parts.shape.flow_context)
    run_options = ort.RunOptions()
    if spec.get("shrink"):
        run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
    cancel = voice.Cancellation()
    cancel._options = run_options
    original_render = loaded.render

    def render(ids: list[int], params: Any, plan: Any = None, _: Any = None) -> Any:
        return original_render(ids, params, plan or voice.FramePlan.largest_only(frames), cancel)

    loaded.render = render  # type: ignore[method-assign,assignment]
    original_stream = loaded.stream

    def stream(ids: list[int], params: Any, plan: Any = None, _: Any = None) -> Any:
        return original_stream(ids, params, plan, cancel)

    loaded.stream = stream  # type: ignore[method-assign,assignment]
    loaded.prewarm()
    from bench import synth  # noqa: PLC0415
    from bench.texts import SPEED_TEXTS  # noqa: PLC0415

    result: dict[str, Any] = {"after_prewarm": _status("VmRSS:")}
    _reset_peak()
    for _ in synth.agent_chunks(
        loaded,
        SPEED_TEXTS["long"],
        loaded.default_params,
        (chunking.FIRST_FRAMES, chunking.FRAME_GROWTH, frames),
    ):
        pass
    result["long_peak"] = _status("VmHWM:")
    result["after_long"] = _status("VmRSS:")
    libc.malloc_trim(0)
    result["after_trim"] = _status("VmRSS:")
    cpu0 = time.process_time()
    for _ in synth.agent_chunks(
        loaded,
        SPEED_TEXTS["long"],
        loaded.default_params,
        (chunking.FIRST_FRAMES, chunking.FRAME_GROWTH, frames),
    ):
        pass
    result["long_cpu_s"] = time.process_time() - cpu0
    from piper import PiperVoice  # noqa: PLC0415

    ours, piper = synth.ours(loaded), synth.piper(PiperVoice.load(model))
    speeds: dict[str, dict[str, list[float]]] = {}
    for name, text in SPEED_TEXTS.items():
        ours(text), piper(text)  # warm both on this text
        runs: dict[str, list[float]] = {"ours": [], "piper": []}
        for _ in range(reps):
            for side, run in (("ours", ours), ("piper", piper)):
                time.sleep(0.1)
                runs[side].append(run(text).speed)
        speeds[name] = runs
    result["ratio"] = {
        name: statistics.median(r["ours"]) / statistics.median(r["piper"])
        for name, r in speeds.items()
    }
    result["speed"] = {name: statistics.median(r["ours"]) for name, r in speeds.items()}
    return result


def _bundled() -> Path:
    from agent.speech.voice import bundled_voice  # noqa: PLC0415

    return bundled_voice()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--only", default="")
    parser.add_argument("--child", default="")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "memory" / "levers-cache")
    args = parser.parse_args()
    if args.child:
        print("LEVER " + json.dumps(child(json.loads(args.child), args.reps, args.cache)))
        return 0
    args.cache.mkdir(parents=True, exist_ok=True)
    wanted = [w for w in args.only.split(",") if w]
    rows: dict[str, Any] = {}
    for name, spec in VARIANTS.items():
        if wanted and not any(w in name for w in wanted):
            continue
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                json.dumps(spec),
                "--reps",
                str(args.reps),
                "--cache",
                str(args.cache),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        line = next((x for x in out.stdout.splitlines() if x.startswith("LEVER ")), None)
        if line is None:
            print(f"{name}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
            continue
        rows[name] = json.loads(line[6:])
        r = rows[name]
        print(
            f"| {name} | {r['after_prewarm']:.1f} | {r['long_peak']:.1f} | {r['after_long']:.1f}"
            f" | {r['after_trim']:.1f} | {r['long_cpu_s']:.2f} | "
            + " / ".join(f"{r['ratio'][k]:.2f}" for k in ("short", "medium", "long"))
            + " |",
            flush=True,
        )
    out_file = ROOT / ".cache" / "memory" / "levers.json"
    out_file.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
