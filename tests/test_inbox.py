"""The loop's inbox on its own: the urgent lane, the budgets per source, the refusals' lane, and
the workers' reports (the paths through the broker: tests/test_inbox_agent.py)."""

from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from agent.loop.inbox import Inbox


def drain(inbox: Inbox[str]) -> list[str]:
    out = []
    while (event := inbox.get(0)) is not None:
        out.append(event)
    return out


def test_an_alarm_overtakes_everything_that_waits_higher_class_first_then_arrival() -> None:
    inbox: Inbox[str] = Inbox({"speak": 10, "sparkplug": 10})
    for n in range(5):
        assert inbox.offer(f"chat{n}", "speak")
    assert inbox.offer("alarm-a", "speak", rank=3)
    inbox.notice("connected")
    assert inbox.offer("critical", "sparkplug", rank=4)
    assert inbox.offer("alarm-b", "sparkplug", rank=3)
    assert drain(inbox) == [
        "critical",
        "alarm-a",
        "alarm-b",
        "chat0",
        "chat1",
        "chat2",
        "chat3",
        "chat4",
        "connected",
    ]


def test_a_stop_that_arrived_before_an_alarm_is_served_before_it() -> None:
    """A stop waiting behind a flood must not stop an alarm published after it: it is hoisted
    with the alarm; one that arrived after the alarm waits its turn."""
    inbox: Inbox[str] = Inbox({"speak": 10, "command": 10})
    inbox.offer("chat0", "speak")
    inbox.offer("stop-before", "command", barrier=True)
    inbox.offer("chat1", "speak")
    inbox.offer("alarm", "speak", rank=3)
    inbox.offer("stop-after", "command", barrier=True)
    assert drain(inbox) == ["stop-before", "alarm", "chat0", "chat1", "stop-after"]


def test_a_flood_fills_its_own_source_only_and_alarms_still_get_in() -> None:
    inbox: Inbox[str] = Inbox({"speak": 3, "sparkplug": 3}, urgent=2)
    taken = [inbox.offer(f"s{n}", "speak") for n in range(5)]
    assert taken == [True, True, True, False, False]
    assert not inbox.has_room("speak")
    assert inbox.has_room("sparkplug")
    assert inbox.offer("p0", "sparkplug")
    assert inbox.offer("alarm", "speak", rank=3)  # the urgent lane has its own room
    assert inbox.offer("alarm2", "speak", rank=3)
    assert not inbox.offer("alarm3", "speak", rank=3)
    assert drain(inbox)[:2] == ["alarm", "alarm2"]
    assert inbox.has_room("speak")


def test_a_critical_takes_the_place_of_the_newest_alarm_in_a_full_urgent_lane() -> None:
    """The issue's amplification through Sparkplug: 600 alarm-class commands filled the
    source's urgent room and a critical after them was refused. A higher class makes room."""
    answers: list[str] = []

    def answer(event: str, _source: str) -> str:
        answers.append(event)
        return f"refused {event}"

    inbox: Inbox[str] = Inbox({"sparkplug": 4}, urgent=2, evicted=answer)
    assert inbox.offer("alarm-1", "sparkplug", rank=3)
    assert inbox.offer("alarm-2", "sparkplug", rank=3)
    assert not inbox.offer("alarm-3", "sparkplug", rank=3)  # no lower class to make room
    assert inbox.offer("critical-1", "sparkplug", rank=4)
    assert answers == ["alarm-2"]
    assert inbox.offer("critical-2", "sparkplug", rank=4)
    assert not inbox.offer("critical-3", "sparkplug", rank=4)
    assert answers == ["alarm-2", "alarm-1"]
    assert drain(inbox) == ["critical-1", "critical-2", "refused alarm-2", "refused alarm-1"]
    assert inbox.refused["sparkplug"] == 2


def test_answers_to_what_had_no_room_have_a_bounded_lane_of_their_own() -> None:
    inbox: Inbox[str] = Inbox({"speak": 1}, refusals=2)
    inbox.offer("s0", "speak")
    for n in range(5):
        assert not inbox.offer(f"x{n}", "speak")
        inbox.refuse(f"refused x{n}", "speak")
    inbox.refuse(None, "speak")  # nothing to answer: counted
    assert inbox.refused["speak"] == 6
    assert inbox.uncounted["speak"] == 3
    assert drain(inbox) == ["s0", "refused x0", "refused x1"]


def test_a_worker_waits_for_room_and_is_released_at_close() -> None:
    inbox: Inbox[str] = Inbox({}, reports=1)
    assert inbox.report("r0")
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(inbox.report("r1")))
    worker.start()
    worker.join(0.2)
    assert worker.is_alive()  # no room: it waits
    assert inbox.get(0) == "r0"
    worker.join(10)
    assert results == [True]
    assert inbox.get(0) == "r1"
    inbox.close()
    assert inbox.report("r3") is False


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["speak", "command", "sparkplug", "wyoming"]),
            st.sampled_from([0, 0, 0, 3, 4]),
            st.booleans(),
        ),
        max_size=60,
    )
)
def test_any_mix_comes_out_alarms_first_by_class_then_arrival_and_the_rest_in_order(
    offers: list[tuple[str, int, bool]],
) -> None:
    evicted: list[tuple[int, int, bool]] = []

    def evict(event: tuple[int, int, bool], _source: str) -> None:
        evicted.append(event)

    inbox: Inbox[tuple[int, int, bool]] = Inbox({}, default=8, urgent=4, evicted=evict)
    taken = []
    for seq, (source, rank, barrier) in enumerate(offers):
        event = (seq, rank, barrier)
        if inbox.offer(event, source, rank=rank, barrier=barrier and rank == 0):
            taken.append(event)
    out = []
    while (got := inbox.get(0)) is not None:
        out.append(got)
    assert sorted(out + evicted) == sorted(taken)  # nothing lost, nothing made up
    assert all(e[1] == 3 for e in evicted)  # only an alarm makes room, for a critical
    urgent = [e for e in out if e[1]]
    assert urgent == sorted(urgent, key=lambda e: (-e[1], e[0]))
    plain = [e for e in out if not e[1]]
    barriers = [e for e in plain if e[2]]
    assert [e for e in plain if not e[2]] == sorted(e for e in plain if not e[2])
    assert barriers == sorted(barriers)
    if urgent:  # every barrier older than the first alarm served came before it
        first = out.index(urgent[0])
        assert all(out.index(b) < first for b in barriers if b[0] < urgent[0][0])
