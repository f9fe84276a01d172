"""The Wyoming announce target: the port Home Assistant's Wyoming integration connects to as
a *satellite* (`wyoming.satellite_port`), so that `assist_satellite.announce` plays through
the node's own scheduler.

Home Assistant is the client here. It sends `run-satellite` and `describe` (answered with an
`info` whose `satellite` is installed), a `ping` every 2 s (answered `pong`), and for each
announcement `audio-start`, its audio as `audio-chunk`s (16-bit PCM, not paced) and `audio-stop`.
The audio is gathered into a WAV recording (bounded: 60 s of it, or `speak.max_audio_seconds` if
shorter, and no more than `audio.max_queued_media_bytes`) and becomes a request like any other:
recorded audio of the class `wyoming.announce_priority`, with that class's chime (or the default
one), source `wyoming`, queued, preempted by alarms, stopped by `stop`. When its last event goes out
(`finished`, or whatever ended it) the connection is sent `played`, which Home Assistant waits
for. No microphone is offered: the node never asks for a pipeline run, and Home Assistant needs
none to announce.

One connection is served at a time. A new connection from the address that holds the target
replaces the one it holds (Home Assistant reconnects after a network fault while its old
connection may still look open; wyoming-satellite serves the newest too); one from another
address is refused `busy` while the target is held, so no other host on the LAN can take Home
Assistant's announcements from it. The held connection ends when Home Assistant closes it, or
after `wyoming.idle_seconds` without an event (Home Assistant pings every 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import threading
import wave
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.satellite import PauseSatellite, RunSatellite
from wyoming.snd import Played

from agent.core.messages import AudioClip, Notify, Priority, SpeakRequest
from agent.core.reasons import Reason
from agent.link.wyoming.server import UNREADABLE, ClientError, Incoming, peer_address
from agent.settings.declarations import WyomingConfig

_LOGGER = logging.getLogger(__name__)

SOURCE: Final = "wyoming"
"""The `source` of a Wyoming announcement's events."""
ANNOUNCEMENT_TEXT: Final = "(Home Assistant announcement)"
"""What an announcement's request says it is (its audio is what plays)."""
RATES: Final = range(8000, 48001)
"""Sample rates taken (Home Assistant sends 22,050 Hz)."""
WIDTH: Final = 2
"""Bytes per sample taken: 16-bit, what Home Assistant sends."""
CHANNELS: Final = range(1, 3)
"""Channels taken: mono or stereo."""


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one announcement may hold."""

    max_seconds: float
    """`speak.max_audio_seconds` (and the decoder's cap, 60 s): the longest audio taken."""
    max_bytes: int
    """`audio.max_queued_media_bytes` (and the decoder's cap): what could never wait in the
    queue is refused at once."""


class AnnounceTarget:
    """The satellite side: connections served one at a time, announcements handed to the loop,
    `played` sent when the loop reports their end (`notified`, from the loop's thread)."""

    def __init__(
        self,
        config: WyomingConfig,
        describe: Callable[[], Info],
        announce: Callable[[SpeakRequest], object],
        new_id: Callable[[], str],
        limits: Limits,
    ) -> None:
        self._config = config
        self._describe = describe
        self._announce = announce
        self._new_id = new_id
        self._limits = limits
        self._priority = Priority[config.announce_priority.upper()]
        self._lock = threading.Lock()
        self._pending: dict[str, _Satellite] = {}
        """Announcements under way, by request id: the connection owed their `played`."""
        self._current: _Satellite | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, until it ends: it replaces one held from its own address, and is
        refused `busy` while another address holds the target."""
        address = peer_address(writer.get_extra_info("peername"))
        held = self._current
        if held is not None and held.address != address:
            detail = "the announce target is held by another address"
            _LOGGER.info("Wyoming: refused %s: %s", address, detail)
            with contextlib.suppress(Exception):
                error = ClientError(Reason.BUSY, detail).event()
                await asyncio.wait_for(async_write_event(error, writer), 1.0)
            return
        connection = _Satellite(self, reader, writer, address)
        older, self._current = self._current, connection
        if older is not None:
            _LOGGER.info("Wyoming: a newer announce connection from %s replaces its older", address)
            older.close()
        try:
            await connection.run()
        finally:
            if self._current is connection:
                self._current = None

    @property
    def connected(self) -> bool:
        """Home Assistant (or another client) is connected to the announce target."""
        return self._current is not None

    def notified(self, notify: Notify) -> None:
        """A lifecycle event went out (the loop's thread): an announcement's last one sends its
        connection `played`."""
        if not notify.last:
            return
        with self._lock:
            connection = self._pending.pop(notify.id, None)
        if connection is not None:
            connection.played(notify)

    def _request(self, clip: _Clip) -> SpeakRequest:
        return SpeakRequest(
            f"wyoming-{self._new_id()[:16]}",
            ANNOUNCEMENT_TEXT,
            audio=AudioClip(clip.wav()),
            priority=self._priority,
            chime=True,  # the class's chime, or the default one: as the node's announcements
            source=SOURCE,
        )

    async def _hand_over(self, connection: _Satellite, clip: _Clip) -> None:
        """The announcement to the loop (its inbox may make a reporter wait: not on this
        loop's thread)."""
        request = self._request(clip)
        with self._lock:
            self._pending[request.id] = connection
        _LOGGER.info(
            "Wyoming: announcement %s of %.1f s handed to the scheduler", request.id, clip.seconds
        )
        await asyncio.get_running_loop().run_in_executor(None, self._announce, request)

    def _forget(self, connection: _Satellite) -> None:
        with self._lock:
            for request_id in [r for r, c in self._pending.items() if c is connection]:
                del self._pending[request_id]


class _Clip:
    """One announcement's audio as it arrives."""

    def __init__(self, start: AudioStart, limits: Limits) -> None:
        if start.rate not in RATES or start.width != WIDTH or start.channels not in CHANNELS:
            detail = (
                f"audio {start.rate} Hz, {start.width} bytes, {start.channels} channels; "
                f"taken: 8000-48000 Hz, 16-bit, mono or stereo"
            )
            raise ClientError(Reason.UNSUPPORTED_AUDIO, detail)
        self.rate, self.channels = start.rate, start.channels
        self._frame = WIDTH * start.channels
        seconds_bytes = int(limits.max_seconds * start.rate) * self._frame
        self._max_bytes = min(seconds_bytes, limits.max_bytes)
        self._data = bytearray()

    def add(self, chunk: AudioChunk) -> None:
        if (chunk.rate, chunk.width, chunk.channels) != (self.rate, WIDTH, self.channels):
            detail = "an audio-chunk of another format than audio-start"
            raise ClientError(Reason.UNSUPPORTED_AUDIO, detail)
        if len(self._data) + len(chunk.audio) > self._max_bytes:
            raise ClientError(Reason.TOO_LONG, f"announcement audio over {self._max_bytes} bytes")
        self._data += chunk.audio

    @property
    def seconds(self) -> float:
        return len(self._data) / self._frame / self.rate

    def wav(self) -> bytes:
        whole = len(self._data) - len(self._data) % self._frame
        out = io.BytesIO()
        with wave.open(out, "wb") as wav:
            wav.setnchannels(self.channels)
            wav.setsampwidth(WIDTH)
            wav.setframerate(self.rate)
            wav.writeframes(bytes(self._data[:whole]))
        return out.getvalue()


class _Satellite:
    """One connection from Home Assistant: its events in order."""

    def __init__(
        self,
        target: AnnounceTarget,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        address: str | None,
    ) -> None:
        self._target = target
        self._config = target._config
        self._reader = reader
        self._writer = writer
        self.address = address
        """The peer's address (a new connection from it replaces this one)."""
        self._loop = asyncio.get_running_loop()
        self._clip: _Clip | None = None
        self._dropping = False
        """An announcement was refused: its remaining chunks are dropped until its audio-stop."""
        self._writes: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        try:
            incoming = Incoming(self._reader, self._write, self._config.idle_seconds, self.address)
            while True:
                event = await incoming.next()
                if event is None:
                    return
                try:
                    try:
                        await self._handle(event)
                    except UNREADABLE as err:
                        detail = f"{event.type}: a field of the wrong kind ({type(err).__name__})"
                        raise ClientError(Reason.INVALID_FIELD, detail) from None
                except ClientError as err:
                    if self._clip is not None or AudioStart.is_type(event.type):
                        self._clip, self._dropping = None, True  # its audio, to audio-stop
                    await self._write(err.event())
        finally:
            self._target._forget(self)

    def close(self) -> None:
        self._writer.close()

    def played(self, notify: Notify) -> None:
        """From the loop's thread: `played` for an announcement that ended."""

        def send() -> None:
            if self._writer.is_closing():
                return
            task = self._loop.create_task(self._write(Played().event()))
            self._writes.add(task)
            task.add_done_callback(self._written)

        _LOGGER.debug("Wyoming: %s %s: played", notify.id, notify.event)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the agent stops
            self._loop.call_soon_threadsafe(send)

    def _written(self, task: asyncio.Task[None]) -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _LOGGER.info("Wyoming: played not sent: %r", task.exception())

    async def _write(self, event: Event) -> None:
        await asyncio.wait_for(async_write_event(event, self._writer), self._config.write_seconds)

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self._write(self._target._describe().event())
        elif Ping.is_type(event.type):
            await self._write(Pong(text=Ping.from_event(event).text).event())
        elif RunSatellite.is_type(event.type) or PauseSatellite.is_type(event.type):
            _LOGGER.info("Wyoming: announce target: %s", event.type)
        elif AudioStart.is_type(event.type):
            self._dropping = False
            self._clip = _Clip(AudioStart.from_event(event), self._target._limits)
        elif AudioChunk.is_type(event.type):
            if self._dropping:
                return
            if self._clip is None:
                detail = "audio-chunk outside audio-start/-stop"
                raise ClientError(Reason.INVALID_FIELD, detail)
            self._clip.add(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            clip, self._clip, self._dropping = self._clip, None, False
            if clip is None or not clip.seconds:
                _LOGGER.info("Wyoming: an announcement without audio: nothing to play")
                return
            await self._target._hand_over(self, clip)
        else:
            _LOGGER.debug("Wyoming: announce target ignored %s", event.type)
