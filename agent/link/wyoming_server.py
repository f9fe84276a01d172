"""The Wyoming edge: a TCP server of Wyoming events (the `wyoming` package frames and reads
them) on a thread and an asyncio loop of its own, for Home Assistant's Assist pipelines.

`describe` is answered with `info` (one TTS program, every voice and speaker of the node);
`synthesize`, and its streaming form `synthesize-start` / `-chunk` / `-stop`, with audio from a
render worker: a second synthesizer over the node's own voices and phrase cache, one request at
a time, never the player's. Every connection is bounded: its peer must be in `wyoming.allow`,
at most `wyoming.max_clients` are served, an event's data and payload are capped before they are
read, a text (or a stream's whole text) by `wyoming.max_text_chars`, a silent connection is
closed after `wyoming.idle_seconds`, and a client that stops reading is dropped after
`wyoming.write_seconds`, its synthesis cut (the render worker is never held by it). A bad event
is answered with Wyoming's `error` event and the connection goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import queue
import re
import socket
import threading
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Final

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)

from agent.core.messages import SpeakRequest
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk
from agent.protocol.payloads import has_lone_surrogate
from agent.settings.declarations import WyomingConfig

_LOGGER = logging.getLogger(__name__)

LINE_LIMIT: Final = 64 * 1024
"""Bytes an event's header line may have (asyncio's reader refuses a longer line)."""
MAX_PART: Final = 1024 * 1024
"""Bytes of an event's extra data, and of its payload, read at most (a larger `data_length` or
`payload_length` closes the connection before anything is read; a TTS server takes no audio)."""
SEND_BUFFER: Final = 256 * 1024
"""The kernel's send buffer per connection (bytes, about 6 s of audio): a client that stops
reading is found out within `wyoming.write_seconds` of it filling, and holds no more."""
SAMPLES_PER_CHUNK: Final = 1024
"""Samples per `audio-chunk` (wyoming-piper's default)."""
_SENTENCE_END: Final = re.compile(r"[.!?;:\u3002\uff01\uff1f]+[\"')\]]*\s+")
"""Where a streamed text can be cut into sentences to say while the rest arrives."""


UNREADABLE: Final = (TypeError, AttributeError, KeyError, ValueError)
"""What the library raises reading an event of the wrong shape (a JSON list, no `type`, a
`data_length` that is text, `data` that is no object) or a field of the wrong kind."""


class ClientError(Exception):
    """A request the server answers with Wyoming's `error` event (its code, its text)."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = text


class GuardedReader:
    """The stream reader `async_read_event` reads through: a data or payload length beyond
    the caps raises ValueError (the library reads it as the end of the stream) before a byte
    of it is read, so a hostile length can never make the server hold it."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    async def readline(self) -> bytes:
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        if not isinstance(n, int) or n < 0 or n > MAX_PART:
            raise ValueError(f"an event part of {n!r} bytes, at most {MAX_PART}")
        return await self._reader.readexactly(n)


def sentences_ready(text: str) -> tuple[list[str], str]:
    """The complete sentences at the start of a streamed text, and what is left to wait for."""
    done: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        sentence = text[start : match.end()].strip()
        if sentence:
            done.append(sentence)
        start = match.end()
    return done, text[start:]


def allowed(
    peer: object, networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
) -> bool:
    """Whether a peer address (asyncio's `peername`) is in one of the allowed networks."""
    if not isinstance(peer, tuple) or not peer:
        return False
    try:
        address = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in network for network in networks)


@dataclass(slots=True)
class _Render:
    """One request for the render worker, and where its audio goes."""

    request: SpeakRequest
    sink: Callable[[Chunk], bool]
    """Hands one chunk on; False when the client is gone (the synthesis is cut)."""
    done: threading.Event


class RenderDesk:
    """The render worker's queue: requests are synthesized one at a time, in arrival order,
    by a synthesizer whose `put` is this desk's (never the player's)."""

    def __init__(self, capacity: int) -> None:
        self._jobs: queue.Queue[_Render | None] = queue.Queue(maxsize=capacity)
        self._current: _Render | None = None
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._thread = threading.Thread(
            target=self._run_blocking, name="wyoming-render", daemon=True
        )
        self._submit: Callable[[SpeakRequest, int], None] | None = None
        self._cancel: Callable[[int], None] | None = None
        self._token = 0
        self.rendered = 0
        """Requests rendered since start (sentences: a text is one request per sentence)."""

    def bind(
        self, submit: Callable[[SpeakRequest, int], None], cancel: Callable[[int], None]
    ) -> None:
        """The render synthesizer's `submit` and `cancel`."""
        self._submit, self._cancel = submit, cancel

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self._jobs.put_nowait(None)
        with self._lock:
            current = self._current
        if current is not None:
            current.done.set()

    def render(self, request: SpeakRequest, sink: Callable[[Chunk], bool]) -> threading.Event:
        """Queue a request; the event is set once its end went to `sink`. Raises ClientError
        when the queue is full."""
        job = _Render(request, sink, threading.Event())
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise ClientError("busy", "too many requests wait for synthesis") from None
        return job.done

    def put(self, chunk: Chunk) -> bool:
        """The render synthesizer's output: to the current request's sink."""
        with self._lock:
            current, token = self._current, self._token
        if current is None or chunk.job != token:
            return False
        accepted = current.sink(chunk)
        if chunk.end:
            current.done.set()
        elif not accepted and self._cancel is not None:
            self._cancel(chunk.job)
        return accepted

    def _run_blocking(self) -> None:
        assert self._submit is not None  # noqa: S101 - bound by the composition root
        while True:
            job = self._jobs.get()
            if job is None:
                return
            token = next(self._tokens)
            with self._lock:
                self._current, self._token = job, token
            self._submit(job.request, token)
            job.done.wait()
            with self._lock:
                self._current = None
                self.rendered += 1

    @property
    def rendering(self) -> bool:
        """A request is being rendered now."""
        with self._lock:
            return self._current is not None


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
"""What serves one admitted connection."""


