"""Speak payload parsing and event encoding: every input gets a request or a reasoned rejection."""

from __future__ import annotations

import itertools
import json

import pytest

from agent.core.messages import Lifecycle, Rejection, SpeakRequest
from agent.core.reasons import Reason
from agent.protocol.payloads import SpeakLimits, encode_event, parse_speak

LIMIT = 256
LIMITS = SpeakLimits(max_bytes=LIMIT, max_text_chars=40)


def parse(payload: bytes) -> SpeakRequest | Rejection:
    counter = itertools.count(1)
    return parse_speak(payload, LIMITS, lambda: f"gen-{next(counter)}")


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b"The door is open.", SpeakRequest("gen-1", "The door is open.")),
        (b"  padded text \n", SpeakRequest("gen-1", "padded text")),
        (b'"quoted" is text', SpeakRequest("gen-1", '"quoted" is text')),
        (b'{"text": "Hi", "id": "a1"}', SpeakRequest("a1", "Hi")),
        (b' \n{"text": "Hi"}', SpeakRequest("gen-1", "Hi")),
        ('\ufeff{"text": "Hi", "id": "b"}'.encode(), SpeakRequest("b", "Hi")),
        (b'{"text": "Hi", "id": "x", "zz": 1, "aa": 2}', SpeakRequest("x", "Hi", ("aa", "zz"))),
        ("Grüße aus Köln".encode(), SpeakRequest("gen-1", "Grüße aus Köln")),
    ],
)
def test_valid_payloads(payload: bytes, expected: SpeakRequest) -> None:
    assert parse(payload) == expected


@pytest.mark.parametrize(
    ("payload", "reason", "field", "request_id"),
    [
        (b"x" * (LIMIT + 1), Reason.PAYLOAD_TOO_LARGE, None, "gen-1"),
        (b"caf\xe9", Reason.INVALID_UTF8, None, "gen-1"),
        (b"{not json", Reason.INVALID_JSON, None, "gen-1"),
        (b'{"text": "a"} trailing', Reason.INVALID_JSON, None, "gen-1"),
        (b"{" * 200, Reason.INVALID_JSON, None, "gen-1"),
        (b'{"id": "k"}', Reason.INVALID_FIELD, "text", "k"),
        (b'{"id": "k", "text": null}', Reason.INVALID_FIELD, "text", "k"),
        (b'{"id": "k", "text": 3}', Reason.INVALID_FIELD, "text", "k"),
        (b'{"id": "k", "text": {"a": 1}}', Reason.INVALID_FIELD, "text", "k"),
        (b'{"id": true, "text": "a"}', Reason.INVALID_FIELD, "id", "gen-1"),
        (b'{"id": "", "text": "a"}', Reason.INVALID_FIELD, "id", "gen-1"),
        (b'{"id": 42, "text": "a"}', Reason.INVALID_FIELD, "id", "gen-1"),  # "42" would collide
        (b'{"id": 1e400, "text": "a"}', Reason.INVALID_FIELD, "id", "gen-1"),
        (('{"id": ' + "9" * 60 + ', "text": "a"}').encode(), Reason.INVALID_FIELD, "id", "gen-1"),
        (b'{"text": "a", "x\\ud800": 1}', Reason.INVALID_UTF8, None, "gen-1"),
        (b'{"text": "a\\udc00b"}', Reason.INVALID_UTF8, None, "gen-1"),
        (b'{"id": "\\ud83d", "text": "a"}', Reason.INVALID_UTF8, None, "gen-1"),
        (b'{"text": "a", "nested": [{"\\udfff": 1}]}', Reason.INVALID_UTF8, None, "gen-1"),
        (b'{"id": "a\\nb", "text": "a"}', Reason.INVALID_FIELD, "id", "gen-1"),
        (json.dumps({"id": "i" * 129, "text": "a"}).encode(), Reason.INVALID_FIELD, "id", "gen-1"),
        (b"", Reason.EMPTY_TEXT, None, "gen-1"),
        (b" \t\n", Reason.EMPTY_TEXT, None, "gen-1"),
        (b'{"id": "e", "text": "  "}', Reason.EMPTY_TEXT, None, "e"),
    ],
)
def test_invalid_payloads_are_rejected_with_a_reason(
    payload: bytes, reason: Reason, field: str | None, request_id: str
) -> None:
    result = parse(payload)
    assert isinstance(result, Rejection)
    assert (result.reason, result.field, result.id) == (reason, field, request_id)
    assert result.detail


