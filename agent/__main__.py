"""Command line: `voice-agent run | say | check-config | prepare`."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import wave
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from agent import version
from agent.settings.declarations import AgentConfig, ConfigError, key_docs
from agent.settings.loading import SYSTEM_CONFIG_PATH, load
from agent.system import allocator

_LOGGER = logging.getLogger(__name__)

ENGINE_NICE = 5
"""How much lower the engine's CPU priority is than the sounder's (the decoder child, its own
child, is at +10 from the engine's)."""
SOUNDER_NICE = -5
"""The sounder's CPU priority where it may raise it (root, CAP_SYS_NICE, or the unit's `Nice=`):
under a load that takes both cores, the alarm lane and the player are served before the test
runs, floods and builds beside them; elsewhere it runs at the priority it was given."""
CANNOT_RUN = 3
"""The engine's exit status when it cannot run as configured (the configured voice does not
load, the Wyoming port cannot be bound, the broker refuses it for good): the sounder ends too,
with status 1, instead of starting it again."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voice-agent", description="Speak MQTT messages on this device."
    )
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the agent", description="Run the agent.")
    _config_option(run)
    run.add_argument("--debug", action="store_true", help="log debug messages")

    say = commands.add_parser(
        "say",
        help="synthesize text to a WAV file, without a broker",
        description="Synthesize TEXT with the configured voice into a WAV file.",
    )
    say.add_argument("text", metavar="TEXT", help="what to say")
    say.add_argument("--wav", type=Path, required=True, metavar="OUT.wav", help="output file")
    _config_option(say)
    say.add_argument("--voice", default="default", help="voice id (default: the tts.voice one)")
    say.add_argument("--noise-scale", type=float, help="generator noise (0 = deterministic)")
    say.add_argument("--noise-w", type=float, help="phoneme width noise (0 = deterministic)")
    say.add_argument("--length-scale", type=float, help="phoneme duration factor (>1 slower)")

    engine = commands.add_parser("engine")  # the sounder's child: not for people (no help)
    engine.add_argument("--fd", type=int, required=True)
    _config_option(engine)
    engine.add_argument("--debug", action="store_true")

    check = commands.add_parser(
        "check-config",
        help="validate a config file",
        description="Validate FILE; print every problem with its key path and exit 1 if any.",
    )
    check.add_argument("file", type=Path, metavar="FILE", help="config file to check")

    prepare = commands.add_parser(
        "prepare",
        help="build the voices' optimized models now, not at the first start",
        description=(
            "Do now what a first start would: each configured voice's graph analysis (its split "
            "for chunked decoding, or its optimized whole model), kept in the cache directory "
            "the agent reads at start (cache.dir, else $CACHE_DIRECTORY, else "
            "$XDG_CACHE_HOME/voice-agent). Run it as the user the agent runs as."
        ),
    )
    _config_option(prepare)
    return parser


class _VersionAction(argparse.Action):
    """Print the version only when asked (looking it up costs start-up time)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"voice-agent {version()}")
        parser.exit()


