"""Component workloads for bench/memory/measure_memory.py, each run in a fresh process.

Usage: python bench/memory/memory_workloads.py SCENARIO [options] (PYTHONPATH must hold the project
folder; measure_memory.py starts it so). It prints one line `RESULT <json>`: the memory of each
phase (RSS, PSS, anonymous and file-backed pages at its end, and its peak, VmHWM reset at its
start) and what else the scenario measured.

Scenarios (the real bundled voice unless --model; the model cache given by --cache is warm):
- `imports`: the interpreter, then numpy, onnxruntime, piper, paho, and the whole agent package.
- `load`: one voice (`--what parts|whole|both|build`), prewarmed, then the bench's long text
  through the agent's Synthesizer, then malloc_trim; live sessions counted.
- `speak`: a voice with the hook settings (`--hooks`), then the long text (its peak), then a
  short announcement mix.
- `speed`: several settings (`--variants`) in one process, runs interleaved: wall and CPU time
  per second of audio, first chunk, decoder frames per frame of audio, seconds per part.
- `mix`: the agent's Synthesizer (its own thread) and PhraseCache over a soak-like mix:
  `--announcements` of 1-3 sentences, every third uncached; RSS every 10 announcements.
- `build`: the first start with a cold model cache (the parts built in process), traced at each
  ONNX/onnx step.
- `check`: a health check of a model, as agent/speech/healthcheck.py does it or leaner (`--cache`,
  `--cache-cold`, `--decode whole|chunked`, `--max-frames`, `--phrases`, `--reference`,
  `--release`, `--no-prewarm`, `--hooks`).
- `switch`: a voice in use, then a second model loaded beside it (`--order both`) or after the
  first is dropped (`--order drop-first`), with its parts cached or built (`--cold`).
- `piper`: piper-tts (PiperVoice) synthesizing the long text, as `make bench` runs it.
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from memory_proc import malloc_trim, reset_peak, threads, usage

if TYPE_CHECKING:
    from agent.speech.phrase_cache import PhraseCache
    from agent.speech.voice import SynthesisParams, Voice

SEED: Final = 1
"""ONNX Runtime's seed: the same noise, hence the same durations, in every process."""
CACHED_TEXTS: Final = (
    "The front door is open.",
    "The laundry is done. Please hang it up.",
    "Dinner is ready. Please come to the kitchen. The oven is still hot.",
    "The garage door is closed.",
    "Rain is expected this afternoon. Take an umbrella.",
    "The dishwasher has finished. The kitchen is tidy. Good night.",
)
"""Announcements of one to three sentences that the mix repeats (cached after the first time)."""
MARK_EVERY: Final = 10
"""Announcements between two memory samples of a mix."""
HOP: Final = 256
"""Samples per latent frame of the joe voice."""


class Phases:
    """Memory per phase: each `mark` reads the usage and the peak since the last mark."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        reset_peak()

    def mark(self, phase: str, **extra: Any) -> None:
        """Close a phase: its memory now and its peak; the next phase starts here."""
        self.rows.append({"phase": phase, **usage().as_dict(), **extra})
        reset_peak()


def emit(result: dict[str, Any]) -> None:
    """Print the scenario's result for the parent."""
    print("RESULT " + json.dumps(result), flush=True)


# ---- synthesis as the agent does it ----------------------------------------------------------


def agent_params(voice: Voice) -> SynthesisParams:
    """The voice's own scales (what the agent uses by default)."""
    return voice.default_params


def load_voice(model: Path, threads_: int, cache: Path | None, *, split: bool = True) -> Voice:
    """Voice.load with the seed set first (as the agent does with `tts.seed`)."""
    from agent.speech.voice import Voice, seed_random  # noqa: PLC0415

    seed_random(SEED)
    return Voice.load(model, threads_, cache, split=split)


def live_sessions() -> int:
    """InferenceSession objects still reachable in this process."""
    import onnxruntime as ort  # noqa: PLC0415

    gc.collect()
    return sum(isinstance(o, ort.InferenceSession) for o in gc.get_objects())


def no_cache() -> PhraseCache:
    """A phrase cache that keeps nothing (every sentence is synthesized)."""
    from agent.speech.phrase_cache import PhraseCache  # noqa: PLC0415

    return PhraseCache(None, 0, 0)


