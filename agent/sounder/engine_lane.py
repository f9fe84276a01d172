"""The engine's lane into the player: chunks from the pipe's reader relayed by a thread of their
own (the reader never waits on the player), one credit back per chunk the player took, each
job numbered with the engine's epoch so that a lost engine's last utterance is cut and a new
engine's jobs never meet an old one's."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Final, Protocol

from agent.core.messages import (
    AudioStatus,
    Event,
    NormalPreempted,
    UtteranceEnded,
    UtteranceStarted,
)
from agent.formats.chunk import Chunk
from agent.protocol import engine_wire as wire
from agent.protocol.engine_wire import WireError

CREDITS: Final = 2
"""Chunks of each lane the engine may send ahead of the player."""


class Lanes(Protocol):
    """The player as the sounder feeds it."""

    volume: float

    def put(self, chunk: Chunk) -> bool: ...
    def cut(self, job: int) -> None: ...
    @property
    def underruns(self) -> int: ...


def player_job(epoch: int, job: int) -> int:
    """An engine's job as the player knows it (its epoch in the high bits)."""
    return (epoch << 32) | job


def engine_job(job: int) -> int:
    """A player's job as its engine knows it."""
    return job & 0xFFFFFFFF


class EngineLane:
    """The relay of the engine's lane into the player's normal lane."""

    def __init__(self, send: Callable[[bytes], object], epoch: Callable[[], int]) -> None:
        self._send = send
        self._epoch = epoch
        self.player: Lanes | None = None
        self._waiting: deque[tuple[int, Chunk]] = deque()
        self._changed = threading.Condition()
        self._stopping = False
        self._last_job = 0
        """The last job handed to the player (as the player knows it)."""
        self._audio: AudioStatus | None = None
        """What the player last said of the device."""
        self._underruns_told = 0
        """The device's underruns as the engine knows them (a new engine knows none)."""
        self._thread = threading.Thread(
            target=self._relay_blocking, name="engine-lane", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()

    def received(self, chunk: Chunk, epoch: int) -> None:
        """A chunk from the pipe's reader (never waits): WireError beyond its credits."""
        with self._changed:
            if len(self._waiting) >= CREDITS * 2:
                raise WireError("chunk: more than its credits")
            self._waiting.append((epoch, replace(chunk, job=player_job(epoch, chunk.job))))
            self._changed.notify_all()

    def hello(self) -> None:
        """A new engine: its credits, and the device as it is (the state it has may be older)."""
        for _ in range(CREDITS):
            self._send(wire.encode("credit", {"lane": "normal"}))
        if self._audio is not None:
            self._send(wire.audio_frame(self._audio))
        self._underruns_told = 0
        self.tell_underruns()

    def tell_underruns(self) -> None:
        """The device's underrun count, told to the engine when it changed (its state and
        Sparkplug's metric say it)."""
        count = 0 if self.player is None else self.player.underruns
        if count != self._underruns_told:
            self._underruns_told = count
            self._send(wire.encode("underruns", {"count": count}))

    def report(self, event: Event) -> None:
        """What the player did with this lane, told to the engine in its own job numbers
        (the ALSA writer's thread); what was of an engine that is gone is told to nobody."""
        self.tell_underruns()  # first: the event after an underrun comes with its count
        job = getattr(event, "job", None)
        if job is not None and job >> 32 != self._epoch():
            return
        match event:
            case UtteranceStarted():
                self._send(wire.started_frame(replace(event, job=engine_job(event.job))))
            case UtteranceEnded():
                self._send(wire.ended_frame(replace(event, job=engine_job(event.job))))
            case NormalPreempted(request_id, job, by):
                header = {"id": request_id, "job": engine_job(job), "by": by}
                self._send(wire.encode("preempted", header))
            case AudioStatus():
                self._audio = event
                self._send(wire.audio_frame(event))

    def lost(self) -> None:
        """The engine came or went: what waits is dropped, what it was saying is cut."""
        with self._changed:
            self._waiting.clear()
        if self.player is not None and self._last_job:
            self.player.cut(self._last_job)
            self._last_job = 0

    def _relay_blocking(self) -> None:
        while True:
            with self._changed:
                while not self._waiting and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
                epoch, chunk = self._waiting.popleft()
            if epoch != self._epoch() or self.player is None:
                continue
            self._last_job = chunk.job
            if self.player.put(chunk) and epoch == self._epoch():
                self._send(wire.encode("credit", {"lane": "normal"}))
