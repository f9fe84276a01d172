"""How the operator's tool scales: 100 to 3,000 simulated nodes on one Mosquitto.

For each fleet size: a fresh broker (`harness.fleet_sim.fleet_broker`), the simulated nodes in
their own process (one MQTT connection per node, one thread), then, as an operator runs them,
`python -m ota status --json` and `python -m ota rollout` to every node in waves 1,10,50,100 %.
Measured per run: wall time, CPU seconds and peak RSS of the tool (os.wait4), CPU seconds and
peak RSS of the broker and of the simulator (/proc) over the rollout, and what the rollout
reached. `--save-every-change 300,1000` runs those sizes again with the broker saving its
database at every change (the crash-safe setting the README recommends for the agents).
Writes `fleet.json` and `FLEET.md` to --out-dir.
Usage: `python -m bench.fleet_scale [--out-dir bench] [--sizes 100,300,1000,3000]
[--save-every-change 300,1000]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness import Broker, wait_until
from harness.fleet_sim import fleet_broker, release_envelope, tool
from ota import release

OFFLINE_EVERY: Final = 20
"""Every 20th simulated node is offline (announced, then gone)."""
DOWNLOAD_SECONDS: Final = 1.0
"""The simulated download phase of each update (seconds)."""
WAVES: Final = "1,10,50,100"


@dataclass
class Usage:
    """What one process used."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float


@dataclass
class Run:
    """One fleet size."""

    nodes: int
    save_every_change: bool
    sim_ready_s: float
    status: Usage
    status_nodes: int
    rollout: Usage
    rollout_status: str
    installed: int
    offline: int
    broker_cpu_s: float
    broker_peak_rss_mb: float
    sim_cpu_s: float
    sim_peak_rss_mb: float
    messages_to_tool: int
    """Update events and state messages the tool received during the rollout (from the
    nodes' count: 16 events per update, 2 states per node)."""
    rollout_tail: str
    """The rollout's last output lines (its result, or why it stopped)."""


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _proc_peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _timed(command: list[str], log: Path) -> tuple[int, Usage]:
    """Run a command to its end; its exit code and usage (from wait4, this child only)."""
    began = time.monotonic()
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _pid, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - began
    cpu = usage.ru_utime + usage.ru_stime
    return process.returncode, Usage(
        round(wall, 2), round(cpu, 2), round(usage.ru_maxrss / 1024, 1)
    )


def _broker_pid(broker: Broker) -> int:
    process = broker._process  # the harness keeps the Popen there
    if process is None:
        raise RuntimeError("the broker is not running")
    return process.pid


