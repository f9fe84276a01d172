"""Whole-agent memory runs for bench/memory/measure_memory.py: `python -m agent run` (harness
AgentProcess) against a real Mosquitto, ALSA `null`, the model cache warm, measured from outside.

Usage: python bench/memory/memory_agent.py --models DIR [--env JSON] [--hooks JSON] [--config JSON]
[--announcements N] [--cgroup-mb MB] (PYTHONPATH must hold the project folder and bench/memory/).
Phases: start (spawn to `online`, prewarm included), the bench's long text, then a soak-like mix
(memory_workloads.mix_texts), and with --ota-model an update to that model (a signed release
served over HTTP from this process: download, health check, switch) and a rollback; RSS, PSS and
the phase's peak (VmHWM reset per phase through /proc/PID/clear_refs), and with --cgroup-mb the
cgroup's charge, peak, failcnt and OOM kills (the health check is the agent's child, so it is
in the group too).
Prints one line `RESULT <json>`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from memory_hooks import SETTINGS_ENV, check
from memory_proc import MemoryCgroup, reset_peak, threads, usage
from memory_workloads import MARK_EVERY, emit, mix_texts

from agent.core.states import FINAL_PHASES
from harness import TIMEOUT, AgentProcess, Broker, Watcher, agent_config, free_port, write_config
from ota import release

NODE: Final = "memory"
SCRIPTS: Final = Path(__file__).resolve().parent
SITECUSTOMIZE: Final = "import memory_hooks\nmemory_hooks.install_from_environment()\n"
"""Run at the agent's interpreter start when the hooks are asked for (memory_hooks.py)."""


class AgentGoneError(Exception):
    """The agent exited (killed by the cgroup's OOM killer, or crashed)."""


class Run:
    """One agent process, its broker and watcher, and the phases measured so far."""

    def __init__(self, agent: AgentProcess, watcher: Watcher, cgroup: MemoryCgroup | None) -> None:
        self.agent = agent
        self.watcher = watcher
        self.cgroup = cgroup
        self.rows: list[dict[str, Any]] = []
        self.latency: dict[str, list[float]] = {"cached": [], "uncached": []}

    def mark(self, phase: str, **extra: Any) -> None:
        """Close a phase: the agent's memory and peak, and the cgroup's charge and peak."""
        row: dict[str, Any] = {"phase": phase, **usage(self.agent.pid).as_dict(), **extra}
        if self.cgroup is not None:
            row |= {
                "cgroup": round(self.cgroup.usage_mb, 1),
                "cgroup_peak": round(self.cgroup.max_usage_mb, 1),
                "cgroup_stat": self.cgroup.stat(),
            }
            self.cgroup.reset_max()
        self.rows.append(row)
        reset_peak(self.agent.pid)

    def speak(self, request_id: str, text: str, kind: str) -> None:
        """Publish an announcement and wait until it finished (AgentGoneError if the agent dies)."""
        payload = json.dumps({"id": request_id, "text": text}).encode()
        sent = self.watcher.publish(f"voice/{NODE}/speak", payload)
        deadline = time.monotonic() + TIMEOUT
        while True:
            events = {e["event"]: e for e in self.watcher.events(request_id)}
            if "finished" in events or "failed" in events:
                break
            if not self.agent.alive():
                raise AgentGoneError(f"the agent exited during {request_id}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{request_id} did not finish")
            time.sleep(0.005)
        if "failed" in events:
            raise RuntimeError(f"{request_id} failed: {events['failed']}")
        started = next(
            m.at
            for m in self.watcher.snapshot()
            if m.topic.endswith("/events") and m.json() == events["started"]
        )
        self.latency[kind].append((started - sent) * 1000)


