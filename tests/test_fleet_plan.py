"""The operator tool's pure parts: wave sizes, verdicts, the state file, the report, the
inventory's view of a node, and the broker options."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ota import connection, inventory, rollout_report, rollout_state, waves
from ota.inventory import Inventory
from ota.rollout_state import NodeProgress, Rollout, Step, Wave


@pytest.mark.parametrize(
    ("spec", "sizes"),
    [
        ("1,10,50,100", [1, 9, 40, 50]),
        ("2,10,all", [2, 8, 90]),
        ("10%,all", [10, 90]),
        ("100", [100]),
        ("0.5,100", [1, 99]),
    ],
)
def test_waves_are_cumulative_percentages_or_counts(spec: str, sizes: list[int]) -> None:
    nodes = [f"n{i:03d}" for i in range(100)]
    split = waves.split(nodes, spec)
    assert [len(w) for w in split] == sizes
    assert [n for w in split for n in w] == nodes  # every node once, in order


def test_small_fleets_get_one_node_per_wave_at_least_and_no_empty_wave() -> None:
    assert waves.split(["a", "b", "c"], "1,10,50,100") == [["a"], ["b"], ["c"]]
    assert waves.split(["a", "b"], "5,all") == [["a", "b"]]


@pytest.mark.parametrize(
    "spec", ["", "1,10,50", "2,10", "all,5", "x,100", "0,100", "150", "1.5,all"]
)
def test_bad_wave_lists_are_refused_with_a_reason(spec: str) -> None:
    with pytest.raises(ValueError, match="--waves"):
        waves.parse_waves(spec)


def test_errors_over_the_threshold_halt_before_the_wave_ends() -> None:
    nodes = [f"n{i}" for i in range(10)]
    answers = {"n0": ("failed", "health_check"), "n1": ("failed", "health_check")}
    counts = waves.tally(nodes, {"n9"}, answers, set())
    assert (counts.offered, counts.offline, counts.errors, counts.pending) == (9, 1, 2, 7)
    assert counts.failures == {"health_check": 2}
    assert waves.verdict(counts, 0.9, 0.25) is None  # 2/9 = 22 %
    answers["n2"] = ("rolled_back", "start_failed")
    halt = waves.verdict(waves.tally(nodes, {"n9"}, answers, set()), 0.9, 0.25)
    assert halt is not None
    assert "3 of 9" in halt


def test_the_success_share_is_judged_once_nothing_is_pending() -> None:
    nodes = ["a", "b", "c", "d"]
    answers = {"a": ("installed", None), "b": ("already_installed", None)}
    assert waves.verdict(waves.tally(nodes, set(), answers, set()), 0.9, 0.5) is None
    counts = waves.tally(nodes, set(), answers, {"c", "d"})  # two never answered
    assert counts.no_answer == 2
    halt = waves.verdict(counts, 0.9, 0.5)
    assert halt is not None
    assert "success threshold" in halt
    assert waves.verdict(waves.tally(nodes, set(nodes), {}, set()), 0.9, 0.1) is None  # all off


def _rollout() -> Rollout:
    first = Wave(0, ["a", "b"], "r-w1", started_at=100.0, offered_at=100.1, ended_at=110.0)
    first.outcome = "halted"
    plan = Rollout(
        id="r",
        created_at=100.0,
        broker={"host": "127.0.0.1", "port": 1883, "prefix": "voice"},
        release=3,
        version="3.0",
        model_sha256="ab" * 32,
        envelope="{}",
        base_url="http://h/r3/",
        target="--nodes (3)",
        waves_spec="2,all",
        success_threshold=0.9,
        error_threshold=0.1,
        soak_s=60,
        node_timeout_s=900,
        rollback_on_halt=True,
        session_expiry_s=60,
        waves=[first, Wave(1, ["c"], "r-w2")],
        nodes={
            "a": NodeProgress(0, Step.ANSWERED, 100.0, state="installed", answered_at=104.0),
            "b": NodeProgress(
                0, Step.ANSWERED, 100.0, state="failed", reason="health_check", answered_at=106.0
            ),
            "c": NodeProgress(1),
        },
        status=rollout_state.Status.HALTED,
        halt_reason="1 of 2 offered failed",
        finished_at=112.0,
    )
    plan.nodes["a"].rollback = "rolled_back"
    for at, node, what in (
        (100.0, "a", "offered"),
        (104.0, "a", "installed"),
        (106, "b", "failed"),
    ):
        plan.note(node, what, at)
    return plan


def test_the_state_file_is_replaced_atomically_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    plan = _rollout()
    rollout_state.save(path, plan)
    first = path.stat().st_ino
    plan.nodes["c"].step = Step.OFFERING
    rollout_state.save(path, plan)
    assert path.stat().st_ino != first  # a new file renamed over the old one
    assert [p.name for p in tmp_path.iterdir()] == ["rollout.json"]  # no temporary left
    loaded = rollout_state.load(path)
    assert loaded == plan


def test_a_damaged_or_foreign_state_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        rollout_state.load(path)
    path.write_text(json.dumps({"format": 1, "id": "r"}))
    with pytest.raises(ValueError, match="damaged"):
        rollout_state.load(path)


def test_control_commands_go_through_their_own_file(tmp_path: Path) -> None:
    path = tmp_path / "rollout.json"
    assert rollout_state.read_control(path) is None
    rollout_state.write_control(path, "pause")
    command = rollout_state.read_control(path)
    assert command is not None
    assert command[0] == "pause"
    assert rollout_state.control_path(path).is_file()
    with pytest.raises(ValueError, match="unknown control command"):
        rollout_state.write_control(path, "explode")


def test_the_report_counts_each_wave_and_draws_the_progress(tmp_path: Path) -> None:
    plan = _rollout()
    markdown, png = rollout_report.write(plan, tmp_path / "report.md")
    text = markdown.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:7] == ["1", "halted", "2", "2", "1", "0", "`health_check` 1"]
    assert cells[10] == "1"  # rolled back
    assert "| 2 | not started |" in text
    assert "- `b` (wave 1): failed (`health_check`" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![progress over time](report.png)" in text


def test_a_node_without_the_new_state_fields_shows_question_marks() -> None:
    fleet = Inventory("voice")
    now = time.time()
    old_state = {"audio": "available", "model": "tiny", "model_release": 1, "uptime_s": 5}
    fleet.feed("voice/old/state", json.dumps(old_state).encode(), True, now)
    fleet.feed("voice/old/status", b"offline", True, now)
    fleet.feed("voice/all/ota", b"{}", False, now)  # not a node
    fleet.feed("voice/ghost/events", b"{}", False, now)  # events alone announce nobody
    records = fleet.records()
    assert [r.node for r in records] == ["old"]
    view = records[0].view(now)
    assert view["presence"] == "offline"
    assert view["device_class"] is None
    assert view["since"] is None  # no `ts`: last seen unknown
    line = inventory.table(records, now, 300).splitlines()[1].split()
    assert line[:3] == ["old", "offline", "?"]
    assert line.count("?") >= 5


def test_presence_since_and_stale_from_the_state_timestamp() -> None:
    fleet = Inventory("voice")
    now = time.time()
    stamp = inventory.iso(now - 1000)
    state = {"ts": stamp, "uptime_s": 400, "groups": ["hall"], "ota_groups": ["ring1"]}
    fleet.feed("voice/n1/state", json.dumps(state).encode(), True, now)
    fleet.feed("voice/n1/status", b"online", True, now)
    record = fleet.records()[0]
    assert record.presence(now, stale_after=300) == "stale"
    assert record.since(now, stale_after=300) == pytest.approx(now - 1000, abs=1)
    assert record.presence(now, stale_after=0) == "online"
    assert record.since(now, stale_after=0) == pytest.approx(now - 1400, abs=1)
    assert record.in_group("hall")
    assert record.in_group("ring1")
    assert not record.in_group("ring2")
    fleet.feed("$SYS/broker/connection/site-a/state", b"0", True, now)
    assert fleet.bridges() == {"site-a": ("down", now)}


def _args(**given: object) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    connection.add_arguments(parser)
    argv: list[str] = []
    for name, value in given.items():
        flag = "--" + name.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    return parser.parse_args(argv)


def test_broker_options_parse_and_check_their_files(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2 with spaces\nsecond line\n")
    settings = connection.settings_from_args(
        _args(broker="[::1]:8883", username="ops", password_file=secret, ca_file=secret)
    )
    assert (settings.host, settings.port, settings.tls) == ("::1", 8883, True)
    assert connection.read_password(secret) == "hunter2 with spaces"
    assert connection.parse_address("broker.lan") == ("broker.lan", 1883)
    with pytest.raises(ValueError, match="needs --username"):
        connection.settings_from_args(_args(password_file=secret))
    with pytest.raises(ValueError, match="go together"):
        connection.settings_from_args(_args(cert_file=secret))
    with pytest.raises(ValueError, match="no such file"):
        connection.settings_from_args(_args(ca_file=tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="port"):
        connection.parse_address("host:99999")


def test_an_unreadable_password_file_is_named_and_its_content_never_shown(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_bytes(b"\xff\xfe-s3cret-\n")
    with pytest.raises(connection.BrokerError) as caught:
        connection.read_password(secret)
    assert str(secret) in str(caught.value)
    assert "s3cret" not in str(caught.value)
    if os.geteuid() != 0:  # root reads anything
        secret.chmod(0)
        with pytest.raises(connection.BrokerError, match="cannot read"):
            connection.read_password(secret)


def test_the_tool_never_loads_onnx_runtime() -> None:
    """The operator's machine needs no ONNX Runtime: update phases come from `agent.core.states`."""
    probe = (
        "import sys, ota.__main__, ota.rollout, ota.status, ota.rollout_report; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'onnxruntime', 'onnx'} "
        "or m == 'agent.updates.updater'))"
    )
    found = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=60
    )
    assert found.stdout.strip() == "[]"
