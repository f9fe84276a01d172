"""The engine's side of the sounder (see `agent/sounder/`): the speaker it plays through, and the
alarm lane it serves. Part of the composition root of the engine process.

- **The speaker** (`player`): what the engine's core and synthesizer know as the player. Chunks of
  the engine's lane go to the sounder, one per credit (the sounder hands out a credit for each
  chunk its player took), so at most a double buffer is in flight; cuts and the volume go too.
  What the sounder's player did (started, ended, preempted by an alarm, the device's state)
  comes back as the reports a local player would make.
- **The alarm lane's words** (`words`): a synthesizer of its own over the same voices and phrase
  cache, which says what the sounder asks (an alarm's words, a pinned phrase to keep), holding the
  urgent gate through an alarm's words so that the engine's own synthesis and Wyoming's renders
  give way to it, its chunks sent one per credit too.
- **What the sounder hears of**: the server the engine's session is subscribed on (and when that
  connection ends), its voice ready (with the voices' facts and the pinned phrases to render),
  alarm-class requests the engine's edges received (handed over, never played here), and decoded
  chime files.
- **The server to use**: the sounder says which server its own session is on; the engine's
  link follows it (`MqttLink.follow`), so that both sessions meet on one broker.

A broken pipe (the sounder gone) stops the engine.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol

from agent.core.catalog import VoiceFacts
from agent.core.messages import (
    Lifecycle,
    NormalPreempted,
    Notify,
    SpeakRequest,
)
from agent.formats.chunk import Chunk
from agent.loop.pipe import Pipe
from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import Frame, WireError
from agent.protocol.inputs import AlarmLaneState, AlarmNotified, SounderNotes, SounderReport
from agent.storage.journal import request_from_json, request_json

_LOGGER = logging.getLogger(__name__)

_POLL_SECONDS: Final = 0.05


class SounderAsks(Protocol):
    """What the sounder asks of the engine, on the pipe's thread (`SounderDuty` answers)."""

    def say_words(self, job: int, request: SpeakRequest) -> None:
        """Say an alarm's words (or a pinned phrase to keep) as job `job` of the words' lane."""
        ...

    def cancel_words(self, job: int) -> None:
        """Those words are no longer wanted (the alarm was cut, or the generic phrase said)."""
        ...

    def sounder_gone(self) -> None:
        """The pipe broke: the engine stops."""
        ...


class _Credits:
    """Room for chunks of one lane at the sounder."""

    def __init__(self) -> None:
        self._semaphore = threading.Semaphore(0)

    def give(self) -> None:
        self._semaphore.release()

    def take(self, gone: Callable[[], bool]) -> bool:
        while not gone():
            if self._semaphore.acquire(timeout=_POLL_SECONDS):
                return True
        return False


