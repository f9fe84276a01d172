"""Rooms: how closely one group announcement with `at` starts on two agents, measured at the
sound server; the `at` lead uncached text needs; the first-audio cost of lead-in and release.

Two agents (the real voice, each with its own cache and journal) play through ALSA's `pulse`
device to one PulseAudio null sink (mono, 22,050 Hz: no resampling, and PulseAudio mixes at
unity gain exactly); `parec` records its monitor, so both nodes' samples are seen on the sound
server's one clock, in one file. Each node's chime is its own mark, one sample of +20,000 (node
A) or -10,000 (node B), then 100 ms of silence: in the mix the two marks are two samples apart
by exactly the synchronisation error (45 us at 22,050 Hz), or one sample of +10,000 when they
coincide. (Each node on its own channel of a stereo sink, through a remap sink each, was
tried: 2 of 7 announcements then had no mark on either channel, so the bench keeps the mix.)

A null sink renders in blocks of the smallest latency any of its clients asks for, and a stream
on it advances in those blocks: the harness keeps the sink awake with a 10 ms recording, and
the bench's own recording asks for `block_ms` (so blocks of at most 10 ms; the configured
latency PulseAudio reports for the sink is kept with each result). The recording's latency
itself moves no sample: two recordings of one run at 20 and 5 ms gave the same offsets. The
block does move the agents' starts (each places its first sample from where ALSA says the
stream is, and the stream moves in blocks), so each synchronisation run states its block.
Writes `rooms.json` and `ROOMS.md`.
Usage: `python -m bench.rooms [--out-dir bench] [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
import wave
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from bench.run import Progress, machine_info
from bench.texts import CACHED_PHRASE, SPEED_TEXTS
from harness import AgentProcess, Broker, PulseNullSink, Watcher, agent_config, wait_until
from harness import write_config as write_yaml

RATE: Final = 22050
GROUP: Final = "room"
QUIET_BETWEEN: Final = 1.5
"""Silence between announcements (seconds): the recording is split on it."""
SPLIT_SILENCE: Final = 2.0
"""Exact silence (seconds) between two announcements in the recording."""
MARKS: Final = {"a": 20000, "b": -10000}
"""Each node's chime: this one sample, then 100 ms of silence."""
SYNC_RUNS: Final = (
    ("sync_default", 20, 4, 10),
    ("sync_default_2ms_blocks", 20, 4, 2),
    ("sync_short_periods", 2, 20, 10),
    ("sync_short_periods_2ms_blocks", 2, 20, 2),
)
"""The synchronisation runs: name, ALSA period (ms), periods, the sink's block asked (ms)."""
_SUBJECTS: Final = ("The kitchen window", "The garage door", "The back gate", "The cellar hatch")


@dataclass
class Node:
    """One agent under test and its MQTT view."""

    node_id: str
    process: AgentProcess
    watcher: Watcher

    def stop(self) -> None:
        """SIGTERM, wait, disconnect the watcher."""
        if self.process.alive():
            self.process.signal(signal.SIGTERM)
        self.watcher.close()


def start_node(
    work: Path,
    broker: Broker,
    sink: PulseNullSink,
    device: str,
    audio: dict[str, Any] | None = None,
) -> Node:
    """An agent on ALSA PCM `device` (through the sound server) with these `audio` settings,
    in the bench's speak group, online."""
    node_id = f"{device}-{uuid.uuid4().hex[:6]}"
    home = work / node_id
    speak = {"groups": [GROUP]}
    config = agent_config(broker, home, node_id, device=device, speak=speak)
    config["audio"] |= audio or {}
    path = write_yaml(home / "agent.yaml", config)
    env = sink.env(home / "written.raw")  # paced_capture keeps what the agent wrote there
    watcher = Watcher(broker, f"voice/{node_id}/#")
    process = AgentProcess(path, home / "agent.log", env)
    process.start()
    status = f"voice/{node_id}/status"

    def online() -> bool:
        return any(m.topic == status and m.payload == b"online" for m in watcher.snapshot())

    wait_until(lambda: online() or not process.alive(), 300, f"{node_id} online")
    if not process.alive():
        raise RuntimeError(process.output()[-3000:])
    return Node(node_id, process, watcher)


