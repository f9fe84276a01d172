"""The inbox's rooms: the sources a node's inbox keeps a budget for, the rank of an event there
(an alarm-class request's class), what must be handled before a later alarm (a stop), and the
answer to a message that found no room.

The rules both processes' inboxes apply (the engine's through `routes`, which adds its own
inputs: Hermes, Home Assistant's birth; the sounder's directly). Kept apart from the route
table so that the sounder's start does not import every edge's parsers.

Pure: no I/O, no clock, no threads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from agent.core.messages import (
    Delivery,
    Priority,
    Rejection,
    SpeakInvalid,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
)
from agent.core.reasons import Reason

SPEAK: Final = "speak"
"""The source of speak, say and group speak messages."""
COMMAND: Final = "command"
"""The source of stop, ack, volume, voice and replay messages (the node's and its groups')."""
HERMES: Final = "hermes"
HOMEASSISTANT: Final = "homeassistant"
OTA: Final = "ota"
SPARKPLUG: Final = "sparkplug"
"""The Sparkplug session's commands (`sparkplug_node`)."""
WYOMING: Final = "wyoming"
"""Home Assistant's announcements through the Wyoming announce target."""
SOURCES: Final = (SPEAK, COMMAND, HERMES, HOMEASSISTANT, OTA, SPARKPLUG, WYOMING)
"""Every source the inbox keeps a budget for."""

NewId = Callable[[], str]


def rank(request: SpeakRequest | None) -> int:
    """The inbox rank of a request: its class for an alarm class (alarm, critical), 0 for
    anything else (and for an event that carries no request)."""
    if request is None or request.priority < Priority.ALARM:
        return 0
    return int(request.priority)


def request_of(event: object) -> SpeakRequest | None:
    """The request a core event carries (a speak's), if any."""
    return event.request if isinstance(event, SpeakReceived) else None


def is_barrier(event: object) -> bool:
    """Whether an event must be handled before an alarm that arrived after it (a stop: it must
    never stop an alarm published after it)."""
    return isinstance(event, StopRequested)


def no_room(
    request: SpeakRequest | None, source: str, new_id: NewId, delivery: Delivery | None
) -> SpeakInvalid:
    """The answer to a message whose source had no room in the inbox: `rejected` `queue_full`,
    under the request's id when there is one; `delivery` when the inbox had taken it (a higher
    class took its place: the answer acknowledges it), else the link acknowledged it already."""
    request_id, priority = (new_id(), None) if request is None else (request.id, request.priority)
    detail = f"the node's inbox for {source} messages is full: try again later"
    refusal = Rejection(request_id, Reason.QUEUE_FULL, detail, None, priority)
    return SpeakInvalid(refusal, delivery or Delivery(0, 0))
