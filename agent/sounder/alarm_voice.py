"""The alarm lane's voice: what the sounder plays for an alarm its core decided to play.

First its chime, from the sounder's own memory, at once. Then its words: a pinned phrase from
the kit when the alarm's text is exactly one (said at once, whatever the engine does); else the
engine is asked to synthesize them (it gives them priority over everything it does) and they
are played as they come. While the words cannot come (the engine starting, loading its voice,
hung, stopped or restarting) the generic alarm phrase is said, once, and the words follow when
they can, until `words_wait` seconds have passed: then the alarm ends `failed`
(`synthesis_error`), its chime and the generic phrase heard.

One thread; the loop reaches it through `submit` and `cancel`; the engine's words arrive through
`words` (from the pipe's reader thread), flow-controlled by credits, so that neither the pipe
nor the loop ever waits on this thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from agent.core.messages import TEXT_REPORTED, Event, SpeakRequest, SynthesisDone
from agent.core.reasons import Reason
from agent.formats.chunk import Chunk

_LOGGER = logging.getLogger(__name__)

WORDS_CREDITS: Final = 2
"""Chunks of words the engine may send ahead of what this thread has handed to the player."""
CRASH_LOOP_DEATHS: Final = 2
"""Engines lost while saying one alarm's words before they are asked no more (its chime and
the generic phrase were heard): a text that kills the engine must not kill every engine."""
GRACE_SECONDS: Final = 1.0
"""How long an alarm's words may take from the ask before the generic phrase is said."""


class Speaker(Protocol):
    """The player's alarm lane."""

    def put_urgent(self, chunk: Chunk) -> bool: ...


class Engine(Protocol):
    """What this voice needs of the engine process."""

    @property
    def ready(self) -> bool:
        """The engine's voice is loaded and it answers."""

    @property
    def answering(self) -> bool:
        """An engine takes asks (its voice may still be loading: it says the words once it
        can, holding its urgent gate meanwhile)."""

    @property
    def epoch(self) -> int:
        """Counts the engine's starts: words of an earlier one are not this one's."""

    def ask_words(self, job: int, request: SpeakRequest) -> bool:
        """Ask for the words of this alarm; False when there is no engine to ask."""

    def cancel_words(self, job: int) -> None: ...

    def credit_words(self) -> None:
        """One more chunk of words may come."""


@dataclass(slots=True)
class _Job:
    request: SpeakRequest
    job: int
    start_at: float | None
    said: list[str] = field(default_factory=list)
    """What was handed to the player, in order: `chime`, `pinned`, `alarm_phrase`, `words`
    (the finished event's `said`)."""


