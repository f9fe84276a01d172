"""The Wyoming render desk: requests of Wyoming clients synthesized one at a time by the render
synthesizer (a second synthesizer over the node's voices and phrase cache, whose `put` is the
desk's, never the player's). Each peer (a client address) has its turn: the next request is the
oldest of the peer served least recently, so a host with many connections delays another's
request by one of its own at most, and the desk's room (`capacity`) bounds them all.

The desk's thread is the only one that hands the render synthesizer anything: a request once
the one before it ended, and voice switches (a model update, a rollback) between requests,
however many arrive meanwhile (the latest of each voice id counts). So the synthesizer's bounded
command queue is never full when the desk hands it something, and a hand-over that still finds
it full waits for room instead of raising. A request that cannot be handed over ends with an
error chunk (`internal`), never with silence: a client's wait ends either way.
"""

from __future__ import annotations

import functools
import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Final, Generic, Protocol, TypeVar

from agent.core.messages import SpeakRequest
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk

_LOGGER = logging.getLogger(__name__)

RETRY_SECONDS: Final = 0.01
"""How long the desk waits for room in the synthesizer's command queue before it tries again
(the synthesizer takes its commands within its poll, 0.2 s)."""

VoiceT = TypeVar("VoiceT")
VoiceT_contra = TypeVar("VoiceT_contra", contravariant=True)


class Renderer(Protocol[VoiceT_contra]):
    """What the desk drives: the render synthesizer (`synthesizer.Synthesizer`)."""

    def submit(self, request: SpeakRequest, job: int = 0, start_at: float | None = None) -> None:
        """Hand over a request (raises queue.Full when its commands are full)."""

    def use_voice(self, choice: VoiceT_contra) -> None:
        """Replace a voice (raises queue.Full when its commands are full)."""

    def cancel(self, job: int) -> None:
        """Stop synthesizing this job."""

    def start(self) -> None:
        """Start its thread."""

    def stop(self) -> None:
        """Stop its thread."""


class DeskFullError(Exception):
    """The desk's queue is full: the request is refused (`busy`)."""


@dataclass(slots=True)
class Render:
    """One request for the render worker, and where its audio goes."""

    request: SpeakRequest
    sink: Callable[[Chunk], bool]
    """Hands one chunk on; False when the client is gone (the synthesis is cut)."""
    done: threading.Event


class RenderDesk(Generic[VoiceT]):
    """The render worker's queue and thread."""

    def __init__(self, capacity: int, voice_id: Callable[[VoiceT], str]) -> None:
        self._capacity = capacity
        self._voice_id = voice_id
        self._waiting: dict[str, deque[Render]] = {}
        """Requests waiting, by peer; the peers in turn order (served last: at the end)."""
        self._count = 0
        self._switches: dict[str, VoiceT] = {}
        """Voice switches not handed over yet, the latest per voice id."""
        self._condition = threading.Condition()
        self._stopping = False
        self._current: Render | None = None
        self._token = 0
        self._tokens = itertools.count(1)
        self._renderer: Renderer[VoiceT] | None = None
        self._thread = threading.Thread(
            target=self._run_blocking, name="wyoming-render", daemon=True
        )
        self.rendered = 0
        """Requests rendered since start."""

    def bind(self, renderer: Renderer[VoiceT]) -> None:
        """The render synthesizer (before `start`)."""
        self._renderer = renderer

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the desk's thread runs (a client waits on it only while it does)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        """End the thread; every request still waiting, and the current one, ends."""
        with self._condition:
            self._stopping = True
            waiting = [job for jobs in self._waiting.values() for job in jobs]
            waiting += [self._current] if self._current else []
            self._waiting.clear()
            self._count = 0
            self._condition.notify_all()
        for job in waiting:
            job.done.set()

    def render(
        self, request: SpeakRequest, sink: Callable[[Chunk], bool], peer: str = ""
    ) -> threading.Event:
        """Queue a request of `peer`; the event is set once its end went to `sink`. Raises
        DeskFullError when the desk is full."""
        job = Render(request, sink, threading.Event())
        with self._condition:
            if self._count >= self._capacity:
                raise DeskFullError
            self._waiting.setdefault(peer, deque()).append(job)
            self._count += 1
            self._condition.notify_all()
        return job.done

    def use_voice(self, choice: VoiceT) -> None:
        """A voice switch for the render synthesizer: handed over before the next request
        (never raises, however many arrive during a render)."""
        with self._condition:
            self._switches[self._voice_id(choice)] = choice
            self._condition.notify_all()

    def put(self, chunk: Chunk) -> bool:
        """The render synthesizer's output: to the current request's sink."""
        with self._condition:
            current, token = self._current, self._token
        if current is None or chunk.job != token:
            return False
        accepted = current.sink(chunk)
        if chunk.end:
            current.done.set()
        elif not accepted and self._renderer is not None:
            self._renderer.cancel(chunk.job)
        return accepted

    @property
    def rendering(self) -> bool:
        """A request is being rendered now."""
        with self._condition:
            return self._current is not None

    def _run_blocking(self) -> None:
        renderer = self._renderer
        assert renderer is not None  # noqa: S101 - bound by the composition root
        while True:
            with self._condition:
                while not (self._stopping or self._count or self._switches):
                    self._condition.wait()
                if self._stopping:
                    return
                switches = list(self._switches.values())
                self._switches.clear()
                job = self._next()
                if job is not None:
                    token = next(self._tokens)
                    self._current, self._token = job, token
            for choice in switches:
                self._hand_over(functools.partial(renderer.use_voice, choice))
            if job is None:
                continue
            if not self._hand_over(functools.partial(renderer.submit, job.request, token)):
                end = Chunk(job.request.id, end=True, job=token)
                job.sink(replace(end, error=Reason.INTERNAL, detail="the render worker stopped"))
                job.done.set()
            job.done.wait()
            with self._condition:
                self._current = None
                self.rendered += 1

    def _next(self) -> Render | None:
        """The oldest request of the peer whose turn it is (under the lock); that peer goes to
        the end of the turn order."""
        for peer in self._waiting:
            jobs = self._waiting.pop(peer)
            job = jobs.popleft()
            if jobs:
                self._waiting[peer] = jobs
            self._count -= 1
            return job
        return None

    def _hand_over(self, command: Callable[[], None]) -> bool:
        """One command to the render synthesizer, waiting for room in its queue (its commands
        come from this thread only: room comes within its poll); False once the desk stops."""
        while True:
            try:
                command()
            except queue.Full:
                with self._condition:
                    if self._stopping:
                        return False
                    self._condition.wait(RETRY_SECONDS)
                continue
            return True
