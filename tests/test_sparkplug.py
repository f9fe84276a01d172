"""The Sparkplug B edge node's decisions (agent/protocol/sparkplug.py), without a broker: the
payloads it sends, decoded back field by field; `seq` and `bdSeq`; data by exception; what a
command asks for and every way it is refused (never raised). Through a broker, with a SCADA
stand-in built on another library: tests/test_sparkplug_scada.py."""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.protocol.sparkplug import (
    BY_NAME,
    DEVICE_METRICS,
    MAX_METRICS_PER_COMMAND,
    NODE_METRICS,
    STATE_AHEAD_MS,
    STATE_HOLD_MS,
    DataType,
    EdgeNode,
    HostMarks,
    Refused,
    SparkplugTopics,
    Verdict,
    Write,
    Written,
    command_of,
    host_state,
    node_birth,
    node_death,
    read_command,
    too_large,
)
from agent.protocol.sparkplug_schema import Payload
from tests.hostile import sparkplug_command, sparkplug_metrics, state_payloads

TOPICS = SparkplugTopics("plant", "node-1", "speaker")
DEVICE = frozenset({Write.SPEAK, Write.PRIORITY, Write.STOP, Write.ACKNOWLEDGE, Write.VOLUME})
STATE: dict[str, Any] = {
    "audio": "available",
    "volume": 0.8,
    "speaking": False,
    "queue_depth": 0,
    "underruns": 0,
    "model_version": "cdcdcdcdcdcd",
    "voice": "default",
    "repeating": [],
    "last_error": None,
}


def decoded(payload: bytes) -> Any:
    message = Payload()
    message.ParseFromString(payload)
    return message


def metric_values(message: Any) -> dict[Any, Any]:
    """name (birth) or alias (data) -> value."""
    out = {}
    for m in message.metrics:
        key = m.name if m.HasField("name") else m.alias
        out[key] = None if m.is_null else getattr(m, m.WhichOneof("value"))
    return out


def command(**metrics: tuple[int, Any]) -> bytes:
    """A DCMD payload writing metrics by name: name -> (datatype, value)."""
    payload = Payload(timestamp=1, seq=0)
    for name, (datatype, value) in metrics.items():
        entry = payload.metrics.add(name=name.replace("_", " "), datatype=datatype)
        member = {11: "boolean_value", 12: "string_value", 9: "float_value", 10: "double_value"}
        setattr(entry, member.get(datatype, "long_value"), value)
    return bytes(payload.SerializeToString())


def test_topics_follow_the_namespace() -> None:
    assert TOPICS.nbirth == "spBv1.0/plant/NBIRTH/node-1"
    assert TOPICS.dcmd == "spBv1.0/plant/DCMD/node-1/speaker"
    assert TOPICS.ddeath == "spBv1.0/plant/DDEATH/node-1/speaker"


def test_the_death_and_birth_carry_the_same_bd_seq_and_the_birth_seq_0() -> None:
    death, birth = decoded(node_death(7, 1000)), decoded(node_birth(7, 1001))
    assert not death.HasField("seq")
    assert metric_values(death) == {"bdSeq": 7}
    assert death.metrics[0].datatype == DataType.INT64
    assert birth.seq == 0
    rebirth = next(m for m in birth.metrics if m.name == "Node Control/Rebirth")
    assert not rebirth.HasField("alias")  # Sparkplug 3.0: a rebirth is always asked by name
    aliases = {m.name: m.alias if m.HasField("alias") else None for m in birth.metrics}
    assert aliases == {"bdSeq": None, "Node Control/Rebirth": None, "Node Control/Next Server": 2}
    assert metric_values(birth) == {
        "bdSeq": 7,
        "Node Control/Rebirth": False,
        "Node Control/Next Server": False,
    }


def test_metric_names_aliases_and_property_types_follow_the_rules() -> None:
    """Sparkplug 3.0: names distinct even in lower case, aliases unique over the node and its
    devices, every birth metric typed, every property value typed, keys and values paired."""
    every = [*NODE_METRICS, *DEVICE_METRICS]
    assert len({m.name.lower() for m in every}) == len(every)
    aliases = [m.alias for m in every if m.alias is not None]
    assert len(set(aliases)) == len(aliases)
    edge = EdgeNode(TOPICS, "alarm")
    for _, payload in edge.birth(STATE, 0):
        for entry in decoded(payload).metrics:
            assert entry.HasField("name"), entry
            assert entry.HasField("datatype"), entry
            assert len(entry.properties.keys) == len(entry.properties.values)
            assert all(v.HasField("type") for v in entry.properties.values)


