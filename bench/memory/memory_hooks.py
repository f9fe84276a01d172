"""What-if settings for a process that runs the agent's code unchanged: ONNX Runtime session
options per part of a split voice, a shared environment allocator, arena shrinkage after each
run, and malloc_trim after each announcement.

The agent makes its sessions with `ort.InferenceSession(path, options, ...)`; `install` puts a
subclass in its place that first applies the settings to those options, chosen by the part the
file is (`*.prior.onnx`, `*.flow.onnx`, `*.decoder.onnx`; `whole` for any other file, `bytes`
for a model given as bytes while the parts are built). Component runs call `install` directly;
for the whole agent, bench/memory/measure_memory.py writes a `sitecustomize.py` that calls it with
the settings in the environment variable SETTINGS_ENV. Settings are a JSON object:

- `all` / `prior` / `flow` / `decoder` / `whole` / `bytes`: session settings (the part's own
  win over `all`): `arena` (enable_cpu_mem_arena), `pattern` (enable_mem_pattern), `reuse`
  (enable_mem_reuse), `config` (session config entries, e.g. {"session.disable_prepacking": "1"}).
- `env_arena`: register one CPU arena in the environment, shared by every session (sets
  `session.use_env_allocators`): {"strategy": "same" | "pow2", "max_mb": 0, "initial_mb": 0}.
- `shrink`: every RunOptions the process makes shrinks the CPU arena after the run.
- `trim`: "announcement" calls malloc_trim(0) after each announcement of the agent's synthesizer.
- `max_frames`: the largest decoder chunk of the agent's synthesizer (frames; it has no config
  key).
- `trace`: record memory at each session creation (see `TRACE`).
- `default_cache`: a model cache directory that `Voice.load` uses when it is given none (what
  the health check would do if the updater passed it the agent's cache: the candidate's parts
  built once and kept, the current model's loaded from its cached parts).
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import onnxruntime as ort
from memory_proc import malloc_trim, reset_peak, usage

SETTINGS_ENV: Final = "VOICE_AGENT_MEMORY_HOOKS"
"""Environment variable holding the settings (JSON) for a process started with the hooks."""
PARTS: Final = ("prior", "flow", "decoder")
_SESSION_KEYS: Final = frozenset({"arena", "pattern", "reuse", "config"})
_TOP_KEYS: Final = frozenset(
    {"all", "whole", "bytes", *PARTS, "env_arena", "shrink", "trim", "max_frames", "default_cache"}
)
_TOP_KEYS_ALL: Final = _TOP_KEYS | {"trace"}
_SHRINK: Final = ("memory.enable_memory_arena_shrinkage", "cpu:0")
_STRATEGIES: Final = {"pow2": 0, "same": 1}
"""OrtArenaCfg arena_extend_strategy: kNextPowerOfTwo, kSameAsRequested."""

TRACE: list[dict[str, Any]] = []
"""With `trace`: (label, memory) after each session creation, with the peak since the one
before."""
TRIMS: list[float] = []
"""With `trim`: seconds each malloc_trim took."""


def check(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings, or ValueError naming what is wrong."""
    unknown = set(settings) - _TOP_KEYS_ALL
    if unknown:
        raise ValueError(f"unknown hook settings {sorted(unknown)}; known: {sorted(_TOP_KEYS)}")
    for part in ("all", "whole", "bytes", *PARTS):
        bad = set(settings.get(part, {})) - _SESSION_KEYS
        if bad:
            raise ValueError(f"{part}: unknown session settings {sorted(bad)}")
    arena = settings.get("env_arena")
    if arena is not None and arena.get("strategy", "pow2") not in _STRATEGIES:
        raise ValueError(f"env_arena.strategy: one of {sorted(_STRATEGIES)}")
    if settings.get("trim", "none") not in ("none", "announcement"):
        raise ValueError("trim: 'none' or 'announcement'")
    return settings


def part_of(model: object) -> str:
    """Which part of a split voice a model given to InferenceSession is."""
    if isinstance(model, bytes | bytearray):
        return "bytes"
    name = Path(str(model)).name
    for part in PARTS:
        if name.endswith(f".{part}.onnx"):
            return part
    return "whole"


def _apply(options: ort.SessionOptions, chosen: dict[str, Any]) -> None:
    if "arena" in chosen:
        options.enable_cpu_mem_arena = bool(chosen["arena"])
    if "pattern" in chosen:
        options.enable_mem_pattern = bool(chosen["pattern"])
    if "reuse" in chosen:
        options.enable_mem_reuse = bool(chosen["reuse"])
    for key, value in chosen.get("config", {}).items():
        options.add_session_config_entry(str(key), str(value))


_SESSIONS: dict[str, Any] = {}
"""The session settings in force (`install`, then `use_sessions`)."""


