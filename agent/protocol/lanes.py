"""Which process answers a speak message: the sounder's alarm lane or the engine.

Both processes read every speak message (each through its own MQTT session) and keep the part
this module gives them, so that each message is answered exactly once. The sounder takes the
alarm classes (`alarm`, `critical`): their requests, and their refusals when the payload got as
far as naming its class. The engine takes everything else. Both use the same parser and this
one rule, so the split holds by construction.

`may_be_alarm` lets the sounder drop a flood of ordinary messages without parsing them: a payload
that names an alarm class must contain the class's name, or a JSON escape that could spell it.

Pure: no I/O, no clock, no threads.
"""

from __future__ import annotations

from typing import Final

from agent.core.messages import Priority, SpeakInvalid, SpeakReceived

ALARM_CLASSES: Final = frozenset({Priority.ALARM, Priority.CRITICAL})
"""The classes the sounder plays itself, from its own session, whatever the engine does."""
_MARKS: Final = (b"alarm", b"critical", b"\\u")
"""What a payload naming an alarm class contains: the class's name, or an escape (`\\u0061`)."""


def is_alarm(priority: Priority | None) -> bool:
    """Whether a request of this class belongs to the alarm lane."""
    return priority is not None and priority >= Priority.ALARM


def may_be_alarm(payload: bytes) -> bool:
    """False only when the payload cannot name an alarm class (it then needs no parse)."""
    return any(mark in payload for mark in _MARKS)


def in_alarm_lane(event: object) -> bool:
    """Whether a speak route's event is the alarm lane's: an alarm-class request, or the refusal
    of a payload that got as far as naming an alarm class."""
    if isinstance(event, SpeakReceived):
        return is_alarm(event.request.priority)
    if isinstance(event, SpeakInvalid):
        return is_alarm(event.rejection.priority)
    return False