class RemotePlayer:
    """The player of the engine: the sounder's normal lane, through the pipe."""

    def __init__(self, link: SpeakerLink) -> None:
        self._link = link
        self._volume = 1.0
        self.underruns = 0
        """The sounder's device's underruns since the sounder started, as it last told them."""

    def open(self) -> None:
        """The sounder opened the device."""

    def start(self) -> None:
        """The sounder's writer runs."""

    def stop(self) -> None:
        self._link.close()

    def put(self, chunk: Chunk) -> bool:
        return self._link.send_chunk("chunk", chunk, self._link.normal_credits)

    def cut(self, job: int) -> None:
        self._link.send(wire.encode("cut", {"job": job}))

    @property
    def volume(self) -> float:
        return self._volume

    @volume.setter
    def volume(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            _LOGGER.warning("Volume %.40r refused: expected a number from 0 to 1", value)
            return
        self._volume = float(value)
        self._link.send(wire.encode("volume", {"value": self._volume}))


class SpeakerLink:
    """The engine's end of the pipe to the sounder."""

    def __init__(self, sock: socket.socket, report: Callable[[SounderReport], object]) -> None:
        self._report = report
        self._stopping = threading.Event()
        self.normal_credits = _Credits()
        self.words_credits = _Credits()
        self.player = RemotePlayer(self)
        self._asks: SounderAsks | None = None
        """Who answers what the sounder asks (set by `hello`: nothing is asked before)."""
        self._leader_lock = threading.Lock()
        self._leader: str | None = None
        """The server the sounder's session is on, as it last said (None: not said yet)."""
        self._follow: Callable[[str], object] | None = None
        self._pipe = Pipe(sock, self._frame, self._broken, "sounder-pipe")

    def start(self) -> None:
        """Read and write the pipe (pings are answered from now on)."""
        self._pipe.start()

    def hello(self, asks: SounderAsks) -> None:
        """Say the engine serves: the sounder gives credits and asks for words from now on,
        answered by `asks`. A pipe that broke before (the sounder killed while this engine
        started) stops the engine now: `_broken` found no one to tell."""
        self._asks = asks
        if self._pipe.broken:
            asks.sounder_gone()  # (told twice if `_broken` ran meanwhile: a stop is a stop)
            return
        self.send(wire.encode("hello"))

    def close(self) -> None:
        self._stopping.set()

    def send(self, frame: bytes) -> bool:
        return self._pipe.send(frame)

    def send_chunk(self, kind: str, chunk: Chunk, credits: _Credits) -> bool:
        """One chunk once the sounder has room for it; False once the sounder is gone."""
        if not credits.take(self._gone):
            return False
        return self.send(wire.chunk_frame(kind, chunk))

    def put_words(self, chunk: Chunk) -> bool:
        return self.send_chunk("words", chunk, self.words_credits)

    def _gone(self) -> bool:
        return self._stopping.is_set() or self._pipe.broken

    # ---- told to the sounder ----------------------------------------------------------------

    def session(self, server: str | None) -> None:
        """On paho's thread: the engine's session is subscribed on `server` (None: its
        connection ended). Never waits."""
        if server is None:
            self.send(wire.encode("disconnected"))
        else:
            self.send(wire.encode("connected", {"server": server}))

    def follow_with(self, follow: Callable[[str], object]) -> None:
        """`follow` hears the sounder's server: the one it said already, and each it says."""
        with self._leader_lock:
            self._follow = follow
            leader = self._leader
        if leader is not None:
            follow(leader)

    def ready(self, voices: Mapping[str, VoiceFacts], model: str, phrases: Sequence[str]) -> None:
        facts = {
            vid: {"language": f.language, "speakers": list(f.speakers),
                  "speaker_count": f.speaker_count}
            for vid, f in voices.items()
        }  # fmt: skip
        header = {"ready": True, "voices": facts, "model": model, "phrases": list(phrases)}
        self.send(wire.encode("ready", header))

    def hand_over(self, request: SpeakRequest) -> None:
        """An alarm-class request one of the engine's edges received: the alarm lane's."""
        self.send(wire.encode("alarm", {"request": request_json(request)}))

    def stop(self, clear: bool, current: bool) -> None:
        """A stop the engine received (Sparkplug's, or the MQTT one the sounder also reads:
        a second stop changes nothing): the alarm lane's too."""
        self.send(wire.encode("stop", {"clear": clear, "current": current}))

    def acknowledge(self, request_id: str) -> None:
        """An ack of an alarm the sounder holds (Sparkplug's Acknowledge, or an MQTT ack the
        sounder read already: a second one is ignored there)."""
        self.send(wire.encode("ack", {"id": request_id}))

    def chime(self, name: str, pcm: bytes) -> None:
        self.send(wire.encode("chime", {"name": name}, pcm))

    # ---- the pipe's reader thread -----------------------------------------------------------

    def _frame(self, frame: Frame) -> None:
        match frame.kind:
            case "ping":
                self.send(wire.encode("pong", {"n": frame.integer("n")}))
            case "credit":
                lane = frame.text("lane")
                (self.normal_credits if lane == "normal" else self.words_credits).give()
            case "say":
                request = self._request(frame)
                if self._asks is not None:
                    self._asks.say_words(frame.integer("job"), request)
            case "cancel":
                job = frame.integer("job")
                if self._asks is not None:
                    self._asks.cancel_words(job)
            case "server":
                self._lead(frame.text("server", limit=wire.MAX_ADDRESS))
            case "underruns":
                self.player.underruns = frame.integer("count")
            case _:
                self._report(_report_of(frame))

    def _lead(self, server: str) -> None:
        with self._leader_lock:
            self._leader = server
            follow = self._follow
        if follow is not None:
            follow(server)

    def _request(self, frame: Frame) -> SpeakRequest:
        try:
            return request_from_json(frame.text("request", limit=wire.MAX_HEADER))
        except ValueError as err:
            raise WireError(f"{frame.kind}.request: {err}") from None

    def _broken(self, why: str) -> None:
        if not self._stopping.is_set():
            _LOGGER.warning("The pipe to the sounder broke (%s): stopping", why)
            self._stopping.set()
            if self._asks is not None:
                self._asks.sounder_gone()


def _report_of(frame: Frame) -> SounderReport:  # noqa: PLR0911 - one return a kind
    """What a frame tells the engine's loop."""
    match frame.kind:
        case "started":
            return wire.started_of(frame)
        case "ended":
            return wire.ended_of(frame)
        case "audio":
            return wire.audio_of(frame)
        case "preempted":
            return NormalPreempted(frame.text("id"), frame.integer("job"), frame.text("by"))
        case "notified":
            return AlarmNotified(_notify(frame))
        case "lane":
            ids = frame.header.get("repeating")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise WireError("lane.repeating: expected ids")
            return AlarmLaneState(frame.flag("speaking"), tuple(ids[:1000]))
        case "notes":
            notes = frame.header.get("notes")
            if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
                raise WireError("notes: expected texts")
            return SounderNotes(tuple(n[:300] for n in notes[:8]))
    raise WireError(f"a frame of unknown kind {frame.kind[:32]!r}")


def _notify(frame: Frame) -> Notify:
    try:
        event = Lifecycle(frame.text("event"))
    except ValueError:
        raise WireError("notified.event: no event the node knows") from None
    return Notify(frame.text("id"), event, dict(frame.mapping("details")))
