"""The operator's tool against 100 simulated nodes on a real Mosquitto: inventory, waves that
halt and roll back, a rollout killed mid-wave and resumed (nobody offered twice), pause, resume
and abort, offline and silent nodes, TLS with a password."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from harness import TIMEOUT, Broker, make_pki, wait_until
from harness.fleet_sim import (
    Behaviour,
    NodeSpec,
    SimFleet,
    fleet_broker,
    fleet_specs,
    release_envelope,
    tool,
)
from ota import release, rollout_state
from ota import rollout as rollouts
from ota.connection import BrokerSettings
from ota.fleet import Fleet
from ota.rollout_state import Wave

pytestmark = [pytest.mark.broker, pytest.mark.fleet]


@pytest.fixture(scope="module")
def key() -> Ed25519PrivateKey:
    """The fleet's release signing key."""
    return Ed25519PrivateKey.generate()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto set up for a fleet (see `fleet_broker`)."""
    server = fleet_broker(tmp_path / "broker")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def start_sim(broker: Broker, key: Ed25519PrivateKey) -> Iterator[Any]:
    """Start simulated nodes on the broker; all stopped after the test."""
    started: list[SimFleet] = []

    def start(specs: list[NodeSpec], **behaviour: Any) -> SimFleet:
        how = Behaviour(trusted_keys=(release.public_text(key),), **behaviour)
        sim = SimFleet(broker.host, broker.port, specs, how).start()
        started.append(sim)
        sim.wait_ready(TIMEOUT)
        return sim

    yield start
    for sim in started:
        sim.stop()
        assert not sim.errors, sim.errors


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the tool to its end."""
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=TIMEOUT * 3)


def state_of(path: Path) -> dict[str, Any]:
    """The rollout's state file as JSON (empty before it exists)."""
    try:
        loaded: dict[str, Any] = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return loaded