def test_a_birth_names_every_metric_with_alias_type_and_properties() -> None:
    edge = EdgeNode(TOPICS, "alarm", bd_seq=3)
    (n_topic, _), (d_topic, d_payload) = edge.birth(STATE, 5000)
    assert (n_topic, d_topic) == (TOPICS.nbirth, TOPICS.dbirth)
    birth = decoded(d_payload)
    assert birth.seq == 1
    assert [m.name for m in birth.metrics] == [m.name for m in DEVICE_METRICS]
    assert len({m.alias for m in birth.metrics}) == len(DEVICE_METRICS)
    values = metric_values(birth)
    assert values["Priority"] == "alarm"
    assert values["Volume"] == pytest.approx(0.8)
    assert values["Audio available"] is True
    assert values["Model version"] == "cdcdcdcdcdcd"
    volume = next(m for m in birth.metrics if m.name == "Volume")
    properties = dict(zip(volume.properties.keys, volume.properties.values, strict=True))
    assert properties["engUnit"].string_value == "ratio"
    assert properties["writable"].boolean_value is True


def test_data_goes_by_exception_with_aliases_and_the_time_of_the_change() -> None:
    edge = EdgeNode(TOPICS, "alarm")
    edge.birth(STATE, 1000)
    assert edge.changed(STATE, 2000) == []  # nothing changed: nothing sent
    [(topic, payload)] = edge.changed({**STATE, "speaking": True, "queue_depth": 2}, 3000)
    data = decoded(payload)
    assert topic == TOPICS.ddata
    assert data.seq == 2
    assert all(not m.HasField("name") for m in data.metrics)  # aliases only
    assert all(not m.HasField("datatype") for m in data.metrics)  # known from the birth
    by_alias = {m.alias: m for m in data.metrics}
    assert set(by_alias) == {BY_NAME["Speaking"].alias, BY_NAME["Queue depth"].alias}
    assert all(m.timestamp == 3000 for m in data.metrics)


def test_seq_wraps_at_255_and_a_rebirth_starts_again_at_0() -> None:
    edge = EdgeNode(TOPICS, "alarm")
    edge.birth(STATE, 0)
    seen = []
    for n in range(300):
        [(_, payload)] = edge.changed({**STATE, "queue_depth": n + 1}, n)
        seen.append(decoded(payload).seq)
    assert seen[:3] == [2, 3, 4]
    assert all((b - a) % 256 == 1 for a, b in itertools.pairwise(seen))
    assert max(seen) == 255
    births = edge.birth(STATE, 400)
    assert [decoded(p).seq for _, p in births] == [0, 1]


def test_the_device_dies_with_the_audio_and_is_born_again_with_it() -> None:
    edge = EdgeNode(TOPICS, "alarm")
    edge.birth(STATE, 0)
    [(topic, payload)] = edge.changed({**STATE, "audio": "unavailable"}, 10)
    assert topic == TOPICS.ddeath
    assert decoded(payload).seq == 2
    assert edge.changed({**STATE, "audio": "unavailable", "queue_depth": 3}, 20) == []
    [(topic, payload)] = edge.changed({**STATE, "queue_depth": 3}, 30)
    assert topic == TOPICS.dbirth
    assert metric_values(decoded(payload))["Queue depth"] == 3


def test_a_node_born_without_audio_sends_no_device_birth() -> None:
    messages = EdgeNode(TOPICS, "alarm").birth({**STATE, "audio": "unavailable"}, 0)
    assert [t for t, _ in messages] == [TOPICS.nbirth]


def test_a_command_writes_by_name_or_alias_with_its_type() -> None:
    writes = read_command(
        command(Speak=(12, "Pump 3 tripped"), Stop=(11, True), Volume=(10, 0.5)), DEVICE
    )
    assert writes == [
        Written(BY_NAME["Speak"], "Pump 3 tripped"),
        Written(BY_NAME["Stop"], True),
        Written(BY_NAME["Volume"], 0.5),
    ]
    by_alias = Payload()
    by_alias.metrics.add(alias=BY_NAME["Acknowledge"].alias, boolean_value=True)
    assert read_command(by_alias.SerializeToString(), DEVICE) == [
        Written(BY_NAME["Acknowledge"], True)
    ]


