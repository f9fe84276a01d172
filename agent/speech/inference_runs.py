"""The synthesis worker's inferences as streams it can cut: which activations are cut, which
inference runs now (and its `Cancellation`, ONNX Runtime's terminate), the time spent in them,
the step marker around each, and the wait before each on an urgent gate yielded to. Its lock is
the only state the synthesizer's callers (the loop) and its thread share.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import AbstractContextManager
from typing import Final

from agent.speech.speech_plan import Steps, SynthesisCancelledError
from agent.speech.urgent import UrgentGate
from agent.speech.voice import (
    Audio,
    Cancellation,
    FramePlan,
    StreamCancelledError,
    SynthesisParams,
)

PHRASES: Final = -1
"""The job token of phrase rendering: a request arriving aborts it (it is done again later)."""

Stream = Callable[
    [list[int], SynthesisParams, FramePlan, Cancellation], Generator[Audio, None, None]
]


class InferenceRuns:
    """Cuts, the running inference, its time and its yielding to an urgent gate."""

    def __init__(self, marker: Steps, yields_to: UrgentGate | None) -> None:
        """`yields_to`: a gate to wait on before each inference while it is held."""
        self._marker = marker
        self._yields_to = yields_to
        self._lock = threading.Lock()
        self._cancelled: set[int] = set()
        self._running: tuple[int, Cancellation] | None = None
        self.stopping = threading.Event()
        self.job_cancel = threading.Event()
        """Set when the request being synthesized is cut (ends a wait for its sounds)."""
        self.seconds = 0.0
        """Time spent in inferences since `begin` (the current request's)."""

    def admit(self, job: int) -> None:
        """A request `job` is handed over: cuts of older activations are forgotten, and the
        phrase rendering in progress is aborted (requests go first)."""
        with self._lock:
            self._cancelled = {token for token in self._cancelled if token >= job}
            self._abort_phrases_locked()
        self.wake_gate()

    def abort_phrases(self) -> None:
        """Abort the phrase rendering in progress (a voice switch waits behind it)."""
        with self._lock:
            self._abort_phrases_locked()
        self.wake_gate()

    def cancel(self, job: int) -> None:
        """Cut this activation: abort its running inference; a wait for its sounds ends."""
        with self._lock:
            self._cancelled.add(job)
            self.job_cancel.set()  # a wait for a sound ends; the worker clears it per request
            if self._running is not None and self._running[0] == job:
                self._running[1].cancel()
        self.wake_gate()  # a wait for an urgent request's end ends now

    def stop(self) -> None:
        """Stop: the running inference is aborted, and no other starts."""
        self.stopping.set()
        with self._lock:
            if self._running is not None:
                self._running[1].cancel()
        self.wake_gate()

    def begin(self, token: int) -> None:
        """The worker starts on activation `token` (its sounds' wait armed unless it is cut)."""
        with self._lock:
            if token not in self._cancelled:
                self.job_cancel.clear()
        self.seconds = 0.0

    def is_cut(self, token: int) -> bool:
        """Whether activation `token` is cut or the worker stops."""
        with self._lock:
            cancelled = token in self._cancelled
        return cancelled or self.stopping.is_set()

    def wake_gate(self) -> None:
        """End the current poll of a wait on the gate yielded to (it checks cancellation now);
        called without the lock held."""
        if self._yields_to is not None:
            self._yields_to.wake()

    def streamed(
        self,
        token: int,
        stream: Stream,
        ids: list[int],
        params: SynthesisParams,
        plan: FramePlan,
        *,
        step: tuple[str, str] | None = None,
    ) -> Iterator[Audio]:
        """A voice's stream that `cancel(token)` (or, for phrases, a request) can abort; the time
        spent in it is counted, and marked as `step` (request id, step) of the step marker.
        Before each inference it gives way to an urgent request (`yields_to`): that wait is not
        counted, and a cancel or a stop ends it."""
        cancellation = Cancellation()
        with self._lock:
            if token in self._cancelled or self.stopping.is_set():
                raise SynthesisCancelledError
            self._running = (token, cancellation)
        chunks = stream(ids, params, plan, cancellation)
        try:
            while True:
                self._give_way_blocking(token, cancellation)
                began = time.perf_counter()
                try:
                    with self._marked(step):
                        audio = next(chunks)
                except StopIteration:
                    return
                except StreamCancelledError:
                    raise SynthesisCancelledError from None
                finally:
                    self.seconds += time.perf_counter() - began
                yield audio
        finally:
            chunks.close()
            with self._lock:
                self._running = None

    def _abort_phrases_locked(self) -> None:
        if self._running is not None and self._running[0] == PHRASES:
            self._running[1].cancel()

    def _give_way_blocking(self, token: int, cancellation: Cancellation) -> None:
        """Wait while the gate yielded to is held; SynthesisCancelledError if the stream is cut
        (or the worker stops) meanwhile."""
        gate = self._yields_to
        if gate is None:
            return

        def cancelled() -> bool:
            with self._lock:
                cut = token in self._cancelled
            return cut or cancellation.cancelled or self.stopping.is_set()

        if not gate.wait_clear(cancelled):
            raise SynthesisCancelledError

    def _marked(self, step: tuple[str, str] | None) -> AbstractContextManager[None]:
        return contextlib.nullcontext() if step is None else self._marker.step(*step)