def test_status_lists_every_node_that_announced_itself(
    broker: Broker, start_sim: Any, tmp_path: Path
) -> None:
    sim = start_sim(fleet_specs(100, offline_every=10))
    shown = run(tool(broker, "status", "--json"))
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    nodes = {n["node"]: n for n in document["nodes"]}
    assert len(nodes) == 100
    offline = sorted(n for n, v in nodes.items() if v["presence"] == "offline")
    assert offline == [f"sim{i:04d}" for i in range(9, 100, 10)]
    first = nodes["sim0000"]
    assert first["presence"] == "online"
    assert first["since"] is not None
    assert nodes["sim0009"]["since"] == nodes["sim0009"]["last_seen"] is not None
    assert (first["groups"], first["ota_groups"], first["agent_version"]) == (
        ["room0"],
        ["ring0"],
        "sim-1",
    )
    assert (first["model_release"], first["audio"], first["last_update"]) == (0, "available", None)
    assert document["summary"] == [
        {
            "release": 0,
            "version": first["model_version"],
            "nodes": 100,
            "online": 90,
            "offline": 10,
            "stale": 0,
            "unknown": 0,
        }
    ]
    ring = run(tool(broker, "status", "--group", "ring1"))
    assert ring.returncode == 0, ring.stderr
    assert "25 nodes: 20 online, 5 offline" in ring.stdout  # ring1: i % 4 == 1; 9, 29, ... off
    assert "NODE" in ring.stdout.splitlines()[2]

    watching = subprocess.Popen(
        [*tool(broker, "status", "--json", "--watch", "--interval", "0.2")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert watching.stdout is not None
        first_view = json.loads(watching.stdout.readline())
        assert len(first_view["nodes"]) == 100
        sim.kill("sim0001")
        for line in watching.stdout:  # refreshed until the Last Will shows
            view = {n["node"]: n for n in json.loads(line)["nodes"]}
            if view["sim0001"]["presence"] == "offline":
                break
    finally:
        watching.send_signal(signal.SIGINT)
        # read what it still writes: a print into a full pipe waits until the pipe is read
        watching.communicate(timeout=TIMEOUT)
        assert watching.returncode == 0


def test_a_wave_halts_at_its_error_threshold_and_rolls_that_wave_back(
    broker: Broker, start_sim: Any, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """Class voice-agent: the even nodes. Wave 1 (2 nodes) passes, wave 2 (8 nodes) has two
    health-check failures: 25 % > 10 %, so it halts and its six installs are rolled back."""
    specs = fleet_specs(100, classes=("voice-agent", "pi-zero"))
    failing = {"sim0004", "sim0014"}
    specs = [
        dataclasses.replace(s, fail="health_check", fail_release=2) if s.node in failing else s
        for s in specs
    ]
    sim = start_sim(specs)
    signed = release_envelope(tmp_path / "releases", key, 2)
    state = tmp_path / "rollout.json"
    args = [str(signed), "--base-url", "http://127.0.0.1:9/r2/", "--device-class", "voice-agent"]
    args += ["--waves", "2,10,all", "--error-threshold", "0.1", "--soak", "0.5"]
    args += ["--rollback-on-halt", "--state-file", str(state)]
    done = run(tool(broker, "rollout", *args))
    assert done.returncode == 1, done.stdout + done.stderr
    plan = rollout_state.load(state)
    assert plan.status == "halted"
    assert [w.outcome for w in plan.waves] == ["passed", "halted", None]
    first, second, third = (w.nodes for w in plan.waves)
    assert first == ["sim0000", "sim0002"]
    assert second == [f"sim{i:04d}" for i in range(4, 20, 2)]
    for node in first:
        assert sim.release(node) == 2
    for node in second:
        progress = plan.nodes[node]
        if node in failing:
            assert (progress.state, progress.reason, progress.rollback) == (
                "failed",
                "health_check",
                None,
            )
        else:
            assert (progress.state, progress.rollback) == ("installed", "rolled_back"), node
        assert sim.release(node) == 0, node
    untouched = [n for n in sim.nodes if n not in first + second]
    assert all(sim.offers(n) == [] for n in untouched)  # wave 3 and the other class
    assert len(third) == 40
    report = state.with_suffix(".md").read_text()
    assert "| 2 | halted | 8 | 8 | 6 | 0 | `health_check` 2 |" in report
    assert state.with_suffix(".png").is_file()
    assert "halted at wave 2" in done.stdout


def test_a_rollout_killed_mid_wave_resumes_and_offers_nobody_twice(
    broker: Broker, start_sim: Any, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """SIGKILL once wave 2's offers are out and its nodes are downloading; they finish while
    the tool is dead; `--resume` learns their answers (session and retained state) and goes on."""
    sim = start_sim(fleet_specs(100, offline_every=20), download_seconds=4.0)
    signed = release_envelope(tmp_path / "releases", key, 2)
    state = tmp_path / "rollout.json"
    args = [str(signed), "--base-url", "http://127.0.0.1:9/r2/", "--device-class", "voice-agent"]
    args += ["--waves", "10,50,all", "--soak", "0", "--state-file", str(state)]
    running = subprocess.Popen(tool(broker, "rollout", *args), stdout=subprocess.DEVNULL)
    try:
        wait_until(
            lambda: (
                len(state_of(state).get("waves", [])) == 3
                and state_of(state)["waves"][1]["offered_at"] is not None
            ),
            what="wave 2 offered",
        )
    finally:
        running.kill()
        running.wait(TIMEOUT)
    killed = rollout_state.load(state)
    second = killed.waves[1]
    assert all(killed.nodes[n].step in {"offered", "offline"} for n in second.nodes)
    assert not any(killed.nodes[n].step == "answered" for n in second.nodes)
    wait_until(
        lambda: all(sim.release(n) == 2 for n in second.nodes if sim.nodes[n].spec.online),
        what="wave 2 to install while the tool is dead",
    )
    resumed = run(tool(broker, "rollout", "--resume", str(state)))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "the broker session was kept" in resumed.stdout
    plan = rollout_state.load(state)
    assert plan.status == "done"
    assert len(plan.resumed_at) == 1
    for node, spec in ((n, s.spec) for n, s in sim.nodes.items()):
        offers = sim.offers(node)
        if spec.online:
            assert offers == [plan.waves[plan.nodes[node].wave].offer_id], node
            assert plan.nodes[node].state == "installed"
        else:
            assert offers == []
            assert plan.nodes[node].step == "offline"


def test_offers_recorded_but_never_sent_are_sent_once_after_a_resume(
    broker: Broker,
    start_sim: Any,
    key: Ed25519PrivateKey,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tool dies between recording a wave's offers and publishing them: the resumed rollout
    finds no sign of them, waits its grace, and sends them with the same id, once."""
    sim = start_sim(fleet_specs(10))
    envelope = release_envelope(tmp_path / "releases", key, 2).read_bytes()
    settings = BrokerSettings(broker.host, broker.port)
    path = tmp_path / "rollout.json"
    rollout_id = rollouts.new_id()
    client = Fleet(settings, client_id=f"ota-rollout-{rollout_id}", session_expiry=600)
    assert client.sync()
    plan = rollouts.new_rollout(
        rollout_id,
        client,
        sorted(sim.nodes),
        envelope,
        "http://127.0.0.1:9/r2/",
        release=2,
        version="2.0",
        model_sha256="0" * 64,
        target="test",
        waves_spec="all",
        success_threshold=1.0,
        error_threshold=0.0,
        soak_s=0,
        node_timeout_s=TIMEOUT,
        rollback_on_halt=False,
        session_expiry_s=600,
    )
    dying = rollouts.Runner(client, plan, path, progress=lambda _line: None)

    def crash(_wave: Wave, _nodes: list[str]) -> None:
        raise KeyboardInterrupt  # as if the process died right after the save

    monkeypatch.setattr(dying, "_publish_offers", crash)
    with pytest.raises(KeyboardInterrupt):
        dying.run()
    client.close()
    assert {p.step for p in rollout_state.load(path).nodes.values()} == {"offering"}
    assert all(sim.offers(n) == [] for n in sim.nodes)
    lines: list[str] = []
    resumed = Fleet(settings, client_id=plan.client_id, clean_start=False, session_expiry=600)
    try:
        again = rollout_state.load(path)
        runner = rollouts.Runner(resumed, again, path, progress=lines.append, resumed=True)
        assert runner.run() == "done"
    finally:
        resumed.close(forget_session=True)
    assert any("sent again (same id)" in line for line in lines), lines
    for node in sim.nodes:
        assert sim.offers(node) == [plan.waves[0].offer_id]


def test_pause_resume_and_abort_from_another_process(
    broker: Broker, start_sim: Any, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    sim = start_sim(fleet_specs(30))
    signed = release_envelope(tmp_path / "releases", key, 2)
    state = tmp_path / "rollout.json"
    args = [str(signed), "--base-url", "http://127.0.0.1:9/r2/", "--nodes", ",".join(sim.nodes)]
    args += ["--waves", "2,10,20,all", "--soak", "1", "--state-file", str(state)]
    running = subprocess.Popen(tool(broker, "rollout", *args), stdout=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: bool(state_of(state).get("waves")), what="the state file")
        paused = run([sys.executable, "-m", "ota", "rollout-control", str(state), "pause"])
        assert paused.returncode == 0, paused.stderr
        wait_until(lambda: state_of(state)["status"] == "paused", what="paused")
        waves = state_of(state)["waves"]
        started = sum(1 for w in waves if w["started_at"] is not None)
        wait_until(  # the wave under way ended, and its soak is long over
            lambda: (
                (w := state_of(state)["waves"][started - 1])["outcome"] == "passed"
                and time.time() > w["soak_until"] + 2
            ),
            what="the soak to pass while paused",
        )
        assert state_of(state)["waves"][started]["started_at"] is None
        shown = run([sys.executable, "-m", "ota", "rollout-control", str(state), "show"])
        assert "paused" in shown.stdout
        resumed = run([sys.executable, "-m", "ota", "rollout-control", str(state), "resume"])
        assert resumed.returncode == 0, resumed.stderr
        wait_until(
            lambda: state_of(state)["waves"][started]["started_at"] is not None,
            what="the next wave after resume",
        )
        rollout_state.write_control(state, "abort")
        assert running.wait(TIMEOUT) == 3
    finally:
        if running.poll() is None:
            running.kill()
        running.wait(TIMEOUT)
    plan = rollout_state.load(state)
    assert plan.status == "aborted"
    assert plan.waves[-1].started_at is None
    assert all(sim.offers(n) == [] for n in plan.waves[-1].nodes)
    assert state.with_suffix(".md").is_file()


def test_offline_and_silent_nodes_are_counted_not_waited_for(
    broker: Broker, start_sim: Any, key: Ed25519PrivateKey, tmp_path: Path
) -> None:
    """One node offline when offered, one that never answers, one that dies mid-update: the
    rollout ends at the node timeout and counts them."""
    specs = [NodeSpec(f"n{i}") for i in range(10)]
    specs[2] = NodeSpec("n2", online=False)
    specs[3] = NodeSpec("n3", mute=True)
    sim = start_sim(specs, download_seconds=3.0)
    signed = release_envelope(tmp_path / "releases", key, 2)
    state = tmp_path / "rollout.json"
    args = [str(signed), "--base-url", "http://127.0.0.1:9/r2/", "--nodes", ",".join(sim.nodes)]
    args += ["--waves", "all", "--node-timeout", "8", "--success-threshold", "0.5"]
    args += ["--state-file", str(state)]
    running = subprocess.Popen(tool(broker, "rollout", *args), stdout=subprocess.PIPE, text=True)
    wait_until(lambda: bool(sim.offers("n5")), what="n5 offered")
    sim.kill("n5")
    assert running.wait(TIMEOUT) == 0
    plan = rollout_state.load(state)
    assert plan.status == "done"
    steps = {n: (p.step, p.presence) for n, p in plan.nodes.items()}
    assert steps["n2"] == ("offline", "offline")
    assert steps["n3"] == ("no_answer", "online")
    assert steps["n5"] == ("no_answer", "offline")
    assert sim.offers("n2") == []
    report = state.with_suffix(".md").read_text()
    assert "| 1 | passed | 10 | 9 | 7 | 0 | 0 | 0 | 1 | 2 |" in report


def test_tls_and_a_password_file_and_no_secret_in_any_error(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    secured = Broker(tmp_path / "secured", tls=pki)
    passwd = secured.workdir / "passwd"
    subprocess.run(
        ["mosquitto_passwd", "-c", "-b", str(passwd), "ops", "s3cret-ops"],
        check=True,
        capture_output=True,
    )
    text = secured.config.read_text().replace("allow_anonymous true", "allow_anonymous false")
    secured.config.write_text(text + f"password_file {passwd}\n")
    secured.start()
    try:
        state = {"node": "tls1", "model_release": 4, "audio": "available"}
        for topic, payload in (("state", json.dumps(state)), ("status", "online")):
            publish = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(secured.port), "-r"]
            publish += ["--cafile", str(pki.ca), "-u", "ops", "-P", "s3cret-ops", "-q", "1"]
            subprocess.run([*publish, "-t", f"voice/tls1/{topic}", "-m", payload], check=True)
        good = tmp_path / "good"
        good.write_text("s3cret-ops\n")
        bad = tmp_path / "bad"
        bad.write_text("wr0ng-pa55\n")
        login = ["--ca-file", str(pki.ca), "--username", "ops", "--password-file"]
        shown = run(tool(secured, "status", "--json", *login, str(good)))
        assert shown.returncode == 0, shown.stderr
        nodes = json.loads(shown.stdout)["nodes"]
        assert [(n["node"], n["model_release"], n["presence"]) for n in nodes] == [
            ("tls1", 4, "online")
        ]
        refused = run(tool(secured, "status", *login, str(bad)))
        assert refused.returncode == 2
        assert "refused the connection" in refused.stderr
        assert "wr0ng-pa55" not in refused.stderr + refused.stdout
        plain = run(tool(secured, "status", "--username", "ops", "--password-file", str(bad)))
        assert plain.returncode == 2
        assert "wr0ng-pa55" not in plain.stderr + plain.stdout
        assert "error:" in plain.stderr
    finally:
        secured.stop()