@pytest.mark.parametrize(
    ("payload", "label", "reason"),
    [
        (command(Nope=(12, "x")), "Nope", "unknown metric"),
        (command(Speak=(11, True)), "Speak", "expected String"),
        (command(Stop=(12, "yes")), "Stop", "expected Boolean"),
        (command(Speaking=(11, True)), "Speaking", "not writable"),
        (command(Node_Control_Rebirth=(11, True)), "Node Control Rebirth", "unknown metric"),
        (b"\xff\xff\xff", "payload", "not a Sparkplug B payload"),
        (b"x" * 70000, "payload", "larger than"),
    ],
)
def test_a_command_that_cannot_be_carried_out_is_refused_with_its_reason(
    payload: bytes, label: str, reason: str
) -> None:
    [refused] = read_command(payload, DEVICE)
    assert isinstance(refused, Refused)
    assert refused.label == label
    assert reason in refused.reason


def test_node_controls_are_refused_on_the_device_and_device_metrics_on_the_node() -> None:
    rebirth = Payload()
    rebirth.metrics.add(name="Node Control/Rebirth", datatype=11, boolean_value=True)
    [refused] = read_command(rebirth.SerializeToString(), DEVICE)
    assert isinstance(refused, Refused)
    assert read_command(rebirth.SerializeToString(), frozenset({Write.REBIRTH})) == [
        Written(BY_NAME["Node Control/Rebirth"], True)
    ]


def test_a_null_a_mismatched_alias_and_too_many_metrics_are_refused() -> None:
    null = Payload()
    null.metrics.add(name="Speak", datatype=12, is_null=True)
    mismatched = Payload()
    mismatched.metrics.add(name="Speak", alias=BY_NAME["Stop"].alias, string_value="x")
    many = Payload()
    for _ in range(MAX_METRICS_PER_COMMAND + 1):
        many.metrics.add(name="Stop", boolean_value=True)
    for message in (null, mismatched, many):
        [refused] = read_command(message.SerializeToString(), DEVICE)
        assert isinstance(refused, Refused), message


@settings(max_examples=400)
@given(st.binary(max_size=512))
def test_any_bytes_as_a_command_are_read_or_refused_never_raised(data: bytes) -> None:
    for write in read_command(data, DEVICE):
        assert isinstance(write, Written | Refused)
        if isinstance(write, Refused):
            assert write.label.isprintable()


def test_last_error_follows_refusals_and_the_state() -> None:
    edge = EdgeNode(TOPICS, "alarm")
    edge.birth(STATE, 0)
    edge.refuse("Priority: expected one of critical, alarm")
    [(_, payload)] = edge.changed(STATE, 10)
    assert list(metric_values(decoded(payload)).values()) == [
        "Priority: expected one of critical, alarm"
    ]
    [(_, payload)] = edge.changed({**STATE, "last_error": "rejected abc: too_long"}, 20)
    assert list(metric_values(decoded(payload)).values()) == ["rejected abc: too_long"]
    assert edge.changed({**STATE, "last_error": "rejected abc: too_long"}, 30) == []
    edge.refuse("Bogus: unknown metric", "spb-1")
    edge.changed({**STATE, "last_error": "rejected abc: too_long"}, 40)
    # the state's line for the refusal's own event keeps the more precise reason
    assert edge.changed({**STATE, "last_error": "rejected spb-1: invalid_field"}, 50) == []
    assert edge.last_error == "Bogus: unknown metric"


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"online": true, "timestamp": 5}', (True, 5)),
        (b'{"online": false, "timestamp": 6}', (False, 6)),
        (b'{"online": "yes", "timestamp": 6}', None),
        (b"ONLINE", None),  # Sparkplug 2.2's plain-text STATE is not 3.0's
        (b"[" * 5000, None),
        (b'{"online": true, "timestamp": true}', None),
    ],
)
def test_a_host_state_is_read_or_ignored(payload: bytes, expected: object) -> None:
    assert host_state(payload) == expected


def test_a_node_without_sparkplug_does_not_load_protobuf() -> None:
    """The edge node (and protobuf, ~50 ms and a few MB at start) is imported only when
    `sparkplug.enabled`: the agent's loop, assembly and entry point do not pull it in."""
    probe = "import sys, agent.__main__, agent.app; print('google.protobuf' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stdout


def _field(number: int, data: bytes) -> bytes:
    """One length-delimited field of the wire format (built by hand here: the library will not
    write a string that is not UTF-8, which is what a hostile publisher sends)."""
    length, size = b"", len(data)
    while True:
        low, size = size & 0x7F, size >> 7
        length += bytes([low | (0x80 if size else 0)])
        if not size:
            break
    return bytes([number << 3 | 2]) + length + data


