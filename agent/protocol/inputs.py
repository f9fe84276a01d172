"""Every input of the engine's loop (`App` in `agent/app.py`), in one vocabulary: each kind of
event that reaches its one bounded inbox (`agent/loop/inbox.py`), and their union, `LoopInput`,
which `App._dispatch` matches on. Pure data.

Who makes them:
- **The route table** (`routes`, on paho's thread), one event a message (`RoutedEvent`): the
  core's requests and commands (`agent.core.messages`: speak, stop, ack, volume, voice, replay),
  Home Assistant's birth, Hermes requests, OTA commands, deliveries that only need acknowledging.
- **The link and the Sparkplug session**: `Connected`; `SparkplugConnected`, `SparkplugLost`,
  `SparkplugCommand`, `SparkplugHostState`. **Wyoming's announce target**: a `SpeakReceived`.
- **The workers**: the synthesizer and the player (the core's reports: `SynthesisDone`,
  `UtteranceStarted`, `UtteranceEnded`, `AudioStatus`, `MediaHeld`), the updater (its progress,
  `UpdateReport`, kept in `agent.core.states` because the operator's tools read it too; a model
  switch asked or withdrawn), the voice loader (`VoicesLoaded`), the tier worker (`TierDecided`).
- **The sounder**, over the pipe (`SounderReport`): its player's reports, as a local player's
  (`UtteranceStarted`, `UtteranceEnded`, `AudioStatus`, `NormalPreempted`), and its alarm lane's
  (`AlarmNotified`, `SounderNotes`, `AlarmLaneState`).

The events that carry a voice are generic in its type (`V`): the pure layers do not know the
speech edge's `Voice`; the composition names it (`LoopInput[Voice]`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from agent.core.messages import (
    AudioStatus,
    Delivery,
    Event,
    NormalPreempted,
    Notify,
    Rejection,
    SpeakRequest,
    UtteranceEnded,
    UtteranceStarted,
)
from agent.core.states import UpdatePhase, UpdateReason, UpdateReport
from agent.core.tiers import TierState
from agent.protocol.hermes import HermesContext

if TYPE_CHECKING:  # protobuf only with the edge node on
    from agent.protocol.sparkplug import Command

V = TypeVar("V")
"""The voice an event carries (the speech edge's `Voice`)."""


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

    def refused(self) -> UpdateReport:
        """The report of a message that is no command (`body` None): `failed`, reason
        `malformed`, with its problem, as the updater reports an offer it refuses."""
        failed, reason = UpdatePhase.FAILED, UpdateReason.MALFORMED
        return UpdateReport(self.offer_id, failed, reason=reason, detail=self.problem)


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


# ---- the workers' reports -----------------------------------------------------------------


class Answer(Protocol):
    """Where the loop answers a switch it was asked for (a queue the asker waits on)."""

    def put(self, item: bool, /) -> None: ...


@dataclass(frozen=True, slots=True)
class SwapAsked(Generic[V]):
    """The updater asks the loop to switch the default voice to `voice` (`loop/voice_swap.py`
    has the handshake)."""

    token: int
    voice: V
    answer: Answer


@dataclass(frozen=True, slots=True)
class SwapWithdrawn:
    """The updater no longer waits for the switch it asked with this token."""

    token: int


@dataclass(frozen=True, slots=True)
class VoicesLoaded(Generic[V]):
    """Every voice's sessions are loaded and prewarmed: the default voice's replacement when
    its installed model did not load (None: it loaded), and the tier measured at start."""

    replacement: V | None
    tier: TierState
    error: str | None = None
    """The configured model did not load (the agent stops)."""


@dataclass(frozen=True, slots=True)
class TierDecided(Generic[V]):
    """The INT8 tier's worker is done: the variant to switch to (None: stay on FP32), and what
    the state says about it."""

    voice: V | None
    state: TierState


# ---- the sounder's reports ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlarmNotified:
    """An event of the alarm lane (the sounder published it): for the engine's readers."""

    notify: Notify


@dataclass(frozen=True, slots=True)
class SounderNotes:
    """What is wrong with the sounder's files (its alarm journal, its kit): the state says it."""

    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AlarmLaneState:
    """The sounder's alarm lane: whether it speaks, and the ids of the alarms that repeat."""

    speaking: bool
    repeating: tuple[str, ...]


# ---- the unions ---------------------------------------------------------------------------

RoutedEvent = (
    Event
    | HermesRequest
    | HermesToggle
    | HermesVoicesAsked
    | HomeAssistantBirth
    | Ignored
    | OtaCommand
)
"""What a route makes of an MQTT message."""

SounderReport = (
    UtteranceStarted
    | UtteranceEnded
    | AudioStatus
    | NormalPreempted
    | AlarmNotified
    | SounderNotes
    | AlarmLaneState
)
"""What the sounder tells the engine's loop."""

LoopInput = (
    RoutedEvent
    | Connected
    | SparkplugConnected
    | SparkplugLost
    | SparkplugCommand
    | SparkplugHostState
    | UpdateReport
    | SwapAsked[V]
    | SwapWithdrawn
    | VoicesLoaded[V]
    | TierDecided[V]
    | SounderReport
)
"""Everything the engine's loop handles (the core's events among them, `Event`)."""
