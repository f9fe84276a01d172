"""Where the agent's memory goes, and what each lever does to it: docs/memory.md records a run.

Usage: .venv/bin/python bench/memory/measure_memory.py [--workdir DIR] [--json FILE] COMMAND [...]

Every measurement runs in a fresh process: component runs drive agent.speech.voice / the agent's
Synthesizer directly (bench/memory/memory_workloads.py), whole-agent runs start
`python -m agent run` against a real Mosquitto with ALSA `null` (bench/memory/memory_agent.py);
both read /proc/PID/status (VmRSS, VmHWM, RssAnon, RssFile) and smaps_rollup (Pss), and reset
VmHWM per phase. Settings the agent has no key for (ONNX Runtime session options per part,
malloc_trim, the largest decoder chunk) are applied to its unchanged code by
bench/memory/memory_hooks.py.

Commands (each a few minutes at most on 2 shared cores; `all` runs them in turn, ~1 hour):
  prepare   warm model caches in the workdir: the split parts, a whole-model copy, the parts
            with external initializers (memory-mapped weights), the bundled model's parts
            alone, and a second model B (same weights, another sha256); run by any command
            when missing
  baseline  imports alone; one whole session vs the three parts vs both; a cold-cache build
  options   ONNX Runtime session options: memory (a process each) and speed (one process,
            runs interleaved: wall and CPU time)
  malloc    glibc (MALLOC_ARENA_MAX, MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_,
            malloc_trim after each announcement) over a soak-like mix (--arena on|off)
  malloc-speed  speed and first-chunk latency under those glibc settings (a process each,
            alternated over --rounds)
  threads   tts.threads 1 vs 2, arena on and off
  chunks    the largest decoder chunk: 256 / 128 / 64 / 32 frames, arena on and off
  build     a lean build of the split parts, one step a process (bench/memory/memory_build.py),
            against the agent's build in one process (`baseline`, "cold build")
  check     the OTA health check: as the updater runs it now, and leaner variants
  switch    a second split model in the process (a switch or rollback), and the alternatives
  piper     piper-tts's peak on the bench's long text against ours, in the same run
  agent     the whole agent with presets (--preset a,b), optionally in a memory cgroup
            (--cgroup-mb, root) and through an OTA update and rollback (--ota)
`--env JSON` sets the environment of every run of options, threads and chunks; `--only WORDS`
runs the variants whose names contain one of the comma-separated words.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from memory_proc import is_root

ROOT: Final = Path(__file__).resolve().parents[2]
SCRIPTS: Final = Path(__file__).resolve().parent
DEFAULT_WORKDIR: Final = ROOT / ".cache" / "memory"
CHILD_TIMEOUT: Final = 600.0
"""Seconds one measured process may take before it is killed."""
ARENA_OFF: Final = {"all": {"arena": False}}
"""ONNX Runtime's CPU memory arena off for every part."""

Row = dict[str, Any]


# ---- running the measured processes -----------------------------------------------------------