@settings(max_examples=300)
@given(name=st.binary(max_size=80), text=st.binary(max_size=300))
def test_names_and_texts_that_are_not_utf8_are_refused_never_raised_or_spoken(
    name: bytes, text: bytes
) -> None:
    """A metric name or a Speak text of any bytes: read when it is UTF-8 (the text as text),
    refused otherwise; never raised, never a bytes value written as its repr."""
    for metric_name in (name, b"Speak"):
        metric = _field(1, metric_name) + b"\x20\x0c" + _field(15, text)  # name, String, value
        for write in read_command(_field(2, metric), DEVICE):
            assert isinstance(write, Written | Refused)
            if isinstance(write, Written):
                assert write.value == text.decode("utf-8"), write


# ---- one command, one unit of work ----------------------------------------------------------

CLASSES = ("critical", "alarm", "warning", "info", "chat")


def test_a_command_of_32_speaks_is_one_speak_and_one_answer() -> None:
    """The issue's amplification: a DCMD of 32 writes was 32 speaks. A metric counts once per
    command (its first write); the others are refused together."""
    message = Payload()
    for n in range(MAX_METRICS_PER_COMMAND):
        message.metrics.add(name="Speak", datatype=12, string_value=f"Pump {n} tripped")
    done = command_of(message.SerializeToString(), device=True, classes=CLASSES)
    assert dict(done.values) == {Write.SPEAK: "Pump 0 tripped"}
    assert [(r.label, r.reason) for r in done.refused] == [
        ("Speak", "written 31 more times in one command (the first write counts)")
    ]
    assert done.speaks_at("info") == "info"


def test_a_command_s_priority_is_for_its_own_speak_wherever_it_is() -> None:
    message = Payload()
    message.metrics.add(name="Speak", datatype=12, string_value="Fire in hall two.")
    message.metrics.add(name="Priority", datatype=12, string_value="critical")
    message.metrics.add(name="Priority", datatype=12, string_value="chat")
    message.metrics.add(name="Stop", datatype=11, boolean_value=True)
    message.metrics.add(name="Bogus", datatype=11, boolean_value=True)
    done = command_of(message.SerializeToString(), device=True, classes=CLASSES)
    assert done.speaks_at("info") == "critical"
    assert done.asks(Write.STOP)
    assert not done.asks(Write.ACKNOWLEDGE)
    assert {r.label for r in done.refused} == {"Bogus", "Priority"}
    loud = Payload()
    loud.metrics.add(name="Priority", datatype=12, string_value="loud")
    refused = command_of(loud.SerializeToString(), device=True, classes=CLASSES)
    assert refused.values == {}
    assert refused.refused[0].reason.startswith("expected one of critical")


@settings(max_examples=300)
@given(st.binary(max_size=2048))
def test_any_command_is_at_most_one_write_of_each_metric(data: bytes) -> None:
    for device in (True, False):
        done = command_of(data, device=device, classes=CLASSES)
        assert len(done.values) <= len(Write)
        assert all(r.label.isprintable() for r in done.refused)


def test_a_command_too_large_to_read_is_one_refusal() -> None:
    done = too_large(52_428_805, device=True)
    assert done.values == {}
    assert "52428805 bytes" in done.refused[0].reason


# ---- the primary host's STATE: plausible timestamps -------------------------------------------

NOW = 1_765_000_000_000


@pytest.mark.parametrize("clock_known", [True, False])
def test_a_forged_far_future_offline_is_ignored_and_the_host_s_genuine_states_count(
    clock_known: bool,
) -> None:
    """The issue's case: STATE offline with timestamp 10^15 gave an NDEATH, and the host's
    genuine online after it never counted. Such a timestamp is implausible and ignored."""
    marks = HostMarks()
    assert marks.judge(True, NOW - 5000, NOW, 0.0, clock_known=clock_known) is Verdict.ONLINE
    forged = marks.judge(False, 10**15, NOW + 1000, 1000.0, clock_known=clock_known)
    assert forged is Verdict.IMPLAUSIBLE
    assert marks.judge(False, NOW + 2000, NOW + 2000, 2000.0, clock_known=clock_known) is (
        Verdict.OFFLINE
    )
    assert marks.judge(True, NOW + 1500, NOW + 3000, 3000.0, clock_known=clock_known) is (
        Verdict.STALE  # older than the offline that counted (Sparkplug 3.0)
    )
    assert marks.judge(True, NOW + 4000, NOW + 4000, 4000.0, clock_known=clock_known) is (
        Verdict.ONLINE
    )