class WyomingServer:
    """The server's thread and loop; `start` binds the ports (an error there fails the start):
    `wyoming.port` for text to speech and, given the announce target's handler,
    `wyoming.satellite_port` for it (both behind the same allowlist and connection cap)."""

    def __init__(  # noqa: PLR0917 - the composition root passes every collaborator
        self,
        config: WyomingConfig,
        describe: Callable[[], Info],
        voice_ids: Callable[[], Collection[str]],
        desk: RenderDesk,
        rate: int,
        new_id: Callable[[], str],
        satellite: Handler | None = None,
    ) -> None:
        self._config = config
        self._satellite = satellite if config.satellite_port else None
        self._describe = describe
        self._voice_ids = voice_ids
        self._desk = desk
        self._rate = rate
        self._new_id = new_id
        self._networks = tuple(ipaddress.ip_network(a, strict=False) for a in config.allow)
        self._loop = asyncio.new_event_loop()
        self._servers: list[asyncio.Server] = []
        self._clients = 0
        self._thread = threading.Thread(target=self._loop.run_forever, name="wyoming", daemon=True)
        self.port = config.port
        self.satellite_port: int | None = None
        """The announce target's port once listening (None: none)."""

    def start_rendering(self) -> None:
        """Start the render desk's thread."""
        self._desk.start()

    @property
    def clients(self) -> int:
        """Connections being served."""
        return self._clients

    def start(self) -> None:
        """Listen (the ports are bound before this returns), then serve on the thread. Raises
        OSError naming the key whose port cannot be bound."""
        self.port = self._listen(self._serve, "wyoming.port", self._config.port)
        if self._satellite is not None:
            handler = self._satellite
            port = self._config.satellite_port
            self.satellite_port = self._listen(
                lambda r, w: self._admit(r, w, handler), "wyoming.satellite_port", port
            )
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
        self._desk.stop()
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await self._admit(reader, writer, lambda r, w: _Connection(self, r, w).run())

    async def _admit(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
    ) -> None:
        """A connection served by `handler` if its peer is allowed and there is room."""
        peer = writer.get_extra_info("peername")
        if not allowed(peer, self._networks):
            _LOGGER.warning("Wyoming: refused %s (not in wyoming.allow)", peer)
            writer.close()
            return
        if self._clients >= self._config.max_clients:
            with contextlib.suppress(Exception):
                busy = Error(text="too many connections", code="busy").event()
                await asyncio.wait_for(async_write_event(busy, writer), 1.0)
            writer.close()
            return
        sock = writer.get_extra_info("socket")
        if sock is not None:  # a client that stops reading holds this much of the kernel's
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self._clients += 1
        try:
            await handler(reader, writer)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            _LOGGER.info("Wyoming: %s dropped", peer)
        except asyncio.CancelledError:  # the server stops: ended here, not logged by asyncio
            _LOGGER.debug("Wyoming: %s closed as the server stops", peer)
        finally:
            self._clients -= 1
            writer.close()


