"""The Wyoming edge: a TCP server of Wyoming events on a thread and an asyncio loop of its own,
for Home Assistant's Assist pipelines.

`describe` is answered with `info` (one TTS program, every voice and speaker of the node);
`synthesize`, and its streaming form `synthesize-start` / `-chunk` / `-stop`, with audio from
the render desk (`render`): a second synthesizer over the node's own voices and phrase
cache, one request at a time, never the player's.

A Wyoming text becomes a request as a speak message's text does (`Intake`): the same typed
`SpeakRequest`, the same checks of its voice, speaker and language (`payloads.SPEAK_FIELDS`),
the same text rules and bounds (`payloads.finish_request`: `speak.max_text_chars`), the same
admission (`core.admission`: the voice, the speaker), and every refusal is Wyoming's `error`
event whose code is one of the core's reasons. A `synthesize` is one request, bounded by
`speak.max_audio_seconds` as any other; a stream is cut into sentences as it arrives by the
text front end's linear cutter (`text.TextCutter`), each sentence said as soon as it is whole.

Every connection is bounded: its peer must be in `wyoming.allow`; each port serves at most
`wyoming.max_clients` connections, and at most `wyoming.max_clients_per_peer` from one address;
an event is read with its bounds checked from its header (`framing`); a silent
connection is closed after `wyoming.idle_seconds`, and a client that stops reading is dropped
after `wyoming.write_seconds`, its synthesis cut (the render worker is never held by it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from agent.core.admission import Admission
from agent.core.messages import Rejection, SpeakRequest
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk
from agent.formats.text import TextCutter
from agent.link.wyoming.framing import LINE_LIMIT, UnreadableError, read_event
from agent.link.wyoming.render import DeskFullError, RenderDesk
from agent.protocol.payloads import SPEAK_FIELDS, SpeakLimits, finish_request
from agent.settings.declarations import WyomingConfig

_LOGGER = logging.getLogger(__name__)

SOURCE: Final = "wyoming"
"""The `source` of the requests of the Wyoming edge."""
SEND_BUFFER: Final = 256 * 1024
"""The kernel's send buffer per connection (bytes, about 6 s of audio): a client that stops
reading is found out within `wyoming.write_seconds` of it filling, and holds no more."""
SAMPLES_PER_CHUNK: Final = 1024
"""Samples per `audio-chunk` (wyoming-piper's default)."""
DEFAULT_VOICE: Final = "default"
"""The voice of a request that names none and no language (wyoming-piper's default voice)."""
LIVENESS_SECONDS: Final = 1.0
"""How often a client waiting for audio checks that the render desk's thread still runs."""

_STREAM_EVENTS: Final = frozenset(
    e.event().type for e in (SynthesizeStart(), SynthesizeChunk(text=""), SynthesizeStop())
)
"""The events of Wyoming's streaming form of `synthesize`."""
UNREADABLE: Final = (TypeError, AttributeError, KeyError, ValueError)
"""What the library raises reading a field of the wrong kind (`Event.from_event`)."""


class ClientError(Exception):
    """A request the server answers with Wyoming's `error` event: one of the core's reasons
    as its code, and what went wrong as its text."""

    def __init__(self, reason: Reason, text: str) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text

    @classmethod
    def of(cls, rejection: Rejection) -> ClientError:
        """The refusal of the core's rules, as Wyoming says it."""
        where = f"{rejection.field}: " if rejection.field else ""
        return cls(rejection.reason, f"{where}{rejection.detail}")

    def event(self) -> Event:
        return Error(text=self.text, code=str(self.reason)).event()


def peer_address(peer: object) -> str | None:
    """A peer's address (asyncio's `peername`) as text, an IPv4-mapped IPv6 one as IPv4; None
    when it is none."""
    if not isinstance(peer, tuple) or not peer:
        return None
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def allowed(
    peer: object, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
) -> bool:
    """Whether a peer address (asyncio's `peername`) is in one of the allowed networks."""
    address = peer_address(peer)
    return address is not None and any(
        ipaddress.ip_address(address) in network for network in networks
    )


class Slots:
    """The connections of one port: at most `total`, at most `per_peer` from one address.
    Used on the server's loop only."""

    def __init__(self, total: int, per_peer: int) -> None:
        self._total = total
        self._per_peer = per_peer
        self._held: Counter[str] = Counter()

    @property
    def count(self) -> int:
        """Connections served now."""
        return self._held.total()

    def take(self, address: str) -> str | None:
        """Take a slot for a connection from `address`; why not, if there is none."""
        if self._held.total() >= self._total:
            return f"all {self._total} connections of this port are taken"
        if self._held[address] >= self._per_peer:
            return f"{address} holds {self._per_peer} connections of this port already"
        self._held[address] += 1
        return None

    def give(self, address: str) -> None:
        """Give back a slot taken for `address`."""
        self._held[address] -= 1
        if self._held[address] <= 0:
            del self._held[address]


@dataclass(frozen=True, slots=True)
class Asked:
    """What a Wyoming request asks for besides its text (its `voice` object): a voice by name,
    a speaker, or a language (a name comes first, as in the `wyoming` package)."""

    voice: str | None = None
    speaker: str | None = None
    lang: str | None = None


_VOICE_FIELDS: Final = (("name", "voice"), ("speaker", "speaker"), ("language", "lang"))
"""Wyoming's voice fields and the speak message's fields they are."""


class Intake:
    """How a Wyoming text becomes a request: by the speak message's rules and the core's
    admission, every refusal a `ClientError` with the core's reason."""

    def __init__(self, admission: Admission, limits: SpeakLimits, new_id: Callable[[], str]):
        self._admission = admission
        self._limits = limits
        self._new_id = new_id

    @property
    def max_text_chars(self) -> int:
        """The longest text of a request (`speak.max_text_chars`)."""
        return self._limits.max_text_chars

    def asked(self, data: Mapping[str, Any]) -> Asked:
        """The voice, speaker and language of a `synthesize` or `synthesize-start` (checked as
        the speak message's `voice`, `speaker` and `lang`), refusing a text format but text."""
        text_format = data.get("text_format")
        if text_format not in (None, "text"):  # the raw value: the library may make an enum
            shown = text_format if isinstance(text_format, str) else type(text_format).__name__
            detail = f"text_format {shown[:32]!r}: the node takes plain text over Wyoming"
            raise ClientError(Reason.UNSUPPORTED, detail)
        raw = data.get("voice")
        if raw is None:
            return Asked()
        if not isinstance(raw, dict):
            raise ClientError(Reason.INVALID_FIELD, "voice: expected an object")
        values: dict[str, str] = {}
        for key, field in _VOICE_FIELDS:
            value = raw.get(key)
            if value is None or value == "":
                continue
            checked, problem = SPEAK_FIELDS[field](value)
            if problem is not None:
                raise ClientError(Reason.INVALID_FIELD, f"voice.{key}: {problem}")
            values[field] = str(checked)
        if "voice" in values:
            values.pop("lang", None)
        return Asked(**values)

    def request(self, text: object, asked: Asked) -> SpeakRequest:
        """The request for a text, decided as a speak message's is."""
        if not isinstance(text, str):
            raise ClientError(Reason.INVALID_FIELD, "text: expected a string")
        request = SpeakRequest(
            f"wyoming-{self._new_id()[:16]}",
            text,
            voice=asked.voice,
            speaker=asked.speaker,
            lang=asked.lang,
            source=SOURCE,
        )
        finished = finish_request(request, self._limits)
        if isinstance(finished, Rejection):
            raise ClientError.of(finished)
        decided = self._admission.voice_of(finished, DEFAULT_VOICE)
        if isinstance(decided, Rejection):
            raise ClientError.of(decided)
        refusal = self._admission.refusal(decided, 0.0)  # no `at`: the time plays no part
        if refusal is not None:
            raise ClientError.of(refusal)
        return decided


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""What serves one admitted connection."""


class WyomingServer:
    """The server's thread and loop; `start` binds the ports (an error there fails the start):
    `wyoming.port` for text to speech and, given the announce target's handler,
    `wyoming.satellite_port` for it (both behind the same allowlist, each with its own
    connection slots)."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        config: WyomingConfig,
        describe: Callable[[], Info],
        intake: Intake,
        desk: RenderDesk[Any],
        rate: int,
        satellite: Handler | None = None,
    ) -> None:
        self._config = config
        self._satellite = satellite if config.satellite_port else None
        self._describe = describe
        self.intake = intake
        self.desk = desk
        self.rate = rate
        self._networks = tuple(ipaddress.ip_network(a, strict=False) for a in config.allow)
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._slots = [Slots(config.max_clients, config.max_clients_per_peer) for _ in range(2)]
        """The TTS port's slots, then the announce target's."""
        self._thread = threading.Thread(target=self._loop.run_forever, name="wyoming", daemon=True)
        self.port = config.port
        self.satellite_port: int | None = None
        """The announce target's port once listening (None: none)."""

    def start_rendering(self) -> None:
        """Start the render desk's thread."""
        self.desk.start()

    @property
    def clients(self) -> int:
        """Connections being served (both ports)."""
        return sum(slots.count for slots in self._slots)

    def describe(self) -> Info:
        """The `info` answer."""
        return self._describe()

    def start(self) -> None:
        """Listen (the ports are bound before this returns), then serve on the thread. Raises
        OSError naming the key whose port cannot be bound."""
        tts, announce = self._slots

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._admit(reader, writer, lambda r, w: _Connection(self, r, w).run(), tts)

        self.port = self._listen(serve, "wyoming.port", self._config.port)
        if self._satellite is not None:
            handler = self._satellite

            async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await self._admit(reader, writer, handler, announce)

            port = self._config.satellite_port
            self.satellite_port = self._listen(target, "wyoming.satellite_port", port)
        self._thread.start()
        _LOGGER.info(
            "Wyoming: serving on %s:%d%s",
            self._config.host,
            self.port,
            f", the announce target on {self.satellite_port}" if self.satellite_port else "",
        )

    def _listen(self, handler: Handler, key: str, port: int) -> int:
        try:
            server = self._loop.run_until_complete(
                asyncio.start_server(handler, self._config.host, port, limit=LINE_LIMIT)
            )
        except OSError as err:
            raise OSError(err.errno, f"{key} {self._config.host}:{port}: {err.strerror}") from err
        self._servers.append(server)
        bound: int = server.sockets[0].getsockname()[1]
        return bound

    def stop(self) -> None:
        """Close the server and every connection, then the render desk."""
        self.desk.stop()
        if not self._thread.is_alive():
            return

        async def close() -> None:
            for server in self._servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    async def _admit(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        handler: Handler,
        slots: Slots,
    ) -> None:
        """A connection served by `handler` if its peer is allowed and a slot is free."""
        peer = writer.get_extra_info("peername")
        address = peer_address(peer)
        if address is None or not allowed(peer, self._networks):
            _LOGGER.warning("Wyoming: refused %s (not in wyoming.allow)", peer)
            writer.close()
            return
        problem = slots.take(address)
        if problem is not None:
            _LOGGER.info("Wyoming: refused %s: %s", peer, problem)
            with contextlib.suppress(Exception):
                busy = ClientError(Reason.BUSY, problem).event()
                await asyncio.wait_for(async_write_event(busy, writer), 1.0)
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a client that stops reading holds this much of the kernel's
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        try:
            await handler(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            _LOGGER.info("Wyoming: %s dropped", peer)
        except asyncio.CancelledError:  # the server stops: ended here, not logged by asyncio
            _LOGGER.debug("Wyoming: %s closed as the server stops", peer)
        finally:
            slots.give(address)
            writer.close()


class Incoming:
    """A connection's events as it can serve them. An unreadable one is answered with `error`
    (its reason as code) and skipped, or ends the connection when the framing is lost; the
    first of a connection is logged at INFO, later ones at DEBUG (a host that sends nothing
    else cannot fill the log)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        write: Callable[[Event], Awaitable[None]],
        idle_seconds: float,
        peer: object,
    ) -> None:
        self._reader = reader
        self._write = write
        self._idle_seconds = idle_seconds
        self._peer = peer
        self._level = logging.INFO

    async def next(self) -> Event | None:
        """The next event to serve (None: the connection ends)."""
        while True:
            try:
                return await asyncio.wait_for(read_event(self._reader), self._idle_seconds)
            except UnreadableError as err:
                detail = err.detail
                _LOGGER.log(
                    self._level, "Wyoming: %s sent an unreadable event: %s", self._peer, detail
                )
                self._level = logging.DEBUG
                await self._write(ClientError(err.reason, err.detail).event())
                if err.lost:
                    return None


class _Connection:
    """One client of the TTS port: its events in order, one request at a time."""

    def __init__(
        self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._intake = server.intake
        self._config = server._config
        self._reader = reader
        self._writer = writer
        self._peer = writer.get_extra_info("peername")
        self._address = peer_address(self._peer) or ""
        self._stream: tuple[Asked, TextCutter] | None = None

    async def run(self) -> None:
        incoming = Incoming(self._reader, self._write, self._config.idle_seconds, self._peer)
        while True:
            event = await incoming.next()
            if event is None:
                return
            try:
                try:
                    await self._handle(event)
                except UNREADABLE as err:  # a field of the wrong kind (`Event.from_event`)
                    detail = f"{event.type}: a field of the wrong kind ({type(err).__name__})"
                    raise ClientError(Reason.INVALID_FIELD, detail) from None
            except ClientError as err:
                await self._write(err.event())

    async def _write(self, event: Event) -> None:
        await asyncio.wait_for(async_write_event(event, self._writer), self._config.write_seconds)

    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self._write(self._server.describe().event())
        elif Ping.is_type(event.type):
            await self._write(Pong(text=Ping.from_event(event).text).event())
        elif event.type in _STREAM_EVENTS:
            await self._streamed(event)
        elif Synthesize.is_type(event.type):
            if self._stream is not None:
                return  # sent inside a stream for older servers: the chunks say it
            request = self._intake.request(event.data.get("text"), self._intake.asked(event.data))
            await self._say(request, streamed=False)
        else:
            _LOGGER.debug("Wyoming: ignored %s", event.type)

    async def _streamed(self, event: Event) -> None:
        """`synthesize-start`, `-chunk` or `-stop`: each sentence said once it is whole."""
        if SynthesizeStart.is_type(event.type):
            self._stream = None
            cutter = TextCutter(self._intake.max_text_chars, every_sentence=True)
            self._stream = (self._intake.asked(event.data), cutter)
            return
        if self._stream is None:
            raise ClientError(Reason.INVALID_FIELD, f"{event.type} outside a stream")
        asked, cutter = self._stream
        if SynthesizeChunk.is_type(event.type):
            text = event.data.get("text")
            if not isinstance(text, str):
                raise ClientError(Reason.INVALID_FIELD, f"{event.type}: text: expected a string")
            for cut in cutter.feed(text):
                await self._say_sentence(cut.text, asked)
            return
        self._stream = None  # synthesize-stop
        for cut in cutter.end():
            await self._say_sentence(cut.text, asked)
        await self._write(SynthesizeStopped().event())

    async def _say_sentence(self, text: str, asked: Asked) -> None:
        """One sentence of a stream: said, or its refusal answered (the stream goes on); a
        sentence with nothing to say is skipped."""
        if not text.strip():
            return
        try:
            request = self._intake.request(text.strip(), asked)
        except ClientError as err:
            if err.reason != Reason.EMPTY_TEXT:
                await self._write(err.event())
            return
        await self._say(request, streamed=True)

    async def _say(self, request: SpeakRequest, *, streamed: bool) -> None:
        """One request through the render desk: `audio-start`, its chunks as they come, and
        `audio-stop`; a failure's `error` comes before the `audio-stop` (a one-shot client reads
        nothing after it). A sentence of a stream with no speech in it is no failure."""
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[Chunk] = asyncio.Queue(maxsize=64)
        gone = threading.Event()
        write_seconds = self._config.write_seconds

        def sink(chunk: Chunk) -> bool:  # on the render thread
            if gone.is_set():
                return False
            future = asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop)
            try:
                future.result(timeout=write_seconds)
            except Exception:  # noqa: BLE001 - a stalled or closed client: cut its synthesis
                future.cancel()
                gone.set()
                return False
            return True

        try:
            done = self._server.desk.render(request, sink, self._address)
        except DeskFullError:
            raise ClientError(Reason.QUEUE_FULL, "too many requests wait for synthesis") from None
        rate = self._server.rate
        try:
            await self._write(AudioStart(rate=rate, width=2, channels=1).event())
            failure = await self._relay(chunks, rate)
            if failure is not None and not (streamed and failure.reason == Reason.NO_SPEECH):
                _LOGGER.info("Wyoming: %s failed: %s", request.id, failure.text)
                await self._write(failure.event())
            await self._write(AudioStop().event())
        finally:
            gone.set()
            while not chunks.empty():  # release a sink waiting for room
                chunks.get_nowait()
            await loop.run_in_executor(None, done.wait, write_seconds + 5)

    async def _relay(self, chunks: asyncio.Queue[Chunk], rate: int) -> ClientError | None:
        """A request's audio written as it comes, until its end; the failure it ended with."""
        step = SAMPLES_PER_CHUNK * 2
        while True:
            chunk = await self._next(chunks)
            if chunk.end:
                if chunk.error is None:
                    return None
                return ClientError(Reason(chunk.error), chunk.detail or str(chunk.error))
            if chunk.pcm is not None:
                data = chunk.pcm
                for offset in range(0, len(data), step):
                    part = data[offset : offset + step]
                    audio = AudioChunk(rate=rate, width=2, channels=1, audio=part)
                    await self._write(audio.event())

    async def _next(self, chunks: asyncio.Queue[Chunk]) -> Chunk:
        """The next chunk, however long a render waits (for the desk, or for an alarm), as long
        as the render desk's thread runs."""
        while True:
            try:
                return await asyncio.wait_for(chunks.get(), LIVENESS_SECONDS)
            except TimeoutError:
                if not self._server.desk.alive:
                    raise ClientError(Reason.INTERNAL, "the render worker stopped") from None
