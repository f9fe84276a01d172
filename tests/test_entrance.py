"""The way into the engine's loop (`agent/loop/entrance.py`) with a real inbox and route table:
alarm-class requests first, a full source answered `queue_full` (read only when it may be
urgent), the sounder's alarms left to it, Wyoming's announcements ranked as any request. The
paths through the broker: tests/test_alarm_under_fire.py, tests/test_sparkplug.py."""

from __future__ import annotations

import itertools
import json

from agent.core.messages import Delivery, Priority, SpeakInvalid, SpeakReceived, SpeakRequest
from agent.core.reasons import Reason
from agent.loop.entrance import Entrance
from agent.loop.inbox import Inbox
from agent.protocol.inputs import Connected, LoopInput
from agent.protocol.rooms import SOURCES
from agent.protocol.routes import route_table
from agent.protocol.topics import Topics
from agent.settings import loading as configs

CONFIG = configs.from_mapping({"node_id": "n1"}, environ={})
TOPICS = Topics(CONFIG.mqtt.topic_prefix, CONFIG.node_id)


def entrance(
    budget: int, *, alarms_elsewhere: bool = False
) -> tuple[Entrance[str], Inbox[LoopInput[str]]]:
    ids = (f"{n:032x}" for n in itertools.count())
    inbox: Inbox[LoopInput[str]] = Inbox(dict.fromkeys(SOURCES, budget), default=budget)
    table = route_table(CONFIG, TOPICS, lambda: next(ids))
    return Entrance(inbox, table, lambda: next(ids), alarms_elsewhere=alarms_elsewhere), inbox


def speak(text: str, priority: str = "info") -> bytes:
    return json.dumps({"text": text, "priority": priority}).encode()


def drained(inbox: Inbox[LoopInput[str]]) -> list[object]:
    out: list[object] = []
    while (event := inbox.get(0)) is not None:
        out.append(event)
    return out


def test_an_alarm_enters_ahead_of_a_full_source_and_the_rest_is_refused_unread() -> None:
    door, inbox = entrance(2)
    handle = door.message_handler(TOPICS.speak)
    taken = [handle(TOPICS.speak, speak(f"chat {n}"), Delivery(n + 1, 1)) for n in range(3)]
    assert taken == [True, True, False]  # the third: answered, the link acknowledges it
    assert handle(TOPICS.speak, speak("fire", "critical"), Delivery(9, 1))
    door.connected()
    events = drained(inbox)
    texts = [e.request.text for e in events if isinstance(e, SpeakReceived)]
    assert texts == ["fire", "chat 0", "chat 1"]
    (refused,) = [e for e in events if isinstance(e, SpeakInvalid)]
    assert refused.rejection.reason == Reason.QUEUE_FULL
    assert Connected() in events


def test_the_sounders_alarms_are_left_to_it_and_announcements_ranked_by_class() -> None:
    door, inbox = entrance(4, alarms_elsewhere=True)
    handle = door.message_handler(TOPICS.speak)
    assert not handle(TOPICS.speak, speak("fire", "alarm"), Delivery(1, 1))  # the sounder's
    assert handle(TOPICS.speak, speak("tea"), Delivery(2, 1))
    door.announced(SpeakRequest("w1", "doorbell", priority=Priority.INFO))
    door.announced(SpeakRequest("w2", "smoke", priority=Priority.CRITICAL))
    events = drained(inbox)
    said = [e.request.text for e in events if isinstance(e, SpeakReceived)]
    assert said == ["smoke", "tea", "doorbell"]
