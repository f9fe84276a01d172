"""Building a voice's split decoder (`decoder_parts`), once per model, in child processes.

`split_parts` is what a voice calls at load: the parts from the cache, or built now (never in
the agent's own process) and checked against the whole model; None when the voice runs whole.
The build's steps run as `python -m agent.speech.split_graph` (the graph steps: `onnx`, no ONNX
Runtime) and `python -m agent.speech.decoder_build` (optimize, reference, check), each in a child
process with its own memory and CPU limits.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
import onnxruntime as ort
from piper.phoneme_ids import phonemes_to_ids

from agent.speech.decoder_parts import (
    CONTEXT_MARGIN_FRAMES,
    SPLIT_FORMAT,
    SPLIT_TOLERANCE,
    STREAM_PART,
    Audio,
    Geometry,
    Latent,
    Parts,
    StreamSpec,
    decode_frames,
    flow_until,
    joined,
    load_parts,
    part_path,
    read_record,
)
from agent.speech.sessions import (
    PER_UTTERANCE,
    PROVIDERS,
    SPEAKER_INPUT,
    Feed,
    cache_stem,
    graph_feed,
    install_optimized,
    load_optimized,
    peak_rss_mb,
    save_optimized,
    session_options,
    takes,
    use_memory_arena,
    work_directory,
    write_atomic,
)

_LOGGER = logging.getLogger(__name__)

_PROBE_PHONEMES: Final = "ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ."  # noqa: RUF001
"""What the parts are checked on at build (~2 s of speech; unknown symbols are skipped). The
whole model's memory while it speaks grows with the probe: 209 MB at the peak for 2 s, 297 for
5 s (docs/memory.md)."""
_PROBE_CHUNKS: Final = 5


def split_parts(  # noqa: PLR0917 - what a voice's split depends on
    model_path: Path,
    phoneme_id_map: Mapping[str, Sequence[int]],
    speaker_id: int | None,
    digest: str,
    threads: int,
    cache_dir: Path | None,
    *,
    stream: bool = True,
) -> Parts | None:
    """The voice's parts: cached, or built and checked now in child processes (never in this
    one); None when it must run whole. With `stream` the streaming decoder is used where the
    voice has one (`stream_graph`); else chunks are decoded with context frames.

    The verdict is kept in cache_dir beside the parts (a JSON record), so a voice that cannot
    be split is not analysed again at every start. Without a cache the parts are built in a
    temporary directory and loaded from there (their weights stay mapped once it is removed).
    """
    stem = None if cache_dir is None else cache_stem(cache_dir, digest)
    record = None if stem is None else part_path(stem, "json")
    known = None if record is None else read_record(record)
    if known is not None and stem is not None:
        if not known.get("parts"):
            _LOGGER.info("Voice %s runs whole: %s", model_path.name, known.get("reason"))
            return None
        cached = load_parts(stem, known, threads, stream=stream)
        if cached is not None:
            return cached
    if importlib.util.find_spec("onnx") is None:
        _LOGGER.warning(
            "Voice %s runs whole: the onnx package (needed once to split the model for "
            "chunked decoding) is not installed",
            model_path.name,
        )
        return None
    probe = phonemes_to_ids(list(_PROBE_PHONEMES), phoneme_id_map)
    try:
        verdict, built = _built(model_path, probe, speaker_id, threads, stem, stream=stream)
    except (BuildError, OSError) as err:  # a build process failed, or the cache is not writable
        _LOGGER.warning("Voice %s runs whole: splitting it failed: %s", model_path.name, err)
        return None
    if built is None and verdict["parts"]:
        _LOGGER.warning("Voice %s runs whole: its parts, just built, do not load", model_path.name)
        return None
    if built is None:
        _LOGGER.info(
            "Voice %s runs whole (no chunked decoding): %s", model_path.name, verdict["reason"]
        )
    else:
        _LOGGER.info(
            "Voice %s split for chunked decoding (%s): %d samples a frame, context %d frames "
            "for the decoder, %d for the flow",
            model_path.name,
            ", ".join(built.names),
            built.shape.hop,
            built.shape.decoder_context,
            built.shape.flow_context,
        )
        if built.stream is not None:
            _LOGGER.info(
                "Voice %s decodes in streamed chunks (each layer's context carried forward): "
                "%d samples behind a chunk's frames, first chunk at least %d frames",
                model_path.name,
                built.stream.lag,
                built.stream.first,
            )
        elif "stream_reason" in verdict:
            _LOGGER.info(
                "Voice %s decodes its chunks with context (no streaming decoder: %s)",
                model_path.name,
                verdict["stream_reason"],
            )
    if record is not None:
        with contextlib.suppress(OSError):
            write_atomic(record, json.dumps(verdict).encode())
    return built


def _built(
    model_path: Path,
    probe: list[int],
    speaker_id: int | None,
    threads: int,
    stem: Path | None,
    *,
    stream: bool = True,
) -> tuple[dict[str, Any], Parts | None]:
    """Build the parts in child processes, install them under `stem` (when a cache is given)
    and load them; the verdict and the parts (None when the voice does not split)."""
    began = time.monotonic()
    with work_directory(None if stem is None else stem.parent) as work:
        work_stem = work / ("voice" if stem is None else stem.name)
        verdict, peaks = _build(model_path, probe, speaker_id, threads, work_stem)
        _LOGGER.info(
            "Voice %s analysed for chunked decoding in %.1f s by %d processes (peak MB: %s)",
            model_path.name,
            time.monotonic() - began,
            len(peaks),
            ", ".join(f"{steps} {peak or 0:.0f}" for steps, peak in peaks.items()),
        )
        if not verdict["parts"]:
            built = None
        elif stem is None:
            built = load_parts(work_stem, verdict, threads, sealed=False, stream=stream)
        else:
            for name in [*verdict["parts"], *([STREAM_PART] if "stream" in verdict else [])]:
                install_optimized(part_path(work_stem, name), part_path(stem, name))
            built = load_parts(stem, verdict, threads, stream=stream)
    if stem is not None:
        _remove_older_formats(stem)
    return verdict, built


def _remove_older_formats(stem: Path) -> None:
    """Remove this model's cache entries of other split formats (never used again)."""
    current = f"{stem.name}.split{SPLIT_FORMAT}."
    for path in stem.parent.glob(f"{glob.escape(stem.name)}.split*"):
        if not path.name.startswith(current) and path.is_file():
            path.unlink(missing_ok=True)