class Runner:
    """The agent's own Synthesizer (its thread, clause groups, decoder chunks, phrase cache)
    with one voice; the chunks it puts for the player are counted and dropped (the player's
    part is measured in whole-agent runs)."""

    def __init__(self, voice: Voice, cache: PhraseCache, max_frames: int) -> None:
        from agent.formats.chunking import FIRST_FRAMES  # noqa: PLC0415
        from agent.settings.declarations import TtsConfig  # noqa: PLC0415
        from agent.speech.synthesizer import Synthesizer, VoiceChoice  # noqa: PLC0415

        tts = TtsConfig()
        self._done: queue.Queue[object] = queue.Queue()
        self._first: float | None = None
        self._jobs = 0
        self.samples = 0
        """Samples put for the player so far."""
        self.last_first = 0.0
        """Seconds from submit to the first chunk of the last `timed` announcement."""
        self.sample_rate = voice.sample_rate
        choice = VoiceChoice("default", voice, agent_params(voice))
        self.synthesizer = Synthesizer(
            {"default": choice},
            cache,
            (tts.first_chunk_phonemes, tts.max_chunk_phonemes),
            self._put,
            self._done.put,
            chunk_frames=(min(FIRST_FRAMES, max_frames), max_frames),
        )
        self.synthesizer.start()

    def _put(self, chunk: object) -> bool:
        pcm = getattr(chunk, "pcm", None)
        if pcm is not None:
            self.samples += len(pcm)
            if self._first is None:
                self._first = time.perf_counter()
        return True

    def speak(self, request_id: str, text: str) -> tuple[float, float]:
        """Synthesize one announcement; seconds from submit to its first chunk and to its end."""
        from agent.core.messages import SpeakRequest, SynthesisDone  # noqa: PLC0415

        self._first = None
        self._jobs += 1
        began = time.perf_counter()
        self.synthesizer.submit(SpeakRequest(request_id, text), self._jobs)
        while True:
            event = self._done.get(timeout=120)
            if isinstance(event, SynthesisDone) and event.id == request_id:
                break
        ended = time.perf_counter()
        return (self._first or ended) - began, ended - began

    def timed(self, text: str) -> tuple[float, float, float]:
        """(wall seconds, CPU seconds of this process's threads, audio seconds) of one
        announcement. CPU time hardly depends on what else the machine runs; wall time does.
        `last_first` is then the seconds to its first chunk."""
        before, cpu = self.samples, time.process_time()
        self.last_first, wall = self.speak(f"t{self._jobs}", text)
        return wall, time.process_time() - cpu, (self.samples - before) / self.sample_rate

    def stop(self) -> None:
        """Stop the synthesis thread."""
        self.synthesizer.stop()


class PartTimer:
    """Time spent in each part's runs, and the frames the decoder ran over (each chunk's
    context included), while installed."""

    def __init__(self) -> None:
        import onnxruntime as ort  # noqa: PLC0415

        self.seconds: dict[str, float] = {}
        self.decoder_frames = 0
        self._real = ort.InferenceSession.run
        self._session = ort.InferenceSession

    def __enter__(self) -> PartTimer:
        import memory_hooks  # noqa: PLC0415

        real = self._real

        def run(session: Any, names: Any, feed: dict[str, Any], *args: Any, **kw: Any) -> Any:
            began = time.perf_counter()
            outputs = real(session, names, feed, *args, **kw)
            part = memory_hooks.part_of(getattr(session, "_model_path", None) or b"")
            self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - began
            if part == "decoder":
                self.decoder_frames += max(v.shape[-1] for v in feed.values())
            return outputs

        self._session.run = run
        return self

    def __exit__(self, *_exc: object) -> None:
        self._session.run = self._real


# ---- the announcement mix --------------------------------------------------------------------


