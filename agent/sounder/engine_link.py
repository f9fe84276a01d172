"""The sounder's side of the engine: its process (`engine_process`), and what goes each way.

From the engine: its lane's audio (relayed into the player's normal lane by a thread of its own,
one credit per chunk, so the pipe's reader never waits on the player), words for an alarm (to
the alarm voice), cuts and the volume (to the player), alarm-class requests its edges received
(to the loop, as requests), and what it knows (its session is up, its voice is ready, the
voices' facts, decoded chime files, pinned phrases rendered at the sounder's asking: to the loop,
which keeps them in the kit). To the engine: what the speaker did with its lane (started, ended,
preempted, the device's state), asks for an alarm's words, renders of the pinned phrases, and
the lifecycle of the alarms it handed over. Every frame from the engine is checked
(`engine_wire`): one that breaks the rules ends that engine.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final, Protocol

from agent.core.catalog import VoiceFacts
from agent.core.messages import (
    AudioStatus,
    Delivery,
    Event,
    NormalPreempted,
    Notify,
    Priority,
    SpeakReceived,
    SpeakRequest,
    UtteranceEnded,
    UtteranceStarted,
)
from agent.formats.chunk import Chunk
from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import Frame, WireError
from agent.sounder.chime_bank import ChimeBank
from agent.sounder.engine_process import EngineProcess
from agent.sounder.kit import MAX_SOUND_BYTES, Kit, KitFiles
from agent.storage.journal import request_from_json, request_json

_LOGGER = logging.getLogger(__name__)

CREDITS: Final = 2
"""Chunks of each lane the engine may send ahead of the player."""
_RENDER_JOBS: Final = 1 << 40
"""Jobs of pinned-phrase renders count from here (alarms' jobs are the core's, far below)."""


class Lanes(Protocol):
    """The player as this link uses it."""

    volume: float

    def put(self, chunk: Chunk) -> bool: ...
    def cut(self, job: int) -> None: ...


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


@dataclass(frozen=True, slots=True)
class KitSound:
    """A sound for the kit: a chime file the engine decoded, or a phrase it rendered."""

    kind: str
    """`chimes` or `phrases`."""
    name: str
    pcm: bytes
    model: str = ""


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
        self._player: Lanes | None = None
        self._words: Words | None = None
        environment = {
            k: v for k, v in environ.items() if not k.startswith(("NOTIFY_", "WATCHDOG_"))
        }
        self._process = EngineProcess(command, self._frame, self._changed, environ=environment)
        self.chimes = ChimeBank(kit)
        self._relay: deque[tuple[int, Chunk]] = deque()
        self._relay_changed = threading.Condition()
        self._relay_thread = threading.Thread(
            target=self._relay_blocking, name="engine-lane", daemon=True
        )
        self._session = False
        """The engine's own MQTT session exists (it connected once since the sounder started)."""
        self._on_session: Callable[[], object] = lambda: None
        self._rendering: dict[int, tuple[str, bytearray, int]] = {}
        """Pinned phrases being rendered: job → (text, PCM so far, epoch)."""
        self._to_render: deque[str] = deque()
        self._render_jobs = _RENDER_JOBS
        self._model = ""
        self._kit_changed = False
        self._stopping = False
        self._lock = threading.Lock()
        """Guards the renders (asked by the loop and the alarm voice, ended by the pipe)."""
        self._last_job = 0
        """The engine's lane's last job handed to the player (as the player knows it)."""
        self._audio: AudioStatus | None = None
        """What the player last said of the device."""
        self.notes: list[str] = []
        """What is wrong with the sounder's files: told to each engine (its state says it)."""

    def attach(self, player: Lanes) -> None:
        self._player = player

    def attach_words(self, words: Words) -> None:
        self._words = words

    def on_session(self, announce: Callable[[], object]) -> None:
        self._on_session = announce

    def session_known(self) -> bool:
        return self._session

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
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def cannot_run(self) -> bool:
        """The engine cannot run as configured: the sounder ends."""
        return self._process.cannot_run.is_set()

    def start(self) -> None:
        self._relay_thread.start()
        self._process.start()

    def stop(self) -> None:
        self._stopping = True
        with self._relay_changed:
            self._relay_changed.notify_all()
        self._process.stop()

    # ---- asked by the alarm voice (its thread) and the loop -----------------------------------

    def ask_words(self, job: int, request: SpeakRequest) -> bool:
        with self._lock:  # an alarm's words first: a render is done again later
            for render, (text, _, _) in self._rendering.items():
                self._process.send(wire.encode("cancel", {"job": render}))
                self._to_render.appendleft(text)
            self._rendering.clear()
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

    def handles(self, event: object) -> bool:
        return isinstance(event, EngineReady | KitSound)

    def handle(self, event: object, files: KitFiles) -> None:
        """On the loop's thread: the kit follows what the engine says."""
        if isinstance(event, EngineReady):
            self._process.set_ready(event.ready)
            if event.ready:
                self._kit.voices = dict(event.voices)
                stale = event.model != self._kit.model
                self._model = event.model
                for text in event.phrases:
                    if stale or text not in self._kit.phrases:
                        self._to_render.append(text)
                self._kit_changed = True
                self._render_next()
            if self._words is not None:
                self._words.engine_changed()
        elif isinstance(event, KitSound):
            into = self._kit.chimes if event.kind == "chimes" else self._kit.phrases
            into[event.name] = event.pcm
            if event.kind == "phrases":
                if event.model != self._kit.model:  # a new model: its phrases replace the old
                    self._kit.model = event.model
                seconds = len(event.pcm) / 2 / self._kit.rate
                _LOGGER.info(
                    "Pinned phrase kept by the sounder: %r (%.2f s)", event.name[:64], seconds
                )
                self._render_next()
            self._kit_changed = True
        del files

    def kit_changed(self) -> bool:
        changed, self._kit_changed = self._kit_changed, False
        return changed

    def _render_next(self) -> None:
        """Ask for the next pinned phrase, one at a time, at the lowest class."""
        with self._lock:
            if self._rendering or not self._to_render or not self.ready:
                return
            text = self._to_render.popleft()
            self._render_jobs += 1
            job = self._render_jobs
            self._rendering[job] = (text, bytearray(), self.epoch)
        request = SpeakRequest(f"pinned-{job}", text, priority=Priority.CHAT, chime=False)
        self._process.send(wire.encode("say", {"job": job, "request": request_json(request)}))

    # ---- the speaker's reports of the engine's lane (the ALSA writer's thread) ----------------

    def speaker_report(self, event: Event) -> None:
        """The player's normal lane, told to the engine (its own job numbers); what was of an
        engine that is gone is told to nobody."""
        job = getattr(event, "job", None)
        if job is not None and job >> 32 != self.epoch:
            return
        match event:
            case UtteranceStarted():
                self._process.send(wire.started_frame(replace(event, job=_engine_job(event.job))))
            case UtteranceEnded():
                self._process.send(wire.ended_frame(replace(event, job=_engine_job(event.job))))
            case NormalPreempted(request_id, job, by):
                header = {"id": request_id, "job": _engine_job(job), "by": by}
                self._process.send(wire.encode("preempted", header))
            case AudioStatus():
                self._audio = event  # told again to each engine as it says hello
                self._process.send(wire.audio_frame(event))

    # ---- the pipe's reader thread ---------------------------------------------------------------

    def _frame(self, frame: Frame, epoch: int) -> None:
        handler = _HANDLERS.get(frame.kind)
        if handler is None:
            raise WireError(f"a frame of unknown kind {frame.kind[:32]!r}")
        handler(self, frame, epoch)

    def _hello(self, frame: Frame, epoch: int) -> None:
        del frame, epoch
        for lane in ("normal", "words"):
            for _ in range(CREDITS):
                self._process.send(wire.encode("credit", {"lane": lane}))
        if self._audio is not None:  # the device as it is (its state may be older than this engine)
            self._process.send(wire.audio_frame(self._audio))
        if self.notes:
            self._process.send(wire.encode("notes", {"notes": self.notes}))

    def _connected(self, frame: Frame, epoch: int) -> None:
        del frame, epoch
        if not self._session:
            self._session = True
            self._on_session()

    def _ready(self, frame: Frame, epoch: int) -> None:
        del epoch
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
        ready = EngineReady(frame.flag("ready"), voices, frame.text("model", ""), tuple(phrases))
        self._to_loop(ready)

    def _chunk(self, frame: Frame, epoch: int) -> None:
        chunk = wire.chunk_of(frame)
        with self._relay_changed:
            if len(self._relay) >= CREDITS * 2:
                raise WireError("chunk: more than its credits")
            self._relay.append((epoch, replace(chunk, job=(epoch << 32) | chunk.job)))
            self._relay_changed.notify_all()

    def _words_frame(self, frame: Frame, epoch: int) -> None:
        chunk = wire.chunk_of(frame)
        if chunk.job >= _RENDER_JOBS or self._words is None:
            self._rendered(chunk, epoch)
            self.credit_words()
        else:
            self._words.words(chunk, epoch)  # it gives the credit back

    def _rendered(self, chunk: Chunk, epoch: int) -> None:
        with self._lock:
            entry = self._rendering.get(chunk.job)
            if entry is None or entry[2] != epoch:
                return
            text, pcm, _ = entry
            pcm += chunk.pcm or b""
            if len(pcm) > MAX_SOUND_BYTES:
                chunk = replace(chunk, end=True, detail="too long to keep")
            if chunk.end:
                del self._rendering[chunk.job]
        if chunk.end:
            if chunk.error is None and not chunk.detail and pcm:
                self._to_loop(KitSound("phrases", text, bytes(pcm), self._model))
            else:
                _LOGGER.warning("Pinned phrase %r not rendered: %s", text[:64], chunk.detail)

    def _cut(self, frame: Frame, epoch: int) -> None:
        if self._player is not None:
            self._player.cut((epoch << 32) | frame.integer("job"))

    def _volume(self, frame: Frame, epoch: int) -> None:
        del epoch
        value = frame.number("value")
        if value is None or not 0.0 <= value <= 1.0:
            raise WireError("volume.value: expected 0 to 1")
        if self._player is not None:
            self._player.volume = value

    def _alarm(self, frame: Frame, epoch: int) -> None:
        del epoch
        try:
            request = request_from_json(frame.text("request", limit=wire.MAX_HEADER))
        except ValueError as err:
            raise WireError(f"alarm.request: {err}") from None
        self._to_loop(SpeakReceived(request, Delivery(0, 0)))

    def _chime(self, frame: Frame, epoch: int) -> None:
        del epoch
        if not frame.body or len(frame.body) % 2 or len(frame.body) > MAX_SOUND_BYTES:
            raise WireError("chime: expected 16-bit PCM")
        self._to_loop(KitSound("chimes", frame.text("name", limit=64), frame.body))

    # ---- the relay thread: the engine's lane into the player ----------------------------------

    def _relay_blocking(self) -> None:
        while True:
            with self._relay_changed:
                while not self._relay and not self._stopping:
                    self._relay_changed.wait()
                if self._stopping:
                    return
                epoch, chunk = self._relay.popleft()
            if epoch != self.epoch or self._player is None:
                continue
            self._last_job = chunk.job
            if self._player.put(chunk) and epoch == self.epoch:
                self._process.send(wire.encode("credit", {"lane": "normal"}))

    def _changed(self) -> None:
        """The engine came or went (the keeper's thread): a new one is not ready yet."""
        with self._relay_changed:
            self._relay.clear()
        with self._lock:
            for text, _, _ in self._rendering.values():
                self._to_render.appendleft(text)
            self._rendering.clear()
        if self._player is not None and self._last_job:
            self._player.cut(self._last_job)  # what a lost engine was saying ends here
            self._last_job = 0
        if self._words is not None:
            self._words.engine_changed()


def _engine_job(job: int) -> int:
    return job & 0xFFFFFFFF


_HANDLERS: Final[Mapping[str, Callable[[EngineLink, Frame, int], None]]] = {
    "hello": EngineLink._hello,
    "connected": EngineLink._connected,
    "ready": EngineLink._ready,
    "chunk": EngineLink._chunk,
    "words": EngineLink._words_frame,
    "cut": EngineLink._cut,
    "volume": EngineLink._volume,
    "alarm": EngineLink._alarm,
    "chime": EngineLink._chime,
}
