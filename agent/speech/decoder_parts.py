"""The split decoder at run time: the prior, flow and decoder sessions of a split voice, a clause
group's latent frames, and their decoding in ranges with context (docs/measurements.md, "Split
decoder").

At load a VITS graph is split in three parts (`split_graph`): the prior (text encoder and
duration predictor: phoneme ids to the latent frames `z_p` and their mask), the flow (`z_p` to
`z`) and the decoder (`z`, [1, 192, frames], to 256 samples a frame). The flow and the decoder
are convolutional, so a range of frames can be run with enough frames of context on each side
and cropped. The parts are built once per model, in child processes (`python -m
agent.speech.split_graph`, the only time `onnx` is needed, then `python -m
agent.speech.decoder_build`), measured, checked against the whole model, and cached as optimized
models beside a JSON record of the verdict; a voice whose parts do not give the whole model's
samples runs whole.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from agent.speech.sessions import (
    PER_UTTERANCE,
    SPEAKER_INPUT,
    Feed,
    cached_session,
    graph_feed,
    load_optimized,
    read_cached,
    takes,
)

_LOGGER = logging.getLogger(__name__)

Audio = npt.NDArray[np.float32]

CONTEXT_MARGIN_FRAMES: Final = 1
"""Context frames beyond a part's receptive field. The flow and the decoder run a range of
frames with context on each side, then crop it; the context is measured per voice at build
(the frames over which the output responds to one changed input frame, rounded up) plus this.
On the joe voice: decoder +-10.1 frames, so 12; flow +-32 frames (4 coupling layers of 4
convolutions with kernel 5), so 33 (docs/measurements.md)."""
FLOW_SPLIT_MIN_FRAMES: Final = 96
"""The flow runs as a head (what the first decoder chunk needs) and a rest only when the rest
is at least this long; otherwise whole."""
SPLIT_TOLERANCE: Final = 2.0 / 32767.0
"""Largest sample difference accepted, at build, between the parts and the whole model and
between chunked and whole decoding (2 steps of 16-bit PCM; measured: 0 and 5e-7)."""
SPLIT_FORMAT: Final = 3
"""Version of the split and its cache entries: a change leaves old entries unused (2: weights
in a data file beside each part, sealed; 3: the streaming decoder beside them)."""
STREAM_PART: Final = "stream"
"""The streaming decoder's file among the parts (`part_path(stem, STREAM_PART)`)."""


@dataclass(frozen=True, slots=True)
class Geometry:
    """Samples per latent frame, and the context frames each convolutional part needs."""

    hop: int
    decoder_context: int
    flow_context: int


@dataclass(frozen=True, slots=True)
class StreamSpec:
    """How the streaming decoder (`stream_graph`) is run: the latent frames in, `end` saying
    whether a chunk is a clause group's last, and each state carried from a chunk's outputs to
    the next chunk's inputs (zeros of `lead` + [initial] at a clause group's start)."""

    end: str
    lag: int
    """Samples a chunk's audio ends before the end of its frames (given by the last chunk)."""
    first: int
    """Fewest frames in a clause group's first chunk (unless it is also the last): enough for
    every layer to give output."""
    states: tuple[tuple[str, str, tuple[int, ...], int], ...]
    """(input, output, lead dimensions, initial frames) of each state."""

    @classmethod
    def from_record(cls, known: Mapping[str, Any]) -> StreamSpec:
        """From a verdict's `stream` (raises KeyError, TypeError or ValueError when damaged)."""
        states = tuple(
            (
                str(name),
                str(state["next"]),
                tuple(int(d) for d in state["lead"]),
                int(state["initial"]),
            )
            for name, state in dict(known["states"]).items()
        )
        return cls(str(known["end"]), int(known["lag"]), int(known["first"]), states)

    def initial(self) -> dict[str, Audio]:
        """The states at a clause group's start."""
        return {name: np.zeros((*lead, size), np.float32) for name, _, lead, size in self.states}


@dataclass(frozen=True, slots=True)
class Parts:
    """The sessions of a split voice and the tensor names that join them."""

    prior: ort.InferenceSession
    flow: ort.InferenceSession | None
    """None when the flow could not be cut out: the prior then gives `z` itself."""
    decoder: ort.InferenceSession
    frames: tuple[str, ...]
    """The prior's outputs (the flow's inputs), cut along their last axis: the frames."""
    z: str
    output: str
    shape: Geometry
    stream: StreamSpec | None = None
    """Set when `decoder` is the streaming decoder (`stream_graph`): chunks carry each layer's
    context forward and none is decoded twice; else chunks are decoded with context frames."""

    @property
    def names(self) -> list[str]:
        """The parts, in order."""
        return ["prior", "decoder"] if self.flow is None else ["prior", "flow", "decoder"]