def speak_to_group(nodes: Sequence[Node], **payload: object) -> list[dict[str, Any]]:
    """Publish to the group and wait until every node finished it; their `started` events."""
    request_id = str(payload["id"])
    nodes[0].watcher.publish(f"voice/group/{GROUP}/speak", json.dumps(payload).encode())
    for node in nodes:
        node.watcher.wait_event(request_id, "finished", 120)
    return [node.watcher.wait_event(request_id, "started") for node in nodes]


def _summary(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p95": round(p95, 3),
        "max": round(ordered[-1], 3),
    }


def record_monitor(sink: PulseNullSink, path: Path, block_ms: int) -> subprocess.Popen[bytes]:
    """Record the null sink's monitor (mono) asking for a `block_ms` latency (which
    makes the sink render in blocks that small, if no client asks for less); returns once
    samples arrive. Terminate the process to stop."""
    command = ["parec", "-d", "nullsink.monitor", "--raw", "--format=s16le", f"--rate={RATE}"]
    command += ["--channels=1", f"--latency-msec={block_ms}"]
    with path.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, env={**os.environ, **sink.env(path)})
    wait_until(lambda: path.stat().st_size > 0, 15, "the monitor recording")
    return process


def sink_latency_ms(sink: PulseNullSink) -> float:
    """The null sink's configured latency as PulseAudio reports it (`pactl --format=json`):
    the block it renders in."""
    env = {**os.environ, **sink.env(sink.socket.parent / "unused.raw")}
    command = ["pactl", "--format=json", "list", "sinks"]
    listed = json.loads(subprocess.run(command, env=env, capture_output=True, check=True).stdout)
    null = next(entry for entry in listed if entry["name"] == "nullsink")
    return round(float(null["latency"]["configured"]) / 1000, 3)


def synchronisation(
    work: Path,
    broker: Broker,
    count: int,
    say: Progress,
    *,
    period_ms: int,
    periods: int,
    block_ms: int,
) -> dict[str, Any]:
    """`count` uncached, then `count` cached group announcements with `at`, both nodes on one
    null sink rendering in `block_ms` blocks (at most the harness's 10 ms); the
    per-announcement start offsets between the two nodes."""
    geometry = {"period_ms": period_ms, "periods": periods}
    name = f"{period_ms}ms-{block_ms}ms"
    sink = PulseNullSink(work / f"pulse-sync-{name}", "rate=22050 channels=1")
    sink.start()
    with ExitStack() as stack:
        stack.callback(sink.stop)
        nodes = [
            start_node(
                work,
                broker,
                sink,
                "paced_capture",
                audio={"chime_files": {"mark": write_mark(work / f"mark-{node}.wav", mark)}}
                | geometry,
            )
            for node, mark in MARKS.items()
        ]
        for node in nodes:
            stack.callback(node.stop)
        recording = work / f"monitor-{name}.raw"
        parec = record_monitor(sink, recording, block_ms)
        stack.callback(parec.terminate)
        rng = random.Random(15)  # noqa: S311 - varied text, not secrets
        late: dict[str, list[float]] = {"uncached": [], "cached": []}
        latency = 0.0
        for mode in ("uncached", "prime", "cached"):
            for trial in range(1 if mode == "prime" else count):
                if mode == "uncached":
                    text = f"{rng.choice(_SUBJECTS)} is open, number {trial + 1}."
                else:
                    text = CACHED_PHRASE
                payload: dict[str, object] = {"id": f"{mode}-{trial}", "text": text}
                payload["chime"] = "mark"
                if mode != "prime":  # the prime fills each node's phrase cache
                    payload["at"] = round(time.time() + (3.0 if mode == "uncached" else 1.0), 3)
                started = speak_to_group(nodes, **payload)
                if mode != "prime":
                    late[mode] += [float(event.get("late_ms", 0.0)) for event in started]
                time.sleep(QUIET_BETWEEN)
            latency = max(latency, sink_latency_ms(sink))  # every stream connected
            say(f"sync: {mode} announcements played on both nodes ({name} blocks)")
        parec.terminate()
        parec.wait(10)
    samples = np.frombuffer(recording.read_bytes(), dtype="<i2")
    heard = announcements(samples)
    if len(heard) != 2 * count + 1:
        raise RuntimeError(
            f"expected {2 * count + 1} announcements in the recording (2 s of silence apart), "
            f"found {len(heard)}"
        )
    # the untimed prime (the middle one) is not counted: its marks may overlap speech
    found = {"uncached": heard[:count], "cached": heard[count + 1 :]}
    result: dict[str, Any] = {
        "period_ms": period_ms,
        "periods": periods,
        "block_ms_asked": block_ms,
        "sink_latency_ms": latency,
    }
    for mode, spans in found.items():
        pairs = [mark_offsets(samples[begin:end]) for begin, end in spans]
        values = [pair[0] * 1000 / RATE for pair in pairs if len(pair) == 1]
        result[mode] = {
            "offset_ms": [round(v, 3) for v in values],
            "abs_offset_ms": _summary([abs(v) for v in values]),
            "unpaired": len(spans) - len(values),
            "late_ms_reported": _summary(late[mode]),
        }
        stats = result[mode]["abs_offset_ms"]
        say(
            f"sync {periods} x {period_ms} ms periods, {latency} ms sink blocks, {mode}: "
            f"|B - A| p50 {stats['p50']} ms, p95 {stats['p95']}, max {stats['max']}; "
            f"{result[mode]['unpaired']} of {len(spans)} without a pair of marks"
        )
    return result


