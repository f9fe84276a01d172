"""Benchmark the voice agent against piper-tts 1.8 on the same voice, on this machine, in one run.

Measures warm synthesis speed, the compute overhead of chunked decoding, time to first audio of
uncached texts, cached-phrase latency through a real Mosquitto, cold start, memory and (full
mode) underruns while a minute-long text streams to a paced device, then writes
`results.json` and `REPORT.md` to --out-dir, the latency chart to --chart.
Usage: `python -m bench.run [--out-dir bench] [--quick]`.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from piper import PiperVoice

from agent.speech.voice import SynthesisParams, Voice, bundled_voice
from bench import metrics, synth
from bench.agent_side import (
    EVENTS_TOPIC,
    STATE_TOPIC,
    STATUS_TOPIC,
    AgentUnderTest,
    write_config,
)
from bench.metrics import Measured, Plan
from bench.probe import Probe
from bench.report import Panel, write_chart, write_json, write_markdown
from bench.stats import Entry
from bench.texts import (
    BENCH_SOUND,
    CACHED_PHRASE,
    COLD_START_SENTENCE,
    POWER_ON_PHRASE,
    SPEED_TEXTS,
    STORY,
)
from harness import Broker, PulseNullSink

_THREADS = 2


class Results(list[Measured]):
    """The measured blocks, each one's rows printed as it is added (a run cut short, or one
    that fails later, still shows what it measured)."""

    def __init__(self, say: Progress) -> None:
        super().__init__()
        self._say = say

    def append(self, measured: Measured) -> None:
        super().append(measured)
        for entry in measured.entries:
            self._say(" | ".join(entry.row()))


class Progress:
    """Prints `[bench  12s] message` lines, flushed at once."""

    def __init__(self) -> None:
        self.began = time.monotonic()

    def __call__(self, message: str) -> None:
        print(f"[bench {self.elapsed():4.0f}s] {message}", flush=True)

    def elapsed(self) -> float:
        """Seconds since the benchmark started."""
        return time.monotonic() - self.began


def machine_info() -> dict[str, Any]:
    """CPU, kernel and the versions that matter, with the date."""
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "onnxruntime": version("onnxruntime"),
        "piper-tts": version("piper-tts"),
        "numpy": version("numpy"),
        "paho-mqtt": version("paho-mqtt"),
        "mosquitto": _mosquitto_version(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_at_start": _load_average(),
    }


def _load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _mosquitto_version() -> str:
    done = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True, check=False)
    lines = done.stdout.splitlines()
    return lines[0].strip() if lines else "mosquitto (version unknown)"


def measure(work: Path, plan: Plan, say: Progress, stack: ExitStack) -> list[Measured]:
    """Every measurement, in an order where nothing else runs beside the timed work."""
    tag = uuid.uuid4().hex[:8]
    model = bundled_voice()
    results = in_process(model, work, plan, say)
    return [*results, *through_the_node(model, work, plan, say, stack, tag)]


def in_process(model: Path, work: Path, plan: Plan, say: Progress) -> list[Measured]:
    """Our voice against piper-tts's in this process: warm speed, the INT8 tier, the cost of
    decoding in chunks."""
    cache_dir = work / "cache"
    say("loading our voice (split, and whole) and piper-tts's in this process")
    split = Voice.load(model, threads=_THREADS, cache_dir=cache_dir)
    whole = Voice.load(model, threads=_THREADS, cache_dir=cache_dir, split=False)
    piper = synth.piper(PiperVoice.load(model))
    results = Results(say)
    results.append(metrics.warm_speed(synth.ours(split), piper, plan.speed_reps, say))
    int8 = int8_voice(model, work / "int8", cache_dir, say)
    if int8 is not None:
        results.append(
            metrics.warm_speed_tier(
                synth.ours(int8), synth.ours(split), plan.speed_reps, say, "int8"
            )
        )
        del int8
    noiseless = SynthesisParams(0.0, 1.0, 0.0)  # the same durations in every run
    results.append(
        metrics.chunking_overhead(
            synth.streamed(split, noiseless),
            synth.streamed(whole, noiseless),
            plan.overhead_reps,
            say,
        )
    )
    del whole
    return results


def through_the_node(  # noqa: PLR0917 - the run's context
    model: Path, work: Path, plan: Plan, say: Progress, stack: ExitStack, tag: str
) -> list[Measured]:
    """The agent run as a node, through Mosquitto: starts, first audio, CPU per second of
    speech, cached latency, memory, underruns on a paced device."""
    cache_dir = work / "cache"
    results = Results(say)
    broker = Broker(work / "broker")
    stack.callback(broker.stop)
    broker.start()
    probe = Probe(broker.host, broker.port, [EVENTS_TOPIC, STATUS_TOPIC, STATE_TOPIC])
    stack.callback(probe.close)
    config = write_config(work, broker, cache_dir, media={BENCH_SOUND: str(_doorbell(work))})

    def new_agent(agent_config: Path = config, env: dict[str, str] | None = None) -> AgentUnderTest:
        agent = AgentUnderTest(agent_config, work / "agent.log", probe, env)
        stack.callback(agent.stop)
        return agent

    def agent_cold_start() -> float:
        agent = new_agent()
        try:
            return agent.start()
        finally:
            agent.stop()

    def piper_child(texts: Sequence[str]) -> synth.ChildRun:
        return synth.run_piper_child(model, texts, work / "piper-child.log")

    def piper_cold_start() -> float:
        return piper_child([COLD_START_SENTENCE]).seconds

    results.append(metrics.cold_start(agent_cold_start, piper_cold_start, plan.cold_starts, say))
    powered = write_config(
        work, broker, cache_dir, name="agent-power-on.yaml", phrases=(POWER_ON_PHRASE,)
    )
    results.append(
        metrics.power_on(lambda: new_agent(powered), piper_cold_start, plan.cold_starts, say)
    )
    agent = new_agent()
    say(f"agent online after {agent.start():.2f} s; measuring time to first audio")
    piper = synth.piper(PiperVoice.load(model))
    first = metrics.first_audio(agent, piper, plan.ttfa_trials, tag, say)
    results.append(first)
    server = synth.PiperServer(model, work / "piper-server.log")
    stack.callback(server.stop)
    say("CPU per second of speech: the agent's processes against a long-lived piper-tts")
    results.append(metrics.cpu_per_speech(agent, server, plan.speed_reps, tag, say))
    server.stop()
    results.append(metrics.cached_latency(agent, plan.cached_messages, tag, say))
    results.append(metrics.cached_media_latency(agent, plan.cached_messages, tag, say))
    say("memory: the agent speaks the short, medium and long texts; piper-tts does the same")
    results.append(
        metrics.memory(agent, piper_child, [*first.details["texts"], CACHED_PHRASE], tag)
    )
    results[-1].details["publisher_tcp_nodelay"] = probe.nodelay
    agent.stop()
    if plan.paced:
        paced = write_config(work, broker, cache_dir, "paced_capture", "agent-paced.yaml")
        results.append(paced_run(work, paced, new_agent, tag, say))
    return results


def _doorbell(work: Path) -> Path:
    """A two-tone doorbell, 0.8 s, as a stereo 44.1 kHz FLAC: decoded, mixed and resampled on
    its first play, then found in the phrase cache."""
    import numpy as np  # noqa: PLC0415 - only here
    import soundfile  # noqa: PLC0415

    rate = 44_100
    seconds = np.arange(int(0.4 * rate)) / rate
    tones = [0.3 * np.sin(2 * np.pi * hz * seconds) for hz in (659.3, 523.3)]
    mono = np.concatenate(tones)
    path = work / "doorbell.flac"
    soundfile.write(path, np.stack([mono, mono], axis=1), rate, format="FLAC")
    return path


def int8_voice(model: Path, out_dir: Path, cache_dir: Path, say: Progress) -> Voice | None:
    """The INT8 tier (docs/quantization.md): the selective recipe (`tiers.recipes.DEFAULT`)
    built from the bundled voice as a node builds it (calibration, then the recipe's units);
    None if it cannot be built here."""
    from tiers import recipes, selective  # noqa: PLC0415 - the operator tool, only for this
    from tiers.quantize import CALIBRATION_TEXTS, sentence_ids  # noqa: PLC0415
    from tiers.variants import BuildInputs  # noqa: PLC0415

    say("building the INT8 tier (the selective recipe)")
    fp32 = Voice.describe(model, None)
    defaults = fp32.default_params
    inputs = BuildInputs(
        model,
        sentence_ids(fp32, CALIBRATION_TEXTS),
        (defaults.noise_scale, defaults.length_scale, defaults.noise_w),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{model.stem}.int8.onnx"
    selective.calibrate(inputs, out_dir / "calibration.json", selective.options_of(recipes.DEFAULT))
    selective.build_recipe(model, recipes.DEFAULT, out_dir / "calibration.json", path)
    path.with_name(f"{path.name}.json").write_bytes(Path(f"{model}.json").read_bytes())
    return Voice.load(path, threads=_THREADS, cache_dir=cache_dir)


def paced_run(
    work: Path,
    config: Path,
    new_agent: Callable[[Path, dict[str, str]], AgentUnderTest],
    tag: str,
    say: Progress,
) -> Measured:
    """The agent on ALSA's `pulse` device over a PulseAudio null sink (paced in real time)
    speaks a minute-long text; the underruns its state reports afterwards."""
    sink = PulseNullSink(work / "pulse")
    sink.start()
    try:
        agent = new_agent(config, sink.env(work / "paced.raw"))
        say(f"paced agent online after {agent.start():.2f} s; streaming a minute-long text")
        timing = agent.speak(STORY, f"{tag}-paced", timeout=180)
        state = agent.state()
        agent.stop()
    finally:
        sink.stop()
    say(f"paced: {timing.audio_seconds:.0f} s of audio, {state['underruns']} underruns")
    return metrics.paced_underruns(int(state["underruns"]), timing.audio_seconds)


def panels(entries: dict[str, Entry]) -> list[Panel]:
    """The chart: first audio (three sentences; one long sentence), cached latency, cold start."""
    ttfa_whole = entries["ttfa_vs_piper_whole_text"]
    ttfa_first = entries["ttfa_vs_piper_first_sentence"]
    unpunctuated = entries["ttfa_unpunctuated"]
    cached = entries["cached_latency_p50"]
    cold = entries["cold_start"]
    return [
        Panel(
            "Time to first audio, uncached 3 sentences",
            "ms",
            {
                "ours (MQTT,\npublish → started)": ttfa_whole.ours,
                "piper-tts\nfirst sentence": ttfa_first.piper or [],
                "piper-tts\nwhole text": ttfa_whole.piper or [],
            },
        ),
        Panel(
            "Time to first audio, one long sentence\nwithout punctuation",
            "ms",
            {
                "ours (MQTT,\npublish → started)": unpunctuated.ours,
                "piper-tts": unpunctuated.piper or [],
            },
        ),
        Panel(
            "Cached phrase, publish → started",
            "ms",
            {"ours": cached.ours},
            {"target p50 10 ms": 10.0, "target p99 30 ms": 30.0},
        ),
        Panel(
            "Cold start",
            "s",
            {
                "ours\n(spawn → online)": cold.ours,
                "piper-tts\n(spawn → 1st sentence)": cold.piper or [],
            },
        ),
    ]


def write_outputs(
    out: Path, chart: Path, machine: dict[str, Any], run: dict[str, Any], done: list[Measured]
) -> None:
    """results.json and REPORT.md in out; the latency chart at `chart`."""
    entries = [entry for measured in done for entry in measured.entries]
    by_key = {entry.key: entry for entry in entries}
    details: dict[str, Any] = {}
    for measured in done:
        details.update(measured.details)
    write_json(
        out / "results.json",
        {
            "machine": machine,
            "run": run,
            "metrics": {entry.key: entry.to_json() for entry in entries},
            "details": details,
        },
    )
    write_markdown(out / "REPORT.md", machine, run, entries)
    chart.parent.mkdir(parents=True, exist_ok=True)
    write_chart(chart, panels(by_key))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and write its outputs."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("bench"), help="output folder")
    parser.add_argument(
        "--chart",
        type=Path,
        default=Path("docs/images/latency.png"),
        help="the latency chart (the documentation site shows it)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    plan = metrics.QUICK if args.quick else metrics.FULL
    say = Progress()
    machine = machine_info()
    say(f"{machine['cpu_model']}, {machine['cores']} cores; plan {asdict(plan)}")
    with tempfile.TemporaryDirectory(prefix="voice-agent-bench-") as tmp, ExitStack() as stack:
        done = measure(Path(tmp), plan, say, stack)
    run = {
        "quick": args.quick,
        "plan": asdict(plan),
        "duration_s": round(say.elapsed(), 1),
        "load_average_at_end": _load_average(),
        "speed_texts": SPEED_TEXTS,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_outputs(args.out_dir, args.chart, machine, run, done)
    for entry in (entry for measured in done for entry in measured.entries):
        say(" | ".join(entry.row()))
    say(f"wrote results.json and REPORT.md to {args.out_dir}, the chart to {args.chart}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