def mix_texts(count: int, seed: int = SEED) -> list[tuple[str, str]]:
    """(kind, text) of a soak-like mix: every third uncached (one to three sentences that start
    with a number unique in the run), the others from CACHED_TEXTS."""
    from bench.texts import uncached_short, uncached_text  # noqa: PLC0415

    rng = random.Random(seed)  # noqa: S311 - varied words, not secrets
    texts: list[tuple[str, str]] = []
    for n in range(count):
        if n % 3:
            texts.append(("cached", CACHED_TEXTS[n % len(CACHED_TEXTS)]))
            continue
        sentences = 1 + (n // 3) % 3
        text = uncached_short(rng, n) if sentences == 1 else uncached_text(rng, n)
        if sentences == 2:
            text = " ".join(text.split(". ")[:2]) + "."
        texts.append(("uncached", text))
    return texts


def run_mix(
    voice: Voice, count: int, cache_mb: float, max_frames: int, *, trim: bool
) -> dict[str, Any]:
    """The mix through the agent's synthesizer; memory every MARK_EVERY announcements."""
    from agent.speech.phrase_cache import PhraseCache  # noqa: PLC0415

    cache = PhraseCache(None, int(cache_mb * 1024 * 1024), 0)
    runner = Runner(voice, cache, max_frames)
    latency: dict[str, list[float]] = {"cached": [], "uncached": []}
    synthesis: list[float] = []
    series: list[dict[str, Any]] = []
    trims: list[float] = []
    try:
        for n, (kind, text) in enumerate(mix_texts(count)):
            first, total = runner.speak(f"m{n}", text)
            latency[kind].append(first)
            if kind == "uncached":
                synthesis.append(total)
            if trim:
                began = time.perf_counter()
                malloc_trim()
                trims.append(time.perf_counter() - began)
            if (n + 1) % MARK_EVERY == 0:
                cache_mb_now = round(cache.stats().memory_bytes / 2**20, 1)
                series.append({"n": n + 1, **usage().as_dict(), "phrase_cache": cache_mb_now})
    finally:
        runner.stop()
    stats = cache.stats()
    return {
        "series": series,
        "cached_first_chunk_ms_p50": round(statistics.median(latency["cached"]) * 1000, 2),
        "uncached_first_chunk_ms_p50": round(statistics.median(latency["uncached"]) * 1000, 1),
        "uncached_synthesis_s": round(sum(synthesis), 2),
        "phrase_cache_mb": round(stats.memory_bytes / 2**20, 1),
        "trim_ms_p50": round(statistics.median(trims) * 1000, 2) if trims else None,
        "threads": threads(),
    }


def long_text(voice: Voice, max_frames: int) -> tuple[float, float]:
    """The bench's long text through the agent's synthesizer (nothing cached): (wall seconds,
    audio seconds)."""
    from bench.texts import SPEED_TEXTS  # noqa: PLC0415

    runner = Runner(voice, no_cache(), max_frames)
    try:
        wall, _, audio = runner.timed(SPEED_TEXTS["long"])
    finally:
        runner.stop()
    return wall, audio


# ---- scenarios --------------------------------------------------------------------------------


def scenario_imports(_args: argparse.Namespace) -> dict[str, Any]:
    """The interpreter alone, then each import the agent makes, in order."""
    phases = Phases()
    phases.mark("python")
    import numpy  # noqa: PLC0415, F401 - measured one at a time

    phases.mark("numpy")
    import onnxruntime  # noqa: PLC0415, F401

    phases.mark("onnxruntime")
    import piper.config  # noqa: PLC0415, F401
    from piper import espeakbridge  # noqa: PLC0415, F401

    phases.mark("piper")
    import paho.mqtt.client  # noqa: PLC0415, F401

    phases.mark("paho")
    import agent.app  # noqa: PLC0415, F401

    phases.mark("agent (every module)")
    return {"phases": phases.rows}


def scenario_load(args: argparse.Namespace) -> dict[str, Any]:
    """One voice or two sessions' worth, loaded, prewarmed and used on the long text."""
    import agent.app  # noqa: PLC0415, F401 - the agent's imports, as in the agent

    phases = Phases()
    phases.mark("imports")
    voices: list[Voice] = []
    with tempfile.TemporaryDirectory() as cold:
        cache = Path(cold) if args.what == "build" else args.cache
        if args.what in ("parts", "both", "build"):
            voices.append(load_voice(args.model, args.threads, cache))
        if args.what in ("whole", "both"):
            voices.append(load_voice(args.model, args.threads, cache, split=False))
        phases.mark("load", sessions=live_sessions())
        for voice in voices:
            voice.prewarm()
        phases.mark("prewarm")
        for voice in voices:
            wall, audio = long_text(voice, args.max_frames)
        phases.mark("long text", audio_s=round(audio, 1), wall_s=round(wall, 2))
        malloc_trim()
        phases.mark("after malloc_trim", sessions=live_sessions())
    return {"phases": phases.rows, "chunked": [v.chunked for v in voices]}


def scenario_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Real-time factor of several settings in one process, runs interleaved (so the load of
    a shared machine falls on all alike): `--variants` is a JSON object {name: {"hooks":
    session settings, "threads": n, "max_frames": n}}; each name gets its own voice and
    synthesizer (nothing cached)."""
    import memory_hooks  # noqa: PLC0415

    from bench.texts import SPEED_TEXTS  # noqa: PLC0415

    variants: dict[str, dict[str, Any]] = json.loads(args.variants)
    runners: dict[str, Runner] = {}
    for name, spec in variants.items():
        memory_hooks.use_sessions(spec.get("hooks", {}))
        voice = load_voice(args.model, spec.get("threads", args.threads), args.cache)
        voice.prewarm()
        runners[name] = Runner(voice, no_cache(), spec.get("max_frames", args.max_frames))
    decoded: dict[str, float] = {}
    seconds: dict[str, dict[str, float]] = {}
    for name, runner in runners.items():
        before = runner.samples
        with PartTimer() as parts:
            for text in SPEED_TEXTS.values():
                runner.timed(text)  # warm-up: first runs on new shapes are slower
        played = (runner.samples - before) / HOP
        decoded[name] = round(parts.decoder_frames / max(1.0, played), 3)
        seconds[name] = {part: round(value, 3) for part, value in parts.seconds.items()}
    rtf: dict[str, dict[str, list[float]]] = {n: {t: [] for t in SPEED_TEXTS} for n in runners}
    cpu: dict[str, dict[str, list[float]]] = {n: {t: [] for t in SPEED_TEXTS} for n in runners}
    first: dict[str, dict[str, list[float]]] = {n: {t: [] for t in SPEED_TEXTS} for n in runners}
    for rep in range(args.reps):
        order = list(runners) if rep % 2 == 0 else list(reversed(runners))
        for text_name, text in SPEED_TEXTS.items():
            for name in order:
                time.sleep(0.05)  # let the previous run's pool threads go quiet
                wall, used, audio = runners[name].timed(text)
                rtf[name][text_name].append(round(wall / audio, 4))
                cpu[name][text_name].append(round(used / audio, 4))
                first[name][text_name].append(round(runners[name].last_first * 1000, 1))
    for runner in runners.values():
        runner.stop()
    return {
        "rtf": rtf,
        "cpu": cpu,
        "first_ms": first,
        "decoded_per_frame": decoded,
        "part_seconds": seconds,
    }


def scenario_speak(args: argparse.Namespace) -> dict[str, Any]:
    """Load, the long text's peak, then a short mix (speed: the `speed` scenario)."""
    import agent.app  # noqa: PLC0415, F401

    phases = Phases()
    phases.mark("imports")
    voice = load_voice(args.model, args.threads, args.cache)
    phases.mark("load")
    voice.prewarm()
    phases.mark("prewarm")
    wall, audio = long_text(voice, args.max_frames)
    phases.mark("long text", audio_s=round(audio, 1), wall_s=round(wall, 2))
    mixed = run_mix(voice, args.announcements, args.cache_mb, args.max_frames, trim=args.trim)
    phases.mark("mix")
    return {"phases": phases.rows, "mix": mixed}


def scenario_mix(args: argparse.Namespace) -> dict[str, Any]:
    """The soak-like mix on a loaded, prewarmed voice."""
    import agent.app  # noqa: PLC0415, F401

    phases = Phases()
    phases.mark("imports")
    voice = load_voice(args.model, args.threads, args.cache)
    voice.prewarm()
    phases.mark("load and prewarm")
    mixed = run_mix(voice, args.announcements, args.cache_mb, args.max_frames, trim=args.trim)
    phases.mark("mix")
    return {"phases": phases.rows, "mix": mixed}


def _trace_onnx() -> list[dict[str, Any]]:
    """Record memory after each onnx step of a build (load, shape inference, extraction)."""
    import memory_hooks  # noqa: PLC0415
    import onnx  # noqa: PLC0415
    import onnx.shape_inference  # noqa: PLC0415
    import onnx.utils  # noqa: PLC0415

    def traced(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            value = function(*args, **kwargs)
            seconds = round(time.perf_counter() - began, 3)
            memory_hooks.TRACE.append({"label": label, "seconds": seconds, **usage().as_dict()})
            reset_peak()
            return value

        return run

    onnx.load = traced("onnx.load", onnx.load)
    onnx.shape_inference.infer_shapes = traced(
        "onnx.shape_inference.infer_shapes", onnx.shape_inference.infer_shapes
    )
    extractor = onnx.utils.Extractor
    extractor.extract_model = traced("extract_model", extractor.extract_model)  # type: ignore[method-assign]
    return memory_hooks.TRACE


def scenario_build(args: argparse.Namespace) -> dict[str, Any]:
    """A first start: the parts built in this process, every step traced."""
    import memory_hooks  # noqa: PLC0415

    import agent.app  # noqa: PLC0415, F401

    phases = Phases()
    phases.mark("imports")
    trace = _trace_onnx()
    memory_hooks.install({**json.loads(args.hooks), "trace": True})
    with tempfile.TemporaryDirectory() as cold:
        began = time.perf_counter()
        voice = load_voice(args.model, args.threads, Path(cold))
        seconds = time.perf_counter() - began
        phases.mark("build", seconds=round(seconds, 1), sessions=live_sessions())
        voice.prewarm()
        phases.mark("prewarm")
        malloc_trim()
        phases.mark("after malloc_trim")
        onnx_loaded = "onnx" in sys.modules
    return {"phases": phases.rows, "trace": trace, "onnx_imported": onnx_loaded}


def _check_one(voice: Voice, phrases: tuple[str, ...], decode: str, max_frames: int) -> float:
    """Synthesize the health check's phrases (noise 0) as agent/speech/healthcheck.py does
    (`Voice.render`: decoder chunks of `max_frames`), or each clause group whole; seconds."""
    from agent.speech.voice import FramePlan  # noqa: PLC0415

    params = replace(voice.default_params, noise_scale=0.0, noise_w=0.0)
    began = time.perf_counter()
    for phrase in phrases:
        for ids in voice.sentence_ids(phrase):
            plan = FramePlan.whole() if decode == "whole" else FramePlan.largest_only(max_frames)
            voice.render(ids, params, plan)
    return time.perf_counter() - began


def scenario_check(args: argparse.Namespace) -> dict[str, Any]:
    """A health check: the candidate (and the reference, one after the other) loaded and
    made to speak the check's phrases."""
    import memory_hooks  # noqa: PLC0415

    from agent.speech.healthcheck import PHRASES  # noqa: PLC0415

    memory_hooks.install(json.loads(args.hooks))
    phases = Phases()
    phrases = PHRASES[: args.phrases]
    timings: dict[str, float] = {}
    models = [("candidate", args.model)]
    if args.reference is not None:
        models.append(("reference", args.reference))
    with tempfile.TemporaryDirectory() as scratch:
        cache = args.cache if args.cache is not None else None
        if args.cache_cold:
            cache = Path(scratch)
        for name, model in models:
            voice = load_voice(model, args.threads, cache)
            phases.mark(f"{name}: load", chunked=voice.chunked)
            if args.prewarm:
                voice.prewarm()
            timings[name] = round(_check_one(voice, phrases, args.decode, args.max_frames), 3)
            phases.mark(f"{name}: phrases")
            del voice
            if args.release:
                gc.collect()
                malloc_trim()
    return {"phases": phases.rows, "compute_s": timings}


def scenario_switch(args: argparse.Namespace) -> dict[str, Any]:
    """A voice in use, then the model B loaded (cached parts, or built with --cold) beside it
    or after it was dropped, as a switch or a rollback does."""
    import memory_hooks  # noqa: PLC0415

    import agent.app  # noqa: PLC0415, F401

    memory_hooks.install(json.loads(args.hooks))
    phases = Phases()
    current: Voice | None = load_voice(args.model, args.threads, args.cache)
    assert current is not None  # noqa: S101 - for the type checker
    current.prewarm()
    run_mix(current, args.announcements, args.cache_mb, args.max_frames, trim=False)
    phases.mark("A in use (load, mix)")
    with tempfile.TemporaryDirectory() as cold:
        cache = Path(cold) if args.cold else args.cache
        if args.order == "drop-first":
            current = None
            gc.collect()
            malloc_trim()
            phases.mark("A dropped")
        candidate = load_voice(args.other, args.threads, cache)
        candidate.prewarm()
        phases.mark("B loaded and prewarmed", sessions=live_sessions())
        current = None
        gc.collect()
        malloc_trim()
        phases.mark("A released (B only)")
        run_mix(candidate, args.announcements, args.cache_mb, args.max_frames, trim=False)
        phases.mark("B in use (mix)")
    return {"phases": phases.rows}


def scenario_piper(args: argparse.Namespace) -> dict[str, Any]:
    """piper-tts on the long text (its own session, defaults), as the bench's child runs it."""
    from piper import PiperVoice  # noqa: PLC0415

    from bench.texts import SPEED_TEXTS  # noqa: PLC0415

    phases = Phases()
    phases.mark("imports")
    voice = PiperVoice.load(args.model)
    phases.mark("load")
    for _ in voice.synthesize(SPEED_TEXTS["long"]):
        pass
    phases.mark("long text")
    return {"phases": phases.rows}


SCENARIOS: Final[dict[str, Callable[[argparse.Namespace], dict[str, Any]]]] = {
    "imports": scenario_imports,
    "load": scenario_load,
    "speak": scenario_speak,
    "speed": scenario_speed,
    "mix": scenario_mix,
    "build": scenario_build,
    "check": scenario_check,
    "switch": scenario_switch,
    "piper": scenario_piper,
}


def parser() -> argparse.ArgumentParser:
    """The command line (one scenario a process)."""
    from agent.formats.chunking import MAX_FRAMES  # noqa: PLC0415

    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("scenario", choices=sorted(SCENARIOS))
    parse.add_argument("--model", type=Path, default=None, help="default: the bundled voice")
    parse.add_argument("--other", type=Path, default=None, help="switch: the model B")
    parse.add_argument("--reference", type=Path, default=None, help="check: the current model")
    parse.add_argument("--cache", type=Path, default=None, help="a warm model cache")
    parse.add_argument("--cache-cold", action="store_true", help="check: an empty model cache")
    parse.add_argument("--threads", type=int, default=2)
    parse.add_argument("--max-frames", type=int, default=MAX_FRAMES)
    parse.add_argument("--what", choices=("parts", "whole", "both", "build"), default="parts")
    parse.add_argument("--hooks", default="{}", help="memory_hooks settings (JSON)")
    parse.add_argument("--reps", type=int, default=0, help="speak, speed: timed runs per text")
    parse.add_argument("--variants", default="{}", help="speed: {name: settings} (JSON)")
    parse.add_argument("--announcements", type=int, default=30)
    parse.add_argument("--cache-mb", type=float, default=32.0, help="phrase cache in memory")
    parse.add_argument("--trim", action="store_true", help="malloc_trim after each announcement")
    parse.add_argument("--decode", choices=("whole", "chunked"), default="chunked")
    parse.add_argument("--phrases", type=int, default=2, help="check: how many of its phrases")
    parse.add_argument("--prewarm", action=argparse.BooleanOptionalAction, default=True)
    parse.add_argument("--release", action="store_true", help="check: trim between models")
    parse.add_argument("--order", choices=("both", "drop-first"), default="both")
    parse.add_argument("--cold", action="store_true", help="switch: B's parts not cached")
    return parse


def main() -> None:
    """Run one scenario and print its RESULT line."""
    args = parser().parse_args()
    if args.model is None and args.scenario != "imports":
        from agent.speech.voice import bundled_voice  # noqa: PLC0415

        args.model = bundled_voice()
    if args.scenario in ("load", "speak", "mix"):
        import memory_hooks  # noqa: PLC0415 - not before `imports` has measured onnxruntime

        memory_hooks.install(json.loads(args.hooks))
    began = time.perf_counter()
    result = SCENARIOS[args.scenario](args)
    result["wall_s"] = round(time.perf_counter() - began, 1)
    emit(result)


if __name__ == "__main__":
    main()