def announcements(samples: npt.NDArray[np.int16]) -> list[tuple[int, int]]:
    """(first, past the last) sample of each announcement in the mix: sound separated by at
    least `SPLIT_SILENCE` of exact silence (announcements are published at least 2.5 s after
    both nodes finished the one before, with 1 or 3 s of lead)."""
    loud = np.flatnonzero(samples)
    if len(loud) == 0:
        return []
    breaks = np.flatnonzero(np.diff(loud) > SPLIT_SILENCE * RATE)
    firsts = [int(loud[0]), *(int(loud[b + 1]) for b in breaks)]
    lasts = [*(int(loud[b]) for b in breaks), int(loud[-1])]
    return [(first, last + 1) for first, last in zip(firsts, lasts, strict=True)]


def write_mark(path: Path, value: int) -> str:
    """A chime file: one sample of `value`, then 100 ms of silence (22,050 Hz mono WAV)."""
    frames = np.zeros(RATE // 10 + 1, dtype="<i2")
    frames[0] = value
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(frames.tobytes())
    return str(path)


def mark_offsets(samples: npt.NDArray[np.int16]) -> list[int]:
    """Node B's mark minus node A's (samples) for each pair of marks in the mix, in order: A's
    mark (or both at once, +10,000) with nothing else within 50 ms but B's one sample, or
    none. Speech never gives that: it starts 100 ms after a mark, and an untimed start (the
    prime) whose marks lie apart overlaps the other node's speech. An announcement whose
    nodes started more than 50 ms apart has no pair (its marks may lie under speech): the
    bench counts it `unpaired`."""
    half = RATE // 20
    both = sum(MARKS.values())
    offsets: list[int] = []
    for start in np.flatnonzero((samples == MARKS["a"]) | (samples == both)):
        window = samples[max(0, start - half) : start + half + 1].astype(np.int32)
        others = np.flatnonzero(window)
        here = int(start) - max(0, int(start) - half)
        if samples[start] == both and len(others) == 1:
            offsets.append(0)
        elif samples[start] == MARKS["a"] and len(others) == 2:  # A's and B's
            other = int(others[others != here][0])
            if window[other] == MARKS["b"]:
                offsets.append(other - here)
    return offsets


def lead_needed(work: Path, broker: Broker, trials: int, say: Progress) -> dict[str, Any]:
    """Publish -> `started` of uncached texts of each length, without `at`: the least lead an
    `at` needs for the first sample to be ready (the rest streams faster than real time)."""
    sink = PulseNullSink(work / "pulse-lead")
    sink.start()
    rng = random.Random(7)  # noqa: S311 - varied text, not secrets
    result: dict[str, Any] = {}
    with ExitStack() as stack:
        stack.callback(sink.stop)
        monitor = sink.record(work / "lead-monitor.raw", 1, RATE)  # keeps the sink awake
        stack.callback(monitor.terminate)
        node = start_node(work, broker, sink, "pulse")
        stack.callback(node.stop)
        topic = f"voice/{node.node_id}/speak"
        for length, text in SPEED_TEXTS.items():
            waits = []
            for trial in range(trials):
                request_id = f"lead-{length}-{trial}"
                fresh = f"Number {rng.randint(100, 999)}. {text}"  # no cache serves it
                body = {"id": request_id, "text": fresh, "chime": False}
                sent = node.watcher.publish(topic, json.dumps(body).encode())
                started = node.watcher.wait_event(request_id, "started", 120)
                node.watcher.wait_event(request_id, "finished", 300)
                waits.append((_epoch(started["ts"]) - sent) * 1000)
            result[length] = _summary(waits)
            say(f"lead: {length} text ready {result[length]['max']:.0f} ms after publication")
    return result


def idle_costs(work: Path, broker: Broker, trials: int, say: Progress) -> dict[str, Any]:
    """Publish -> `started` of a cached phrase after the device sat idle, with the defaults,
    with a 300 ms lead-in, and with the device released when idle."""
    settings: dict[str, dict[str, Any]] = {
        "defaults": {},
        "lead_in_300ms": {"lead_in_ms": 300, "idle_wake_s": 1.0},
        "release_when_idle": {"release_when_idle_s": 1.0},
    }
    sink = PulseNullSink(work / "pulse-idle")
    sink.start()
    result: dict[str, Any] = {}
    with ExitStack() as stack:
        stack.callback(sink.stop)
        # A null sink with nothing on it sleeps in 2 s blocks and only notices a new stream at
        # the end of one (a stall no hardware sink has: those rewind); recording its monitor
        # at low latency keeps it awake, as a sound card's sink is.
        monitor = sink.record(work / "idle-monitor.raw", 1, RATE)
        stack.callback(monitor.terminate)
        for name, audio in settings.items():
            node = start_node(work, broker, sink, "pulse", audio=audio)
            topic = f"voice/{node.node_id}/speak"
            waits = []
            for trial in range(trials + 1):  # the first fills the phrase cache
                request_id = f"{name}-{trial}"
                time.sleep(2.5)  # idle longer than idle_wake_s and release_when_idle_s
                body = {"id": request_id, "text": CACHED_PHRASE, "chime": False}
                sent = node.watcher.publish(topic, json.dumps(body).encode())
                started = node.watcher.wait_event(request_id, "started", 120)
                node.watcher.wait_event(request_id, "finished", 120)
                if trial:
                    waits.append((_epoch(started["ts"]) - sent) * 1000)
            node.stop()
            result[name] = _summary(waits)
            say(f"idle: {name}: publish -> started p50 {result[name]['p50']:.1f} ms")
    return result


def _epoch(stamp: str) -> float:
    from datetime import datetime  # noqa: PLC0415 - only here

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def write_markdown(path: Path, machine: dict[str, Any], results: dict[str, Any]) -> None:
    """ROOMS.md: the tables docs/performance.md quotes."""
    lead, idle = results["lead"], results["idle"]
    lines = [
        "# Rooms: synchronised group announcements, lead time, idle costs",
        "",
        f"Measured {machine['date']} on {machine['cpu_model']} ({machine['cores']} cores) by "
        "`make bench` (`python -m bench.rooms`). Raw numbers: `rooms.json`.",
        "",
        "## Two nodes, one `at`, measured at the sound server",
        "",
        "Two agents on one machine (one clock), each with its own voice session, cache and "
        "journal, in speak group `room`; each announcement is published once to "
        "`voice/group/room/speak` with `at` 3 s (uncached) or 1 s (cached) ahead. Both play "
        "through ALSA's `pulse` device to one PulseAudio null sink (mono, 22,050 Hz, so nothing "
        "is resampled and the mix is an exact sum); `parec` records its monitor: both nodes on "
        "the sound server's one clock, in one file. Each node's chime is its own mark, one "
        "sample of +20,000 (A) or -10,000 (B) and then silence, so in the recording the two "
        "marks lie exactly the synchronisation error apart (to the sample, 45 us). The offset "
        "is B's mark minus A's.",
        "",
        "A null sink renders in blocks of the smallest latency a client asks for, and each "
        "stream on it advances in those blocks; an agent places its first sample from where "
        "ALSA says its stream is, so the block bounds how closely two nodes start. The harness "
        "keeps the sink awake with a recording at 10 ms; the runs below record the monitor "
        "asking for 10 ms (the sink's blocks as the harness leaves them) or 2 ms, and the "
        "block column is the sink's configured latency PulseAudio reported. The recording's "
        "own latency moves no sample: two recordings of one run, at 20 and 5 ms, gave the "
        "same offsets to the sample.",
        "",
        "An announcement whose two nodes started more than 50 ms apart has no pair of marks "
        "(a mark then lies under the other node's speech): it is counted in the `unpaired` "
        "column, not in the offsets, and misses the goal.",
        "",
        "| ALSA periods | sink blocks | announcements | n | unpaired | \\|offset\\| p50 | p95 | "
        "max | goal p95 ≤ 2 ms, max ≤ 5 ms | late_ms the agents reported (max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, _period, _periods, _block in SYNC_RUNS:
        sync = results[key]
        geometry = f"{sync['periods']} x {sync['period_ms']} ms"
        for mode in ("uncached", "cached"):
            stats, unpaired = sync[mode]["abs_offset_ms"], sync[mode].get("unpaired", 0)
            p95_ok = stats["n"] > 0 and stats["p95"] <= 2.0
            max_ok = stats["n"] > 0 and stats["max"] <= 5.0 and not unpaired
            goal = (
                "met"
                if p95_ok and max_ok
                else ("max met, p95 **missed**" if max_ok else "**missed**")
            )
            lines.append(
                f"| {geometry} | {sync['sink_latency_ms']} ms | {mode} | {stats['n']} | "
                f"{unpaired} | {stats['p50']} ms | {stats['p95']} ms | {stats['max']} ms | "
                f"{goal} | {sync[mode]['late_ms_reported']['max']} |"
            )
    lines += [
        "",
        "## How early to send: publish → first sample ready, uncached, without `at`",
        "",
        "An `at` at least this far ahead starts on time (the rest of the text is synthesized "
        "while the first part plays, faster than real time).",
        "",
        "| text | n | p50 | max |",
        "|---|---|---|---|",
    ]
    for length, stats in lead.items():
        words = len(SPEED_TEXTS[length].split()) + 2
        lines.append(
            f"| {length} ({words} words) | {stats['n']} | {stats['p50']:.0f} ms | "
            f"{stats['max']:.0f} ms |"
        )
    lines += [
        "",
        "## Idle device: publish → `started` of a cached phrase after 2.5 s idle",
        "",
        "| audio settings | n | p50 | max |",
        "|---|---|---|---|",
    ]
    for name, stats in idle.items():
        lines.append(f"| {name} | {stats['n']} | {stats['p50']:.1f} ms | {stats['max']:.1f} ms |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@contextmanager
def _broker(work: Path) -> Iterator[Broker]:
    broker = Broker(work / "broker")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


def _sync_step(
    count: int, period_ms: int, periods: int, block_ms: int
) -> Callable[[Path, Broker, int, Progress], dict[str, Any]]:
    def step(work: Path, broker: Broker, _trials: int, say: Progress) -> dict[str, Any]:
        return synchronisation(
            work, broker, count, say, period_ms=period_ms, periods=periods, block_ms=block_ms
        )

    return step


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and write rooms.json and ROOMS.md."""
    parser = argparse.ArgumentParser(prog="python -m bench.rooms", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("bench"), help="output folder")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    args = parser.parse_args(argv)
    say = Progress()
    machine = machine_info()
    count, trials = (5, 2) if args.quick else (20, 5)
    steps: dict[str, Callable[[Path, Broker, int, Progress], dict[str, Any]]] = {
        name: _sync_step(count, period_ms, periods, block_ms)
        for name, period_ms, periods, block_ms in SYNC_RUNS
    }
    steps |= {"lead": lead_needed, "idle": idle_costs}
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="voice-agent-rooms-") as tmp, _broker(Path(tmp)) as b:
        for name, step in steps.items():
            results[name] = step(Path(tmp), b, trials, say)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    body = {"machine": machine, "quick": args.quick, "results": results}
    (args.out_dir / "rooms.json").write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    write_markdown(args.out_dir / "ROOMS.md", machine, results)
    say(f"wrote rooms.json and ROOMS.md to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