class Latent:
    """A clause group after the prior: `frames` latent frames, decoded in ranges by
    `Voice.decode`. The flow runs lazily: a head for the first decoder chunk, then the rest."""

    __slots__ = ("_decoded", "_done", "_flow_feed", "_head", "_sid", "_states", "_z", "frames")

    def __init__(
        self,
        parts: Parts,
        outputs: Sequence[Any],
        sid: npt.NDArray[Any] | None,
        *,
        head: bool = True,
    ) -> None:
        arrays = {n: np.asarray(v, np.float32) for n, v in zip(parts.frames, outputs, strict=True)}
        counts = {array.shape[-1] for array in arrays.values()}
        if len(counts) != 1:
            raise RuntimeError(f"the prior's outputs disagree on their frame count: {counts}")
        self.frames: int = counts.pop()
        """Latent frames (`hop` samples of audio each)."""
        self._sid = sid
        self._flow_feed: dict[str, Audio] = {} if parts.flow is None else arrays
        self._z: Audio | None = None if parts.flow is not None else arrays[parts.z]
        self._done = 0 if parts.flow is not None else self.frames
        """Frames of `z` computed so far."""
        self._head = head
        """Whether the flow may run a head for the first chunk first (first audio sooner, its
        context frames computed twice); else it runs whole at the first chunk."""
        self._states = None if parts.stream is None else parts.stream.initial()
        """The streaming decoder's states after the frames decoded so far."""
        self._decoded = 0
        """Frames decoded so far (the streaming decoder takes them in order)."""


def with_context(parts: Parts, decoder: int, flow: int) -> Parts:
    """The parts with other context frames for the decoder and the flow (for measurements of
    the split: the agent uses the measured ones)."""
    return replace(parts, shape=replace(parts.shape, decoder_context=decoder, flow_context=flow))


def encode(
    parts: Parts,
    ids: list[int],
    scales: tuple[float, float, float],
    speaker: npt.NDArray[Any] | None,
    run_options: ort.RunOptions | None,
    *,
    head: bool = True,
) -> Latent:
    """Run the prior over the ids of one clause group (it needs all of them at once)."""
    feed = graph_feed(ids, scales, speaker)
    outputs = parts.prior.run(list(parts.frames), feed, run_options)
    return Latent(parts, outputs, speaker, head=head)


def _with_speaker(feed: Feed, session: ort.InferenceSession, latent: Latent) -> Feed:
    if latent._sid is not None and takes(session, SPEAKER_INPUT):
        feed[SPEAKER_INPUT] = latent._sid
    return feed


def decode_frames(
    parts: Parts,
    latent: Latent,
    frames: range,
    run_options: ort.RunOptions | None,
    release: ort.RunOptions | None = None,
) -> Audio:
    """Float samples of a range of the latent's frames (`hop` samples a frame), decoded with
    the voice's context frames on each side and cropped, so consecutive ranges join into the
    whole decoding (within SPLIT_TOLERANCE); `run_options.terminate` aborts it (it raises).
    `release` (`sessions.releasing`, terminated with `run_options`) runs the flow and the
    latent's last chunk: their arenas' growth is given back after them."""
    if not 0 <= frames.start < frames.stop <= latent.frames or frames.step != 1:
        raise ValueError(f"frames {frames} outside the latent's {latent.frames}")
    if parts.stream is not None:
        return _decode_next(parts, parts.stream, latent, frames, run_options, release)
    hop, context = parts.shape.hop, parts.shape.decoder_context
    begin = max(0, frames.start - context)
    end = min(latent.frames, frames.stop + context)
    z = flow_until(parts, latent, end, release or run_options)
    piece = z if begin == 0 and end == latent.frames else np.ascontiguousarray(z[:, :, begin:end])
    feed = _with_speaker({parts.z: piece}, parts.decoder, latent)
    last = frames.stop == latent.frames
    chosen = release if last and release is not None else run_options
    output = parts.decoder.run([parts.output], feed, chosen)[0]
    audio = np.asarray(output, dtype=np.float32).reshape(-1)
    if audio.size != (end - begin) * hop:
        raise RuntimeError(f"the decoder gave {audio.size} samples for {end - begin} frames")
    first = (frames.start - begin) * hop
    return audio[first : first + len(frames) * hop]


def _decode_next(  # noqa: PLR0917 - decode_frames's arguments, and its spec
    parts: Parts,
    spec: StreamSpec,
    latent: Latent,
    frames: range,
    run_options: ort.RunOptions | None,
    release: ort.RunOptions | None,
) -> Audio:
    """The streaming decoder over the next frames of the latent: the chunk's samples up to
    `spec.lag` before its end (the last chunk: to the end), its states kept for the next."""
    if frames.start != latent._decoded or latent._states is None:
        raise ValueError(f"frames {frames} are not the next after {latent._decoded}")
    last = frames.stop == latent.frames
    if frames.start == 0 and not last and len(frames) < spec.first:
        raise ValueError(f"a first chunk of {len(frames)} frames: at least {spec.first}")
    z = flow_until(parts, latent, frames.stop, release or run_options)
    whole = frames.start == 0 and last
    piece = z if whole else np.ascontiguousarray(z[:, :, frames.start : frames.stop])
    feed = _with_speaker({parts.z: piece, **latent._states}, parts.decoder, latent)
    feed[spec.end] = _LAST if last else _NOT_LAST
    chosen = release if last and release is not None else run_options
    names = [parts.output, *(output for _, output, _, _ in spec.states)]
    outputs = parts.decoder.run(names, feed, chosen)
    latent._states = {name: outputs[i] for i, (name, *_) in enumerate(spec.states, 1)}
    latent._decoded = frames.stop
    if last:
        latent._states = None  # no longer needed
    audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
    expected = len(frames) * parts.shape.hop + spec.lag * (last - (frames.start == 0))
    if audio.size != expected:
        raise RuntimeError(f"the decoder gave {audio.size} samples, not {expected}")
    return audio


