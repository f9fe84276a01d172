"""The pinned phrases the sounder asks the engine to render, one at a time at the lowest class,
each into the kit when whole: asked again of a new engine, or after an alarm's words (which
cancel a render in progress: alarms first)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Final

from agent.core.messages import Priority, SpeakRequest
from agent.formats.chunk import Chunk
from agent.protocol import engine_wire as wire
from agent.sounder.kit import MAX_SOUND_BYTES
from agent.storage.journal import request_json

_LOGGER = logging.getLogger(__name__)

RENDER_JOBS: Final = 1 << 40
"""Jobs of renders count from here (alarms' jobs are the core's, far below)."""


@dataclass(frozen=True, slots=True)
class KitSound:
    """A sound for the kit: a chime file the engine decoded, or a phrase it rendered."""

    kind: str
    """`chimes` or `phrases`."""
    name: str
    pcm: bytes
    model: str = ""


class PinnedRenders:
    """Phrases to render and the one being rendered (the loop asks, the pipe's reader
    receives, the alarm voice cancels: one lock)."""

    def __init__(self, send: Callable[[bytes], object], kept: Callable[[KitSound], object]) -> None:
        self._send = send
        self._kept = kept
        self._lock = threading.Lock()
        self._waiting: deque[str] = deque()
        self._rendering: dict[int, tuple[str, bytearray, int]] = {}
        """job → (text, PCM so far, the engine's epoch)."""
        self._jobs = RENDER_JOBS
        self.model = ""
        """The model the engine renders with (the kit's phrases are of it once kept)."""

    def want(self, texts: Iterable[str]) -> None:
        with self._lock:
            self._waiting.extend(t for t in texts if t not in self._waiting)

    def next(self, epoch: int) -> None:
        """Ask for the next phrase if none is being rendered."""
        with self._lock:
            if self._rendering or not self._waiting:
                return
            text = self._waiting.popleft()
            self._jobs += 1
            job = self._jobs
            self._rendering[job] = (text, bytearray(), epoch)
        request = SpeakRequest(f"pinned-{job}", text, priority=Priority.CHAT, chime=False)
        self._send(wire.encode("say", {"job": job, "request": request_json(request)}))

    def put_back(self, *, cancel: bool) -> None:
        """The render in progress is done again later (an alarm's words first: `cancel` tells
        the engine to stop it; a lost engine needs no telling)."""
        with self._lock:
            for job, (text, _, _) in self._rendering.items():
                if cancel:
                    self._send(wire.encode("cancel", {"job": job}))
                self._waiting.appendleft(text)
            self._rendering.clear()

    def received(self, chunk: Chunk, epoch: int) -> None:
        """A chunk of a render (the pipe's reader): kept whole at its end."""
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
        if not chunk.end:
            return
        if chunk.error is None and not chunk.detail and pcm:
            self._kept(KitSound("phrases", text, bytes(pcm), self.model))
        else:
            _LOGGER.warning("Pinned phrase %r not rendered: %s", text[:64], chunk.detail)
