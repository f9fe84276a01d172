"""The split of speak messages between the sounder's alarm lane and the engine: every message is
the lane's of exactly one of them, and the sounder's cheap test never drops an alarm."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from agent.core.messages import Delivery, Priority, Rejection, SpeakInvalid, SpeakReceived
from agent.protocol.lanes import in_alarm_lane, is_alarm, may_be_alarm
from agent.protocol.payloads import SpeakLimits, parse_speak

LIMITS = SpeakLimits(16384, 5000)
LABELS = [p.label for p in Priority]


def _event(payload: bytes) -> SpeakReceived | SpeakInvalid:
    """What the speak route makes of a payload (as both processes route it)."""
    parsed = parse_speak(payload, LIMITS, lambda: "generated-id")
    delivery = Delivery(1, 1)
    if isinstance(parsed, Rejection):
        return SpeakInvalid(parsed, delivery)
    return SpeakReceived(parsed, delivery)


def _escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" for c in text)


@given(
    label=st.sampled_from([*LABELS, "ALARM", "Critical", "alarmx"]),
    text=st.text(max_size=40),
    escape=st.booleans(),
    extra=st.dictionaries(st.sampled_from(["volume", "ttl", "voice", "chime"]), st.integers()),
)
def test_a_payload_the_parser_reads_as_an_alarm_always_passes_the_sounders_test(
    label: str, text: str, escape: bool, extra: dict[str, int]
) -> None:
    body = json.dumps({"text": text, **extra, "priority": "PLACEHOLDER"}, ensure_ascii=False)
    value = _escaped(label) if escape else label
    payload = body.replace("PLACEHOLDER", value).encode()
    event = _event(payload)
    if in_alarm_lane(event):
        assert may_be_alarm(payload)


def test_an_escaped_class_is_still_an_alarm_and_still_found() -> None:
    payload = b'{"text": "Fire", "priority": "\\u0063ritical"}'
    event = _event(payload)
    assert in_alarm_lane(event)
    assert may_be_alarm(payload)


def test_ordinary_messages_need_no_parse_in_the_sounder() -> None:
    for payload in (b"The front door is open.", b'{"text": "hi", "priority": "warning"}'):
        assert not may_be_alarm(payload)
        assert not in_alarm_lane(_event(payload))


def test_a_refusal_that_named_an_alarm_class_is_the_alarm_lanes() -> None:
    payload = b'{"text": 5, "priority": "alarm"}'
    event = _event(payload)
    assert isinstance(event, SpeakInvalid)
    assert in_alarm_lane(event)
    unnamed = _event(b'{"text": 5}')
    assert not in_alarm_lane(unnamed)


def test_the_alarm_classes() -> None:
    assert [p for p in Priority if is_alarm(p)] == [Priority.ALARM, Priority.CRITICAL]
    assert not is_alarm(None)