class _Connection:
    """One client: its events in order, one request at a time."""

    def __init__(
        self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._config = server._config
        self._reader = GuardedReader(reader)
        self._writer = writer
        self._stream: Synthesize | None = None
        self._pending = ""
        self._streamed = 0

    async def run(self) -> None:
        while True:
            try:
                event = await asyncio.wait_for(
                    async_read_event(self._reader),  # type: ignore[arg-type]  # its two methods
                    self._config.idle_seconds,
                )
            except UNREADABLE as err:  # JSON of another shape: the framing is lost, so it ends
                detail = f"not a Wyoming event: {type(err).__name__}"
                await self._write(Error(text=detail, code="bad-event").event())
                return
            if event is None:
                return
            try:
                try:
                    await self._handle(event)
                except UNREADABLE as err:  # a field of the wrong kind (`Event.from_event`)
                    detail = f"{event.type}: a field of the wrong kind ({type(err).__name__})"
                    raise ClientError("bad-event", detail) from None
            except ClientError as err:
                await self._write(Error(text=err.text, code=err.code).event())

    async def _write(self, event: Event) -> None:
        await asyncio.wait_for(async_write_event(event, self._writer), self._config.write_seconds)

    async def _handle(self, event: Event) -> None:  # noqa: PLR0912 - one branch per kind
        if Describe.is_type(event.type):
            await self._write(self._server._describe().event())
        elif Ping.is_type(event.type):
            await self._write(Pong(text=Ping.from_event(event).text).event())
        elif SynthesizeStart.is_type(event.type):
            start = SynthesizeStart.from_event(event)
            self._stream = Synthesize(text="", voice=start.voice, text_format=start.text_format)
            self._pending, self._streamed = "", 0
        elif SynthesizeChunk.is_type(event.type):
            if self._stream is None:
                raise ClientError("no-stream", "synthesize-chunk outside synthesize-start/-stop")
            text = event.data.get("text", "")
            if not isinstance(text, str):
                raise ClientError("bad-event", "synthesize-chunk: text is no string")
            self._streamed += len(text)
            if self._streamed > self._config.max_text_chars:
                self._stream = None
                detail = f"the stream's text is over {self._config.max_text_chars} characters"
                raise ClientError("too-long", detail)
            ready, self._pending = sentences_ready(self._pending + text)
            for sentence in ready:
                await self._say(sentence, self._stream, start=True, stop=True)
        elif SynthesizeStop.is_type(event.type):
            if self._stream is None:
                raise ClientError("no-stream", "synthesize-stop outside a stream")
            stream, rest = self._stream, self._pending.strip()
            self._stream, self._pending = None, ""
            if rest:
                await self._say(rest, stream, start=True, stop=True)
            await self._write(SynthesizeStopped().event())
        elif Synthesize.is_type(event.type):
            if self._stream is not None:
                return  # sent inside a stream for older servers: the chunks say it
            await self._synthesize(Synthesize.from_event(event))
        else:
            _LOGGER.debug("Wyoming: ignored %s", event.type)

    async def _synthesize(self, synthesize: Synthesize) -> None:
        text = synthesize.text or ""
        if not isinstance(text, str):
            raise ClientError("bad-event", "synthesize: text is no string")
        if len(text) > self._config.max_text_chars:
            detail = f"{len(text)} characters, at most {self._config.max_text_chars}"
            raise ClientError("too-long", detail)
        ready, rest = sentences_ready(text + " ")
        parts = [*ready, rest.strip()] if rest.strip() else ready
        if not parts:
            raise ClientError("no-text", "nothing to say")
        for index, sentence in enumerate(parts):
            await self._say(sentence, synthesize, start=index == 0, stop=index == len(parts) - 1)

    def _request(self, text: str, synthesize: Synthesize) -> SpeakRequest:
        voices = self._server._voice_ids()
        voice, speaker = None, None
        if synthesize.voice is not None:
            if synthesize.voice.name:
                if synthesize.voice.name not in voices:
                    known = ", ".join(sorted(voices))
                    raise ClientError(
                        "unknown-voice", f"no voice {synthesize.voice.name!r} ({known})"
                    )
                voice = synthesize.voice.name
            speaker = synthesize.voice.speaker or None
        if has_lone_surrogate(text):
            raise ClientError(str(Reason.INVALID_UTF8), "a lone surrogate in the text")
        ssml = str(synthesize.text_format or "").lower() == "ssml"
        if ssml:
            raise ClientError("unsupported", "text_format ssml is not served over Wyoming")
        return SpeakRequest(
            f"wyoming-{self._server._new_id()[:16]}", text, voice=voice, speaker=speaker
        )

    async def _say(self, text: str, synthesize: Synthesize, *, start: bool, stop: bool) -> None:
        """One sentence through the render worker; its chunks written as they come."""
        request = self._request(text, synthesize)
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

        done = self._server._desk.render(request, sink)
        rate = self._server._rate
        try:
            if start:
                await self._write(AudioStart(rate=rate, width=2, channels=1).event())
            while True:
                chunk = await chunks.get()
                if chunk.end:
                    if chunk.error is not None and not stop:
                        _LOGGER.info("Wyoming: %s failed: %s", request.id, chunk.detail)
                    if chunk.error is not None:
                        await self._write(AudioStop().event())
                        raise ClientError(str(chunk.error), chunk.detail or str(chunk.error))
                    break
                if chunk.pcm is not None:
                    data = chunk.pcm
                    step = SAMPLES_PER_CHUNK * 2
                    for offset in range(0, len(data), step):
                        part = data[offset : offset + step]
                        await self._write(
                            AudioChunk(rate=rate, width=2, channels=1, audio=part).event()
                        )
            if stop:
                await self._write(AudioStop().event())
        finally:
            gone.set()
            while not chunks.empty():  # release a sink waiting for room
                chunks.get_nowait()
            await asyncio.get_running_loop().run_in_executor(None, done.wait, write_seconds + 5)