class AlarmVoice:
    """Plays the alarm lane's requests: chime, then pinned words or the engine's."""

    def __init__(  # noqa: PLR0917 - the composition root passes every part
        self,
        speaker: Speaker,
        engine: Engine,
        report: Callable[[Event], object],
        chime_for: Callable[[SpeakRequest], bytes | None],
        pinned: Callable[[SpeakRequest], bytes | None],
        generic: Callable[[], bytes | None],
        words_wait: float,
    ) -> None:
        self._speaker = speaker
        self._engine = engine
        self._report = report
        self._chime_for = chime_for
        self._pinned = pinned
        self._generic = generic
        self._words_wait = words_wait
        self._changed = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._cancelled: set[int] = set()
        self._words: deque[tuple[int, Chunk]] = deque()
        """(engine epoch, chunk) received for the job being said."""
        self._saying: int | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run_blocking, name="alarm-voice", daemon=True)

    # ---- the loop's thread ------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: SpeakRequest, job: int, start_at: float | None) -> None:
        with self._changed:
            self._jobs.append(_Job(request, job, start_at))
            self._changed.notify_all()

    def cancel(self, job: int) -> None:
        with self._changed:
            self._cancelled.add(job)
            self._changed.notify_all()
        self._engine.cancel_words(job)

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join(timeout=5)

    # ---- the pipe's thread ------------------------------------------------------------------

    def words(self, chunk: Chunk, epoch: int) -> None:
        """A chunk of words from the engine (its end says they are all there, or why not)."""
        with self._changed:
            if chunk.job != self._saying:  # a cancelled or earlier job's: room again at once
                stale = True
            else:
                stale = False
                self._words.append((epoch, chunk))
                self._changed.notify_all()
        if stale:
            self._engine.credit_words()

    def engine_changed(self) -> None:
        """The engine became ready, or was lost: a wait for words looks again."""
        with self._changed:
            self._changed.notify_all()

    # ---- its own thread ---------------------------------------------------------------------

    def _run_blocking(self) -> None:
        while True:
            with self._changed:
                while not self._jobs and not self._stopping:
                    self._changed.wait()
                if self._stopping:
                    return
                job = self._jobs.popleft()
                self._saying = job.job
                self._words.clear()
            try:
                error = self._say_blocking(job)
            except Exception as err:  # the lane goes on: this alarm fails, the next is said
                _LOGGER.exception("Saying alarm %s failed", job.request.id)
                error = (Reason.INTERNAL, type(err).__name__)
            reason, detail = error if error is not None else (None, "")
            request = job.request
            said: dict[str, object] = {"said": job.said}
            if reason == Reason.CRASH_LOOP:  # what it was, for whoever must say it another way
                said["text"] = request.text[:TEXT_REPORTED]
            end = Chunk(request.id, end=True, error=reason, detail=detail,
                        info=said, priority=request.priority, job=job.job)  # fmt: skip
            self._speaker.put_urgent(end)
            with self._changed:
                self._saying = None
                self._cancelled.discard(job.job)
                leftover = len(self._words)
                self._words.clear()
            for _ in range(leftover):
                self._engine.credit_words()
            self._report(SynthesisDone(request.id, job.job))

    def _is_cancelled(self, job: _Job) -> bool:
        with self._changed:
            return job.job in self._cancelled or self._stopping

    def _play(self, job: _Job, pcm: bytes | None, what: str) -> bool:
        """Hand PCM to the player's alarm lane (the first with the job's instant, if timed);
        False once the job is cut (or the player stops)."""
        if self._is_cancelled(job):
            return False
        if not pcm:
            return True
        if not job.said or job.said[-1] != what:
            job.said.append(what)
        request = job.request
        chunk = Chunk(request.id, pcm, volume=request.volume, priority=request.priority,
                      job=job.job, start_at=job.start_at)  # fmt: skip
        job.start_at = None  # the player waits for it before the first sample only
        return self._speaker.put_urgent(chunk) and not self._is_cancelled(job)

    def _say_blocking(self, job: _Job) -> tuple[Reason, str] | None:
        request = job.request
        if not self._play(job, self._chime_for(request), "chime"):
            return None
        pinned = self._pinned(request)
        if pinned is not None:
            self._play(job, pinned, "pinned")
            return None
        if not request.text and not request.has_media:
            return None
        return self._words_blocking(job)

    def _words_blocking(self, job: _Job) -> tuple[Reason, str] | None:
        """The engine's words for this alarm, the generic phrase first when they do not come
        in time; None when they were all said (or the job was cut)."""
        deadline = time.monotonic() + self._words_wait
        ask = _Ask(self._engine, job)
        generic_due = True
        while not self._is_cancelled(job):
            now = time.monotonic()
            died = ask.again_if_needed(now)
            if died is not None:
                return died
            if generic_due and ask.late(now):  # the words do not come: the generic phrase
                generic_due = False
                if not self._play(job, self._generic(), "alarm_phrase"):
                    return None
                continue
            if now >= deadline:
                self._engine.cancel_words(job.job)
                return (
                    Reason.SYNTHESIS_ERROR,
                    f"no words came for {self._words_wait:g} s",
                )
            chunk = self._next_words(ask.epoch, deadline - now)
            if chunk is None:
                continue
            generic_due = False  # words are heard: the generic phrase would only interrupt
            deadline = time.monotonic() + self._words_wait  # they come: the wait is for the next
            played = self._play(job, chunk.pcm, "words")
            self._engine.credit_words()  # in the player's buffer: room for the next one
            if not played:
                return None
            if chunk.end:
                return None if chunk.error is None else (chunk.error, chunk.detail)
        return None

    def _next_words(self, epoch: int, wait: float) -> Chunk | None:
        """The next chunk of words of this engine, waiting up to 0.1 s; the caller gives its
        credit back once it is in the player's buffer (so the engine's words synthesizer, and
        the urgent gate it holds, keep pace with the alarm). An earlier engine's chunk is
        credited at once and skipped: its words are asked again."""
        with self._changed:
            if not self._words:
                self._changed.wait(min(0.1, max(0.0, wait)))
            got = self._words.popleft() if self._words else None
        if got is None:
            return None
        from_epoch, chunk = got
        if from_epoch != epoch:
            self._engine.credit_words()
            return None
        return chunk


class _Ask:
    """One alarm's ask for its words: made of each engine in turn, as each becomes ready; an
    engine that goes away while it works on them counts as a death."""

    def __init__(self, engine: Engine, job: _Job) -> None:
        self._engine = engine
        self._job = job
        self.asked_at: float | None = None
        self.epoch = -1
        self._deaths = 0

    def again_if_needed(self, now: float) -> tuple[Reason, str] | None:
        """Ask (again) when no engine has the ask; the crash-loop refusal when engines died
        on these words too often."""
        if self.asked_at is not None and self.epoch == self._engine.epoch:
            return None
        if self.asked_at is not None:  # the engine died on these words (or was killed)
            self._deaths += 1
            if self._deaths >= CRASH_LOOP_DEATHS:
                return (
                    Reason.CRASH_LOOP,
                    f"the synthesis process died {self._deaths} times on its words",
                )
        self.asked_at, self.epoch = None, self._engine.epoch
        if self._engine.answering and self._engine.ask_words(self._job.job, self._job.request):
            self.asked_at = now
        return None

    def late(self, now: float) -> bool:
        """No engine has the ask, its voice is not ready, or its words are later than the
        grace: the generic phrase is due."""
        if self.asked_at is None or not self._engine.ready:
            return True
        return now - self.asked_at > GRACE_SECONDS
