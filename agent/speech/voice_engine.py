"""A voice's inference sessions: attached once loaded (or their failure kept), waited for by
whatever wants audio (a described voice plays cached phrases while they load), and the runs that
take a speaker id or compute a clause group's latent frames at a speaking rate.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final, TypeAlias

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.speech.decoder_parts import Latent, Parts, encode
from agent.speech.sessions import SPEAKER_INPUT, graph_feed, takes

_ENGINE_POLL_S: Final = 0.02
"""How often a wait for a loading voice's sessions looks at its cancellation (seconds)."""

Engine: TypeAlias = ort.InferenceSession | Parts
"""A voice's sessions: the whole model's, or the parts of the split decoder."""


class VoiceEngine:
    """The sessions of one voice (whole, or split for chunked decoding), once loaded."""

    def __init__(self, name: str, default_speaker: int | None) -> None:
        """`name`: the model file's (for the error of a voice that did not load)."""
        self._name = name
        self._default_speaker = default_speaker
        self._ready = threading.Event()
        self._engine: Engine | None = None
        self._error: BaseException | None = None
        self._takes_speaker = False

    def attach(self, engine: Engine) -> bool:
        """The sessions are here: audio no longer waits. Whether they take a speaker id."""
        first = engine.prior if isinstance(engine, Parts) else engine
        self._takes_speaker = takes(first, SPEAKER_INPUT)
        self._engine = engine
        self._ready.set()
        return self._takes_speaker

    def fail(self, error: BaseException) -> None:
        """The sessions did not load: everything waiting for audio gets the error."""
        self._error = error
        self._ready.set()

    @property
    def loaded(self) -> bool:
        """Whether the sessions are loaded (or failed to)."""
        return self._ready.is_set()

    def wait(self, check: Callable[[], None] | None = None) -> Engine:
        """The sessions, once loaded: `check` (a cancellation's) may end the wait by raising."""
        while not self._ready.wait(_ENGINE_POLL_S):
            if check is not None:
                check()
        if self._engine is None:
            raise RuntimeError(f"the voice {self._name} did not load") from self._error
        return self._engine

    @property
    def parts(self) -> Parts | None:
        """The split decoder's parts (None: the voice runs whole); waits for the sessions."""
        engine = self.wait()
        return engine if isinstance(engine, Parts) else None

    @property
    def session(self) -> ort.InferenceSession | None:
        """The whole model's session (None: the voice is split); waits for the sessions."""
        engine = self.wait()
        return None if isinstance(engine, Parts) else engine

    def speaker(self, chosen: int | None) -> npt.NDArray[np.int64] | None:
        """The speaker input for `chosen` (None: the voice's default); None if the sessions
        take none."""
        if not self._takes_speaker:
            return None
        speaker = chosen if chosen is not None else self._default_speaker
        return np.array([speaker or 0], dtype=np.int64)

    def latent(
        self,
        ids: list[int],
        scales: tuple[float, float, float],
        rate: float,
        speaker: npt.NDArray[np.int64] | None,
        options: ort.RunOptions | None,
        *,
        head: bool = True,
    ) -> Latent:
        """The prior over a clause group's ids, its frames resampled to `rate`; `head`: the
        flow may run a head for the first chunk first (`decoder_parts.Latent`). Only on a
        split voice."""
        parts = self.parts
        assert parts is not None  # noqa: S101 - only a split voice has a prior
        if rate == 1.0:
            return encode(parts, ids, scales, speaker, options, head=head)
        feed = graph_feed(ids, scales, speaker)
        outputs = parts.prior.run(list(parts.frames), feed, options)
        arrays = [np.asarray(output, dtype=np.float32) for output in outputs]
        keep = rate_frames(arrays[0].shape[-1], rate)
        kept = [np.ascontiguousarray(a[..., keep]) for a in arrays]
        return Latent(parts, kept, speaker, head=head)


def rate_frames(frames: int, rate: float) -> npt.NDArray[np.intp]:
    """Which of `frames` latent frames make speech `rate` times as fast: round(frames / rate)
    of them (at least one), each the nearest source frame to its place in time, so a token of
    d frames gets about d / rate (a one-frame blank may get none above 1, two below 1)."""
    count = max(1, round(frames / rate))
    places = (np.arange(count, dtype=np.float64) + 0.5) * (frames / count)
    return np.minimum(frames - 1, places.astype(np.intp))
