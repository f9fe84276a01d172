"""Domain messages: what edges tell the core (events) and what the core asks of edges (actions).

Pure data, no behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Final

from agent.core.reasons import Reason
from agent.core.segments import Segment


class Lifecycle(StrEnum):
    """The `event` field of messages on `<prefix>/<node_id>/events`."""

    ACCEPTED = "accepted"
    STARTED = "started"
    FINISHED = "finished"
    REJECTED = "rejected"
    FAILED = "failed"
    PREEMPTED = "preempted"
    REQUEUED = "requeued"
    EXPIRED = "expired"
    STOPPED = "stopped"
    ACKNOWLEDGED = "acknowledged"
    COALESCED = "coalesced"
    INTERRUPTED = "interrupted"
    UPDATE = "update"
    """A model update's progress or result (its id is the offer's)."""
    SUPPRESSED = "suppressed"
    """Rejections held back during a flood: their count by reason (one event per interval)."""


FINAL_EVENTS: Final = frozenset(
    {
        Lifecycle.FINISHED,
        Lifecycle.FAILED,
        Lifecycle.REJECTED,
        Lifecycle.EXPIRED,
        Lifecycle.STOPPED,
        Lifecycle.ACKNOWLEDGED,
        Lifecycle.COALESCED,
        Lifecycle.PREEMPTED,
    }
)
"""Events that end an announcement (`finished` of a repeat is the last): its journal entry
ends and a Hermes request gets its reply."""


class Priority(IntEnum):
    """Announcement classes, lowest first: a higher class may preempt a lower one."""

    CHAT = 0
    INFO = 1
    WARNING = 2
    ALARM = 3
    CRITICAL = 4

    @property
    def label(self) -> str:
        """The name used in payloads and events."""
        return self.name.lower()


UNTIL_ACKNOWLEDGED = 0
"""`repeat` value: play again and again until an `ack` (or `stop`, or the `ttl`) ends it."""
FALLBACK_CACHED: Final = "chime_and_cached_phrase"
"""An alarm the agent died on, said another way: its chime, then the sentences of it that the
phrase cache holds (nothing synthesized, no sound decoded)."""
FALLBACK_CHIME: Final = "chime"
"""An alarm the agent died on while reading its text (or too often): its chime only."""
FALLBACKS: Final = frozenset({FALLBACK_CACHED, FALLBACK_CHIME})
TEXT_REPORTED: Final = 500
"""Characters of an announcement's text reported in the event that ends it unspoken (a crash
loop, a damaged journal entry)."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """How to acknowledge one MQTT message: its packet id and QoS (QoS 0 needs no ack)."""

    mid: int
    qos: int
    redelivered: bool = False
    """The broker flagged it as a redelivery (MQTT DUP): an earlier copy may have arrived."""
    fingerprint: str = ""
    """Digest of topic and payload: recognizes a redelivered message that carries no id."""
    expiry: float | None = None
    """MQTT 5 Message Expiry Interval left when it arrived (seconds), if the sender set one."""


@dataclass(frozen=True, slots=True)
class AudioClip:
    """Recorded audio to play instead of speech (Hermes playBytes): a sound file's bytes (WAV
    of any sample format, FLAC, Ogg, MP3), decoded and resampled once the core accepted it.
    The core keeps none of them: it hands them on with `Prepare`."""

    data: bytes


@dataclass(frozen=True, slots=True)
class SpeakRequest:
    """A valid request to say something."""

    id: str
    text: str
    """Cleaned text (see `text.clean_text`); with `ssml`, the SSML document as it came. Empty
    only when a sound is all there is to play."""
    unknown_fields: tuple[str, ...] = ()
    """Fields of a JSON payload that this version does not know (reported, not used)."""
    voice: str | None = None
    """Voice id (`default` or a key of `tts.voices`; None: the selected one); never a path."""
    rate: float = 1.0
    """Speaking rate: 2.0 is twice as fast (the voice's length scale is divided by it)."""
    volume: float = 1.0
    """Gain asked for, 0 to 1 (the global volume and the class's floor also apply)."""
    priority: Priority = Priority.INFO
    ttl: float | None = None
    """Seconds from arrival: not started by then, it expires."""
    interrupt: bool | None = None
    """Preempt a lower class at once; None means the class default (alarm and critical do)."""
    chime: bool | str | None = None
    """None: the class's chime, if it has one; True: the class's chime or, if it has none, the
    default one; False: none; a name: that chime."""
    repeat: int = 1
    """Plays in all; UNTIL_ACKNOWLEDGED (0) repeats until an ack."""
    repeat_interval: float = 10.0
    """Seconds from the end of one play to the start of the next."""
    dedupe_key: str | None = None
    """A later request with the same key replaces this one while it waits."""
    audio: AudioClip | None = None
    """Play this instead of synthesizing `text` (which then only describes it)."""
    at: float | None = None
    """The wall-clock instant (Unix seconds) its first sample should reach the speaker (a
    common start across the nodes of a group); None: as soon as it can."""
    ssml: bool = False
    """`text` is an SSML document (checked when it arrived)."""
    document: tuple[Segment, ...] = field(default=(), compare=False, repr=False)
    """With `ssml`: the document parsed, once, on arrival (or read back from the journal), its
    `say-as` said in English; `program` says it in the voice's language. Empty otherwise."""
    speaker: str | None = None
    """A speaker of a multi-speaker voice: a name from its `speaker_id_map`, or a number."""
    lang: str | None = None
    """A language (`de`, `de_DE`, `de-DE`): without `voice`, the voice that speaks it."""
    sound: str | None = None
    """A sound played before the text: a name of `audio.media`, or an http(s) URL."""
    sound_after: str | None = None
    """A sound played after the text."""
    fallback: str | None = None
    """Said another way (FALLBACK_CACHED, FALLBACK_CHIME): an alarm or critical announcement
    the agent died on (`crash_loop`); never set by a payload."""
    source: str | None = None
    """Where it came from when not a speak message (`wyoming`: Home Assistant's announce
    target); every event of it carries it. Never set by a payload."""

    @property
    def urls(self) -> tuple[str, ...]:
        """The sounds it names by URL (fetched before it plays)."""
        return tuple(s for s in (self.sound, self.sound_after) if s and is_url(s))

    @property
    def media_bytes(self) -> int:
        """Bytes of media it brings with it (a recording's), held for it while it waits."""
        return 0 if self.audio is None else len(self.audio.data)

    @property
    def has_media(self) -> bool:
        """Whether it plays a sound (by name or URL) or a recording, made ready on arrival."""
        return bool(self.audio is not None or self.sound or self.sound_after)

    @property
    def interrupts(self) -> bool:
        """Whether it preempts a lower class that is playing."""
        if self.interrupt is not None:
            return self.interrupt
        return self.priority >= Priority.ALARM


def is_url(sound: str) -> bool:
    """Whether a sound is named by an http(s) URL (else it is a name of `audio.media`)."""
    return sound.startswith(("http://", "https://"))


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a message cannot be served."""

    id: str
    reason: Reason
    detail: str
    field: str | None = None
    """The payload field at fault, for `invalid_field`."""
    priority: Priority | None = None
    """The request's class, when the payload got that far."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """An announcement accepted before a restart that had not ended."""

    request: SpeakRequest
    ttl_left: float | None
    """Seconds of its ttl left now (None: no ttl)."""
    started: bool
    """It was playing when the agent stopped."""
    crashed: bool = False
    """The agent died twice in one step of its work (or too often in a row): it is not tried
    again as it is."""
    crash_step: str | None = None
    """The step it died in (None: no one step, or not known)."""


# ---- events: edges -> core -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpeakReceived:
    """A well-formed speak message arrived."""

    request: SpeakRequest
    delivery: Delivery
    wall: float = field(default=0.0, compare=False)
    """Wall-clock time (Unix seconds) it is handled at: how a request's `at` is placed on the
    core's clock (0: the `wall` the loop hands `SpeakCore.handle` with `now`)."""


@dataclass(frozen=True, slots=True)
class SpeakInvalid:
    """A message arrived that cannot be served as it is (speak, stop, ack or volume)."""

    rejection: Rejection
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class StopRequested:
    """Stop what is playing; with `clear`, also drop everything waiting; with `current` false,
    only drop what waits (Home Assistant's "Clear queue")."""

    clear: bool
    delivery: Delivery
    current: bool = True


@dataclass(frozen=True, slots=True)
class AckRequested:
    """An operator acknowledged announcement `id` (ends its repeats)."""

    id: str
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class VolumeRequested:
    """Set the global volume (0 to 1)."""

    volume: float
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class ReplayRequested:
    """Say the last announcement again (a Home Assistant button)."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class VoiceSelected:
    """Use this voice for requests that do not name one."""

    voice: str
    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passes: deadlines and repeat intervals are checked."""


@dataclass(frozen=True, slots=True)
class AudioStatus:
    """The audio device became available or unavailable."""

    available: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class SynthesisDone:
    """The synthesizer handed the last audio of this job to the player and is free."""

    id: str
    job: int = 0
    """The activation it is about (see `Synthesize.job`)."""


@dataclass(frozen=True, slots=True)
class UtteranceStarted:
    """The first samples of this utterance were handed to the audio device."""

    id: str
    job: int = 0
    wall: float = field(default=0.0, compare=False)
    """Wall-clock time it happened (seconds since the epoch): the `ts` of its events."""
    late_ms: float | None = None
    """For a timed request (`at`): how much later than asked its first sample plays (0: on
    time)."""


@dataclass(frozen=True, slots=True)
class UtteranceEnded:
    """The last sample of this utterance was played (or it could not be, or it was cut)."""

    id: str
    audio_seconds: float
    error: Reason | None = None
    detail: str = ""
    info: Mapping[str, object] = field(default_factory=dict)
    """Extra fields for the `finished` or `failed` event (e.g. how much came from the cache)."""
    job: int = 0
    wall: float = field(default=0.0, compare=False)
    """Wall-clock time it happened (seconds since the epoch): the `ts` of its events."""


@dataclass(frozen=True, slots=True)
class NormalPreempted:
    """The player cut the normal lane's current utterance for an alarm on its urgent lane (or
    dropped it before a sample played): it did not end, and is not reported ended; its owner
    requeues it, as a preemption."""

    request_id: str
    job: int
    """The activation that was cut (see `Synthesize.job`)."""
    by: str
    """What cut it: the id of the alarm that plays instead."""


@dataclass(frozen=True, slots=True)
class MediaHeld:
    """The media source now holds this many bytes for this request (downloaded, read, or
    decoded: what it keeps until the request plays and ends)."""

    id: str
    bytes: int


@dataclass(frozen=True, slots=True)
class SwapRequested:
    """A new default voice is ready: switch to it once nothing is synthesized or played."""

    token: int


@dataclass(frozen=True, slots=True)
class SwapCancelled:
    """The switch asked with this token is no longer wanted (it waited too long)."""

    token: int


Event = (
    SpeakReceived
    | SpeakInvalid
    | StopRequested
    | AckRequested
    | VolumeRequested
    | ReplayRequested
    | VoiceSelected
    | Tick
    | AudioStatus
    | SynthesisDone
    | UtteranceStarted
    | UtteranceEnded
    | NormalPreempted
    | SwapRequested
    | SwapCancelled
    | MediaHeld
)


# ---- actions: core -> edges ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acknowledge:
    """Acknowledge this message to the broker: it is now the agent's responsibility."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class Record:
    """Write this accepted announcement to the journal (before its message is acknowledged)."""

    request: SpeakRequest
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Notify:
    """Publish a lifecycle event."""

    id: str
    event: Lifecycle
    details: Mapping[str, object] = field(default_factory=dict)

    @property
    def last(self) -> bool:
        """Whether this is the announcement's very last event: a final event that is not a
        `finished` with plays left, nor a `preempted` that a `requeued` follows (every class
        but chat is played again)."""
        if self.event not in FINAL_EVENTS:
            return False
        if self.event == Lifecycle.FINISHED:
            return self.details.get("repeats_left") in (0, None)
        if self.event == Lifecycle.PREEMPTED:
            return self.details.get("priority") == Priority.CHAT.label
        return True


@dataclass(frozen=True, slots=True)
class Synthesize:
    """Synthesize and play this request (the synthesizer and the player are free)."""

    request: SpeakRequest
    play: int = 1
    """Which play this is (repeats count up from 1)."""
    job: int = 0
    """This activation's token: every report and cut about it carries it, so a late report or
    cut of an earlier play or of a preempted run never touches a later one."""
    start_at: float | None = None
    """The wall-clock instant (Unix seconds) its first sample plays: the request's `at`, for
    its first play only (a repeat plays when its turn comes)."""


@dataclass(frozen=True, slots=True)
class Prepare:
    """Make ready what this accepted request plays: download and decode its sounds, decode its
    recording (the request as it came, with its bytes)."""

    request: SpeakRequest


@dataclass(frozen=True, slots=True)
class LetGo:
    """This request has left the core (it ended): drop whatever is held for it."""

    id: str


@dataclass(frozen=True, slots=True)
class Cut:
    """Stop this announcement now: cancel its synthesis, fade out what is playing."""

    id: str
    job: int = 0


@dataclass(frozen=True, slots=True)
class SetVolume:
    """Apply a new global volume (at once, to what is playing too)."""

    volume: float


@dataclass(frozen=True, slots=True)
class SwitchVoice:
    """Switch the default voice now (nothing plays; nothing starts before it is done)."""

    token: int


@dataclass(frozen=True, slots=True)
class SwitchDeclined:
    """The switch with this token will not happen."""

    token: int


@dataclass(frozen=True, slots=True)
class Remember:
    """Keep a setting across restarts (the volume, the selected voice): Home Assistant sends
    its commands unretained, so only the node can remember them."""

    name: str
    value: str


Action = (
    Acknowledge
    | Record
    | Notify
    | Synthesize
    | Cut
    | SetVolume
    | SwitchVoice
    | SwitchDeclined
    | Remember
    | Prepare
    | LetGo
)