def child(script: str, args: Sequence[str], env: dict[str, str] | None = None) -> Row:
    """Run scripts/<script> in a fresh interpreter; its RESULT line, parsed."""
    environ = {**os.environ, **(env or {})}
    environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(SCRIPTS)])
    command = [sys.executable, str(SCRIPTS / script), *args]
    done = subprocess.run(
        command,
        check=False,
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result: Row = json.loads(line[len("RESULT ") :])
            return result
    raise RuntimeError(
        f"{' '.join(command[1:])} exited {done.returncode} without a result:\n{done.stderr[-3000:]}"
    )


def workload(scenario: str, *args: str, env: dict[str, str] | None = None, **options: Any) -> Row:
    """A scenario of memory_workloads.py; keyword options become `--key value` (`True`: a flag,
    dicts: JSON)."""
    argv = [scenario, *args]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not None and value is not False:
            argv += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return child("memory_workloads.py", argv, env)


class Layout:
    """The workdir: warm model caches and the second model."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.cache = workdir / "cache"
        """A model cache (`cache.dir`) with the parts and a whole copy of both models."""
        self.cache_ext = workdir / "cache-ext"
        """The same parts saved with external initializers (ONNX Runtime memory-maps them)."""
        self.model_b = workdir / "model-b" / "en_US-joe-medium-b.onnx"
        """The bundled model with one metadata entry added: same weights, another sha256."""
        self.cache_a = workdir / "cache-a"
        """The bundled model's parts only (an update to B finds none of B's)."""

    @property
    def ready(self) -> bool:
        """Whether `prepare` has run."""
        return (self.cache_a / "models").is_dir() and self.model_b.is_file()


# ---- prepare ----------------------------------------------------------------------------------


def prepare(layout: Layout) -> list[Row]:
    """Build the warm caches (once; later calls reuse them)."""
    from agent.speech.voice import bundled_voice  # noqa: PLC0415

    model = bundled_voice()
    if not layout.model_b.is_file():
        _write_model_b(model, layout.model_b)
    for path in (model, layout.model_b):
        workload("load", what="parts", model=path, cache=layout.cache)
    workload("load", what="whole", model=model, cache=layout.cache)
    _externalize(layout.cache / "models", layout.cache_ext / "models")
    digest = sha256_of(model)
    (layout.cache_a / "models").mkdir(parents=True, exist_ok=True)
    for path in (layout.cache / "models").iterdir():
        if path.name.startswith((digest, "digest-")):
            shutil.copyfile(path, layout.cache_a / "models" / path.name)
    return [{"prepared": str(layout.workdir)}]


def sha256_of(path: Path) -> str:
    """A file's sha256 (the agent names its cached parts by it)."""
    with path.open("rb") as data:
        return hashlib.file_digest(data, "sha256").hexdigest()


def _write_model_b(model: Path, target: Path) -> None:
    import onnx  # noqa: PLC0415 - dev dependency, only here

    proto = onnx.load(str(model))
    entry = proto.metadata_props.add()
    entry.key, entry.value = "memory-measurement", "model B"
    target.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(target))
    shutil.copyfile(f"{model}.json", f"{target}.json")


def _externalize(source: Path, target: Path) -> None:
    """Save each cached part again, its initializers in a `.data` file beside it, as ONNX
    Runtime writes them with `session.optimized_model_external_initializers_file_name`."""
    import onnxruntime as ort  # noqa: PLC0415

    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.iterdir()):
        if path.name.endswith((".prior.onnx", ".flow.onnx", ".decoder.onnx")):
            if (target / path.name).is_file():
                continue
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            options.optimized_model_filepath = str(target / path.name)
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", f"{path.name}.data"
            )
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
            )
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        elif path.suffix in ("", ".json") and path.is_file():
            shutil.copyfile(path, target / path.name)


# ---- tables -----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 10 else f"{value:.3g}"
    return "—" if value is None else str(value)


def phase_rows(label: str, result: Row) -> list[list[Any]]:
    """One table row per phase: label, phase, RSS, peak, PSS, anon, file (MiB)."""
    return [
        [label, p["phase"], p["rss"], p["peak"], p["pss"], p["anon"], p["file"]]
        for p in result["phases"]
    ]


PHASE_HEADERS: Final = ["run", "phase", "RSS MB", "peak MB", "PSS MB", "anon MB", "file MB"]


def phase(result: Row, name: str) -> Row:
    """The phase of a result whose name starts with `name`."""
    return next(p for p in result["phases"] if p["phase"].startswith(name))


def median(values: Sequence[float]) -> float:
    """The median (0 for none)."""
    return float(statistics.median(values)) if values else 0.0


# ---- commands ---------------------------------------------------------------------------------


def cmd_baseline(layout: Layout, _args: argparse.Namespace) -> list[Row]:
    """Imports; whole vs parts vs both; a cold-cache build, traced."""
    results: list[Row] = [{"run": "imports", **workload("imports")}]
    for what in ("whole", "parts", "both"):
        results.append({"run": what, **workload("load", what=what, cache=layout.cache)})
    results.append(
        {"run": "parts, memory-mapped weights", **workload("load", cache=layout.cache_ext)}
    )
    results.append({"run": "cold build", **workload("build")})
    rows = [r for result in results for r in phase_rows(result["run"], result)]
    print(table(PHASE_HEADERS, rows))
    build = results[-1]
    print("\nCold build, after each step (peak since the step before):\n")
    print(
        table(
            ["step", "s", "RSS MB", "peak MB", "anon MB"],
            [[t["label"], t["seconds"], t["rss"], t["peak"], t["anon"]] for t in build["trace"]],
        )
    )
    return results


