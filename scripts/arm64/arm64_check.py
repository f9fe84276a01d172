"""`make test-arm64`: the agent installs and runs on aarch64 (Debian bookworm arm64, the base of
Raspberry Pi OS 64-bit), in a debootstrap root run through qemu-user-static on this x86_64 host.

Usage (as root; scripts/arm64/run.sh installs the host packages and registers QEMU first):
    .venv/bin/python scripts/arm64/arm64_check.py [--rebuild]

Inside the root: a wheel of the project installed with its dependencies from PyPI into a venv,
`voice-agent check-config`, `voice-agent say` at noise 0, and one MQTT round trip whose played
samples are captured. On the host: the same text synthesized by the host's venv. The renderings
must match sample by sample (same length, within 2 LSB). Exits non-zero on any failure; prints
the wall time, cold (root built now) or warm (root reused). docs/arm64.md tells more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Final

import yaml
from bookworm_root import BookwormRoot
from chroot_session import Arg, Chroot
from mqtt_round_trip import RoundTrip, free_port, round_trip
from pcm_compare import Comparison, compare, read_raw, read_wav
from pip_config import host_pip_config
from project_install import APP_DIR, VOICE_AGENT, configure_pip, copy_source, install

REPO: Final = Path(__file__).resolve().parents[2]
CACHE: Final = Path(os.environ.get("ARM64_CACHE") or REPO / ".cache" / "arm64")
"""The root, logs and outputs: .cache/arm64 (git-ignored), or $ARM64_CACHE (a folder outside
the clone keeps the root between fresh clones, as CI makes them)."""
HOST_VOICE_AGENT: Final = REPO / ".venv" / "bin" / "voice-agent"
TEXT: Final = "The front door is open and the heating is off."
"""What is said: one clause, so the agent synthesizes it as one group, as `say` does."""
NODE: Final = "arm64"
MESSAGE_ID: Final = "arm64-round-trip"
RUN_DIR: Final = APP_DIR / "run"
"""Per-run files inside the root (config, WAV, capture, journal); emptied at each run."""
SAY_TIMEOUT: Final = 3600.0
"""Longest `voice-agent say` (seconds): the first one in a root optimizes and splits the model
under emulation (see docs/arm64.md for measured times)."""
CHECK_TIMEOUT: Final = 600.0
"""Longest `voice-agent check-config` or `--version` (seconds)."""
HOST_SAY_TIMEOUT: Final = 600.0
"""Longest host-side `voice-agent say` (seconds)."""
_LOG_TAIL: Final = 40
"""Log lines shown when a step fails."""


def agent_config(port: int) -> dict[str, Any]:
    """The round trip's config: the root's broker, played samples captured to a file, noise 0,
    no Home Assistant discovery, no phrase cache on disk (every run synthesizes)."""
    return {
        "node_id": NODE,
        "mqtt": {"host": "127.0.0.1", "port": port, "reconnect_min": 0.2, "reconnect_max": 2.0},
        "audio": {"device": f"file:FILE={RUN_DIR / 'capture.raw'},FORMAT=raw"},
        "tts": {"noise_scale": 0.0, "noise_w": 0.0},
        "cache": {"disk_bytes": 0},
        "storage": {"dir": str(RUN_DIR / "storage")},
        "homeassistant": {"discovery": False},
    }


@dataclass(frozen=True, slots=True)
class RootRun:
    """What the steps inside the root showed; the audio copied to the host."""

    version: str
    machine: str
    check: str
    trip: RoundTrip
    wav: Path
    capture: Path


def say_command(voice_agent: Arg, wav: Arg) -> list[Arg]:
    """`voice-agent say` of TEXT, deterministic (noise scales 0)."""
    return [voice_agent, "say", TEXT, "--wav", wav, "--noise-scale", "0", "--noise-w", "0"]


class Steps:
    """Named steps, timed, with the log to show when one fails."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str, log: Path | None = None) -> Iterator[None]:
        """Time a step; on failure print the tail of its log."""
        print(f"--- {name}", flush=True)
        start = time.monotonic()
        try:
            yield
        except BaseException:
            if log is not None and log.is_file():
                tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-_LOG_TAIL:]
                print(f"--- last lines of {log}:", *tail, sep="\n", file=sys.stderr)
            raise
        finally:
            self.times[name] = time.monotonic() - start
        print(f"    {self.times[name]:.1f} s", flush=True)