# ---- the build, in child processes ------------------------------------------------------------
#
# The agent never builds parts in its own process: a build parses the whole model, infers
# shapes, optimizes every part and runs the whole model beside them (614 MB at the peak in one
# process, most of it left behind as freed heap: docs/memory.md). Here the weights move once
# into a data file and every later step works on a graph without them, or on one part whose
# weights ONNX Runtime maps from the file; each group of steps runs in a process of its own, so
# what a step needs leaves with its process.

STEP_GROUPS: Final = (("externalize",), ("split",), ("optimize",), ("reference",), ("check",))
"""The build's steps in order, each tuple in one child process: the graph steps run `python -m
agent.speech.split_graph` (onnx, no onnxruntime), the others `python -m
agent.speech.decoder_build`. Peak RSS of each on the joe voice (63 MB, x86_64): 172, 69, 96, 194 and
196 MB."""
SMALL_STEP_GROUPS: Final = (("externalize", "split"), ("optimize", "reference", "check"))
"""The same steps for a model smaller than SMALL_MODEL_BYTES: every step's memory grows with
the model, and more processes would only add their start-up."""
SMALL_MODEL_BYTES: Final = 8 * 1024 * 1024
"""Model files smaller than this (bytes) are built in two processes (SMALL_STEP_GROUPS)."""
_GRAPH_STEPS: Final = frozenset({"externalize", "split"})
STEP_CPU_SECONDS: Final = 1800
"""CPU time (seconds) a build process may use before the kernel stops it (a model that never
finishes a step); the slowest step takes a few seconds here, a Zero 2 W is several times
slower."""
STEP_ENVIRONMENT: Final = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "65536"}
"""glibc settings of the build's processes unless the environment sets them: the agent's own
(`allocator`), so large blocks a step frees go back to the system before its next."""
_WHOLE: Final = "model.onnx"
"""The whole model in a work directory, its weights in the data file beside it."""
_PLAN: Final = "plan.json"
_CUT: Final = "cut.json"
_REFERENCE: Final = "reference.npy"
_VERDICT: Final = "verdict.json"
"""The build's outcome: the split record (`parts` and the geometry)."""


