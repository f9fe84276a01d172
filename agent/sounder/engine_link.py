"""The sounder's side of the engine: its process (`engine_process`), and what goes each way.

From the engine: its lane's audio (relayed into the player's normal lane by a thread of its own,
one credit per chunk, so the pipe's reader never waits on the player), words for an alarm (to
the alarm voice), cuts and the volume (to the player), alarm-class requests its edges received
(to the loop, as requests), what it knows (its voice is ready, the voices' facts, decoded chime
files, pinned phrases rendered at the sounder's asking: to the loop, which keeps them in the
kit), and the server its MQTT session is subscribed on (or none). To the
engine: the server the sounder's session is on (which the engine's follows), what the speaker
did with its lane (started, ended, preempted, the device's state), asks for an alarm's words,
renders of the pinned phrases, and the lifecycle of the alarms it handed over. Every frame from
the engine is checked (`engine_wire`): one that breaks the rules ends that engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from agent.core.catalog import VoiceFacts
from agent.core.messages import (
    AckRequested,
    Delivery,
    Notify,
    SpeakReceived,
    SpeakRequest,
    StopRequested,
)
from agent.formats.chunk import Chunk
from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import Frame, WireError
from agent.sounder.chime_bank import ChimeBank
from agent.sounder.engine_lane import CREDITS, EngineLane, Lanes, player_job
from agent.sounder.engine_process import EngineProcess
from agent.sounder.kit import MAX_SOUND_BYTES, Kit
from agent.sounder.pinned_renders import RENDER_JOBS, KitSound, PinnedRenders
from agent.sounder.session_servers import SessionServers
from agent.storage.journal import request_from_json, request_json

_LOGGER = logging.getLogger(__name__)


class Words(Protocol):
    """The alarm voice as this link feeds it."""

    def words(self, chunk: Chunk, epoch: int) -> None: ...
    def engine_changed(self) -> None: ...


@dataclass(frozen=True, slots=True)
class EngineReady:
    """The engine's voice is ready (or no longer): its voices' facts and default model."""

    ready: bool
    voices: Mapping[str, VoiceFacts]
    model: str
    phrases: tuple[str, ...]


LOOP_EVENTS = (EngineReady, KitSound)
"""What this link hands the sounder's loop (`EngineLink.handle` takes them)."""