def children(pid: int) -> list[int]:
    """The processes a process's threads started (that are still running)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(child) for child in (task / "children").read_text().split()]
    return found


def _final(watcher: Watcher, offer: str) -> dict[str, Any] | None:
    for event in watcher.events(offer):
        if event["event"] == "update" and event["state"] in FINAL_PHASES:
            return event
    return None


def watch_update(current: Run, offer: str, body: dict[str, Any]) -> dict[str, Any]:
    """Send an OTA command and sample memory every 50 ms until its final report: the agent's
    peak RSS, the peak of the processes it starts (the health check), and the most of their
    RSS and of their PSS together (RSS counts the pages they share twice, PSS once)."""
    agent = current.agent
    current.watcher.publish(f"voice/{NODE}/ota", json.dumps({"id": offer, **body}).encode())
    most = {"agent": 0.0, "children": 0.0, "sum": 0.0, "pss_sum": 0.0}
    deadline = time.monotonic() + 3 * TIMEOUT
    while (final := _final(current.watcher, offer)) is None:
        if not agent.alive():
            raise AgentGoneError(f"the agent exited during {offer}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no result of {offer}")
        try:
            own = usage(agent.pid)
        except OSError as gone:  # it exited between the check above and this read
            raise AgentGoneError(f"the agent exited during {offer}") from gone
        theirs = []
        for pid in children(agent.pid):
            with contextlib.suppress(OSError, KeyError):
                theirs.append(usage(pid))
        most["agent"] = max(most["agent"], own.rss)
        most["children"] = max(most["children"], *(u.peak for u in theirs), 0.0)
        most["sum"] = max(most["sum"], own.rss + sum(u.rss for u in theirs))
        most["pss_sum"] = max(most["pss_sum"], own.pss + sum(u.pss for u in theirs))
        time.sleep(0.05)
    return {"state": final["state"], "reason": final.get("reason"), "sampled_mb": most}


def run_ota(current: Run, model: Path, key: Ed25519PrivateKey, workdir: Path) -> None:
    """Offer model B as release 1 (served over HTTP from here), then roll back; a phase each."""
    releases = workdir / "releases"
    envelope = release.sign(release.build_manifest(model, 1, "1.0"), [key])
    release.publish_release(releases / "r1", model, envelope)
    port = free_port()
    server = release.serve(releases, port, host="127.0.0.1")
    try:
        offer = {"manifest": json.loads(envelope), "base_url": f"http://127.0.0.1:{port}/r1/"}
        outcome = watch_update(current, "ota-1", offer)
        current.mark("OTA update (download, check, switch)", **outcome)
        current.speak("after-update", "The new voice is speaking now.", "uncached")
        outcome = watch_update(current, "back", {"rollback": True})
        current.mark("rollback", **outcome)
        current.speak("after-rollback", "The old voice is back.", "uncached")
    finally:
        server.shutdown()
        server.server_close()


def evict(path: Path) -> None:
    """Drop a file's pages from the page cache (written here, they would be charged to this
    process's cgroup): the agent's first read then charges them to its own group, as on a
    device where nothing else has read the model."""
    with path.open("rb+") as file:
        os.fsync(file.fileno())
        os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _config(
    args: argparse.Namespace, broker: Broker, workdir: Path, key: Ed25519PrivateKey
) -> Path:
    """The agent's config file: the harness's, the --config sections merged over it, the
    model cache (a copy of --models) and, for an update, the release key trusted."""
    cache = workdir / "cache"
    cache.mkdir(parents=True)
    shutil.copytree(args.models, cache / "models")  # a copy: an update adds its own parts
    for path in (cache / "models").iterdir():
        evict(path)
    sections: dict[str, dict[str, Any]] = json.loads(args.config)
    if args.ota_model is not None:
        trusted = {"trusted_keys": [release.public_text(key)], "health_timeout": 300}
        trusted["hosts"] = ["127.0.0.1:*"]  # the release server of this script
        sections["ota"] = {**trusted, **sections.get("ota", {})}
    config = agent_config(broker, workdir, NODE)
    for section, values in sections.items():  # merged over the harness's defaults
        config[section] = {**config.get(section, {}), **values}
    config["cache"]["dir"] = str(cache)
    return write_config(workdir / "agent.yaml", config)


def _environment(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    """The agent's extra environment: --env, and the hooks through a sitecustomize."""
    env = dict(json.loads(args.env))
    hooks = check(json.loads(args.hooks))
    if args.check_cache:  # the health check (a child: same hooks) uses the agent's model cache
        hooks["default_cache"] = str(workdir / "cache")
    if hooks:
        site = workdir / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE, encoding="utf-8")
        env |= {
            SETTINGS_ENV: json.dumps(hooks),
            "PYTHONPATH": os.pathsep.join([str(site), str(SCRIPTS), os.environ["PYTHONPATH"]]),
        }
    return env