def main() -> int:
    """Run every step; 0 when all renderings match."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rebuild", action="store_true", help="discard the cached root first")
    args = parser.parse_args()
    started = float(os.environ.get("ARM64_T0") or time.time())  # run.sh's start, if set
    signal.signal(signal.SIGTERM, _exit_on_signal)  # so every `finally` unmounts and stops
    logs = CACHE / "logs"
    if logs.exists():
        shutil.rmtree(logs)
    logs.mkdir(parents=True)
    root = BookwormRoot(CACHE)
    steps = Steps()
    if args.rebuild:
        root.discard()
    cold = not root.complete()
    if cold:
        with steps.step("build the bookworm arm64 root (debootstrap, apt)", logs / "root.log"):
            root.build(logs / "root.log")
    with root.session() as chroot:
        results = _inside(chroot, steps, logs)
    host_wav = CACHE / "host.wav"
    with steps.step("host: voice-agent say (x86_64 reference)"):
        subprocess.run(
            say_command(HOST_VOICE_AGENT, host_wav),
            check=True,
            timeout=HOST_SAY_TIMEOUT,
        )
    comparisons = _compare(host_wav, results.wav, results.capture)
    total = time.time() - started
    _report(steps, comparisons, results, cold, total)
    return 0 if all(c.ok for c in comparisons) else 1


def _inside(chroot: Chroot, steps: Steps, logs: Path) -> RootRun:
    """The steps inside the root."""
    pip_log = logs / "pip.log"
    with steps.step("install the project in the root (wheel, venv, PyPI)", pip_log):
        pip_config = host_pip_config(
            [str(REPO / ".venv/bin/python"), "-m", "pip"], dict(os.environ)
        )
        configure_pip(chroot, pip_config)
        for dropped in pip_config.dropped:
            print(f"    pip setting of the host left out: {dropped}")
        files = copy_source(REPO, chroot)
        with pip_log.open("a", encoding="utf-8") as log:
            done = install(REPO, chroot, log)
        print(f"    {files} source files copied; {done}")
    run_dir = chroot.path(RUN_DIR)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    port = free_port()
    config = RUN_DIR / "agent.yaml"
    chroot.path(config).write_text(yaml.safe_dump(agent_config(port)), encoding="utf-8")
    agent_log = logs / "agent.log"
    with agent_log.open("a", encoding="utf-8") as log:
        with steps.step("root: voice-agent --version, check-config", agent_log):
            version = chroot.output([VOICE_AGENT, "--version"], CHECK_TIMEOUT).strip()
            machine = chroot.output(["uname", "-m"], CHECK_TIMEOUT).strip()
            check = chroot.output([VOICE_AGENT, "check-config", config], CHECK_TIMEOUT).strip()
            print(f"    {version} on {machine}; {check}")
        say = say_command(VOICE_AGENT, RUN_DIR / "say.wav")
        with steps.step(
            "root: voice-agent say (builds the model caches when the root has none)", agent_log
        ):
            chroot.run(say, log, SAY_TIMEOUT)
    message = {"id": MESSAGE_ID, "text": TEXT}
    with steps.step(
        "root: MQTT round trip (mosquitto, voice-agent run, mosquitto_pub)", logs / "agent-run.log"
    ):
        trip = round_trip(chroot, VOICE_AGENT, config, port, NODE, message, logs)
    return RootRun(
        version,
        machine,
        check,
        trip,
        _keep(chroot.path(RUN_DIR / "say.wav"), CACHE / "arm64.wav"),
        _keep(chroot.path(RUN_DIR / "capture.raw"), CACHE / "arm64-capture.raw"),
    )


def _keep(source: Path, target: Path) -> Path:
    shutil.copyfile(source, target)
    return target


def _compare(host_wav: Path, arm_wav: Path, capture: Path) -> list[Comparison]:
    host_rate, host = read_wav(host_wav)
    arm_rate, arm = read_wav(arm_wav)
    if host_rate != arm_rate:
        raise RuntimeError(f"sample rates differ: host {host_rate}, arm64 {arm_rate}")
    played = read_raw(capture)
    return [
        compare("say: arm64 vs x86_64", arm, host),
        compare("round trip capture (arm64) vs say (x86_64)", played, host),
        compare("round trip capture (arm64) vs say (arm64)", played, arm),
    ]


def _report(
    steps: Steps, comparisons: list[Comparison], results: RootRun, cold: bool, total: float
) -> None:
    trip = results.trip
    finished = next(e for e in trip.events if e["event"] == "finished")
    print("\n=== arm64 results")
    print(f"events of {MESSAGE_ID}: {' '.join(e['event'] for e in trip.events)}")
    print(
        f"round trip: online {trip.online_s:.1f} s after start, finished {trip.finished_s:.1f} s "
        f"after publication ({finished.get('audio_seconds')} s of audio), stopped "
        f"{trip.stop_s:.1f} s after SIGTERM"
    )
    for comparison in comparisons:
        print(comparison.line())
    for name, seconds in steps.times.items():
        print(f"{seconds:8.1f} s  {name}")
    kind = "cold (root built in this run)" if cold else "warm (cached root)"
    print(f"wall time, {kind}: {total:.1f} s")
    record = {
        "kind": "cold" if cold else "warm",
        "total_s": round(total, 1),
        "steps": {k: round(v, 1) for k, v in steps.times.items()},
        "max_diff": [c.max_diff for c in comparisons],
        "at": time.strftime("%FT%T%z"),
    }
    with (CACHE / "times.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")
    passed = sum(c.ok for c in comparisons)
    print(f"arm64: {passed} passed, {len(comparisons) - passed} failed")  # CI's plain summary line


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