OPTION_VARIANTS: Final[dict[str, dict[str, Any]]] = {
    "current (arena on, pattern on, reuse on)": {},
    "arena off, every part": ARENA_OFF,
    "arena off, decoder only": {"decoder": {"arena": False}},
    "arena on, shrink after each run": {"shrink": True},
    "arena off, mem pattern off": {"all": {"arena": False, "pattern": False}},
    "arena off, mem reuse off": {"all": {"arena": False, "reuse": False}},
    "shared env arena, kSameAsRequested": {"env_arena": {"strategy": "same"}},
    "arena on, prepacking off": {"all": {"config": {"session.disable_prepacking": "1"}}},
    "arena off, initializers by device allocator": {
        "all": {"arena": False, "config": {"session.use_device_allocator_for_initializers": "1"}}
    },
}


SESSION_KEYS: Final = ("all", "prior", "flow", "decoder")
"""Hook settings that are per session (a speed run can hold voices with different ones)."""


def _lever(
    layout: Layout, variants: dict[str, dict[str, Any]], args: argparse.Namespace
) -> list[Row]:
    """Memory: each variant in a fresh process (load, prewarm, the long text, a short mix).
    Speed: every variant's voice in one process, runs interleaved (`speed`), as the real-time
    factor (compute seconds per second of audio) of the bench's short/medium/long texts and
    its ratio to the first variant. Variants are {"hooks", "threads", "max_frames"}; those
    with a process-wide setting (a shared environment arena, arena shrinkage) get no speed
    figure."""
    chosen = {name: spec for name, spec in variants.items() if _selected(name, args.only)}
    summary: list[Row] = []
    for name, spec in chosen.items():
        result = workload(
            "speak",
            env=json.loads(args.env),
            cache=layout.cache,
            announcements=args.announcements,
            **_flags(spec),
        )
        row = {
            "variant": name,
            "after_load": phase(result, "load")["rss"],
            "after_prewarm": phase(result, "prewarm")["rss"],
            "long_peak": phase(result, "long text")["peak"],
            "after_long": phase(result, "long text")["rss"],
            "mix_peak": phase(result, "mix")["peak"],
            "steady": phase(result, "mix")["rss"],
            "steady_pss": phase(result, "mix")["pss"],
            "run": result,
        }
        summary.append(row)
        print(
            f"{name}: long text peak {row['long_peak']} MB, steady {row['steady']} MB", flush=True
        )
    timed = {
        name: {
            "hooks": {k: v for k, v in spec.get("hooks", {}).items() if k in SESSION_KEYS},
            **{k: v for k, v in spec.items() if k in ("threads", "max_frames")},
        }
        for name, spec in chosen.items()
        if not {"env_arena", "shrink"} & set(spec.get("hooks", {}))
    }
    measured = workload(
        "speed", env=json.loads(args.env), cache=layout.cache, reps=args.reps, variants=timed
    )
    texts = ("short", "medium", "long")
    speed, cpu = measured["rtf"], measured["cpu"]
    print(
        f"Seconds per part, long text, first row: {measured['part_seconds']}; decoder frames "
        f"run per frame of audio (context included): {measured['decoded_per_frame']}"
    )
    base = {t: median(next(iter(speed.values()))[t]) for t in texts}
    base_cpu = {t: median(next(iter(cpu.values()))[t]) for t in texts}
    rows = []
    for row in summary:
        name = row["variant"]
        rtf = {t: median(speed[name][t]) for t in texts} if name in speed else None
        used = {t: median(cpu[name][t]) for t in texts} if name in cpu else None
        row["rtf"], row["cpu"] = rtf, used
        row["decoded_per_frame"] = measured["decoded_per_frame"].get(name)
        rows.append(
            [
                name,
                row["after_load"],
                row["after_prewarm"],
                row["long_peak"],
                row["after_long"],
                row["steady"],
                row["steady_pss"],
                " / ".join(f"{rtf[t] / base[t]:.2f}" for t in texts) if rtf else "—",
                " / ".join(f"{used[t] / base_cpu[t]:.2f}" for t in texts) if used else "—",
            ]
        )
    print(
        "RTF of the first row (wall s per s of audio, short/medium/long): "
        + " / ".join(f"{base[t]:.3f}" for t in texts)
        + "; CPU s per s of audio: "
        + " / ".join(f"{base_cpu[t]:.3f}" for t in texts)
    )
    headers = [
        "setting",
        "after load MB",
        "after prewarm MB",
        "long text peak MB",
        "after long MB",
        "steady MB",
        "steady PSS MB",
        "wall time vs first row s/m/l",
        "CPU time vs first row s/m/l",
    ]
    print(table(headers, rows))
    return summary