def _drive(current: Run, args: argparse.Namespace, key: Ed25519PrivateKey, workdir: Path) -> Any:
    """The phases after the start: the long text, the mix, an update and a rollback; the
    memory series of the mix."""
    from bench.texts import SPEED_TEXTS  # noqa: PLC0415

    agent = current.agent
    current.speak("long", SPEED_TEXTS["long"], "uncached")
    current.mark("long text")
    series = []
    for n, (kind, text) in enumerate(mix_texts(args.announcements)):
        current.speak(f"m{n}", text, kind)
        if (n + 1) % MARK_EVERY == 0:
            series.append({"n": n + 1, **usage(agent.pid).as_dict()})
            current.watcher.clear()
    current.mark("mix", announcements=args.announcements, threads=threads(agent.pid))
    if args.ota_model is not None:
        run_ota(current, args.ota_model, key, workdir)
    return series


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Start the agent with the settings, drive the phases, stop it; the measurements."""
    broker = Broker(workdir / "broker")
    broker.start()
    key = Ed25519PrivateKey.generate()
    agent = AgentProcess(_config(args, broker, workdir, key), workdir / "agent.log")
    agent.env |= _environment(args, workdir)
    cgroup = None
    if args.cgroup_mb:
        cgroup = MemoryCgroup(f"voice-agent-memory-{os.getpid()}", args.cgroup_mb)
    watcher = Watcher(broker, f"voice/{NODE}/events", f"voice/{NODE}/status")
    result: dict[str, Any] = {"killed": None}
    began = time.monotonic()
    try:
        with cgroup.spawn_inside() if cgroup is not None else contextlib.nullcontext():
            agent.start()
        watcher.wait_payload(f"voice/{NODE}/status", b"online")
        current = Run(agent, watcher, cgroup)
        current.mark("start", seconds=round(time.monotonic() - began, 1))
        try:
            result["series"] = _drive(current, args, key, workdir)
        except AgentGoneError as gone:
            result["killed"] = str(gone)
        result["phases"] = current.rows
        result["latency_ms_p50"] = {
            kind: round(statistics.median(v), 2) for kind, v in current.latency.items() if v
        }
        if cgroup is not None:
            result["cgroup"] = {
                "limit_mb": cgroup.limit_mb,
                "failcnt": cgroup.failcnt,
                "oom_kills": cgroup.oom_kills,
            }
    finally:
        if agent.alive():
            result["exit_code"] = agent.signal(signal.SIGTERM)
        watcher.close()
        broker.stop()
        if cgroup is not None:
            cgroup.close()
    result["log_tail"] = agent.output()[-1500:] if result.get("killed") else ""
    return result


def main() -> None:
    """Parse the arguments, run once, print the RESULT line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, required=True, help="a warm models/ directory")
    parser.add_argument("--env", default="{}", help="extra environment variables (JSON)")
    parser.add_argument("--hooks", default="{}", help="memory_hooks settings (JSON)")
    parser.add_argument("--config", default="{}", help="agent config sections (JSON)")
    parser.add_argument("--announcements", type=int, default=150)
    parser.add_argument("--cgroup-mb", type=float, default=0.0, help="run in a memory cgroup")
    parser.add_argument("--ota-model", type=Path, default=None, help="then update to it, roll back")
    parser.add_argument(
        "--check-cache", action="store_true", help="the health check uses the model cache"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="voice-agent-memory-") as workdir:
        emit(run(args, Path(workdir)))


if __name__ == "__main__":
    main()