def test_deeply_nested_json_is_rejected_not_raised() -> None:
    deep = b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    result = parse_speak(deep, SpeakLimits(len(deep), 100), lambda: "g")
    assert isinstance(result, Rejection)
    assert result.reason == Reason.INVALID_JSON


def test_event_encoding() -> None:
    body = json.loads(
        encode_event("kitchen", "a1", Lifecycle.FINISHED, {"audio_seconds": 1.5}, 0.25)
    )
    assert body == {
        "id": "a1",
        "event": "finished",
        "ts": "1970-01-01T00:00:00.250Z",
        "node": "kitchen",
        "audio_seconds": 1.5,
    }


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (b'{"text": "a", "voice": ""}', "voice"),
        (b'{"text": "a", "voice": 3}', "voice"),
        (b'{"text": "a", "rate": 0.2}', "rate"),
        (b'{"text": "a", "rate": "fast"}', "rate"),
        (b'{"text": "a", "rate": true}', "rate"),
        (b'{"text": "a", "volume": 1.5}', "volume"),
        (b'{"text": "a", "volume": -0.1}', "volume"),
        (b'{"text": "a", "volume": null}', "volume"),
    ],
)
def test_invalid_voice_rate_and_volume_name_their_field(payload: bytes, field: str) -> None:
    result = parse(payload)
    assert isinstance(result, Rejection)
    assert (result.reason, result.field) == (Reason.INVALID_FIELD, field)


def test_voice_rate_and_volume_are_carried() -> None:
    result = parse(b'{"text": "Hi", "voice": "lessac", "rate": 1.5, "volume": 0}')
    assert result == SpeakRequest("gen-1", "Hi", (), "lessac", 1.5, 0.0)


def test_text_is_cleaned_and_capped() -> None:
    assert parse(b"<b>Fire</b>  alarm\x00") == SpeakRequest("gen-1", "Fire alarm")
    long = parse(b"y" * 41)
    assert isinstance(long, Rejection)
    assert long.reason == Reason.TEXT_TOO_LONG
    only_tags = parse(b'{"id": "t", "text": "<speak></speak>"}')
    assert isinstance(only_tags, Rejection)
    assert only_tags.reason == Reason.EMPTY_TEXT


def test_a_lone_surrogate_is_refused_before_anything_encodes_it() -> None:
    """The poison message that crash-looped every node: a JSON escape of half a UTF-16 pair in
    an unknown field's name. Refused at the edge; and events are ASCII-safe whatever they
    carry."""
    poison = b'{"text": "The front door is open.", "\\ud800": true}'
    rejected = parse(poison)
    assert isinstance(rejected, Rejection)
    assert rejected.reason == Reason.INVALID_UTF8
    event = encode_event("n", "x", Lifecycle.REJECTED, {"detail": "\ud800\u00e9\n"}, 0.0)
    assert event.isascii()
    assert json.loads(event)["detail"] == "\ud800\u00e9\n"


@pytest.mark.parametrize(
    ("at", "seconds"),
    [
        ('"2026-12-01T10:00:00Z"', 1796119200.0),
        ('"2026-12-01T10:00:00.250+00:00"', 1796119200.25),
        ('"2026-12-01T11:00:00+01:00"', 1796119200.0),
        ("1796119200.5", 1796119200.5),
        ("1796119200", 1796119200.0),
    ],
)
def test_at_is_an_instant_in_iso_8601_with_its_zone_or_unix_seconds(
    at: str, seconds: float
) -> None:
    parsed = parse(f'{{"text": "Hi", "id": "a", "at": {at}}}'.encode())
    assert isinstance(parsed, SpeakRequest)
    assert parsed.at == seconds


@pytest.mark.parametrize(
    "at",
    [
        '"2026-12-01T10:00:00"',  # no zone: whose ten o'clock?
        '"tomorrow"',
        '"2026-13-01T10:00:00Z"',
        '"' + "9" * 80 + '"',
        "true",
        "-5",
        "0",
        "1e400",
        "[1796119200]",
    ],
)
def test_an_at_that_is_no_instant_is_rejected_naming_the_field(at: str) -> None:
    parsed = parse(f'{{"text": "Hi", "id": "a", "at": {at}}}'.encode())
    assert isinstance(parsed, Rejection), parsed
    assert (parsed.reason, parsed.field, parsed.id) == (Reason.INVALID_FIELD, "at", "a")