def test_a_host_clock_a_little_ahead_is_believed_and_far_ahead_is_not() -> None:
    marks = HostMarks()
    ahead = NOW + STATE_AHEAD_MS - 1
    assert marks.judge(True, ahead, NOW, 0.0, clock_known=True) is Verdict.ONLINE
    assert HostMarks().judge(True, NOW + STATE_AHEAD_MS + 1, NOW, 0.0, clock_known=True) is (
        Verdict.IMPLAUSIBLE
    )
    assert HostMarks().judge(True, -1, NOW, 0.0, clock_known=True) is Verdict.IMPLAUSIBLE
    assert HostMarks().judge(True, 10**15, 0, 0.0, clock_known=False) is Verdict.IMPLAUSIBLE
    assert HostMarks().judge(True, NOW, 0, 0.0, clock_known=False) is Verdict.ONLINE  # 1970 here


def test_an_offline_stamped_ahead_keeps_older_onlines_out_for_a_while_only() -> None:
    """A forged offline stamped as far ahead as is plausible (or any, while the node's clock is
    not known) outranks the host's online, whose timestamp is its connect time: for
    `STATE_HOLD_MS` of the node's own time, then the host's online overrules it."""
    marks = HostMarks()
    assert marks.judge(True, NOW - 60_000, NOW, 0.0, clock_known=True) is Verdict.ONLINE
    forged = NOW + STATE_AHEAD_MS - 1
    assert marks.judge(False, forged, NOW, 0.0, clock_known=True) is Verdict.OFFLINE
    assert marks.judge(True, NOW - 60_000, NOW + 1000, 1000.0, clock_known=True) is (Verdict.STALE)
    later = STATE_HOLD_MS + 1.0
    assert marks.judge(True, NOW - 60_000, NOW + int(later), later, clock_known=True) is (
        Verdict.ONLINE
    )
    assert marks.judge(False, NOW - 90_000, NOW + int(later), later, clock_known=True) is (
        Verdict.STALE  # an offline older than the online that counted: still not believed
    )


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(-(10**16), 10**16), st.integers(0, 10**6)),
        max_size=20,
    ),
    st.booleans(),
)
def test_no_sequence_of_states_keeps_the_node_unborn(
    forged: list[tuple[bool, int, int]], clock_known: bool
) -> None:
    """Whatever STATEs a forger sends (any timestamps, any order), the host's genuine online
    (stamped with its connect time, before all of them) counts once `STATE_HOLD_MS` passed
    after the last of them, or the node is online already."""
    marks, now, mono = HostMarks(), NOW, 0.0
    for online, stamp, step in forged:
        now, mono = now + step, mono + step
        marks.judge(online, stamp, now, mono, clock_known=clock_known)
    mono += STATE_HOLD_MS
    verdict = marks.judge(True, NOW - 1000, now + STATE_HOLD_MS, mono, clock_known=clock_known)
    assert verdict is Verdict.ONLINE or marks.online


# ---- the hostile generators of tests/hostile.py -----------------------------------------------


@settings(max_examples=300)
@given(st.lists(sparkplug_metrics, max_size=40), st.booleans())
def test_any_hostile_command_is_one_unit_of_work_refused_in_words_never_raised(
    metrics: list[dict[str, Any]], device: bool
) -> None:
    """Commands of any metrics the wire carries (any name or alias, matching or not, any type
    and value, many writes of one metric): at most one write of each counts, every refusal
    is printable, nothing raised."""
    done = command_of(sparkplug_command(metrics, Payload), device=device, classes=CLASSES)
    assert len(done.values) <= len(Write)
    assert all(r.label.isprintable() for r in done.refused)
    if len(metrics) > MAX_METRICS_PER_COMMAND:
        assert done.values == {}


@settings(max_examples=300)
@given(st.lists(state_payloads, max_size=12), st.booleans())
def test_hostile_states_are_read_or_ignored_and_never_keep_the_node_unborn(
    payloads: list[bytes], clock_known: bool
) -> None:
    marks, now = HostMarks(), NOW
    for n, payload in enumerate(payloads):
        parsed = host_state(payload)
        if parsed is not None:
            marks.judge(*parsed, now + n, float(n), clock_known=clock_known)
    later = len(payloads) + STATE_HOLD_MS
    verdict = marks.judge(True, NOW - 1000, now + later, float(later), clock_known=clock_known)
    assert verdict is Verdict.ONLINE or marks.online