class BuildError(Exception):
    """A build process failed (it crashed, was killed or used up its CPU time)."""


def _build(
    model_path: Path, probe: list[int], speaker_id: int | None, threads: int, stem: Path
) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Run the build's steps in child processes, in stem's directory; the verdict (as the
    record keeps it), and each process's peak RSS in MB by its steps. The parts are saved as
    `part_path(stem, name)`."""
    work = stem.parent
    plan = {"threads": threads, "probe": probe, "speaker": speaker_id, "stem": stem.name}
    (work / _PLAN).write_text(json.dumps(plan), encoding="utf-8")
    small = model_path.stat().st_size < SMALL_MODEL_BYTES
    peaks: dict[str, float | None] = {}
    for group in SMALL_STEP_GROUPS if small else STEP_GROUPS:
        if _GRAPH_STEPS.issuperset(group):
            command = ["-m", "agent.speech.split_graph", str(work / _WHOLE)]
            if "externalize" in group:
                command += ["--externalize", str(model_path.resolve())]
            if "split" in group:
                command += ["--split", str(work / _CUT)]
        else:
            command = ["-m", "agent.speech.decoder_build", *group, "--dir", str(work)]
        peaks["+".join(group)] = _run_step(command, "+".join(group))
        cut = read_record(work / _CUT)
        if cut is not None and "reason" in cut:
            return {"parts": [], "reason": str(cut["reason"])}, peaks
    verdict = read_record(work / _VERDICT)
    if verdict is None:
        raise BuildError("the build ended without a verdict")
    return verdict, peaks


def _run_step(arguments: Sequence[str], name: str) -> float | None:
    """Run a step of the build in a child process of this interpreter; its peak RSS in MB (as
    it reports it). Raises BuildError, with the last line of its output, when it fails."""
    environment = {**STEP_ENVIRONMENT, **os.environ}
    with tempfile.TemporaryFile() as output:
        child = subprocess.Popen(  # our own modules, with our own interpreter
            [sys.executable, *arguments],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            env=environment,
        )
        try:
            with contextlib.suppress(ProcessLookupError):  # already gone: reported below
                limit = (STEP_CPU_SECONDS, STEP_CPU_SECONDS + 5)
                resource.prlimit(child.pid, resource.RLIMIT_CPU, limit)
            child.wait()
        except BaseException:
            child.kill()
            child.wait()
            raise
        output.seek(0)
        lines = output.read().decode(errors="replace").strip().splitlines() or ["no output"]
    if child.returncode != 0:
        how = f"was killed by signal {-child.returncode}" if child.returncode < 0 else "failed"
        raise BuildError(f"the build step {name} {how}: {lines[-1][:300]}")
    with contextlib.suppress(ValueError, TypeError, KeyError):
        return float(json.loads(lines[-1])["peak_mb"])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """The build's steps on parts in this process (run by `split_parts`, not by hand)."""
    runners: dict[str, Callable[[Path, dict[str, Any]], None]] = {
        "optimize": _optimize,
        "reference": _reference,
        "check": _verify,
    }
    parser = argparse.ArgumentParser(
        prog="python -m agent.speech.decoder_build",
        description="Steps of building a voice's split parts, after the graph steps.",
    )
    parser.add_argument("steps", nargs="+", choices=list(runners))
    parser.add_argument("--dir", type=Path, required=True, help="the build's work directory")
    args = parser.parse_args(argv)
    use_memory_arena(False)  # a build step: held to what one run needs (docs/memory.md)
    plan = json.loads((args.dir / _PLAN).read_text(encoding="utf-8"))
    for step in args.steps:
        runners[step](args.dir, plan)
    print(json.dumps({"peak_mb": peak_rss_mb()}))  # the last line: read by `_run_step`
    return 0


def _optimize(work: Path, plan: dict[str, Any]) -> None:
    """Optimize each part (ENABLE_ALL) and save it, weights apart, as the cache will hold it."""
    cut = json.loads((work / _CUT).read_text(encoding="utf-8"))
    for name in [*cut["parts"], *([STREAM_PART] if "stream" in cut else [])]:
        target = part_path(work / plan["stem"], name)
        save_optimized(str(work / f"{name}.onnx"), target, int(plan["threads"]))


