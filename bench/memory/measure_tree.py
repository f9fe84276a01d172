"""Where the node's memory goes, process by process: `voice-agent run` (the sounder), the engine
it spawns, and any child below (the media decoder, a tier build), against a real Mosquitto with
ALSA `null`, measured from outside (docs/memory.md, "The node's processes").

Usage: .venv/bin/python -m bench.memory.measure_tree [--workdir DIR] [--sound] [--env K=V ...]

Phases: online (idle after the start), the bench's long text spoken (the tree sampled every
50 ms: summed RSS, summed Pss, and the union of physical pages), a sound fetched by name when
`--sound`, and idle again. After each phase, per process: RSS, Pss, USS (private), anonymous vs
file-backed resident memory (/proc/PID/smaps_rollup), and the tree's union. Prints a table and
one line `RESULT <json>`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from bench import process_tree
from bench.agent_side import EVENTS_TOPIC, STATE_TOPIC, STATUS_TOPIC, AgentUnderTest, write_config
from bench.probe import Probe
from bench.texts import uncached_speed_text
from harness import Broker
from harness.processes import command_line

_FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Anonymous", "Pss_Anon", "Pss_File")


def rollup(pid: int) -> dict[str, float]:
    """smaps_rollup fields of one process, MB (USS = private clean + dirty)."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in _FIELDS:
            values[key] = int(value.split()[0]) * 1024 / 1e6
    values["USS"] = values.pop("Private_Clean", 0.0) + values.pop("Private_Dirty", 0.0)
    values["File"] = values["Rss"] - values.get("Anonymous", 0.0)
    return values


def name_of(pid: int) -> str:
    """A short name for a process of the node."""
    args = command_line(pid)
    joined = " ".join(args)
    for marker, name in (
        ("agent engine", "engine"),
        ("media", "media decoder"),
        ("tier", "tier build"),
        ("run", "sounder"),
    ):
        if marker in joined:
            return name
    return joined[:40]


def snapshot(root: int) -> dict[str, Any]:
    """Every process's rollup and the tree's sums and union, MB."""
    processes = {}
    largest: list[tuple[str, float, float]] = []
    for pid in process_tree.descendants(root):
        if name_of(pid) == "engine":
            with contextlib.suppress(OSError):
                largest = largest_mappings(pid)
        try:
            processes[f"{name_of(pid)} ({pid})"] = rollup(pid)
        except OSError:
            continue
    return {
        "processes": processes,
        "rss_sum": sum(p["Rss"] for p in processes.values()),
        "pss_sum": sum(p["Pss"] for p in processes.values()),
        "unique": process_tree.unique_mb(root),
        "largest": largest,
    }


class Sampler(threading.Thread):
    """The tree's summed RSS, summed Pss and union every `interval` seconds: their peaks."""

    def __init__(self, root: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.stop = threading.Event()
        self.peaks = {"rss_sum": 0.0, "pss_sum": 0.0, "unique": 0.0}
        self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            now = process_tree.memory(self.root)
            unique = process_tree.unique_mb(self.root) or 0.0
            for key, value in (
                ("rss_sum", now.rss_mb),
                ("pss_sum", now.pss_mb),
                ("unique", unique),
            ):
                self.peaks[key] = max(self.peaks[key], value)
            self.samples += 1
            self.stop.wait(self.interval)


def largest_mappings(pid: int, count: int = 8) -> list[tuple[str, float, float]]:
    """The `count` largest resident mappings of a process by file (or [anon], [heap]): name,
    RSS MB, anonymous MB."""
    rss: Counter[str] = Counter()
    anon: Counter[str] = Counter()
    current = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            parts = line.split(None, 5)
            current = parts[5].strip() if len(parts) > 5 else "[anon]"
        elif line.startswith("Rss:"):
            rss[current] += int(line.split()[1])
        elif line.startswith("Anonymous:"):
            anon[current] += int(line.split()[1])
    return [
        (name, kib * 1024 / 1e6, anon[name] * 1024 / 1e6) for name, kib in rss.most_common(count)
    ]


def show(phase: str, snap: dict[str, Any]) -> None:
    print(
        f"\n== {phase}: RSS sum {snap['rss_sum']:.1f}, Pss sum {snap['pss_sum']:.1f}, "
        f"union {snap['unique']:.1f} MB"
    )
    print(f"{'process':28} {'RSS':>7} {'Pss':>7} {'USS':>7} {'anon':>7} {'file':>7} {'PssAnon':>7}")
    for name, v in snap["processes"].items():
        print(
            f"{name:28} {v['Rss']:7.1f} {v['Pss']:7.1f} {v['USS']:7.1f} "
            f"{v.get('Anonymous', 0):7.1f} {v['File']:7.1f} {v.get('Pss_Anon', 0):7.1f}"
        )
    for name, rss, anon in snap.get("largest", []):
        print(f"    engine: {rss:6.1f} MB (anon {anon:5.1f}) {name[-70:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--sound", action="store_true", help="fetch a sound by name as well")
    parser.add_argument("--env", action="append", default=[], help="K=V for the agent")
    parser.add_argument("--hold", type=float, default=0.0, help="seconds to keep it at the end")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env) or None
    with ExitStack() as stack:
        work = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        broker = Broker(work / "broker")
        stack.callback(broker.stop)
        broker.start()
        probe = Probe(broker.host, broker.port, [EVENTS_TOPIC, STATUS_TOPIC, STATE_TOPIC])
        stack.callback(probe.close)
        from bench.run import _doorbell  # noqa: PLC0415 - the bench's sound

        config = write_config(work, broker, work / "cache", media={"bell": str(_doorbell(work))})
        agent = AgentUnderTest(config, work / "agent.log", probe, env)
        stack.callback(agent.stop)
        agent.start()
        deadline = time.monotonic() + 600  # a cold cache builds the split parts first
        while agent.state().get("voice_loading", True) and time.monotonic() < deadline:
            pass
        time.sleep(2)
        result: dict[str, Any] = {"online": snapshot(agent.pid)}
        show("online, idle", result["online"])
        sampler = Sampler(agent.pid)
        sampler.start()
        for _ in range(2):  # texts no cache holds
            trial = random.randrange(10**6)  # noqa: S311 - varied text, not a secret
            agent.speak(uncached_speed_text("long", trial), f"long-{time.time_ns()}")
        result["after_long"] = snapshot(agent.pid)
        show("after the long text twice", result["after_long"])
        if args.sound:
            agent.speak(None, f"bell-{time.time_ns()}", sound="bell")
            result["after_sound"] = snapshot(agent.pid)
            show("after a sound by name", result["after_sound"])
        sampler.stop.set()
        sampler.join()
        result["sampled_peaks"] = sampler.peaks
        result["samples"] = sampler.samples
        print(
            f"\nsampled peaks ({sampler.samples} samples): "
            + ", ".join(f"{k} {v:.1f}" for k, v in sampler.peaks.items())
        )
        time.sleep(3)
        result["idle"] = snapshot(agent.pid)
        show("idle 3 s later", result["idle"])
        print("RESULT", json.dumps(result), flush=True)
        time.sleep(args.hold)  # for a look from outside (/proc/PID/smaps)


if __name__ == "__main__":
    main()