def measure(count: int, workdir: Path, key: Ed25519PrivateKey, save_every_change: bool) -> Run:
    """One fleet of `count` simulated nodes: status, then a rollout to all of them."""
    workdir.mkdir(parents=True)
    broker = fleet_broker(workdir / "broker", save_every_change=save_every_change)
    broker.start()
    ready = workdir / "ready.json"
    sim_command = [sys.executable, "-m", "harness.fleet_sim", "--count", str(count)]
    sim_command += ["--broker", f"{broker.host}:{broker.port}", "--ready-file", str(ready)]
    sim_command += ["--offline-every", str(OFFLINE_EVERY), "--download-seconds", "1.0"]
    sim_command += ["--trusted-key", release.public_text(key)]
    sim = subprocess.Popen(sim_command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(ready.is_file, 300, "the simulated fleet")
        sim_ready = float(json.loads(ready.read_text())["seconds"])
        code, status = _timed(tool(broker, "status", "--json"), workdir / "status.json")
        if code != 0:
            raise RuntimeError((workdir / "status.json").read_text()[-2000:])
        listed = len(json.loads((workdir / "status.json").read_text())["nodes"])
        signed = release_envelope(workdir / "releases", key, 2)
        state = workdir / "rollout.json"
        broker_cpu, sim_cpu = _proc_cpu(_broker_pid(broker)), _proc_cpu(sim.pid)
        args = [str(signed), "--base-url", "http://127.0.0.1:9/r2/"]
        args += ["--device-class", "voice-agent", "--waves", WAVES, "--soak", "0"]
        args += ["--node-timeout", "300", "--state-file", str(state)]
        code, rollout = _timed(tool(broker, "rollout", *args), workdir / "rollout.log")
        broker_used = _proc_cpu(_broker_pid(broker)) - broker_cpu
        sim_used = _proc_cpu(sim.pid) - sim_cpu
        plan = json.loads(state.read_text())
        steps = list(plan["nodes"].values())
        installed = sum(1 for p in steps if p["state"] == "installed")
        offline = sum(1 for p in steps if p["step"] == "offline")
        return Run(
            nodes=count,
            save_every_change=save_every_change,
            sim_ready_s=round(sim_ready, 2),
            status=status,
            status_nodes=listed,
            rollout=rollout,
            rollout_status=str(plan["status"]),
            installed=installed,
            offline=offline,
            broker_cpu_s=round(broker_used, 2),
            broker_peak_rss_mb=round(_proc_peak_mb(_broker_pid(broker)), 1),
            sim_cpu_s=round(sim_used, 2),
            sim_peak_rss_mb=round(_proc_peak_mb(sim.pid), 1),
            messages_to_tool=installed * 16 + len(steps) * 2,
            rollout_tail="\n".join((workdir / "rollout.log").read_text().splitlines()[-3:]),
        )
    finally:
        sim.terminate()
        sim.wait(60)
        broker.stop()


def _markdown(runs: list[Run], machine: str) -> str:
    lines = [
        "# The operator's tool at fleet scale",
        "",
        f"`python -m bench.fleet_scale` on {machine}, {datetime.now(UTC):%Y-%m-%d}. Simulated "
        f"nodes (`harness/fleet_sim.py`, one MQTT connection each, {DOWNLOAD_SECONDS:.0f} s "
        f"simulated download, every {OFFLINE_EVERY}th offline) on one Mosquitto; the tool run as "
        f"an operator runs it. Rollout: every node, waves {WAVES} %, no soak. Timings vary by "
        "about ±20 % between runs on these shared machines.",
        "",
        "| nodes | broker saves | status: wall / CPU / peak RSS | rollout: wall / CPU / peak "
        "RSS | rollout | broker CPU / peak RSS | simulator CPU / peak RSS | simulator ready "
        "| busiest in the rollout |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        busiest = max(
            (r.rollout.cpu_s, "the tool"),
            (r.broker_cpu_s, "the broker"),
            (r.sim_cpu_s, "simulator"),
        )[1]
        lines.append(
            f"| {r.nodes} | {'every change' if r.save_every_change else 'every 60 s'} | "
            f"{r.status.wall_s} s / {r.status.cpu_s} s / {r.status.peak_rss_mb} MB "
            f"({r.status_nodes} listed) | "
            f"{r.rollout.wall_s} s / {r.rollout.cpu_s} s / {r.rollout.peak_rss_mb} MB | "
            f"{r.rollout_status}: {r.installed} installed, {r.offline} offline | "
            f"{r.broker_cpu_s} s / {r.broker_peak_rss_mb} MB | "
            f"{r.sim_cpu_s} s / {r.sim_peak_rss_mb} MB | {r.sim_ready_s} s | {busiest} |"
        )
    plain = sorted((r for r in runs if not r.save_every_change), key=lambda r: r.nodes)
    if len(plain) >= 2:
        small, large = plain[0], plain[-1]
        added = large.nodes - small.nodes
        per_node = (large.rollout.cpu_s - small.rollout.cpu_s) / added * 1000
        status_per_node = (large.status.cpu_s - small.status.cpu_s) / added * 1000
        memory = large.rollout.peak_rss_mb - small.rollout.peak_rss_mb
        lines += [
            "",
            f"From {small.nodes} to {large.nodes} nodes the tool's rollout CPU grows by "
            f"{per_node:.1f} ms per node ({large.messages_to_tool} messages at {large.nodes}), "
            f"`status` by {status_per_node:.2f} ms per node, and the rollout's peak RSS by "
            f"{memory:.1f} MB in all (matplotlib, loaded for the report, is most of its "
            f"{small.rollout.peak_rss_mb:.0f} MB). The rollout's wall time is mostly the "
            "simulated update time of four waves.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Measure every size; write fleet.json and FLEET.md."""
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_scale", description=__doc__)
    parser.add_argument("--out-dir", type=Path, default=Path("bench"))
    parser.add_argument("--sizes", default="100,300,1000,3000")
    parser.add_argument(
        "--save-every-change",
        default="",
        help="sizes to run again with the broker saving at every change (e.g. 300,1000)",
    )
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 16384)), hard))
    key = Ed25519PrivateKey.generate()
    sizes = [int(s) for s in args.sizes.split(",")]
    plans = [(n, False) for n in sizes]
    plans += [(int(n), True) for n in args.save_every_change.split(",") if n.strip()]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
        for index, (count, save) in enumerate(plans):
            print(f"[bench-fleet] {count} nodes (saves at every change: {save})", flush=True)
            run = measure(count, Path(scratch) / f"run{index}", key, save)
            print(f"[bench-fleet] {asdict(run)}", flush=True)
            runs.append(run)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {"machine": machine, "runs": [asdict(r) for r in runs]}
    (args.out_dir / "fleet.json").write_text(json.dumps(document, indent=1) + "\n")
    (args.out_dir / "FLEET.md").write_text(_markdown(runs, machine))
    print(f"[bench-fleet] wrote {args.out_dir / 'FLEET.md'} and fleet.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