def _probe_feed(session: ort.InferenceSession, plan: dict[str, Any]) -> Feed:
    speaker = None
    if takes(session, SPEAKER_INPUT):
        speaker = np.array([plan["speaker"] or 0], dtype=np.int64)
    return graph_feed(list(plan["probe"]), (0.0, 1.0, 0.0), speaker)


def _reference(work: Path, plan: dict[str, Any]) -> None:
    """The whole model (unoptimized, weights mapped) speaks the probe: the samples the parts
    must give."""
    options = session_options(int(plan["threads"]), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    whole = ort.InferenceSession(str(work / _WHOLE), options, providers=PROVIDERS)
    audio = whole.run(None, _probe_feed(whole, plan))[0]
    np.save(work / _REFERENCE, np.asarray(audio, dtype=np.float32).reshape(-1))


def _verify(work: Path, plan: dict[str, Any]) -> None:
    """Load the optimized parts as the agent loads them, measure their geometry and check them
    against the whole model's samples; the verdict."""
    cut = json.loads((work / _CUT).read_text(encoding="utf-8"))
    threads = int(plan["threads"])
    sessions = {
        name: load_optimized(part_path(work / plan["stem"], name), threads, True)
        for name in cut["parts"]
    }
    parts = joined(sessions, Geometry(1, 0, 0))
    feed = _probe_feed(parts.prior, plan)
    reference: Audio = np.load(work / _REFERENCE)
    verdict: dict[str, Any]
    try:
        parts = _measured(parts, feed, reference)
        _check(parts, feed, reference)
    except _MismatchError as err:
        verdict = {"parts": [], "reason": str(err)}
    else:
        verdict = {"parts": parts.names, **asdict(parts.shape)}
        verdict.update(_streaming(work, plan, cut, parts, feed, reference))
    write_atomic(work / _VERDICT, json.dumps(verdict).encode())


def _streaming(  # noqa: PLR0917 - the verify step's state
    work: Path,
    plan: dict[str, Any],
    cut: dict[str, Any],
    parts: Parts,
    feed: Feed,
    reference: Audio,
) -> dict[str, Any]:
    """The verdict's `stream` (how to run the streaming decoder) when it gives the whole
    model's samples, decoded whole and in chunks of every kind (the smallest first chunk, one
    frame, a few, the rest); else `stream_reason`."""
    if "stream" not in cut:
        return {"stream_reason": str(cut.get("stream_reason", "not built"))}
    known = dict(cut["stream"])
    if int(known["hop"]) != parts.shape.hop:
        return {"stream_reason": f"it gives {known['hop']} samples a frame, not {parts.shape.hop}"}
    path = part_path(work / plan["stem"], STREAM_PART)
    session = load_optimized(path, int(plan["threads"]), True)
    streaming = replace(parts, decoder=session, stream=StreamSpec.from_record(known))
    outputs = parts.prior.run(list(parts.frames), feed)
    speaker = feed.get(SPEAKER_INPUT)
    try:
        for sizes in ((), (known["first"], 1, 2, 5, 13)):
            latent = Latent(streaming, outputs, speaker)
            _compare(_decoded_in(streaming, latent, sizes), reference, "streaming decoding")
    except (_MismatchError, RuntimeError, ValueError) as err:
        return {"stream_reason": str(err)}
    return {"stream": known}


def _decoded_in(parts: Parts, latent: Latent, sizes: Sequence[int]) -> Audio:
    """A latent decoded in chunks of these sizes, then the rest in one."""
    pieces, start = [], 0
    for size in (*sizes, latent.frames):
        stop = min(latent.frames, start + size)
        pieces.append(decode_frames(parts, latent, range(start, stop), None))
        start = stop
        if stop == latent.frames:
            break
    return np.concatenate(pieces)


def _compare(audio: Audio, reference: Audio, what: str) -> None:
    if audio.shape != reference.shape:
        raise _MismatchError(f"{what} gives {audio.size} samples, not {reference.size}")
    worst = float(np.abs(audio - reference).max(initial=0.0))
    if worst > SPLIT_TOLERANCE:
        raise _MismatchError(f"{what} differs from the whole model by up to {worst:.2g}")


def _measured(parts: Parts, feed: Feed, reference: Audio) -> Parts:
    """The parts with their geometry measured on the probe: samples per frame, and the reach
    of the flow and the decoder (how far one changed input frame changes their output)."""
    outputs = parts.prior.run(list(parts.frames), feed)
    speaker = feed.get(SPEAKER_INPUT)
    frames = outputs[0].shape[-1]
    if frames <= 0 or reference.size % frames:
        raise _MismatchError(f"its {reference.size} samples are not {frames} frames")
    hop = reference.size // frames
    parts = replace(parts, shape=Geometry(hop, 0, 0))
    latent = Latent(parts, outputs, speaker)
    z = flow_until(parts, latent, latent.frames, None)

    def decoded(values: Feed) -> Audio:
        output = parts.decoder.run([parts.output], {**_only(values, parts.decoder)})[0]
        return np.asarray(output, np.float32).reshape(1, -1)

    decoder = _reach(decoded, {**_per_utterance(feed), parts.z: z}, [parts.z], hop)
    flow = 0
    if parts.flow is not None:
        session = parts.flow

        def flowed(values: Feed) -> Audio:
            output = session.run([parts.z], _only(values, session))[0]
            return np.asarray(output, np.float32).reshape(-1, frames)

        given = dict(zip(parts.frames, outputs, strict=True))
        flow = _reach(flowed, {**_per_utterance(feed), **given}, parts.frames, 1)
    margin = CONTEXT_MARGIN_FRAMES
    return replace(parts, shape=Geometry(hop, decoder + margin, flow + margin))


def _per_utterance(feed: Feed) -> Feed:
    return {name: value for name, value in feed.items() if name in PER_UTTERANCE}


def _only(feed: Feed, session: ort.InferenceSession) -> Feed:
    return {i.name: feed[i.name] for i in session.get_inputs()}


def _reach(run: Callable[[Feed], Audio], feed: Feed, names: Sequence[str], per_frame: int) -> int:
    """Frames on either side over which `run`'s output (rows of time) responds at all to a
    change of one frame in the middle of the inputs `names`."""
    frames = feed[names[0]].shape[-1]
    middle = frames // 2
    changed = dict(feed)
    for name in names:
        changed[name] = feed[name].copy()
        changed[name][..., middle] += 0.5
    responds = np.nonzero(np.any(run(changed) != run(feed), axis=0))[0]
    if responds.size == 0:
        return 0
    left = middle - responds[0] / per_frame
    right = (responds[-1] + 1) / per_frame - (middle + 1)
    reach = int(np.ceil(max(left, right, 0.0)))
    if reach >= middle - CONTEXT_MARGIN_FRAMES:
        raise _MismatchError(f"its flow or decoder is not local (reach {reach} frames)")
    return reach


def _check(parts: Parts, feed: Feed, reference: Audio) -> None:
    """Raise unless the parts give the whole model's samples, run whole and in chunks (with a
    flow head), within SPLIT_TOLERANCE."""
    outputs = parts.prior.run(list(parts.frames), feed)
    speaker = feed.get(SPEAKER_INPUT)
    latent = Latent(parts, outputs, speaker)
    whole = decode_frames(parts, latent, range(latent.frames), None)
    if whole.shape != reference.shape:
        raise _MismatchError(f"its parts give {whole.size} samples, not {reference.size}")
    worst = float(np.abs(whole - reference).max(initial=0.0))
    if worst > SPLIT_TOLERANCE:
        raise _MismatchError(f"its parts differ from the whole model by up to {worst:.2g}")
    latent = Latent(parts, outputs, speaker)
    step = max(1, -(-latent.frames // _PROBE_CHUNKS))
    pieces = [
        decode_frames(parts, latent, range(start, min(latent.frames, start + step)), None)
        for start in range(0, latent.frames, step)
    ]
    worst = float(np.abs(np.concatenate(pieces) - whole).max(initial=0.0))
    if worst > SPLIT_TOLERANCE:
        raise _MismatchError(f"chunked decoding differs from whole by up to {worst:.2g}")


class _MismatchError(Exception):
    """The parts do not give the whole model's samples (the message says how)."""


if __name__ == "__main__":
    sys.exit(main())