def _flags(spec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k in ("hooks", "threads", "max_frames")}


def cmd_options(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """ONNX Runtime session options, every part, warm cache."""
    return _lever(layout, {k: {"hooks": v} for k, v in OPTION_VARIANTS.items()}, args)


def _selected(name: str, only: str | None) -> bool:
    return only is None or any(word.strip() in name for word in only.split(","))


MMAP_64K: Final = {"MALLOC_MMAP_THRESHOLD_": "65536"}
"""Blocks of 64 KiB or more get their own mapping, returned to the kernel when freed (a fixed
threshold also stops glibc raising it, and the trim threshold, after large frees)."""
GLIBC: Final = {"MALLOC_ARENA_MAX": "2", **MMAP_64K}
"""The glibc settings recommended (docs/memory.md)."""
MALLOC_VARIANTS: Final[dict[str, tuple[dict[str, str], bool]]] = {
    "glibc defaults": ({}, False),
    "MALLOC_ARENA_MAX=2": ({"MALLOC_ARENA_MAX": "2"}, False),
    "MALLOC_ARENA_MAX=1": ({"MALLOC_ARENA_MAX": "1"}, False),
    "MALLOC_TRIM_THRESHOLD_=128 KiB": ({"MALLOC_TRIM_THRESHOLD_": "131072"}, False),
    "MALLOC_MMAP_THRESHOLD_=64 KiB": (MMAP_64K, False),
    "malloc_trim(0) after each announcement": ({}, True),
    "ARENA_MAX=2 + MMAP_THRESHOLD 64 KiB": ({"MALLOC_ARENA_MAX": "2", **MMAP_64K}, False),
    "ARENA_MAX=2 + MMAP_THRESHOLD 64 KiB + trim": ({"MALLOC_ARENA_MAX": "2", **MMAP_64K}, True),
}


def cmd_malloc(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """glibc settings over the mix, with ONNX Runtime's arena as it is and (--arena off)
    without it."""
    hooks = ARENA_OFF if args.arena == "off" else {}
    results: list[Row] = []
    rows = []
    for name, (env, trim) in MALLOC_VARIANTS.items():
        if not _selected(name, args.only):
            continue
        result = workload(
            "mix",
            env=env,
            cache=layout.cache,
            hooks=hooks,
            announcements=args.announcements,
            trim=trim,
        )
        series = result["mix"]["series"]
        first_third, last = series[max(0, len(series) // 3 - 1)], series[-1]
        third = first_third["rss"]
        growth = (last["rss"] - last["phrase_cache"]) - (third - first_third["phrase_cache"])
        end = phase(result, "mix")
        loaded = phase(result, "load")
        results.append({"variant": name, "env": env, "trim": trim, **result})
        print(f"{name}: end {end['rss']} MB, peak {end['peak']} MB", flush=True)
        rows.append(
            [
                name,
                loaded["rss"],
                end["peak"],
                third,
                end["rss"],
                round(growth, 1),
                end["pss"],
                result["mix"]["trim_ms_p50"],
                result["mix"]["cached_first_chunk_ms_p50"],
                result["mix"]["uncached_first_chunk_ms_p50"],
                result["mix"]["uncached_synthesis_s"],
            ]
        )
    headers = [
        f"glibc (ORT arena {args.arena})",
        "after load MB",
        "mix peak MB",
        "RSS at 1/3 MB",
        "RSS at end MB",
        "growth from 1/3, phrase cache excluded, MB",
        "PSS end MB",
        "trim ms p50",
        "cached first chunk ms",
        "uncached first chunk ms",
        "uncached synthesis s (sum)",
    ]
    print(table(headers, rows))
    return results


SPEED_ENVIRONMENTS: Final[dict[str, dict[str, str]]] = {
    "glibc defaults": {},
    "MALLOC_ARENA_MAX=2": {"MALLOC_ARENA_MAX": "2"},
    "MALLOC_MMAP_THRESHOLD_=64 KiB": MMAP_64K,
    "MALLOC_TRIM_THRESHOLD_=128 KiB": {"MALLOC_TRIM_THRESHOLD_": "131072"},
    "ARENA_MAX=2 + MMAP_THRESHOLD 64 KiB": GLIBC,
}


def cmd_malloc_speed(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """The real-time factor under each glibc environment (process-wide, so one process each,
    alternated over --rounds), with ONNX Runtime's arena as --arena says."""
    hooks = ARENA_OFF if args.arena == "off" else {}
    chosen = {k: v for k, v in SPEED_ENVIRONMENTS.items() if _selected(k, args.only)}
    texts = ("short", "medium", "long")
    found: dict[str, dict[str, dict[str, list[float]]]] = {
        kind: {name: {t: [] for t in texts} for name in chosen}
        for kind in ("rtf", "cpu", "first_ms")
    }
    for round_ in range(args.rounds):
        names = list(chosen) if round_ % 2 == 0 else list(reversed(chosen))
        for name in names:
            variants = {name: {"hooks": hooks}}
            result = workload(
                "speed", env=chosen[name], cache=layout.cache, reps=args.reps, variants=variants
            )
            for kind, by_name in found.items():
                for text in texts:
                    by_name[name][text] += result[kind][name][text]
        print(f"round {round_ + 1} done", flush=True)
    rows = []
    for name in chosen:
        cells = [name]
        for kind in ("rtf", "cpu", "first_ms"):
            first = next(iter(found[kind].values()))
            values = found[kind][name]
            cells.append(" / ".join(f"{median(values[t]):.3g}" for t in texts))
            cells.append(" / ".join(f"{median(values[t]) / median(first[t]):.2f}" for t in texts))
        rows.append(cells)
    headers = [
        f"glibc (ORT arena {args.arena})",
        "wall s per s of audio, s/m/l",
        "vs first row",
        "CPU s per s of audio",
        "vs first row",
        "first chunk ms",
        "vs first row",
    ]
    print(table(headers, rows))
    return [{"variant": name, **{k: v[name] for k, v in found.items()}} for name in chosen]


def cmd_threads(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """tts.threads 1 vs 2, with the arena on and off."""
    variants = {
        f"{count} thread(s), arena {arena}": {"hooks": hooks, "threads": count}
        for arena, hooks in (("on", {}), ("off", ARENA_OFF))
        for count in (2, 1)
    }
    return _lever(layout, variants, args)


def cmd_chunks(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """The largest decoder chunk, with the arena on and off."""
    variants = {
        f"{frames} frames, arena {arena}": {"hooks": hooks, "max_frames": frames}
        for arena, hooks in (("on", {}), ("off", ARENA_OFF))
        for frames in (256, 128, 64, 32)
    }
    return _lever(layout, variants, args)


BUILD_STEPS: Final = (
    "externalize",
    "split",
    "optimize-prior",
    "optimize-flow",
    "optimize-decoder",
    "reference",
    "check",
)


def _cut_of_cached_parts(models: Path, digest: str) -> dict[str, list[list[str]]]:
    """The tensor names where the agent cut this model: each cached part's inputs and outputs
    (read without their weights)."""
    import onnx  # noqa: PLC0415

    from agent.speech.decoder_parts import SPLIT_FORMAT  # noqa: PLC0415

    cut = {}
    for part in ("prior", "flow", "decoder"):
        (path,) = models.glob(f"{digest}-*.split{SPLIT_FORMAT}.{part}.onnx")
        graph = onnx.load(str(path), load_external_data=False).graph
        constants = {tensor.name for tensor in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in constants]
        cut[part] = [inputs, [o.name for o in graph.output]]
    return cut


def cmd_build(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """The lean build, each step in its own process; the probe as long as --probe-seconds."""
    from agent.speech.voice import bundled_voice  # noqa: PLC0415

    model = bundled_voice()
    cut = _cut_of_cached_parts(layout.cache_ext / "models", sha256_of(model))
    results: list[Row] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="voice-agent-lean-build-") as scratch:
        for step in BUILD_STEPS:
            argv = [step, "--dir", scratch, "--model", str(model), "--cut", json.dumps(cut)]
            result = child("memory_build.py", [*argv, "--seconds", str(args.probe_seconds)])
            results.append({"step": step, **result})
            rows += phase_rows(step, result)
    print(table(PHASE_HEADERS, rows))
    print(
        f"\nLargest difference, parts against the whole model: {results[-1]['largest_difference']}"
    )
    return results


def _peak_of_command(command: Sequence[str], env: dict[str, str] | None = None) -> Row:
    """Run a command to its end; its peak RSS (ru_maxrss of the reaped child), exit code, last
    line of output and seconds."""
    environ = {**os.environ, **(env or {})}
    began = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=out, stderr=out)
        _, status, rusage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace").strip().splitlines()
    return {
        "peak": round(rusage.ru_maxrss / 1024, 1),
        "exit": process.returncode,
        "output": text[-1] if text else "",
        "seconds": round(time.perf_counter() - began, 1),
    }


def cmd_check(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """The health check of model B against the bundled model: the real one, then variants."""
    from agent.speech.voice import bundled_voice  # noqa: PLC0415

    current = bundled_voice()
    rows: list[list[Any]] = []
    results: list[Row] = []
    real = [sys.executable, "-m", "agent.speech.healthcheck", str(layout.model_b)]
    real += ["--reference", str(current), "--rate", "22050", "--threads", "2"]
    measured = _peak_of_command(real)
    results.append({"variant": "agent.speech.healthcheck as the updater runs it", **measured})
    rows.append(["agent.speech.healthcheck as the updater runs it", measured["peak"], "—", "—"])
    variants: dict[str, dict[str, Any]] = {
        "same steps, re-implemented (no model cache: both models split in process)": {},
        "both parts from the model cache": {"cache": layout.cache},
        "cached parts, memory released between models": {"cache": layout.cache, "release": True},
        "cached parts, arena off": {"cache": layout.cache, "hooks": ARENA_OFF},
        "cached parts, arena off, chunked decoding (256 frames)": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "decode": "chunked",
        },
        "cached parts, arena off, chunked, no prewarm, 1 phrase": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "decode": "chunked",
            "prewarm": False,
            "phrases": 1,
        },
        "candidate only (no reference in process), cached, arena off, chunked": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "decode": "chunked",
            "reference": None,
        },
        "candidate only, memory-mapped weights, arena off, chunked": {
            "cache": layout.cache_ext,
            "hooks": ARENA_OFF,
            "decode": "chunked",
            "reference": None,
        },
        "candidate only, cached, arena off, 128 frames, glibc settings": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "reference": None,
            "max_frames": 128,
            "env": GLIBC,
        },
        "candidate only, cached, arena off, 128 frames, glibc, 1 phrase, no prewarm": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "reference": None,
            "max_frames": 128,
            "env": GLIBC,
            "phrases": 1,
            "prewarm": False,
        },
        "candidate only, memory-mapped, arena off, 128 frames, glibc settings": {
            "cache": layout.cache_ext,
            "hooks": ARENA_OFF,
            "reference": None,
            "max_frames": 128,
            "env": GLIBC,
        },
        "both from the cache, arena off, 128 frames, glibc, released between": {
            "cache": layout.cache,
            "hooks": ARENA_OFF,
            "max_frames": 128,
            "env": GLIBC,
            "release": True,
        },
        "candidate cold (build in the check), no reference": {
            "cache_cold": True,
            "hooks": ARENA_OFF,
            "decode": "chunked",
            "reference": None,
        },
    }
    for name, spec in variants.items():
        if not _selected(name, args.only):
            continue
        options = dict(spec)
        reference = options.pop("reference", current)
        env = options.pop("env", None)
        result = workload(
            "check",
            env=env,
            model=layout.model_b,
            reference=reference,
            threads=2,
            no_prewarm=not options.pop("prewarm", True),
            **options,
        )
        peak = max(p["peak"] for p in result["phases"])
        results.append({"variant": name, "peak": peak, **result})
        compute = result["compute_s"]
        rows.append([name, peak, compute.get("candidate"), compute.get("reference")])
    print(table(["health check", "peak MB", "candidate s", "reference s"], rows))
    return results


def cmd_switch(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """Model A in use, then model B: beside A (as the updater does) or after A is dropped;
    B's parts cached (built by the check) or built in process (as now)."""
    # tuned: arena off, the recommended glibc settings, decoder chunks of at most 128 frames
    tuned = {"hooks": ARENA_OFF, "env": GLIBC, "max_frames": 128}
    variants: dict[str, dict[str, Any]] = {
        "now: B built in process beside A": {"cold": True, "order": "both"},
        "B from the cache, beside A": {"order": "both"},
        "tuned, B from the cache, beside A": {"order": "both", **tuned},
        "tuned, B from the cache after A is dropped": {"order": "drop-first", **tuned},
        "tuned, B memory-mapped, beside A": {"order": "both", "ext": True, **tuned},
        "tuned, B memory-mapped after A is dropped": {
            "order": "drop-first",
            "ext": True,
            **tuned,
        },
    }
    results: list[Row] = []
    rows = []
    for name, spec in variants.items():
        if not _selected(name, args.only):
            continue
        options = dict(spec)
        cache = layout.cache_ext if options.pop("ext", False) else layout.cache
        result = workload(
            "switch",
            env=options.pop("env", None),
            other=layout.model_b,
            cache=cache,
            announcements=args.announcements,
            **options,
        )
        results.append({"variant": name, **result})
        rows += phase_rows(name, result)
    print(table(PHASE_HEADERS, rows))
    return results


def cmd_piper(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """piper-tts's peak on the long text, ours (component and whole agent) in the same run."""
    results: list[Row] = []
    rows = []
    best_preset = args.preset.split(",")[-1]
    for _ in range(args.rounds):
        piper = workload("piper")
        ours = workload("load", cache=layout.cache)
        best = workload("load", cache=layout.cache, hooks=ARENA_OFF, max_frames=128, env=GLIBC)
        agent_now = _agent(layout, PRESETS["current"], 0)
        agent_best = _agent(layout, PRESETS[best_preset], 0)
        row = {
            "piper-tts (PiperVoice, long text)": phase(piper, "long text")["peak"],
            "ours, Voice as the synthesizer streams it": max(p["peak"] for p in ours["phases"][1:]),
            "ours, Voice, arena off, glibc settings, 128 frames": max(
                p["peak"] for p in best["phases"][1:]
            ),
            "agent process now (start + long text)": max(p["peak"] for p in agent_now["phases"]),
            f"agent process, preset {best_preset}": max(p["peak"] for p in agent_best["phases"]),
        }
        results.append(row)
    piper_peak = median([r["piper-tts (PiperVoice, long text)"] for r in results])
    for name in results[0]:
        value = median([r[name] for r in results])
        rows.append([name, value, round(value / piper_peak, 2)])
    print(table(["process", "peak RSS MB (median)", "vs piper-tts"], rows))
    return results


_RECOMMENDED_HOOKS: Final = {**ARENA_OFF, "trim": "announcement", "max_frames": 128}
_RECOMMENDED: Final[dict[str, Any]] = {
    "env": GLIBC,
    "hooks": _RECOMMENDED_HOOKS,
    "config": {"cache": {"memory_bytes": 8 * 1024 * 1024}},
    "mapped": True,
}
PRESETS: Final[dict[str, dict[str, Any]]] = {
    "current": {},
    "arena-max-2": {"env": {"MALLOC_ARENA_MAX": "2"}},
    "arena-off": {"hooks": ARENA_OFF},
    "arena-off-glibc": {"env": GLIBC, "hooks": ARENA_OFF},
    "recommended": _RECOMMENDED,
    "recommended-64": {**_RECOMMENDED, "hooks": {**_RECOMMENDED_HOOKS, "max_frames": 64}},
    "recommended-32mb-cache": {**_RECOMMENDED, "config": {}},
    "recommended-not-mapped": {**_RECOMMENDED, "mapped": False},
    "recommended-check-cached": {**_RECOMMENDED, "check_cache": True},
}
"""Whole-agent settings: environment, hooks (memory_hooks.py), config sections, whether the
model cache holds the parts with memory-mapped (external) initializers, and whether the OTA
health check loads from the agent's model cache (`check_cache`: B's parts are there, as a
check that built them would leave them)."""


def _agent(
    layout: Layout,
    preset: dict[str, Any],
    announcements: int,
    cgroup_mb: float = 0,
    ota: bool = False,
) -> Row:
    models = (layout.cache_ext if preset.get("mapped") else layout.cache_a) / "models"
    argv = ["--models", str(models), "--announcements", str(announcements)]
    argv += [
        "--env",
        json.dumps(preset.get("env", {})),
        "--hooks",
        json.dumps(preset.get("hooks", {})),
    ]
    argv += ["--config", json.dumps(preset.get("config", {}))]
    if cgroup_mb:
        argv += ["--cgroup-mb", str(cgroup_mb)]
    if ota:
        argv += ["--ota-model", str(layout.model_b)]
    if preset.get("check_cache"):
        argv.append("--check-cache")
    return child("memory_agent.py", argv)


def cmd_agent(layout: Layout, args: argparse.Namespace) -> list[Row]:
    """The whole agent with presets (comma-separated), optionally in a memory cgroup."""
    if args.cgroup_mb and not is_root():
        raise SystemExit("--cgroup-mb needs root (cgroup v1 memory controller)")
    results: list[Row] = []
    rows = []
    growth_rows = []
    for name in args.preset.split(","):
        result = _agent(layout, PRESETS[name], args.announcements, args.cgroup_mb, args.ota)
        results.append({"preset": name, **result})
        rows += [
            [name, *row[1:], p.get("cgroup_peak"), p.get("cgroup")]
            for row, p in zip(phase_rows(name, result), result["phases"], strict=True)
        ]
        series = result.get("series") or []
        if series:
            third = series[max(0, len(series) // 3 - 1)]["rss"]
            growth_rows.append(
                [
                    name,
                    third,
                    series[-1]["rss"],
                    round(series[-1]["rss"] - third, 1),
                    result["latency_ms_p50"].get("cached"),
                    result["latency_ms_p50"].get("uncached"),
                    json.dumps(result.get("cgroup")),
                    result.get("killed") or "no",
                ]
            )
    print(table([*PHASE_HEADERS, "cgroup peak MB", "cgroup MB"], rows))
    print()
    print(
        table(
            [
                "preset",
                "RSS at 1/3 MB",
                "RSS at end MB",
                "growth MB",
                "cached p50 ms",
                "uncached p50 ms",
                "cgroup",
                "killed",
            ],
            growth_rows,
        )
    )
    return results


COMMANDS: Final[dict[str, Callable[[Layout, argparse.Namespace], list[Row]]]] = {
    "baseline": cmd_baseline,
    "options": cmd_options,
    "malloc": cmd_malloc,
    "malloc-speed": cmd_malloc_speed,
    "threads": cmd_threads,
    "chunks": cmd_chunks,
    "build": cmd_build,
    "check": cmd_check,
    "switch": cmd_switch,
    "piper": cmd_piper,
    "agent": cmd_agent,
}


def main() -> None:
    """Parse, prepare the workdir if needed, run the command(s), print tables, save JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["prepare", *COMMANDS, "all"])
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--json", type=Path, default=None, help="default: WORKDIR/COMMAND.json")
    parser.add_argument("--rounds", type=int, default=1, help="piper: repetitions")
    parser.add_argument("--reps", type=int, default=5, help="speed: interleaved runs per text")
    parser.add_argument("--announcements", type=int, default=None)
    parser.add_argument("--only", default=None, help="variants whose name contains a word")
    parser.add_argument("--arena", choices=("on", "off"), default="on", help="malloc: ORT arena")
    parser.add_argument("--preset", default="current,recommended", help=f"agent: {list(PRESETS)}")
    parser.add_argument("--cgroup-mb", type=float, default=0.0, help="agent: memory cgroup limit")
    parser.add_argument(
        "--env", default="{}", help="options, threads, chunks: environment of every run (JSON)"
    )
    parser.add_argument("--ota", action="store_true", help="agent: then update to B, roll back")
    parser.add_argument("--probe-seconds", type=float, default=5.0, help="build: probe length")
    args = parser.parse_args()
    layout = Layout(args.workdir)
    if args.command == "prepare" or not layout.ready:
        print(json.dumps(prepare(layout)), flush=True)
    if args.command == "prepare":
        return
    names = list(COMMANDS) if args.command == "all" else [args.command]
    defaults = {"malloc": 150, "agent": 150}
    for name in names:
        chosen = argparse.Namespace(**vars(args))
        chosen.announcements = args.announcements or defaults.get(name, 30)
        print(f"\n## {name}\n", flush=True)
        began = time.monotonic()
        results = COMMANDS[name](layout, chosen)
        print(f"\n({name}: {time.monotonic() - began:.0f} s)", flush=True)
        out = args.json or args.workdir / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
