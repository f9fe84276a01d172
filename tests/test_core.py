"""The pure core, rule by rule: events and time in, actions out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

import pytest

from agent.core.admission import Timing
from agent.core.intake import RecentIds
from agent.core.messages import (
    UNTIL_ACKNOWLEDGED,
    Acknowledge,
    AckRequested,
    Action,
    AudioStatus,
    Cut,
    Delivery,
    Event,
    Lifecycle,
    Notify,
    Priority,
    Rejection,
    ReplayRequested,
    SetVolume,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
    SynthesisDone,
    Synthesize,
    Tick,
    UtteranceEnded,
    UtteranceStarted,
    VolumeRequested,
)
from agent.core.reasons import Reason
from agent.core.scheduler import SpeakCore

CHAT, INFO, WARNING, ALARM, CRITICAL = (
    Priority.CHAT,
    Priority.INFO,
    Priority.WARNING,
    Priority.ALARM,
    Priority.CRITICAL,
)


def kinds(actions: Sequence[object]) -> list[str]:
    """Actions as short strings: `accepted:a`, `synth:a`, `cut:a`, `ack:3`, `volume:0.5`."""
    out = []
    for action in actions:
        match action:
            case Notify(request_id, event, _):
                out.append(f"{event}:{request_id}")
            case Acknowledge(delivery):
                out.append(f"ack:{delivery.mid}")
            case Synthesize(request, play):
                out.append(f"synth:{request.id}" + (f"#{play}" if play > 1 else ""))
            case Cut(request_id):
                out.append(f"cut:{request_id}")
            case SetVolume(volume):
                out.append(f"volume:{volume}")
    return out


def details(actions: Sequence[Action], request_id: str, event: Lifecycle) -> dict[str, object]:
    found = [
        a for a in actions if isinstance(a, Notify) and a.id == request_id and a.event == event
    ]
    assert len(found) == 1, kinds(actions)
    return dict(found[0].details)


class Driver:
    """Feeds a core events at given times; numbers MQTT deliveries."""

    def __init__(self, **options: object) -> None:
        defaults: dict[str, object] = {"queue_size": 4, "remembered_ids": 50}
        self.core = SpeakCore(**{**defaults, **options})  # type: ignore[arg-type]
        self.now = 0.0
        self._mids = itertools.count(1)
        self.jobs: dict[str, int] = {}

    def at(self, now: float) -> Driver:
        self.now = now
        return self

    def send(self, event: Event) -> list[Action]:
        """Handle an event; reports from the edges get the job token of their id's activation
        unless they name one (as the real edges do)."""
        if isinstance(event, SynthesisDone | UtteranceStarted | UtteranceEnded) and not event.job:
            event = replace(event, job=self.jobs.get(event.id, 0))
        actions = self.core.handle(event, self.now)
        for action in actions:
            if isinstance(action, Synthesize):
                self.jobs[action.request.id] = action.job
        return actions

    def speak(
        self, request_id: str, priority: Priority = INFO, /, **fields: object
    ) -> list[Action]:
        request = SpeakRequest(request_id, f"text of {request_id}", priority=priority, **fields)  # type: ignore[arg-type]
        return self.send(SpeakReceived(request, Delivery(next(self._mids), 1)))

    def play_out(self, request_id: str, seconds: float = 1.0) -> list[Action]:
        """The synthesizer and the player report the whole announcement."""
        return [
            *self.send(SynthesisDone(request_id)),
            *self.send(UtteranceStarted(request_id)),
            *self.send(UtteranceEnded(request_id, seconds)),
        ]

    def cut_reported(self, request_id: str) -> list[Action]:
        """What the edges report after a Cut: synthesis stopped, playback ended (faded)."""
        return [*self.send(SynthesisDone(request_id)), *self.send(UtteranceEnded(request_id, 0.2))]


# ---- arrival, order, lifecycle ---------------------------------------------------------------


def test_first_request_is_accepted_synthesized_and_acknowledged() -> None:
    d = Driver()
    actions = d.speak("a")
    assert kinds(actions) == ["accepted:a", "ack:1", "synth:a"]
    assert details(actions, "a", Lifecycle.ACCEPTED) == {"priority": "info", "queue_depth": 1}


def test_every_event_carries_the_priority() -> None:
    d = Driver()
    actions = [*d.speak("a", WARNING), *d.play_out("a")]
    notes = [a for a in actions if isinstance(a, Notify)]
    assert [n.event for n in notes] == ["accepted", "started", "finished"]
    assert all(n.details["priority"] == "warning" for n in notes)


def test_equal_priority_is_first_in_first_out_and_one_plays_at_a_time() -> None:
    d = Driver()
    d.speak("a")
    assert kinds(d.speak("b")) == ["accepted:b", "ack:2"]
    assert kinds(d.speak("c")) == ["accepted:c", "ack:3"]
    assert kinds(d.send(SynthesisDone("a"))) == []  # still playing
    assert kinds(d.send(UtteranceStarted("a"))) == ["started:a"]
    assert kinds(d.send(UtteranceEnded("a", 1.0))) == ["finished:a", "synth:b"]
    assert kinds(d.play_out("b")) == ["started:b", "finished:b", "synth:c"]


def test_a_higher_class_waiting_goes_before_lower_ones() -> None:
    d = Driver()
    d.speak("playing", CHAT)
    d.speak("info", INFO)
    d.speak("chat2", CHAT)
    d.speak("warn", WARNING, interrupt=False)
    assert kinds(d.play_out("playing"))[-1] == "synth:warn"
    assert kinds(d.play_out("warn"))[-1] == "synth:info"
    assert kinds(d.play_out("info"))[-1] == "synth:chat2"


def test_finished_reports_seconds_and_play_count() -> None:
    d = Driver()
    d.speak("a")
    d.send(SynthesisDone("a"))
    d.send(UtteranceStarted("a"))
    info = {"sentences": 2, "cached_sentences": 1}
    finished = d.send(UtteranceEnded("a", 1.23456, info=info))
    assert details(finished, "a", Lifecycle.FINISHED) == {
        "priority": "info",
        "audio_seconds": 1.235,
        "play": 1,
        "repeats_left": 0,
        **info,
    }


def test_a_failure_ends_the_announcement() -> None:
    d = Driver()
    d.speak("a", repeat=3)
    d.send(SynthesisDone("a"))
    failed = d.send(UtteranceEnded("a", 0.0, Reason.AUDIO_ERROR, "no device"))
    assert kinds(failed) == ["failed:a"]
    assert details(failed, "a", Lifecycle.FAILED)["reason"] == "audio_error"
    assert d.core.queue_depth == 0  # no repeat after a failure


# ---- validation and duplicates -----------------------------------------------------------------


def test_invalid_message_is_rejected_and_still_acknowledged() -> None:
    d = Driver()
    rejection = Rejection("x", Reason.INVALID_FIELD, "expected a string", "text", ALARM)
    assert d.send(SpeakInvalid(rejection, Delivery(1, 1))) == [
        Notify(
            "x",
            Lifecycle.REJECTED,
            {
                "reason": "invalid_field",
                "detail": "expected a string",
                "field": "text",
                "priority": "alarm",
            },
        ),
        Acknowledge(Delivery(1, 1)),
    ]


def test_same_id_is_spoken_once() -> None:
    d = Driver()
    d.speak("a")
    actions = d.speak("a")
    assert kinds(actions) == ["rejected:a", "ack:2"]
    assert details(actions, "a", Lifecycle.REJECTED)["reason"] == "duplicate_id"


def test_a_broker_redelivery_of_a_known_message_is_only_acknowledged() -> None:
    d = Driver()
    d.send(SpeakReceived(SpeakRequest("gen-1", "hi"), Delivery(1, 1, False, "fp1")))
    again = Delivery(5, 1, True, "fp1")  # same message, a fresh generated id
    assert d.send(SpeakReceived(SpeakRequest("gen-2", "hi"), again)) == [Acknowledge(again)]
    by_id = Delivery(6, 1, True, "other")
    assert d.send(SpeakReceived(SpeakRequest("gen-1", "hi"), by_id)) == [Acknowledge(by_id)]
    new = Delivery(7, 1, False, "fp1")  # the same text published again: a new message
    assert kinds(d.send(SpeakReceived(SpeakRequest("gen-3", "hi"), new))) == [
        "accepted:gen-3",
        "ack:7",
    ]


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [("voice", "nope", Reason.UNKNOWN_VOICE), ("chime", "kazoo", Reason.UNKNOWN_CHIME)],
)
def test_unknown_voice_or_chime_is_rejected_and_the_id_not_remembered(
    field: str, value: str, reason: Reason
) -> None:
    d = Driver(voices=frozenset({"default", "lessac"}), chimes=frozenset({"ding"}))
    fields: dict[str, object] = {field: value}
    actions = d.speak("a", **fields)
    assert kinds(actions) == ["rejected:a", "ack:1"]
    assert details(actions, "a", Lifecycle.REJECTED) | {"detail": ""} == {
        "reason": str(reason),
        "detail": "",
        "field": field,
        "priority": "info",
    }
    assert kinds(d.speak("a", voice="lessac", chime="ding")) == ["accepted:a", "ack:2", "synth:a"]


# ---- preemption ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("playing", "arriving", "interrupt", "preempts", "requeued"),
    [
        (CHAT, ALARM, None, True, False),  # chat is dropped when preempted
        (INFO, ALARM, None, True, True),
        (WARNING, CRITICAL, None, True, True),
        (ALARM, CRITICAL, None, True, True),
        (INFO, WARNING, None, False, False),  # warning does not interrupt by default
        (INFO, WARNING, True, True, True),  # unless asked to
        (CHAT, INFO, True, True, False),
        (ALARM, ALARM, True, False, False),  # equal never preempts
        (CRITICAL, ALARM, True, False, False),  # lower never preempts
        (INFO, ALARM, False, False, False),  # an alarm may choose to wait
    ],
)
def test_preemption_table(
    playing: Priority, arriving: Priority, interrupt: bool | None, preempts: bool, requeued: bool
) -> None:
    d = Driver()
    d.speak("old", playing)
    d.send(UtteranceStarted("old"))
    actions = d.speak("new", arriving, interrupt=interrupt)
    expected = ["accepted:new"]
    if preempts:
        expected += ["cut:old", "preempted:old"] + (["requeued:old"] if requeued else [])
    assert kinds(actions) == [*expected, "ack:2"]
    if preempts:
        assert details(actions, "old", Lifecycle.PREEMPTED)["by"] == "new"


def test_after_a_preemption_the_preemptor_plays_then_the_requeued_one_from_the_start() -> None:
    d = Driver()
    d.speak("weather", INFO)
    d.send(UtteranceStarted("weather"))
    d.speak("later", INFO)
    d.speak("fire", ALARM)
    assert kinds(d.cut_reported("weather")) == ["synth:fire"]  # once the cut is done
    assert kinds(d.play_out("fire")) == ["started:fire", "finished:fire", "synth:weather"]
    # the requeued one keeps its place ahead of later ones of its class
    assert kinds(d.play_out("weather")) == ["started:weather", "finished:weather", "synth:later"]


def test_a_cut_announcement_reports_nothing_more() -> None:
    d = Driver()
    d.speak("chat", CHAT)
    d.send(UtteranceStarted("chat"))
    d.speak("fire", ALARM)
    late = [
        *d.send(UtteranceStarted("chat")),
        *d.send(UtteranceEnded("chat", 3.0, Reason.AUDIO_ERROR, "x")),
    ]
    assert [k for k in kinds(late) if k.endswith(":chat")] == []


# ---- queue bound -------------------------------------------------------------------------------


def test_full_queue_drops_the_lowest_oldest_and_never_a_critical_for_a_lower_one() -> None:
    d = Driver(queue_size=3)
    d.speak("playing", CRITICAL)
    d.speak("c1", CHAT)
    d.speak("i1", INFO)
    d.speak("c2", CHAT)
    actions = d.speak("a1", ALARM, interrupt=False)
    assert kinds(actions) == ["accepted:a1", "rejected:c1", "ack:5"]
    assert details(actions, "c1", Lifecycle.REJECTED)["reason"] == "queue_full"
    same_class = d.speak("c3", CHAT)  # lowest class: its oldest goes, not the newcomer
    assert kinds(same_class) == ["accepted:c3", "rejected:c2", "ack:6"]
    crit = Driver(queue_size=2)
    crit.speak("p", CRITICAL)
    crit.speak("k1", CRITICAL)
    crit.speak("k2", CRITICAL)
    refused = crit.speak("w", WARNING)
    assert kinds(refused) == ["rejected:w", "ack:4"]  # criticals stay


def test_a_full_queue_of_equals_drops_the_oldest() -> None:
    d = Driver(queue_size=2)
    d.speak("playing", CHAT)
    d.speak("c1", CHAT)
    d.speak("c2", CHAT)
    actions = d.speak("i1", INFO)
    assert kinds(actions) == ["accepted:i1", "rejected:c1", "ack:4"]


# ---- ttl -------------------------------------------------------------------------------------


def test_an_announcement_not_started_by_its_ttl_expires() -> None:
    d = Driver()
    d.speak("long", INFO)
    d.at(1.0).speak("soon", INFO, ttl=5.0)
    assert kinds(d.at(5.9).send(Tick())) == []
    assert kinds(d.at(6.0).send(Tick())) == ["expired:soon"]
    assert kinds(d.play_out("long")) == ["started:long", "finished:long"]


def test_an_announcement_handed_over_but_not_started_expires_too() -> None:
    d = Driver()
    d.speak("a", ttl=2.0)  # synthesized, but the device has not taken a sample (e.g. it is busy)
    assert kinds(d.at(2.5).send(Tick())) == ["cut:a", "expired:a"]
    assert kinds(Driver().speak("b", ttl=2.0)) == ["accepted:b", "ack:1", "synth:b"]


def test_a_started_announcement_does_not_expire() -> None:
    d = Driver()
    d.speak("a", ttl=2.0)
    d.send(UtteranceStarted("a"))
    assert kinds(d.at(10.0).send(Tick())) == []


def test_nothing_starts_while_the_audio_device_is_unavailable() -> None:
    d = Driver()
    assert kinds(d.send(AudioStatus(False, "gone"))) == []
    assert kinds(d.speak("a", ttl=30.0)) == ["accepted:a", "ack:1"]
    d.speak("b", ttl=3.0)
    assert kinds(d.at(3.0).send(Tick())) == ["expired:b"]
    assert kinds(d.at(4.0).send(AudioStatus(True))) == ["synth:a"]


# ---- repeat and ack ----------------------------------------------------------------------------


def test_repeat_plays_the_count_with_the_interval_between() -> None:
    d = Driver()
    d.speak("r", ALARM, repeat=3, repeat_interval=5.0)
    first = d.at(1.0).play_out("r")
    assert details(first, "r", Lifecycle.FINISHED)["repeats_left"] == 2
    assert kinds(d.at(5.9).send(Tick())) == []
    assert kinds(d.at(6.0).send(Tick())) == ["synth:r#2"]
    d.at(7.0).play_out("r")
    assert kinds(d.at(12.0).send(Tick())) == ["synth:r#3"]
    last = d.at(13.0).play_out("r")
    assert details(last, "r", Lifecycle.FINISHED)["repeats_left"] == 0
    assert kinds(d.at(100.0).send(Tick())) == []


def test_repeat_until_acknowledged_ends_on_ack_while_waiting_or_playing() -> None:
    d = Driver()
    d.speak("r", ALARM, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=2.0)
    for n in range(1, 4):
        finished = d.play_out("r")
        assert details(finished, "r", Lifecycle.FINISHED)["repeats_left"] == "until_acknowledged"
        assert details(finished, "r", Lifecycle.FINISHED)["play"] == n
        assert kinds(d.at(d.now + 2.0).send(Tick())) == [f"synth:r#{n + 1}"]
    d.send(UtteranceStarted("r"))
    acked = d.send(AckRequested("r", Delivery(9, 1)))
    assert kinds(acked) == ["cut:r", "acknowledged:r", "ack:9"]
    d.cut_reported("r")
    assert kinds(d.at(d.now + 60).send(Tick())) == []

    waiting = Driver()
    waiting.speak("r", ALARM, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=30.0)
    waiting.play_out("r")
    assert kinds(waiting.send(AckRequested("r", Delivery(9, 1)))) == ["acknowledged:r", "ack:9"]
    assert kinds(waiting.at(60.0).send(Tick())) == []


def test_ack_of_an_unknown_id_is_rejected() -> None:
    actions = Driver().send(AckRequested("ghost", Delivery(3, 1)))
    assert kinds(actions) == ["rejected:ghost", "ack:3"]
    assert details(actions, "ghost", Lifecycle.REJECTED)["reason"] == "unknown_id"


def test_ttl_bounds_the_repeats() -> None:
    d = Driver()
    d.speak("r", ALARM, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=10.0, ttl=15.0)
    d.play_out("r")
    assert kinds(d.at(10.0).send(Tick())) == ["synth:r#2"]
    d.play_out("r")
    assert kinds(d.at(20.0).send(Tick())) == ["expired:r"]


# ---- stop --------------------------------------------------------------------------------------


def test_stop_cuts_what_plays_and_clear_empties_the_queue() -> None:
    d = Driver()
    d.speak("a")
    d.send(UtteranceStarted("a"))
    d.speak("b")
    d.speak("c", CHAT)
    stop = d.send(StopRequested(False, Delivery(7, 1)))
    assert kinds(stop) == ["cut:a", "stopped:a", "ack:7"]
    assert kinds(d.cut_reported("a")) == ["synth:b"]
    d.send(UtteranceStarted("b"))
    clear = d.send(StopRequested(True, Delivery(8, 1)))
    assert kinds(clear) == ["cut:b", "stopped:b", "stopped:c", "ack:8"]
    assert details(clear, "c", Lifecycle.STOPPED) == {"priority": "chat", "cleared": True}
    assert kinds(d.cut_reported("b")) == []


def test_stop_with_nothing_playing_only_acknowledges() -> None:
    assert kinds(Driver().send(StopRequested(False, Delivery(1, 1)))) == ["ack:1"]


def test_a_stopped_repeating_announcement_does_not_come_back() -> None:
    d = Driver()
    d.speak("r", ALARM, repeat=5, repeat_interval=1.0)
    d.send(UtteranceStarted("r"))
    d.send(StopRequested(False, Delivery(4, 1)))
    d.cut_reported("r")
    assert kinds(d.at(30.0).send(Tick())) == []


# ---- dedupe_key --------------------------------------------------------------------------------


def test_dedupe_key_replaces_the_waiting_one_in_its_place() -> None:
    d = Driver()
    d.speak("playing")
    d.speak("t1", dedupe_key="temperature")
    d.speak("other")
    actions = d.speak("t2", dedupe_key="temperature")
    assert kinds(actions) == ["accepted:t2", "coalesced:t1", "ack:4"]
    assert details(actions, "t1", Lifecycle.COALESCED)["into"] == "t2"
    assert kinds(d.play_out("playing"))[-1] == "synth:t2"  # t1's place, before `other`


def test_dedupe_key_does_not_touch_the_one_playing() -> None:
    d = Driver()
    d.speak("t1", dedupe_key="k")
    assert kinds(d.speak("t2", dedupe_key="k")) == ["accepted:t2", "ack:2"]


# ---- volume and misc ---------------------------------------------------------------------------


def test_volume_is_applied_and_acknowledged() -> None:
    assert kinds(Driver().send(VolumeRequested(0.25, Delivery(2, 1)))) == ["volume:0.25", "ack:2"]


def test_recent_ids_forget_the_oldest() -> None:
    ids = RecentIds(2)
    for request_id in ("a", "b", "c"):
        ids.add(request_id)
    assert "a" not in ids
    assert "b" in ids
    assert "c" in ids


# ---- activations: late reports and cut timing --------------------------------------------------


def test_a_late_report_of_an_earlier_activation_does_not_touch_the_next_one() -> None:
    d = Driver()
    d.speak("w", INFO)
    first_job = d.jobs["w"]
    d.send(UtteranceStarted("w"))
    d.speak("fire", ALARM)  # cuts w's first activation; w is re-queued
    d.cut_reported("w")
    d.play_out("fire")  # then w starts again, as a new activation
    assert d.jobs["w"] != first_job
    stale = [
        *d.send(UtteranceStarted("w", first_job)),
        *d.send(UtteranceEnded("w", 0.0, job=first_job)),
        *d.send(SynthesisDone("w", first_job)),
    ]
    assert kinds(stale) == []
    assert kinds(d.play_out("w")) == ["started:w", "finished:w"]


def test_once_played_out_an_announcement_can_no_longer_be_cut() -> None:
    d = Driver()
    d.speak("a", repeat=2, repeat_interval=5.0)
    d.send(UtteranceStarted("a"))
    assert kinds(d.send(UtteranceEnded("a", 1.0))) == ["finished:a"]  # synthesis not done yet
    # a stop arriving now: "a" is between plays, so it is what stop ends, once
    stop = d.send(StopRequested(False, Delivery(9, 1)))
    assert kinds(stop) == ["stopped:a", "ack:9"]
    d.send(SynthesisDone("a"))
    assert kinds(d.at(10.0).send(Tick())) == []  # it does not come back


def test_a_stop_between_two_plays_ends_the_series() -> None:
    d = Driver()
    d.speak("r", ALARM, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=30.0)
    d.play_out("r")
    stop = d.send(StopRequested(False, Delivery(5, 1)))
    assert kinds(stop) == ["stopped:r", "ack:5"]
    assert kinds(d.at(60.0).send(Tick())) == []


def test_a_repeat_that_falls_due_preempts_a_lower_class() -> None:
    d = Driver()
    d.speak("alarm", ALARM, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=5.0)
    d.play_out("alarm")
    d.at(1.0).speak("news", INFO)
    d.send(UtteranceStarted("news"))
    assert kinds(d.at(4.0).send(Tick())) == []
    due = d.at(6.0).send(Tick())
    assert kinds(due) == ["cut:news", "preempted:news", "requeued:news"]
    assert kinds(d.cut_reported("news")) == ["synth:alarm#2"]


def test_a_requeue_respects_the_queue_bound() -> None:
    d = Driver(queue_size=2)
    d.speak("p", INFO)
    d.send(UtteranceStarted("p"))
    d.speak("q1", INFO, interrupt=False)
    d.speak("c1", CHAT)
    actions = d.speak("fire", ALARM)  # queue q1, c1: fire takes c1's place; p cannot come back
    assert kinds(actions) == [
        "accepted:fire",
        "rejected:c1",
        "cut:p",
        "preempted:p",
        "rejected:p",  # the lowest class's oldest: p (older than q1), even though it played
        "ack:4",
    ]
    assert d.core.queue_depth == 2


def test_an_id_refused_for_a_full_queue_may_be_sent_again() -> None:
    d = Driver(queue_size=1)
    d.speak("playing", ALARM)
    d.speak("w", WARNING)
    assert kinds(d.speak("c", CHAT)) == ["rejected:c", "ack:3"]
    d.play_out("playing")
    assert kinds(d.speak("c", CHAT)) == ["accepted:c", "ack:4"]


def test_a_repeating_announcement_lets_the_others_of_its_class_through() -> None:
    d = Driver()
    d.speak("loop", INFO, repeat=UNTIL_ACKNOWLEDGED, repeat_interval=0.0)
    d.speak("other", INFO)
    assert kinds(d.play_out("loop"))[-1] == "synth:other"  # not loop again
    assert kinds(d.play_out("other"))[-1] == "synth:loop#2"


# ---- timed requests (`at`) ------------------------------------------------------------------


def timed(
    d: Driver, request_id: str, at: float, wall: float, priority: Priority = INFO
) -> list[Action]:
    """A request to start at wall-clock `at`, handled when the wall clock reads `wall`."""
    request = SpeakRequest(request_id, f"text of {request_id}", priority=priority, at=at)
    return d.send(SpeakReceived(request, Delivery(next(d._mids), 1), wall))


def test_a_timed_request_is_made_ready_prepare_seconds_before_its_instant() -> None:
    d = Driver(timing=Timing(max_lead=3600, max_late=10, prepare=5))
    assert kinds(timed(d, "t", at=1_000_060.0, wall=1_000_000.0)) == ["accepted:t", "ack:1"]
    assert kinds(d.at(54.9).send(Tick())) == []
    actions = d.at(55.0).send(Tick())
    assert kinds(actions) == ["synth:t"]
    synth = next(a for a in actions if isinstance(a, Synthesize))
    assert synth.start_at == 1_000_060.0  # the player pads to it


def test_a_timed_request_is_placed_by_the_wall_clock_handed_with_now() -> None:
    """The loop hands the core the wall-clock time of `now`; an event that carries its own
    arrival time is placed by that instead."""
    d = Driver(timing=Timing(max_lead=3600, max_late=10, prepare=5))
    request = SpeakRequest("t", "text of t", at=1_000_060.0)
    handed = d.core.handle(SpeakReceived(request, Delivery(1, 1)), 0.0, 1_000_000.0)
    assert kinds(handed) == ["accepted:t", "ack:1"]
    assert kinds(d.at(54.9).send(Tick())) == []
    assert kinds(d.at(55.0).send(Tick())) == ["synth:t"]
    own = Driver(timing=Timing(max_lead=3600, max_late=10, prepare=5))
    event = SpeakReceived(
        SpeakRequest("u", "text of u", at=1_000_060.0), Delivery(1, 1), 1_000_050.0
    )
    assert kinds(own.core.handle(event, 0.0, 1_000_000.0)) == ["accepted:u", "ack:1"]
    assert kinds(own.at(4.9).send(Tick())) == []
    assert kinds(own.at(5.0).send(Tick())) == ["synth:u"]  # 10 s from its own arrival, less 5


def test_only_the_first_play_of_a_timed_repeat_waits_for_its_instant() -> None:
    """The core decides the start: `at` for the first play; a repeat plays when its turn comes."""
    d = Driver(timing=Timing(prepare=5))
    request = SpeakRequest("t", "text of t", at=1001.0, repeat=2, repeat_interval=1.0)
    first = d.send(SpeakReceived(request, Delivery(next(d._mids), 1), 1000.0))
    assert [(a.play, a.start_at) for a in first if isinstance(a, Synthesize)] == [(1, 1001.0)]
    d.play_out("t")
    again = d.at(10.0).send(Tick())
    assert [(a.play, a.start_at) for a in again if isinstance(a, Synthesize)] == [(2, None)]


def test_a_timed_request_within_prepare_is_synthesized_at_once() -> None:
    d = Driver(timing=Timing(prepare=5))
    assert kinds(timed(d, "t", at=1003.0, wall=1000.0)) == ["accepted:t", "ack:1", "synth:t"]


@pytest.mark.parametrize(
    ("ahead", "reason"), [(3600.5, Reason.AT_TOO_FAR), (-10.5, Reason.AT_PASSED)]
)
def test_an_instant_too_far_ahead_or_too_long_ago_is_rejected(ahead: float, reason: Reason) -> None:
    d = Driver(timing=Timing(max_lead=3600, max_late=10))
    actions = timed(d, "t", at=5000.0 + ahead, wall=5000.0)
    assert kinds(actions) == ["rejected:t", "ack:1"]
    rejected = details(actions, "t", Lifecycle.REJECTED)
    assert rejected["reason"] == reason
    assert rejected["field"] == "at"


def test_a_slightly_late_instant_starts_at_once_and_started_says_how_late() -> None:
    d = Driver(timing=Timing(max_late=10))
    assert kinds(timed(d, "t", at=4998.0, wall=5000.0))[-1] == "synth:t"
    d.send(SynthesisDone("t"))
    started = d.send(UtteranceStarted("t", late_ms=2000.0))
    assert details(started, "t", Lifecycle.STARTED)["late_ms"] == 2000.0


def test_an_alarm_preempts_a_timed_request_waiting_for_its_instant_which_keeps_it() -> None:
    d = Driver(timing=Timing(prepare=5))
    timed(d, "t", at=1004.0, wall=1000.0)  # synthesized, the player holds it for its instant
    actions = d.at(1.0).speak("fire", ALARM)
    assert kinds(actions) == ["accepted:fire", "cut:t", "preempted:t", "requeued:t", "ack:2"]
    d.cut_reported("t")
    after = d.play_out("fire")
    synth = next(a for a in after if isinstance(a, Synthesize))
    assert synth.request.id == "t"
    assert synth.start_at == 1004.0  # still in step with the other nodes


def test_a_timed_alarm_cuts_in_when_it_falls_due_not_when_it_arrives() -> None:
    d = Driver(timing=Timing(max_lead=3600, prepare=5))
    d.speak("news", INFO)
    d.send(UtteranceStarted("news"))
    assert kinds(timed(d, "fire", at=1060.0, wall=1000.0, priority=ALARM)) == [
        "accepted:fire",
        "ack:2",
    ]  # the news plays on
    assert kinds(d.at(54.9).send(Tick())) == []
    assert kinds(d.at(55.0).send(Tick())) == ["cut:news", "preempted:news", "requeued:news"]
    synth = next(a for a in d.cut_reported("news") if isinstance(a, Synthesize))
    assert (synth.request.id, synth.start_at) == ("fire", 1060.0)


def test_a_replayed_timed_announcement_is_said_now() -> None:
    d = Driver(timing=Timing(prepare=5))
    timed(d, "t", at=1001.0, wall=1000.0)
    d.play_out("t")
    actions = d.at(100.0).send(ReplayRequested(Delivery(next(d._mids), 1)))
    synth = next(a for a in actions if isinstance(a, Synthesize))
    assert (synth.request.id, synth.start_at) == ("t~replay1", None)


def test_a_timed_request_cut_while_playing_plays_again_when_it_can() -> None:
    d = Driver(timing=Timing(prepare=5))
    timed(d, "t", at=1001.0, wall=1000.0)
    d.send(SynthesisDone("t"))
    d.send(UtteranceStarted("t", late_ms=0.0))
    d.at(2.0).speak("fire", ALARM)
    d.cut_reported("t")
    after = d.play_out("fire")
    synth = next(a for a in after if isinstance(a, Synthesize))
    assert (synth.request.id, synth.start_at) == ("t", None)


# ---- the alarm lane of the sounder took the speaker -------------------------------------------


def test_an_utterance_the_alarm_lane_took_the_speaker_from_is_preempted_and_requeued() -> None:
    from agent.core.messages import NormalPreempted  # noqa: PLC0415 - the sounder's report

    d = Driver()
    d.speak("a", WARNING)
    d.send(UtteranceStarted("a"))
    actions = d.send(NormalPreempted("a", d.jobs["a"], "fire"))
    assert kinds(actions) == ["cut:a", "preempted:a", "requeued:a"]
    assert details(actions, "a", Lifecycle.PREEMPTED)["by"] == "fire"
    # its synthesis ends (cancelled): the core is free, and plays it again from the start
    again = d.send(SynthesisDone("a"))
    assert kinds(again) == ["synth:a"]
    assert d.jobs["a"] > 1


def test_a_late_report_of_the_lane_preempted_elsewhere_changes_nothing() -> None:
    from agent.core.messages import NormalPreempted  # noqa: PLC0415

    d = Driver()
    d.speak("a")
    first = d.jobs["a"]
    d.play_out("a")
    assert d.send(NormalPreempted("a", first, "fire")) == []


def test_a_chat_preempted_by_the_alarm_lane_is_not_requeued() -> None:
    from agent.core.messages import NormalPreempted  # noqa: PLC0415

    d = Driver()
    d.speak("a", CHAT)
    d.send(UtteranceStarted("a"))
    actions = d.send(NormalPreempted("a", d.jobs["a"], "fire"))
    assert kinds(actions) == ["cut:a", "preempted:a"]
    assert kinds(d.send(SynthesisDone("a"))) == []
    assert not d.core.speaking


def test_the_core_knows_what_plays_and_waits_only() -> None:
    d = Driver()
    d.speak("a")
    d.speak("b")
    assert d.core.knows("a")
    assert d.core.knows("b")
    assert not d.core.knows("c")
    d.play_out("a")
    assert not d.core.knows("a")
    assert d.core.knows("b")