class EngineLink:
    """The engine process and the frames to and from it."""

    def __init__(
        self,
        command: list[str],
        kit: Kit,
        to_loop: Callable[[object], object],
        environ: Mapping[str, str],
    ) -> None:
        self._kit = kit
        self._to_loop = to_loop
        self._words: Words | None = None
        environment = {
            k: v for k, v in environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))
        }
        self._process = EngineProcess(command, self._frame, self._changed, environ=environment)
        self.chimes = ChimeBank(kit)
        self.lane = EngineLane(self._process.send, lambda: self._process.epoch)
        self.renders = PinnedRenders(self._process.send, to_loop)
        self.servers = SessionServers(self._process.send)
        """Where the sounder's session and the engine's are (the engine's follows)."""
        self.kit_changed = False
        """The kit holds something new since it was last kept (the loop keeps it and says so)."""
        self._lane_told: tuple[bool, tuple[str, ...]] | None = None
        self.notes: list[str] = []
        """What is wrong with the sounder's files: told to each engine (its state says it)."""

    def attach(self, player: Lanes, words: Words) -> None:
        self.lane.player = player
        self._words = words

    @property
    def ready(self) -> bool:
        return self._process.ready

    @property
    def answering(self) -> bool:
        return self._process.answering

    @property
    def epoch(self) -> int:
        return self._process.epoch

    @property
    def cannot_run(self) -> bool:
        """The engine cannot run as configured: the sounder ends."""
        return self._process.cannot_run.is_set()

    def start(self) -> None:
        self.lane.start()
        self._process.start()

    def stop(self) -> None:
        self.lane.stop()
        self._process.stop()

    # ---- asked by the alarm voice (its thread) and the loop -----------------------------------

    def ask_words(self, job: int, request: SpeakRequest) -> bool:
        self.renders.put_back(cancel=True)  # an alarm's words first: a render is done later
        body = request_json(replace(request, chime=False))
        return self._process.send(wire.encode("say", {"job": job, "request": body}))

    def cancel_words(self, job: int) -> None:
        self._process.send(wire.encode("cancel", {"job": job}))

    def credit_words(self) -> None:
        self._process.send(wire.encode("credit", {"lane": "words"}))

    def notified(self, notify: Notify) -> None:
        """An alarm's event, for the engine (its Hermes replies, Wyoming's `played`, the ids
        whose acks are the alarm lane's)."""
        header = {"id": notify.id, "event": str(notify.event), "details": dict(notify.details)}
        try:
            self._process.send(wire.encode("notified", header))
        except (TypeError, ValueError):
            _LOGGER.debug("An event of %s not told to the engine", notify.id)

    # ---- the loop's events of this link ------------------------------------------------------

    def handle(self, event: object) -> None:
        """On the loop's thread: the kit follows what the engine says."""
        if isinstance(event, EngineReady):
            self._process.set_ready(event.ready)
            if event.ready:
                self._kit.voices = dict(event.voices)
                stale = event.model != self._kit.model
                self.renders.model = event.model
                self.renders.want(t for t in event.phrases if stale or t not in self._kit.phrases)
                self.kit_changed = True
                self.renders.next(self.epoch)
            if self._words is not None:
                self._words.engine_changed()
        elif isinstance(event, KitSound):
            self._keep(event)

    def _keep(self, sound: KitSound) -> None:
        into = self._kit.chimes if sound.kind == "chimes" else self._kit.phrases
        into[sound.name] = sound.pcm
        self.kit_changed = True
        if sound.kind == "phrases":
            self._kit.model = sound.model  # a new model's phrases replace the old ones
            seconds = len(sound.pcm) / 2 / self._kit.rate
            _LOGGER.info("Pinned phrase kept by the sounder: %r (%.2f s)", sound.name[:64], seconds)
            if self.ready:
                self.renders.next(self.epoch)

    def tell_lane(self, speaking: bool, repeating: tuple[str, ...]) -> None:
        """The alarm lane's state, told to the engine when it changed (its state and Sparkplug's
        metrics say it; Sparkplug's Acknowledge acks those ids)."""
        lane = (speaking, repeating)
        if lane != self._lane_told:
            self._lane_told = lane
            header = {"speaking": speaking, "repeating": list(repeating)}
            self._process.send(wire.encode("lane", header))

    # ---- the pipe's reader thread ---------------------------------------------------------------

    def _frame(self, frame: Frame, epoch: int) -> None:
        if frame.kind == "hello":
            self._hello()
        elif frame.kind in ("connected", "disconnected"):
            self.servers.frame(frame)
        elif frame.kind == "chunk":
            self.lane.received(wire.chunk_of(frame), epoch)
        elif frame.kind == "words":
            self._words_frame(wire.chunk_of(frame), epoch)
        elif frame.kind in ("cut", "volume"):
            self._player_frame(frame, epoch)
        else:
            self._to_loop(_loop_event(frame))

    def _hello(self) -> None:
        self._lane_told = None  # a new engine hears the lane's state at the next event
        self.lane.hello()
        for _ in range(CREDITS):
            self._process.send(wire.encode("credit", {"lane": "words"}))
        if self.notes:
            self._process.send(wire.encode("notes", {"notes": self.notes}))

    def _words_frame(self, chunk: Chunk, epoch: int) -> None:
        if chunk.job >= RENDER_JOBS or self._words is None:
            self.renders.received(chunk, epoch)
            self.credit_words()
        else:
            self._words.words(chunk, epoch)  # it gives the credit back

    def _player_frame(self, frame: Frame, epoch: int) -> None:
        player = self.lane.player
        if frame.kind == "cut":
            if player is not None:
                player.cut(player_job(epoch, frame.integer("job")))
            return
        value = frame.number("value")
        if value is None or not 0.0 <= value <= 1.0:
            raise WireError("volume.value: expected 0 to 1")
        if player is not None:
            player.volume = value

    def _changed(self) -> None:
        """The engine came or went (the keeper's thread): a new one is not ready yet, has no
        session yet, and hears at once which server to use."""
        self.servers.engine_changed()
        self.lane.lost()
        self.renders.put_back(cancel=False)
        if self._words is not None:
            self._words.engine_changed()


def _loop_event(frame: Frame) -> object:
    """A frame for the sounder's loop: the engine ready, an alarm handed over, a chime."""
    match frame.kind:
        case "ready":
            return _ready(frame)
        case "alarm":
            try:
                request = request_from_json(frame.text("request", limit=wire.MAX_HEADER))
            except ValueError as err:
                raise WireError(f"alarm.request: {err}") from None
            return SpeakReceived(request, Delivery(0, 0))
        case "stop":
            return StopRequested(frame.flag("clear"), Delivery(0, 0), frame.flag("current"))
        case "ack":
            return AckRequested(frame.text("id"), Delivery(0, 0))
        case "chime":
            if not frame.body or len(frame.body) % 2 or len(frame.body) > MAX_SOUND_BYTES:
                raise WireError("chime: expected 16-bit PCM")
            return KitSound("chimes", frame.text("name", limit=64), frame.body)
    raise WireError(f"a frame of unknown kind {frame.kind[:32]!r}")


def _ready(frame: Frame) -> EngineReady:
    voices = {}
    for vid, facts in frame.mapping("voices").items():
        if not isinstance(facts, dict):
            raise WireError("ready.voices: expected objects")
        one = Frame("voice", facts)
        speakers = facts.get("speakers", [])
        if not isinstance(speakers, list) or not all(isinstance(s, str) for s in speakers):
            raise WireError("ready.voices: speakers must be names")
        voices[str(vid)[:64]] = VoiceFacts(
            one.text("language", ""), tuple(speakers), one.integer("speaker_count", 1, 1 << 20)
        )
    phrases = frame.header.get("phrases", [])
    if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
        raise WireError("ready.phrases: expected texts")
    return EngineReady(frame.flag("ready"), voices, frame.text("model", ""), tuple(phrases))
