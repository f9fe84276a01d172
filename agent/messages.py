"""Domain messages: what edges tell the core (events) and what the core asks of edges (actions).

Pure data, no behaviour. Allowed imports: stdlib.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class Lifecycle(StrEnum):
    """The `event` field of messages on `<prefix>/<node_id>/events`."""

    ACCEPTED = "accepted"
    STARTED = "started"
    FINISHED = "finished"
    REJECTED = "rejected"
    FAILED = "failed"


class Reason(StrEnum):
    """The `reason` field of `rejected` and `failed` events."""

    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"
    INVALID_FIELD = "invalid_field"
    EMPTY_TEXT = "empty_text"
    TEXT_TOO_LONG = "text_too_long"
    UNKNOWN_VOICE = "unknown_voice"
    DUPLICATE_ID = "duplicate_id"
    QUEUE_FULL = "queue_full"
    SYNTHESIS_ERROR = "synthesis_error"
    NO_SPEECH = "no_speech"
    AUDIO_ERROR = "audio_error"


@dataclass(frozen=True, slots=True)
class Delivery:
    """How to acknowledge one MQTT message: its packet id and QoS (QoS 0 needs no ack)."""

    mid: int
    qos: int
    redelivered: bool = False
    """The broker flagged it as a redelivery (MQTT DUP): an earlier copy may have arrived."""
    fingerprint: str = ""
    """Digest of topic and payload: recognizes a redelivered message that carries no id."""


@dataclass(frozen=True, slots=True)
class SpeakRequest:
    """A valid request to say something."""

    id: str
    text: str
    """Cleaned text (see `text.clean_text`), never empty."""
    unknown_fields: tuple[str, ...] = ()
    """Fields of a JSON payload that this version does not know (reported, not used)."""
    voice: str = "default"
    """Voice id (`default` or a key of `tts.voices`); never a path."""
    rate: float = 1.0
    """Speaking rate: 2.0 is twice as fast (the voice's length scale is divided by it)."""
    volume: float = 1.0
    """Gain applied to the samples, 0 to 1."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message cannot be served."""

    id: str
    reason: Reason
    detail: str
    field: str | None = None
    """The payload field at fault, for `invalid_field`."""


# ---- events: edges -> core -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeakReceived:
    """A well-formed speak message arrived."""

    request: SpeakRequest
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class SpeakInvalid:
    """A speak message arrived that cannot be served as it is."""

    rejection: Rejection
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class SynthesisDone:
    """The synthesizer handed the last audio of this utterance to the player and is free."""

    id: str


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    """The first samples of this utterance were handed to the audio device."""

    id: str


@dataclass(frozen=True, slots=True)
class UtteranceEnded:
    """The last sample of this utterance was played (or it could not be)."""

    id: str
    audio_seconds: float
    error: Reason | None = None
    detail: str = ""
    info: Mapping[str, object] = field(default_factory=dict)
    """Extra fields for the `finished` or `failed` event (e.g. how much came from the cache)."""


Event = SpeakReceived | SpeakInvalid | SynthesisDone | UtteranceStarted | UtteranceEnded


# ---- actions: core -> edges ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acknowledge:
    """Acknowledge this message to the broker: it is now the agent's responsibility."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Notify:
    """Publish a lifecycle event."""

    id: str
    event: Lifecycle
    details: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Synthesize:
    """Synthesize and play this request (the synthesizer is free)."""

    request: SpeakRequest


Action = Acknowledge | Notify | Synthesize