def _config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "config file (default: $VOICE_AGENT_CONFIG, else the checkout's config/agent.yaml "
            f"or {SYSTEM_CONFIG_PATH} if present, else every key's default)"
        ),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `voice-agent` console script."""
    allocator.tune()  # before any thread allocates (docs/memory.md)
    args = _parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    process = "engine " if args.command == "engine" else ""  # the sounder's child says so
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO,
        format=f"%(asctime)s %(levelname)s {process}%(name)s: %(message)s",
    )
    try:
        if args.command == "check-config":
            return _check_config(args.file)
        config_path = args.config or _env_config_path()
        config = load(config_path)
        if args.command == "say":
            return _say(config, args)
        if args.command == "engine":
            return _engine(config, args.fd)
        if args.command == "prepare":
            return _prepare(config)
        return _run(config, config_path, debug)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 2


def _env_config_path() -> Path | None:
    value = os.environ.get("VOICE_AGENT_CONFIG")
    return Path(value) if value else None


def _check_config(path: Path) -> int:
    try:
        config = load(path)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"{path}: OK ({len(key_docs())} keys known; node_id {config.node_id})")
    return 0


def _run(config: AgentConfig, config_path: Path | None, debug: bool) -> int:
    """The sounder (the speaker and the alarm lane), which starts the engine as its child."""
    _raise_priority()  # first: its imports are most of its CPU before an alarm plays
    engine_command, run = sounder()
    command = engine_command(None if config_path is None else str(config_path), debug)
    code = run(config, command, _install_signals)
    _LOGGER.info("Stopped")
    return code


def sounder() -> tuple[Callable[[str | None, bool], list[str]], Callable[..., int]]:
    """What `voice-agent run` imports, and only that: the sounder's start (`engine_command`,
    `run`), with what its alarm path never uses deferred (docs/architecture.md)."""
    from agent.sounder.deferred_imports import defer  # noqa: PLC0415 - lean start

    defer()  # before the sounder's libraries import what its alarm path never uses
    from agent.sounder.engine_process import engine_command  # noqa: PLC0415
    from agent.sounder.main import run  # noqa: PLC0415

    return engine_command, run


def _raise_priority() -> None:
    """The sounder at SOUNDER_NICE where it may be (before its threads and the engine: they
    inherit it, and the engine's ENGINE_NICE counts from it); where not, as it was started."""
    with contextlib.suppress(OSError):  # not allowed: as started (docs/architecture.md)
        if os.getpriority(os.PRIO_PROCESS, 0) > SOUNDER_NICE:
            os.setpriority(os.PRIO_PROCESS, 0, SOUNDER_NICE)
    _LOGGER.debug("CPU priority: nice %d", os.getpriority(os.PRIO_PROCESS, 0))


def _engine(config: AgentConfig, fd: int) -> int:
    """The engine: synthesis and every edge but the alarm lane, playing through the sounder
    that started it (`fd`: its end of their socket pair), at a lower CPU priority than the
    sounder: however busy it is made, the alarm path is served first."""
    lower_priority()  # before any thread: they inherit it
    from agent.app import run_engine  # noqa: PLC0415 - keeps `check-config` free of onnxruntime

    code = run_engine(config, fd, _install_signals)
    _LOGGER.info("Engine stopped")
    if code == 1:  # it cannot run as configured: the sounder stops too (not an engine to restart)
        code = CANNOT_RUN
    busy = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if busy:
        _end_now(code, busy)
    return code


def lower_priority() -> None:
    """The engine's CPU priority ENGINE_NICE below the sounder's. A system-call filter that
    refuses it (a unit older than the shipped one: it keeps `setpriority`) costs a warning, not
    the engine: normal speech goes on, and alarms, which the sounder says, compete with it."""
    try:
        os.nice(ENGINE_NICE)
    except OSError as err:
        _LOGGER.warning(
            "The engine cannot lower its CPU priority (%s): it runs at the sounder's, so what it "
            "is made to do competes with the alarm path for the CPU; allow setpriority "
            "(config/voice-agent.service)",
            err,
        )


def _end_now(code: int, busy: list[str]) -> None:
    """End the process without the interpreter's teardown: a worker still inside ONNX Runtime
    (a voice loading or prewarming, the tier's speed measured, an update's model checked: minutes
    on a slow board) aborts the process when the runtime is torn down under it (exit -6,
    "terminate called without an active exception"). Everything the agent keeps is written and
    closed by then; the log is flushed here."""
    _LOGGER.info("Ending with %s still at work", ", ".join(busy))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _install_signals(stop: Callable[[], None]) -> None:
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _signum, _frame: stop())


def _prepare(config: AgentConfig) -> int:
    """Build (or find) every configured voice's optimized models in the cache directory, as
    `Voice.load` does at a first start; print one line per voice."""
    import time  # noqa: PLC0415 - see _run

    from agent.settings.loading import resolve_cache_dir  # noqa: PLC0415
    from agent.speech.voice import Voice  # noqa: PLC0415
    from agent.voices import factory_model  # noqa: PLC0415

    cache_dir = resolve_cache_dir(config.cache, os.environ)
    models = {"default": factory_model(config), **config.tts.voices}
    for voice_id, path in models.items():
        started = time.monotonic()
        voice = Voice.load(path, config.tts.threads, cache_dir)
        how = "split for chunked decoding" if voice.chunked else "runs whole"
        seconds = time.monotonic() - started
        print(f"{voice_id}: {path.name} {how}, ready in {cache_dir} ({seconds:.1f} s)")
    return 0


def _say(config: AgentConfig, args: argparse.Namespace) -> int:
    from agent.voices import load_voice  # noqa: PLC0415 - see _run

    if args.voice != "default" and args.voice not in config.tts.voices:
        known = ", ".join(["default", *config.tts.voices])
        print(f"unknown voice {args.voice!r}; known: {known}", file=sys.stderr)
        return 2

    choice = load_voice(config, args.voice)
    voice, params = choice.voice, choice.params
    if args.noise_scale is not None:
        params = replace(params, noise_scale=args.noise_scale)
    if args.noise_w is not None:
        params = replace(params, noise_w=args.noise_w)
    if args.length_scale is not None:
        params = replace(params, length_scale=args.length_scale)
    frames = 0
    with wave.open(str(args.wav), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(voice.sample_rate)
        for pcm in voice.synthesize(args.text, params):
            out.writeframes(pcm.tobytes())
            frames += len(pcm)
    print(f"{args.wav}: {frames / voice.sample_rate:.2f} s at {voice.sample_rate} Hz")
    return 0 if frames else 1


if __name__ == "__main__":
    sys.exit(main())
