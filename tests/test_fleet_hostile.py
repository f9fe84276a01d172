"""The operator's tool reads hostile state (issue 20, items 7 and 8).

The attacker: anyone who may publish on the broker. They can retain any bytes on
`<prefix>/<node>/status`, `<prefix>/<node>/state` and `<prefix>/<node>/events`, under any node
id the broker accepts as a topic level, and they can make a node's update failure carry any
`reason` and `detail`. The assets: the operator's inventory of the whole fleet (every node
listed, the good ones right), the tool's network thread (a rollout that stops hearing answers
is blind), the operator's terminal (no control character, no ANSI sequence, no forged line) and
the rollout's Markdown report (no Markdown or HTML from a node).

The strategies below generate that attacker's payloads (any JSON type in any field, any depth,
numbers of any size, NaN and infinities, lone surrogates, control and format characters,
non-UTF-8 bytes, huge strings); they are published retained through a real Mosquitto and the
real tool runs as a subprocess, as an operator runs it. Then one test per case the issue names,
`ota serve`, and the report.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import queue
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import paho.mqtt.client as mqtt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

from harness import TIMEOUT, Broker, free_port, wait_until
from harness.fleet_sim import (
    Behaviour,
    NodeSpec,
    SimFleet,
    fleet_broker,
    release_envelope,
    tool,
)
from ota import inventory, node_messages, release, rollout_report, rollout_state
from ota.inventory import Inventory
from ota.safe_text import escaped, markdown, terminal

BROKER_EXAMPLES = 25
"""Hypothesis examples of the tests through the broker (each runs the tool twice)."""
NODES_PER_EXAMPLE = 24
"""Hostile nodes retained at most per example."""

FIELDS = (
    "ts",
    "uptime_s",
    "groups",
    "ota_groups",
    "device_class",
    "model",
    "model_version",
    "model_sha256",
    "model_release",
    "agent_version",
    "audio",
    "last_update",
)
"""The state fields the tool reads (README: Topics, the state JSON)."""


# ---- the attacker's payloads ------------------------------------------------------------------

HOSTILE_TEXT = st.one_of(
    st.text(),  # any code point: surrogates, controls, bidi overrides, line separators
    st.sampled_from(
        [
            "\x1b[2J\x1b[H",
            "\x1b]0;pwned\x07",
            "\x9b31m",
            "\r\x1b[2Kforged  online",
            "\u202eevil\u202c",
            "\ud800",
            "a\u2028b",
            "\x7f\x00",
            "<script>alert(1)</script>",
            "[click](http://evil.example/)",
        ]
    ),
)
NUMBERS = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**420), max_value=10**420),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324]),
)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), NUMBERS, HOSTILE_TEXT),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


GOOD_VALUES: dict[str, Any] = {
    "ts": st.builds(_now_iso),
    "uptime_s": st.integers(0, 10**6),
    "groups": st.just(["hall"]),
    "ota_groups": st.just(["ring9"]),
    "device_class": st.just("voice-agent"),
    "model": st.just("en_US-joe-medium"),
    "model_version": st.just("1.0"),
    "model_sha256": st.just("ab" * 32),
    "model_release": st.integers(0, 10),
    "agent_version": st.just("0.9"),
    "audio": st.sampled_from(["available", "unavailable"]),
    "last_update": st.fixed_dictionaries(
        {},
        optional={
            k: JSON_VALUES | st.just("installed") for k in ("id", "state", "reason", "release")
        },
    ),
}
FIELDED_STATES = st.fixed_dictionaries(
    {}, optional={name: st.one_of(GOOD_VALUES[name], JSON_VALUES) for name in FIELDS}
)


def _encode(value: Any, ascii_only: bool) -> bytes:
    """JSON as a publisher may send it: NaN and infinities as JavaScript writes them, a lone
    surrogate either escaped (valid JSON) or raw (then not UTF-8)."""
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"0" + b"}" * depth


STATE_PAYLOADS = st.one_of(
    st.builds(_encode, FIELDED_STATES, st.booleans()),
    st.builds(_encode, JSON_VALUES, st.booleans()),  # any JSON at the top
    st.builds(_deep, st.integers(1, 20000), st.sampled_from(["list", "object"])),
    st.binary(min_size=1, max_size=600),
    st.builds(
        lambda digits, name: f'{{"{name}": {"9" * digits}}}'.encode(),
        st.integers(1, 6000),
        st.sampled_from(["uptime_s", "model_release", "ts"]),
    ),
    st.builds(
        lambda size, name: json.dumps({name: "x" * size}).encode(),
        st.sampled_from([129, 5000, 70000, 300000]),
        st.sampled_from(["model", "device_class", "ts"]),
    ),
)
STATUS_PAYLOADS = st.one_of(
    st.sampled_from([b"online", b"offline", b" online\n"]),
    st.binary(min_size=1, max_size=80),
    st.builds(lambda t: t.encode("utf-8", "surrogatepass"), HOSTILE_TEXT.filter(bool)),
)
NODE_IDS = st.text(
    # what Mosquitto accepts as a topic level: it refuses C0/C1 controls, surrogates and
    # non-characters (measured); bidi overrides, format characters, separators get through
    st.characters(exclude_categories=("Cc", "Cs", "Cn"), exclude_characters="/+#"),
    min_size=1,
    max_size=24,
).filter(lambda n: n not in {"all", "group"})
HOSTILE_NODES = st.lists(
    st.tuples(NODE_IDS, STATUS_PAYLOADS, STATE_PAYLOADS),
    min_size=1,
    max_size=NODES_PER_EXAMPLE,
    unique_by=lambda n: n[0].casefold(),
)
EVENT_PAYLOADS = st.one_of(
    STATE_PAYLOADS,
    st.builds(
        _encode,
        st.fixed_dictionaries(
            {"event": st.just("update")},
            optional=dict.fromkeys(("id", "state", "reason", "detail", "release"), JSON_VALUES),
        ),
        st.booleans(),
    ),
)


# ---- real parts: a publisher that retains, the tool as a subprocess -----------------------------


class Retainer:
    """A real paho client that publishes retained at QoS 1 and waits for each PUBACK."""

    def __init__(self, broker: Broker) -> None:
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=MQTTProtocolVersion.MQTTv5)
        self._client.connect(broker.host, broker.port)
        self._client.loop_start()

    def retain(self, topic: str, payload: bytes, retain: bool = True) -> None:
        """Publish; the broker acknowledged it (else the test's model of the broker is wrong)."""
        info = self._client.publish(topic, payload, qos=1, retain=retain)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"the broker did not take {topic!r}"

    def close(self) -> None:
        """Disconnect."""
        self._client.disconnect()
        self._client.loop_stop()


@pytest.fixture
def retainer(broker: Broker) -> Iterator[Retainer]:
    """A publisher on the test's broker."""
    client = Retainer(broker)
    yield client
    client.close()


def assert_terminal_safe(text: str) -> None:
    """No control character (but the line ends), no escape sequence, no bidi override."""
    bad = sorted({c for c in text if c != "\n" and not c.isprintable()})
    assert not bad, f"non-printable characters reached the output: {bad!r}"


def run_tool(broker: Broker, command: str, *args: str) -> tuple[int, str, str]:
    """The real tool to its end: (exit code, stdout, stderr), both checked terminal-safe."""
    done = subprocess.run(
        tool(broker, command, *args), check=False, capture_output=True, timeout=TIMEOUT * 2
    )
    out, err = done.stdout.decode("utf-8"), done.stderr.decode("utf-8")  # strict: valid UTF-8
    assert_terminal_safe(out)
    assert_terminal_safe(err)
    assert "Traceback" not in err, err
    return done.returncode, out, err


def status(broker: Broker, prefix: str, *args: str) -> tuple[str, dict[str, Any]]:
    """`status` as a table and as JSON: both exit 0, no warning (the sync marker came back:
    the network thread lived through every retained message). The sync's patience is generous:
    the test judges what is listed, not how fast a loaded machine delivers it."""
    patient = ("--sync-timeout", str(TIMEOUT))
    code, table, err = run_tool(broker, "status", "--prefix", prefix, *patient, *args)
    assert (code, err) == (0, ""), err
    code, text, err = run_tool(broker, "status", "--prefix", prefix, "--json", *patient, *args)
    assert (code, err) == (0, ""), err
    assert text.isascii()
    document = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    return table, document


def good_state(node: str, release_number: int = 3) -> dict[str, Any]:
    """What a healthy agent retains."""
    return {
        "ts": _now_iso(),
        "node": node,
        "agent_version": "0.9",
        "device_class": "voice-agent",
        "groups": ["hall"],
        "ota_groups": ["ring1"],
        "audio": "available",
        "model": "en_US-joe-medium",
        "model_version": f"{release_number}.0",
        "model_sha256": "cd" * 32,
        "model_release": release_number,
        "last_update": {
            "id": "r3",
            "state": "installed",
            "reason": None,
            "release": release_number,
            "ts": _now_iso(),
        },
        "uptime_s": 42,
    }


def retain_good(retainer: Retainer, prefix: str, nodes: tuple[str, ...]) -> None:
    """Good nodes beside the hostile ones."""
    for node in nodes:
        retainer.retain(f"{prefix}/{node}/status", b"online")
        retainer.retain(f"{prefix}/{node}/state", json.dumps(good_state(node)).encode())


def assert_good(document: dict[str, Any], table: str, nodes: tuple[str, ...]) -> None:
    """The good nodes are listed right, in both modes."""
    views = {v["node"]: v for v in document["nodes"]}
    for node in nodes:
        view, published = views[node], good_state(node)
        assert (view["presence"], view["check"], view["invalid"]) == ("online", "ok", {}), view
        for name in ("device_class", "model", "model_version", "model_sha256", "model_release"):
            assert view[name] == published[name], (node, name)
        assert view["groups"] == ["hall"]
        assert view["last_update"]["state"] == "installed"
        row = next(line for line in table.splitlines() if line.startswith(f"{node} "))
        cells = row.split()
        assert (cells[1], cells[-1]) == ("online", "ok"), row
        assert "voice-agent" in cells
        assert "cdcdcdcdcdcd" in cells


def assert_listed(document: dict[str, Any], table: str, nodes: set[str]) -> None:
    """Every node, and nothing else, in both modes; each view typed as the README says."""
    views = document["nodes"]
    assert {v["node"] for v in views} == nodes
    assert len(views) == len(nodes)
    assert f"{len(nodes)} nodes: " in table
    for view in views:
        assert view["check"] in {"ok", "invalid", "unreadable"}
        assert (view["check"] == "ok") == (not view["invalid"]), view
        assert view["presence"] in {"online", "offline", "stale", "unknown"}
        for name in ("device_class", "model", "model_version", "model_sha256", "audio"):
            assert view[name] is None or isinstance(view[name], str)
        release_number = view["model_release"]
        assert release_number is None or (type(release_number) is int and release_number >= 0)
        assert view["uptime_s"] is None or math.isfinite(view["uptime_s"])
        for name in ("since", "last_seen"):
            assert view[name] is None or datetime.fromisoformat(view[name].replace("Z", "+00:00"))


# ---- properties through the broker --------------------------------------------------------------

GOOD_NODES = ("good-a", "good-b")


@pytest.mark.broker
@settings(
    max_examples=BROKER_EXAMPLES,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(hostile=HOSTILE_NODES)
def test_status_lists_every_node_whatever_is_retained(
    broker: Broker, retainer: Retainer, hostile: list[tuple[str, bytes, bytes]]
) -> None:
    """Hostile nodes retained beside two good ones: table and JSON exit 0 with no warning, list
    every node (the good ones right, each hostile one typed or marked), print nothing that is
    not printable, and the sync marker came back (the network thread survived)."""
    prefix = f"h{uuid.uuid4().hex[:8]}"
    hostile = [n for n in hostile if n[0] not in GOOD_NODES]
    for node, status_payload, state_payload in hostile:
        retainer.retain(f"{prefix}/{node}/status", status_payload)
        retainer.retain(f"{prefix}/{node}/state", state_payload)
    retain_good(retainer, prefix, GOOD_NODES)
    table, document = status(broker, prefix)
    assert_listed(document, table, {n for n, _, _ in hostile} | set(GOOD_NODES))
    assert_good(document, table, GOOD_NODES)


@pytest.mark.broker
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(
    hostile=HOSTILE_NODES,
    events=st.lists(EVENT_PAYLOADS, min_size=1, max_size=8),
    reason=HOSTILE_TEXT.filter(bool),
    detail=HOSTILE_TEXT,
)
def test_a_rollout_among_hostile_nodes_runs_to_its_end(
    tmp_path_factory: pytest.TempPathFactory,
    hostile: list[tuple[str, bytes, bytes]],
    events: list[bytes],
    reason: str,
    detail: str,
) -> None:
    """A simulated fleet of three nodes in an ota group; hostile nodes retained beside them,
    hostile update events retained on the fleet's own events topics, and one node's failure
    carrying a hostile reason and detail. `rollout --group` plans the three, offers, hears every
    answer (its network thread lived), exits 0 with a report whose node text is all in code
    spans, and prints nothing that is not printable."""
    tmp = tmp_path_factory.mktemp("rollout")
    broker = fleet_broker(tmp / "broker")
    broker.start()
    key = Ed25519PrivateKey.generate()
    group = f"ring-{uuid.uuid4().hex[:6]}"  # no generated state names it
    specs = [
        NodeSpec("sim-a", ota_groups=(group,)),
        NodeSpec("sim-b", ota_groups=(group,)),
        NodeSpec("sim-c", ota_groups=(group,), fail=reason, fail_detail=detail),
    ]
    how = Behaviour(trusted_keys=(release.public_text(key),), download_seconds=0.05)
    sim = SimFleet(broker.host, broker.port, specs, how).start()
    publisher = Retainer(broker)
    try:
        sim.wait_ready(TIMEOUT)
        for node, status_payload, state_payload in hostile:
            if node.startswith("sim-"):
                continue
            publisher.retain(f"voice/{node}/status", status_payload)
            publisher.retain(f"voice/{node}/state", state_payload)
        for index, payload in enumerate(events):
            publisher.retain(f"voice/{specs[index % 3].node}/events", payload)
        state = tmp / "r1.json"
        code, out, err = run_tool(
            broker,
            "rollout",
            str(release_envelope(tmp / "release", key, 1)),
            "--base-url",
            "http://127.0.0.1:9/r1/",
            "--group",
            group,
            "--waves",
            "all",
            "--soak",
            "0",
            "--node-timeout",
            "120",
            "--error-threshold",
            "1",
            "--success-threshold",
            "0",
            "--state-file",
            str(state),
        )
        assert code == 0, out + err
        plan = rollout_state.load(state)
        assert sorted(plan.nodes) == ["sim-a", "sim-b", "sim-c"]
        answers = {n: (p.state, p.reason) for n, p in plan.nodes.items()}
        assert answers["sim-a"] == answers["sim-b"] == ("installed", None)
        assert answers["sim-c"] == ("failed", escaped(reason, node_messages.MAX_TEXT))
        assert_safe_report(state.with_suffix(".md").read_text(encoding="utf-8"), plan)
    finally:
        publisher.close()
        sim.stop()
        broker.stop()


# ---- the report --------------------------------------------------------------------------------

CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def assert_safe_report(text: str, plan: rollout_state.Rollout) -> None:
    """No control character; outside code spans no HTML tag, entity, link or emphasis that the
    template does not write; every table row has the header's cells; each node's text appears
    as the code span `safe_text.markdown` makes of it."""
    assert_terminal_safe(text)
    outside = CODE_SPAN.sub("", text)
    assert not re.search(r"<[A-Za-z/!?]", outside), outside
    assert not re.search(r"&#?[A-Za-z0-9]+;", outside), outside
    assert re.findall(r"\]\(", outside) == ["]("]  # the chart, and nothing else
    assert outside.count("**") == 2  # the status
    rows = [line for line in text.splitlines() if line.startswith("|")]
    widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
    assert len(widths) == 1, rows
    for node, progress in plan.nodes.items():
        if progress.reason:
            assert markdown(node) in text
            assert markdown(progress.reason) in text


def test_the_report_writes_node_text_as_code_spans(tmp_path: Path) -> None:
    """A node whose id, reason and detail are Markdown, HTML and ANSI: they come out escaped,
    inside code spans, one line each, the table intact."""
    plan = rollout_state.Rollout(
        id="t",
        created_at=time.time() - 60,
        broker={"host": "127.0.0.1", "port": 1883, "prefix": "voice"},
        release=2,
        version="2.0",
        model_sha256="ab" * 32,
        envelope="{}",
        base_url="http://127.0.0.1/r2/",
        target="--nodes (2)",
        waves_spec="all",
        success_threshold=0.9,
        error_threshold=0.5,
        soak_s=0,
        node_timeout_s=60,
        rollback_on_halt=False,
        session_expiry_s=60,
        waves=[rollout_state.Wave(0, ["<img src=x onerror=alert(1)>", "ok"], "t-w1")],
        nodes={},
        status="done",
        finished_at=time.time(),
    )
    evil = rollout_state.NodeProgress(0, step="answered", state="failed")
    evil.reason = "**bold** | [x](http://evil.example/) `tick` \x1b[31m"
    evil.detail = "line one\nline two\r\x1b]0;title\x07 &amp; <b>b</b> \u202egnp.exe"
    plan.nodes = {
        "<img src=x onerror=alert(1)>": evil,
        "ok": rollout_state.NodeProgress(0, step="answered", state="installed"),
    }
    text = rollout_report.markdown(plan, tmp_path / "r.png")
    assert_safe_report(text, plan)
    line = next(line for line in text.splitlines() if line.startswith("- `<img"))
    assert "\\x1b[31m" in line
    assert "line one\\x0aline two\\x0d" in line
    assert "\\u202e" in line
    assert markdown(evil.detail) in line


# ---- the named cases, one test each -------------------------------------------------------------

NOW = _now_iso()
CASES: dict[str, tuple[str, bytes, bytes, dict[str, str]]] = {
    # case: (node id, status, state, field -> words its reason holds; "state" for unreadable)
    "nan_uptime": ("n1", b"online", b'{"uptime_s": NaN, "ts": "%s"}' % NOW.encode(), {}),
    "infinity_uptime": ("n1", b"online", b'{"uptime_s": Infinity}', {}),
    "1e308_uptime": ("n1", b"online", b'{"uptime_s": 1e308, "ts": "%s"}' % NOW.encode(), {}),
    "400_digit_number": (
        "n1",
        b"online",
        b'{"model_release": %s, "uptime_s": %s}' % (b"7" * 400, b"7" * 400),
        {},
    ),
    "ts_in_year_9999": ("n1", b"online", b'{"ts": "9999-12-31T23:59:59Z", "uptime_s": 5}', {}),
    "ts_negative": ("n1", b"online", b'{"ts": -86400}', {}),
    "ts_before_1970": ("n1", b"online", b'{"ts": "1969-12-31T23:00:00Z"}', {}),
    "ts_a_string_not_a_time": ("n1", b"online", b'{"ts": "yesterday at noon"}', {}),
    "lone_surrogate": ("n1", b"online", b'{"device_class": "\\ud800", "model": "ok"}', {}),
    "lone_surrogate_raw_bytes": ("n1", b"online", b'{"model": "\xed\xa0\x80"}', {}),
    "5000_nested_brackets": ("n1", b"online", b"[" * 5000 + b"]" * 5000, {}),
    "non_utf8": ("n1", b"online", b"\xff\xfe\xfd{}", {}),
    "wrong_types_at_every_field": (
        "n1",
        b"online",
        json.dumps(
            {
                "ts": 12,
                "uptime_s": "long",
                "groups": "hall",
                "ota_groups": [1, None],
                "device_class": ["voice-agent"],
                "model": {"a": 1},
                "model_version": 2.0,
                "model_sha256": True,
                "model_release": "3",
                "agent_version": [],
                "audio": 1,
                "last_update": "installed",
            }
        ).encode(),
        {},
    ),
    "huge_string": ("n1", b"online", json.dumps({"model": "x" * 200_000}).encode(), {}),
    "long_field": ("n1", b"online", json.dumps({"device_class": "x" * 5000}).encode(), {}),
    "ansi_and_controls_forge_a_row": (
        "n1",
        b"online",
        json.dumps(
            {
                "device_class": "\r\x1b[2K\x1b[1A\nforged  online  ok",
                "model_version": "\x9b31mred\x1b[0m",
                "agent_version": "\u202ertl\u202c\x7f",
                "audio": "a\u2028b",
            }
        ).encode(),
        {},
    ),
    "bidi_override_in_the_node_id": ("n\u202e1", b"online", b"{}", {}),
    "status_not_online_or_offline": ("n1", b"\x1b[32monline", b"{}", {}),
}
EXPECTED: dict[str, dict[str, str]] = {
    "nan_uptime": {"uptime_s": "not a finite number (nan)"},
    "infinity_uptime": {"uptime_s": "not a finite number (inf)"},
    "1e308_uptime": {"uptime_s": "out of range"},
    "400_digit_number": {"model_release": "400 digits", "uptime_s": "400 digits"},
    "ts_in_year_9999": {"ts": "ahead of this machine's clock"},
    "ts_negative": {"ts": "not a string"},
    "ts_before_1970": {"ts": "before 1970"},
    "ts_a_string_not_a_time": {"ts": "not an ISO 8601 time"},
    "lone_surrogate": {"device_class": "\\ud800"},
    "lone_surrogate_raw_bytes": {"state": "not UTF-8"},
    "5000_nested_brackets": {"state": "nested too deep"},
    "non_utf8": {"state": "not UTF-8"},
    "wrong_types_at_every_field": {
        "ts": "not a string",
        "uptime_s": "not a number",
        "groups": "not a list",
        "ota_groups": "item 0: not a string",
        "device_class": "not a string",
        "model": "not a string",
        "model_version": "not a string",
        "model_sha256": "not a string",
        "model_release": "not a whole number",
        "agent_version": "not a string",
        "audio": "not a string",
        "last_update": "not an object",
    },
    "huge_string": {"state": "too large"},
    "long_field": {"device_class": "longer than 128"},
    "ansi_and_controls_forge_a_row": {
        "device_class": "\\x0d\\x1b[2K",
        "model_version": "\\x9b31m",
        "agent_version": "\\u202e",
        "audio": "\\u2028",
    },
    "bidi_override_in_the_node_id": {"node": "\\u202e"},
    "status_not_online_or_offline": {"status": "\\x1b[32monline"},
}


@pytest.mark.broker
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_the_issue_names(broker: Broker, retainer: Retainer, case: str) -> None:
    """Each case of the issue, retained beside a good node: both modes exit 0, list both, mark
    the hostile node with exactly the fields it spoiled (reason shown escaped), and print no
    control character; no forged line appears."""
    node, status_payload, state_payload, _ = CASES[case]
    prefix = f"c{uuid.uuid4().hex[:8]}"
    retainer.retain(f"{prefix}/{node}/status", status_payload)
    retainer.retain(f"{prefix}/{node}/state", state_payload)
    retain_good(retainer, prefix, ("good-a",))
    table, document = status(broker, prefix)
    assert_listed(document, table, {node, "good-a"})
    assert_good(document, table, ("good-a",))
    view = next(v for v in document["nodes"] if v["node"] == node)
    expected = EXPECTED[case]
    assert set(view["invalid"]) == set(expected), view["invalid"]
    for name, words in expected.items():
        assert words in view["invalid"][name], (name, view["invalid"][name])
    assert view["check"] == ("unreadable" if "state" in expected else "invalid")
    shown = escaped(node, inventory.NODE_CELL)
    row = next(line for line in table.splitlines() if line.startswith(f"{shown} "))
    assert row.split()[-1] == view["check"]
    assert f"  {shown}: " in table  # the reasons, below the table
    assert not any(line.startswith("forged") for line in table.splitlines())
    if case == "status_not_online_or_offline":
        assert view["presence"] == "unknown"


@pytest.mark.broker
def test_the_network_thread_survives_deep_json_and_hears_a_node_after(
    broker: Broker, retainer: Retainer
) -> None:
    """`status --watch --json`, 5,000 nested brackets retained and then published live (the
    case that ended paho's thread with RecursionError): a node that comes online afterwards
    appears in a later document, the hostile node listed unreadable in every one."""
    retainer.retain("voice/deep/status", b"online")
    retainer.retain("voice/deep/state", b"[" * 5000 + b"]" * 5000)
    command = tool(broker, "status", "--watch", "--json", "--interval", "0.2")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as process:
        lines: queue.Queue[bytes] = queue.Queue()
        assert process.stdout is not None

        def read(stream: IO[bytes]) -> None:
            for line in stream:
                lines.put(line)

        reader = threading.Thread(target=read, args=(process.stdout,))
        reader.start()
        try:
            documents: list[dict[str, Any]] = []

            def heard(node: str) -> bool:
                with contextlib.suppress(queue.Empty):
                    while True:
                        line = lines.get_nowait().decode("utf-8")
                        assert_terminal_safe(line.rstrip("\n"))
                        documents.append(json.loads(line))
                return bool(documents) and node in {v["node"] for v in documents[-1]["nodes"]}

            wait_until(lambda: heard("deep"), what="the first document")
            retainer.retain("voice/deep/state", b"{" * 5000, retain=False)  # live, too
            retainer.retain("voice/late/status", b"online", retain=False)
            retainer.retain("voice/late/state", json.dumps(good_state("late")).encode())
            wait_until(lambda: heard("late"), what="the node that came after")
        finally:
            process.terminate()
            process.wait(TIMEOUT)
            reader.join(TIMEOUT)
        assert process.stderr is not None
        err = process.stderr.read().decode("utf-8")
    assert "may be incomplete" not in err
    assert "could not be read" not in err
    views = {v["node"]: v for v in documents[-1]["nodes"]}
    assert views["deep"]["check"] == "unreadable"
    assert views["late"]["check"] == "ok"


# ---- the same model, without the broker: many more examples ------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile=HOSTILE_NODES)
def test_the_inventory_types_every_payload(hostile: list[tuple[str, bytes, bytes]]) -> None:
    """Fed as paho hands messages over: every node listed, the JSON document strict (no NaN),
    every view typed, the table printable."""
    fleet = Inventory("voice")
    now = time.time()
    for node, status_payload, state_payload in hostile:
        fleet.feed(f"voice/{node}/status", status_payload, True, now)
        fleet.feed(f"voice/{node}/state", state_payload, True, now)
    records = fleet.records()
    document = json.loads(json.dumps(inventory.report(records, now, 300, {}), allow_nan=False))
    table = inventory.table(records, now, 300, {})
    assert_listed(document, table, {n for n, _, _ in hostile})
    assert_terminal_safe(table)
    assert terminal(table) == table


@settings(max_examples=300, deadline=None)
@given(payload=EVENT_PAYLOADS)
def test_an_update_event_is_typed_or_ignored(payload: bytes) -> None:
    """Never raises; what it keeps is typed, bounded and printable."""
    event = node_messages.parse_update_event("n", payload, 1.0)
    if event is None:
        return
    assert event.offer.isprintable()
    assert event.state.isprintable()
    for text, limit in ((event.reason, node_messages.MAX_TEXT), (event.detail, 300)):
        assert text is None or (text.isprintable() and len(text) <= 10 * limit + 1)
    assert event.release is None or type(event.release) is int


def _unescape(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(0)
        return "\\" if code == "\\\\" else chr(int(code[2:], 16))

    return re.sub(r"\\\\|\\x[0-9a-f]{2}|\\u[0-9a-f]{4}|\\U[0-9a-f]{8}", one, text)


@settings(max_examples=1000)
@given(text=HOSTILE_TEXT)
def test_escaping_is_printable_and_reversible(text: str) -> None:
    """`escaped` shows every character (nothing lost, nothing ambiguous); `terminal` leaves
    nothing unprintable but line ends; a code span is one span on one line."""
    shown = escaped(text)
    assert shown.isprintable()
    assert _unescape(shown) == text
    assert all(line.isprintable() for line in terminal(text).split("\n"))
    span = markdown(text, in_table=True)
    assert span.isprintable()
    if not text:
        assert span == "(empty)"
        return
    fence = re.match(r"`+", span)
    assert fence is not None
    assert span.endswith(fence.group(0))
    inner = span[len(fence.group(0)) : -len(fence.group(0))]
    assert fence.group(0) not in re.findall(r"`+", inner)  # no run that would close it early
    assert not re.search(r"(?<!\\)\|", inner)


# ---- ota serve ----------------------------------------------------------------------------------


def _listening(port: int) -> set[str]:
    """Local addresses with a TCP socket listening on the port (from /proc/net/tcp, tcp6)."""
    found = set()
    for name in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/net/{name}").read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


@contextlib.contextmanager
def serving(directory: Path, *args: str) -> Iterator[tuple[int, str]]:
    """`python -m ota serve` as the operator runs it; (port, its first line)."""
    port = free_port()
    command = [sys.executable, "-m", "ota", "serve", str(directory), "--port", str(port), *args]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            wait_until(lambda: bool(_listening(port)), what="the server to listen")
            yield port, line
        finally:
            process.terminate()
            process.wait(TIMEOUT)


def test_serve_binds_loopback_unless_told(tmp_path: Path) -> None:
    """By default only 127.0.0.1 listens; `--bind 0.0.0.0` opens it, as documented."""
    with serving(tmp_path) as (port, line):
        assert _listening(port) == {"0100007F"}
        assert f"http://127.0.0.1:{port}/" in line
    with serving(tmp_path, "--bind", "0.0.0.0") as (port, line):  # noqa: S104 - the documented opt-in
        assert _listening(port) == {"00000000"}


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)  # the path exactly as given
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_serve_answers_only_the_files_of_the_releases(tmp_path: Path) -> None:
    """The files of a release (whole, from an offset, through a symlink inside); 404 for every
    directory (no listing), `..` however spelled, a symlink that leads out, a hidden file and
    a private key."""
    root, outside = tmp_path / "releases", tmp_path / "private"
    (root / "r1").mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    (root / "r1" / "voice.onnx").write_bytes(b"model-bytes")
    (root / "r1" / "manifest.json").write_text("{}")
    (root / "r1" / "out.txt").symlink_to(outside / "secret.txt")
    (root / "r1" / "outdir").symlink_to(outside)
    (root / "current").symlink_to(root / "r1")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("[core]")
    (root / "release.key").write_text("-----BEGIN PRIVATE KEY-----")
    with serving(root) as (port, _line):
        assert _get(port, "/r1/voice.onnx") == (200, b"model-bytes")
        assert _get(port, "/current/voice.onnx") == (200, b"model-bytes")
        assert _get(port, "/r1/voice.onnx", {"Range": "bytes=6-"}) == (206, b"bytes")
        refused = [
            "/",
            "/r1",
            "/r1/",
            "/current/",
            "/../private/secret.txt",
            "/r1/../../private/secret.txt",
            "/%2e%2e/private/secret.txt",
            "/r1/%2E%2E/%2e%2e/private/secret.txt",
            "/r1/..%2f..%2fprivate/secret.txt",
            "/r1/out.txt",
            "/r1/outdir/secret.txt",
            "/.git/config",
            "/release.key",
            "/r1/%ff",
            "//etc/passwd",
        ]
        for path in refused:
            code, body = _get(port, path)
            assert code == 404, path
            assert b"secret" not in body
            assert b"<a href" not in body
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
            raw.sendall(b"GET /r1/voice.onnx HTTP/1.0\r\n\r\n")
            assert raw.recv(64).startswith(b"HTTP/1.0 200")
