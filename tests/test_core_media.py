"""The core's media budget, rule by rule and by generated sequences: bytes held for waiting
requests stay within `audio.max_queued_media_bytes`, the lowest class goes first, the core
keeps no media bytes itself, and what leaves is let go."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.catalog import Catalog
from agent.core.egress import EgressPolicy
from agent.core.messages import (
    FINAL_EVENTS,
    Action,
    AudioClip,
    AudioStatus,
    Delivery,
    LetGo,
    Lifecycle,
    MediaHeld,
    Notify,
    Prepare,
    Priority,
    StopRequested,
    Synthesize,
    UtteranceEnded,
)
from agent.core.reasons import Reason
from tests.test_core import CHAT, CRITICAL, INFO, Driver, details, kinds

BUDGET = 10_000
CATALOG = Catalog(media_hosts=EgressPolicy.parse(("host",), "audio.media_hosts"))
"""The sound URLs of these tests (`http://host/...`) are allowed."""


def clip(size: int) -> AudioClip:
    return AudioClip(bytes(size))


def refused(actions: list[Action]) -> list[str]:
    return [
        a.id
        for a in actions
        if isinstance(a, Notify)
        and a.event == Lifecycle.REJECTED
        and a.details["reason"] == "queue_full"
    ]


def waiting_device() -> Driver:
    """A core with the budget whose device is unavailable: everything waits."""
    d = Driver(queue_size=64, media_budget=BUDGET, catalog=CATALOG)
    d.send(AudioStatus(False))
    return d


def test_a_recording_counts_at_arrival_and_the_oldest_of_the_lowest_class_goes() -> None:
    d = waiting_device()
    for name in "abcd":
        assert refused(d.speak(name, INFO, audio=clip(2400))) == []  # 9,600 held
    actions = d.speak("e", INFO, audio=clip(2400))  # 12,000: the oldest info goes
    assert refused(actions) == ["a"]
    assert "12000 bytes" in str(details(actions, "a", Lifecycle.REJECTED)["detail"])
    assert refused(d.speak("chat", CHAT, audio=clip(2400))) == ["chat"]  # the newcomer is lowest
    assert refused(d.speak("fire", CRITICAL, audio=clip(9000))) == ["b", "c", "d", "e"]
    assert refused(d.speak("fire2", CRITICAL, audio=clip(9000))) == ["fire"]
    assert kinds(d.speak("text", CHAT))[0] == "accepted:text"  # holds nothing: welcome


def test_the_core_keeps_no_media_bytes_and_hands_them_on() -> None:
    d = Driver(media_budget=BUDGET, catalog=CATALOG)
    actions = d.speak("a", INFO, audio=clip(4000))
    (prepare,) = [a for a in actions if isinstance(a, Prepare)]
    assert prepare.request.audio is not None
    assert len(prepare.request.audio.data) == 4000  # the edges get the bytes
    (synth,) = [a for a in actions if isinstance(a, Synthesize)]
    assert synth.request.audio == AudioClip(b"")  # the core's own copy has none
    assert not [a for a in d.speak("t", INFO) if isinstance(a, Prepare)]  # nothing to make


def test_a_download_that_grows_a_request_is_held_to_the_budget() -> None:
    d = waiting_device()
    d.speak("old", INFO, sound="http://host/a.wav")
    d.speak("new", INFO, sound="http://host/b.wav")
    assert d.send(MediaHeld("new", 6000)) == []
    assert refused(d.send(MediaHeld("old", 6000))) == ["old"]  # the oldest of the class
    assert d.send(MediaHeld("nobody", 10**9)) == []  # gone or unknown: nothing to decide
    assert refused(d.send(MediaHeld("new", 2000))) == []  # decoded: smaller


def test_what_plays_is_not_counted_and_counts_again_when_it_waits_again() -> None:
    d = Driver(queue_size=8, media_budget=BUDGET, catalog=CATALOG)
    d.speak("playing", INFO, audio=clip(8000))  # active at once
    assert refused(d.speak("waits", INFO, audio=clip(8000))) == []
    actions = d.speak("fire", CRITICAL)  # cuts "playing", which waits again: 16,000 held
    assert "preempted:playing" in kinds(actions)
    assert refused(actions) == ["playing"]  # the older of the two info


def test_a_request_that_leaves_is_let_go_once() -> None:
    d = waiting_device()
    d.speak("a", INFO, audio=clip(100))
    d.speak("b", INFO, sound="http://host/b.wav")
    d.speak("c", INFO, sound="http://host/c.wav", ttl=5)
    d.speak("d", CHAT, audio=clip(100), dedupe_key="k")
    actions = d.speak("e", CHAT, audio=clip(100), dedupe_key="k")  # d coalesced into e
    assert [a for a in actions if isinstance(a, LetGo)] == [LetGo("d")]
    actions = d.at(6).send(AudioStatus(True))  # c expired; a plays
    assert LetGo("c") in actions
    actions = d.play_out("a")
    assert LetGo("a") in actions
    actions = d.send(StopRequested(clear=True, delivery=Delivery(999, 1)))  # b plays, e waits
    assert [a for a in actions if isinstance(a, LetGo)] == [LetGo("e")]
    actions = d.cut_reported("b")  # the edges are done with it only now
    assert [a for a in actions if isinstance(a, LetGo)] == [LetGo("b")]


def test_a_sound_refused_by_its_size_before_anything_played_is_rejected() -> None:
    d = Driver(media_budget=BUDGET, catalog=CATALOG)
    d.speak("bomb", INFO, sound="http://host/bomb.flac")
    actions = d.send(UtteranceEnded("bomb", 0.0, Reason.TOO_LARGE, "sample rate 655350 Hz", job=1))
    assert details(actions, "bomb", Lifecycle.REJECTED)["reason"] == "too_large"


# ---- generated -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrive:
    priority: Priority
    size: int
    url: bool


@dataclass(frozen=True)
class Grow:
    index: int
    size: int


steps = st.lists(
    st.one_of(
        st.builds(
            Arrive, st.sampled_from(list(Priority)), st.integers(0, 3 * BUDGET), st.booleans()
        ),
        st.builds(Grow, st.integers(0, 200), st.integers(0, 3 * BUDGET)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_held_bytes_stay_within_the_budget_and_no_class_goes_for_a_lower(
    plan: list[Arrive | Grow],
) -> None:
    d = waiting_device()
    held: dict[str, tuple[Priority, int]] = {}  # what waits, with what it holds
    answers: Counter[str] = Counter()
    names: list[str] = []
    for step in plan:
        if isinstance(step, Arrive):
            name = f"r{len(names)}"
            names.append(name)
            held[name] = (step.priority, 0 if step.url else step.size)
            fields: dict[str, object] = (
                {"sound": f"http://host/{name}.wav"} if step.url else {"audio": clip(step.size)}
            )
            actions = d.speak(name, step.priority, **fields)
        else:
            if not names:
                continue
            name = names[step.index % len(names)]
            actions = d.send(MediaHeld(name, step.size))
            if name in held:
                held[name] = (held[name][0], step.size)
        for gone in refused(actions):
            victim = held.pop(gone)
            assert all(p >= victim[0] for p, size in held.values() if size), (gone, held)
        for action in actions:
            if isinstance(action, Notify) and action.event in FINAL_EVENTS:
                answers[action.id] += 1
        assert sum(size for _, size in held.values()) <= BUDGET
    assert all(count == 1 for count in answers.values()), answers