_LAST: Final = np.zeros(1, np.float32)
_NOT_LAST: Final = np.zeros(0, np.float32)


def flow_until(parts: Parts, latent: Latent, end: int, run_options: ort.RunOptions | None) -> Audio:
    """`z`, computed at least up to frame `end`: a head first when the rest is long enough."""
    if latent._done >= end or parts.flow is None:
        if latent._z is None:
            raise RuntimeError("the latent has no z")
        return latent._z
    start, stop = latent._done, latent.frames
    if start == 0 and latent._head and latent.frames - end >= FLOW_SPLIT_MIN_FRAMES:
        stop = end
    begin = max(0, start - parts.shape.flow_context)
    until = min(latent.frames, stop + parts.shape.flow_context)
    whole = begin == 0 and until == latent.frames
    feed = _with_speaker(
        {
            name: value if whole else np.ascontiguousarray(value[:, :, begin:until])
            for name, value in latent._flow_feed.items()
        },
        parts.flow,
        latent,
    )
    z = np.asarray(parts.flow.run([parts.z], feed, run_options)[0], dtype=np.float32)
    if z.shape[-1] != until - begin:
        raise RuntimeError(f"the flow gave {z.shape[-1]} frames for {until - begin}")
    if start == 0 and stop == latent.frames:
        latent._z = z[:, :, start - begin : stop - begin]
    else:
        if latent._z is None:
            latent._z = np.empty((*z.shape[:-1], latent.frames), dtype=np.float32)
        latent._z[:, :, start:stop] = z[:, :, start - begin : stop - begin]
    latent._done = stop
    if stop == latent.frames:
        latent._flow_feed = {}  # no longer needed
    return latent._z


def part_path(stem: Path, part: str) -> Path:
    suffix = "json" if part == "json" else f"{part}.onnx"
    return Path(f"{stem}.split{SPLIT_FORMAT}.{suffix}")


MAX_RECORD_BYTES: Final = 65536
"""The largest split record read (a few hundred bytes are written)."""


def read_record(record: Path) -> dict[str, Any] | None:
    """The split record of a cached model (no link followed, a regular file of at most
    MAX_RECORD_BYTES: `sessions.read_cached`), None when absent or unreadable."""
    try:
        known = json.loads(read_cached(record, MAX_RECORD_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    return known if isinstance(known, dict) else None


def load_parts(
    stem: Path,
    known: Mapping[str, Any],
    threads: int,
    *,
    sealed: bool = True,
    stream: bool = True,
) -> Parts | None:
    """The parts a record names, loaded: from the cache (`sealed`: checked against their seals,
    a damaged one removed), or from a build's work directory. With `stream` (and a streaming
    decoder in the record) the streaming decoder is loaded in place of the decoder."""
    names = known.get("parts")
    if names not in (["prior", "decoder"], ["prior", "flow", "decoder"]):
        return None
    try:
        shape = Geometry(**{key: int(known[key]) for key in Geometry.__dataclass_fields__})
        spec = StreamSpec.from_record(known["stream"]) if stream and "stream" in known else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    sessions: dict[str, ort.InferenceSession] = {}
    for name in names:
        file = STREAM_PART if name == "decoder" and spec is not None else name
        path = part_path(stem, file)
        session = cached_session(path, threads, part=True) if sealed else _loaded(path, threads)
        if session is None:
            return None
        sessions[name] = session
    return joined(sessions, shape, spec)


def _loaded(path: Path, threads: int) -> ort.InferenceSession | None:
    try:
        return load_optimized(path, threads, part=True)
    except Exception:
        _LOGGER.exception("The part %s does not load", path)
        return None


def joined(
    sessions: Mapping[str, ort.InferenceSession], shape: Geometry, stream: StreamSpec | None = None
) -> Parts:
    """The parts from their sessions (`decoder` the streaming one when `stream` is given)."""
    prior, decoder = sessions["prior"], sessions["decoder"]
    frames = tuple(o.name for o in prior.get_outputs())
    carried = set() if stream is None else {stream.end, *(name for name, *_ in stream.states)}
    (z,) = (i.name for i in decoder.get_inputs() if i.name not in PER_UTTERANCE | carried)
    output = decoder.get_outputs()[0].name
    return Parts(prior, sessions.get("flow"), decoder, frames, z, output, shape, stream)