def use_sessions(settings: dict[str, Any]) -> None:
    """From now on, sessions get these session settings (`all` and per part) instead: one
    process can then hold voices made with different options (interleaved speed runs)."""
    check(settings)
    _SESSIONS.clear()
    _SESSIONS.update({k: v for k, v in settings.items() if k in ("all", "whole", "bytes", *PARTS)})


def install(settings: dict[str, Any]) -> None:
    """Apply the settings to every session and run this process makes from now on."""
    use_sessions(settings)
    env_arena = settings.get("env_arena")
    if env_arena is not None:
        info = ort.OrtMemoryInfo(
            "Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT
        )
        config = ort.OrtArenaCfg(
            int(env_arena.get("max_mb", 0)) * 1024 * 1024,
            _STRATEGIES[env_arena.get("strategy", "pow2")],
            int(env_arena.get("initial_mb", 0)) * 1024 * 1024,
            -1,
        )
        ort.create_and_register_allocator(info, config)
    real_session = ort.InferenceSession
    tracing = bool(settings.get("trace"))

    class HookedSession(real_session):  # type: ignore[misc, valid-type]
        """InferenceSession with the settings of its part applied to its options."""

        def __init__(
            self, model: Any, sess_options: ort.SessionOptions | None = None, *args: Any, **kw: Any
        ) -> None:
            part = part_of(model)
            options = sess_options if sess_options is not None else ort.SessionOptions()
            saving = bool(options.optimized_model_filepath)
            chosen = {**_SESSIONS.get("all", {}), **_SESSIONS.get(part, {})}
            if not saving:  # a session made only to save an optimized copy is left alone
                _apply(options, chosen)
                if env_arena is not None:
                    options.add_session_config_entry("session.use_env_allocators", "1")
            began = time.perf_counter()
            super().__init__(model, options, *args, **kw)
            if tracing:
                label = f"{part}{' (saved)' if saving else ''}"
                seconds = round(time.perf_counter() - began, 3)
                TRACE.append({"label": label, "seconds": seconds, **usage().as_dict()})
                reset_peak()

    ort.InferenceSession = HookedSession
    if settings.get("shrink"):
        real_run = ort.RunOptions

        class ShrinkingRun(real_run):  # type: ignore[misc, valid-type]
            """RunOptions that shrink the CPU arena when the run ends."""

            def __init__(self) -> None:
                super().__init__()
                self.add_run_config_entry(*_SHRINK)

        ort.RunOptions = ShrinkingRun
    trim = settings.get("trim", "none") == "announcement"
    if trim or "max_frames" in settings:
        _wrap_synthesizer(trim, settings.get("max_frames"))
    if settings.get("default_cache"):
        _default_cache(Path(settings["default_cache"]))


def _default_cache(directory: Path) -> None:
    """Make `Voice.load(..., cache_dir=None)` use this cache directory."""
    from agent.speech.voice import Voice  # noqa: PLC0415 - only when this hook is asked for

    original = Voice.load.__func__  # type: ignore[attr-defined]

    def load(
        cls: type[Voice], model: Path, threads: int, cache_dir: Path | None, **kw: Any
    ) -> Voice:
        voice: Voice = original(cls, model, threads, cache_dir or directory, **kw)
        return voice

    Voice.load = classmethod(load)  # type: ignore[assignment, method-assign, arg-type]


def _wrap_synthesizer(trim: bool, max_frames: int | None) -> None:
    """Wrap the agent's Synthesizer: its `report` callback trims after each `SynthesisDone`
    (the synthesis thread reports it when an announcement is synthesized), and its decoder
    chunks are at most `max_frames`."""
    from agent.core.messages import SynthesisDone  # noqa: PLC0415 - as above
    from agent.speech import synthesizer  # noqa: PLC0415 - only when this hook is asked for

    original = synthesizer.Synthesizer.__init__
    signature = inspect.signature(original)
    missing = {"report", "chunk_frames"} - set(signature.parameters)
    if missing:
        raise RuntimeError(
            f"agent.speech.synthesizer.Synthesizer no longer takes {sorted(missing)}"
        )

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        report: Callable[[object], None] = bound.arguments["report"]

        def trimmed(event: object) -> None:
            report(event)
            if isinstance(event, SynthesisDone):
                began = time.perf_counter()
                malloc_trim()
                TRIMS.append(time.perf_counter() - began)

        if trim:
            bound.arguments["report"] = trimmed
        if max_frames is not None:
            first, _ = bound.arguments["chunk_frames"]
            bound.arguments["chunk_frames"] = (min(first, max_frames), max_frames)
        original(*bound.args, **bound.kwargs)

    synthesizer.Synthesizer.__init__ = init  # type: ignore[method-assign]


def install_from_environment() -> None:
    """`install` with the settings in SETTINGS_ENV, if set (called by the sitecustomize)."""
    text = os.environ.get(SETTINGS_ENV)
    if text:
        install(json.loads(text))
