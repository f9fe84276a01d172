"""The pure core, table by table: events in, actions out."""

from __future__ import annotations

from collections.abc import Sequence

from agent.core import RecentIds, SpeakCore
from agent.messages import (
    Acknowledge,
    Delivery,
    Lifecycle,
    Notify,
    Reason,
    Rejection,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    SynthesisDone,
    Synthesize,
    UtteranceEnded,
    UtteranceStarted,
)

D1 = Delivery(mid=1, qos=1)
D2 = Delivery(mid=2, qos=1)


def req(request_id: str, text: str = "hello") -> SpeakRequest:
    return SpeakRequest(request_id, text)


def kinds(actions: Sequence[object]) -> list[str]:
    out = []
    for action in actions:
        match action:
            case Notify(request_id, event, _):
                out.append(f"{event}:{request_id}")
            case Acknowledge(delivery):
                out.append(f"ack:{delivery.mid}")
            case Synthesize(request):
                out.append(f"synth:{request.id}")
    return out


def test_first_request_is_accepted_synthesized_and_acknowledged() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    actions = core.handle(SpeakReceived(req("a"), D1))
    assert kinds(actions) == ["accepted:a", "synth:a", "ack:1"]
    assert actions[0] == Notify("a", Lifecycle.ACCEPTED, {"queue_depth": 0})


def test_requests_wait_first_in_first_out_for_the_synthesizer() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    core.handle(SpeakReceived(req("a"), D1))
    assert kinds(core.handle(SpeakReceived(req("b"), D2))) == ["accepted:b", "ack:2"]
    assert kinds(core.handle(SpeakReceived(req("c"), Delivery(3, 1)))) == ["accepted:c", "ack:3"]
    assert core.queue_depth == 2
    assert kinds(core.handle(SynthesisDone("a"))) == ["synth:b"]
    assert kinds(core.handle(SynthesisDone("b"))) == ["synth:c"]
    assert kinds(core.handle(SynthesisDone("c"))) == []


def test_lifecycle_of_playback() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    assert core.handle(UtteranceStarted("a")) == [Notify("a", Lifecycle.STARTED)]
    assert core.handle(UtteranceEnded("a", 1.23456)) == [
        Notify("a", Lifecycle.FINISHED, {"audio_seconds": 1.235})
    ]
    assert core.handle(UtteranceEnded("b", 0.0, Reason.AUDIO_ERROR, "no device")) == [
        Notify("b", Lifecycle.FAILED, {"reason": "audio_error", "detail": "no device"})
    ]


def test_invalid_message_is_rejected_and_still_acknowledged() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    rejection = Rejection("x", Reason.INVALID_FIELD, "expected a string", "text")
    assert core.handle(SpeakInvalid(rejection, D1)) == [
        Notify(
            "x",
            Lifecycle.REJECTED,
            {"reason": "invalid_field", "detail": "expected a string", "field": "text"},
        ),
        Acknowledge(D1),
    ]


def test_same_id_is_spoken_once() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    core.handle(SpeakReceived(req("a"), D1))
    actions = core.handle(SpeakReceived(req("a"), D2))
    assert kinds(actions) == ["rejected:a", "ack:2"]
    assert actions[0].details["reason"] == "duplicate_id"  # type: ignore[union-attr]


def test_a_broker_redelivery_of_a_known_id_is_only_acknowledged() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    core.handle(SpeakReceived(req("a"), D1))
    again = Delivery(mid=7, qos=1, redelivered=True)
    assert core.handle(SpeakReceived(req("a"), again)) == [Acknowledge(again)]


def test_a_redelivery_of_an_unknown_id_is_served() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    first = Delivery(mid=7, qos=1, redelivered=True)
    assert kinds(core.handle(SpeakReceived(req("a"), first))) == ["accepted:a", "synth:a", "ack:7"]


def test_full_queue_rejects_without_remembering_the_id() -> None:
    core = SpeakCore(queue_size=1, remembered_ids=10)
    core.handle(SpeakReceived(req("a"), D1))  # synthesizing
    core.handle(SpeakReceived(req("b"), D2))  # waiting: the queue is full
    actions = core.handle(SpeakReceived(req("c"), Delivery(3, 1)))
    assert kinds(actions) == ["rejected:c", "ack:3"]
    assert actions[0].details["reason"] == "queue_full"  # type: ignore[union-attr]
    core.handle(SynthesisDone("a"))
    assert kinds(core.handle(SpeakReceived(req("c"), Delivery(4, 1)))) == ["accepted:c", "ack:4"]


def test_recent_ids_forget_the_oldest() -> None:
    ids = RecentIds(2)
    for request_id in ("a", "b", "c"):
        ids.add(request_id)
    assert "a" not in ids
    assert "b" in ids
    assert "c" in ids


def test_an_unknown_voice_is_rejected_and_its_id_not_remembered() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10, voices=frozenset({"default", "lessac"}))
    actions = core.handle(SpeakReceived(SpeakRequest("a", "hi", voice="nope"), D1))
    assert kinds(actions) == ["rejected:a", "ack:1"]
    assert actions[0].details["reason"] == "unknown_voice"  # type: ignore[union-attr]
    assert actions[0].details["field"] == "voice"  # type: ignore[union-attr]
    fixed = core.handle(SpeakReceived(SpeakRequest("a", "hi", voice="lessac"), D2))
    assert kinds(fixed) == ["accepted:a", "synth:a", "ack:2"]


def test_a_redelivered_message_without_id_is_recognized_by_its_fingerprint() -> None:
    core = SpeakCore(queue_size=4, remembered_ids=10)
    core.handle(SpeakReceived(req("gen-1"), Delivery(1, 1, False, "fp1")))
    again = Delivery(5, 1, True, "fp1")  # same message, a fresh generated id
    assert core.handle(SpeakReceived(req("gen-2"), again)) == [Acknowledge(again)]
    other = Delivery(6, 1, False, "fp1")  # the same text published again: a new message
    assert kinds(core.handle(SpeakReceived(req("gen-3"), other))) == ["accepted:gen-3", "ack:6"]
