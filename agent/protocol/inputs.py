"""What reaches the app loop besides the core's own events: the link coming up, Home Assistant's
birth, Hermes requests, OTA commands, and deliveries that only need acknowledging. Pure data.

Every input is one event on the one bounded inbox (`inbox`); the route table (`routes`) makes
them from MQTT messages on paho's thread, the edges' workers report theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.core.messages import Delivery, Rejection, SpeakRequest
from agent.protocol.hermes import HermesContext

if TYPE_CHECKING:  # protobuf only with the edge node on
    from agent.protocol.sparkplug import Command


@dataclass(frozen=True, slots=True)
class Connected:
    """The MQTT session is up (again): announce the node and publish its state."""


@dataclass(frozen=True, slots=True)
class HomeAssistantBirth:
    """Home Assistant said `online` on its birth topic: announce again, after a short spread."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Ignored:
    """A delivery that needs nothing but its acknowledgement (another site's Hermes message)."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class HermesRequest:
    """A Hermes say or playBytes for this site: a request, or why it cannot be served."""

    context: HermesContext
    """What its replies must echo."""
    parsed: SpeakRequest | Rejection
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class HermesToggle:
    """Hermes audio on or off for this site."""

    on: bool
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class HermesVoicesAsked:
    """`rhasspy/tts/getVoices` for this site; `request_id` is echoed in the answer."""

    request_id: object
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class OtaCommand:
    """An update offer, a cancel or a rollback (a JSON object), or why the message is none."""

    offer_id: str
    body: dict[str, Any] | None
    """None when the payload was malformed (`problem` says how)."""
    delivery: Delivery
    problem: str = field(default="")


@dataclass(frozen=True, slots=True)
class SparkplugConnected:
    """The Sparkplug session is up with this bdSeq (its Will's): born now, or once the primary
    host says it is online."""

    bd_seq: int
    server: str


@dataclass(frozen=True, slots=True)
class SparkplugLost:
    """The Sparkplug session ended (the broker publishes the NDEATH)."""


@dataclass(frozen=True, slots=True)
class SparkplugCommand:
    """An NCMD or a DCMD for the speaker, read on the session's thread: what it does."""

    command: Command


@dataclass(frozen=True, slots=True)
class SparkplugHostState:
    """The primary host application's STATE message, unparsed."""

    payload: bytes
