"""The voice variants the quantization tool builds, and how each is built from the FP32 model.

Each Variant has a name, a one-line description and a builder that writes the variant's
`.onnx` from the source model (the FP32 baseline has no builder: it is the source file). Static
INT8 builders calibrate on phoneme ids of a calibration text set, fed through FeedReader.
Builders return notes for the report; they raise on failure (the caller reports the error).
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort
from onnxruntime.quantization import (
    CalibrationDataReader,
    CalibrationMethod,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.transformers.float16 import convert_float_to_float16

Feed = dict[str, npt.NDArray[np.generic]]
Scales = tuple[float, float, float]

CALIBRATION_SEED: Final = 1234
"""Seed for the RandomNormalLike nodes while calibrating (calibration runs with noise on)."""
_ORT_WARNING: Final = 2
_ORT_ERROR: Final = 3
CONV_OPS: Final = ("Conv", "ConvTranspose", "MatMul")
DECODER_TAIL: Final = ("/dec/resblocks.8/", "/dec/conv_post/")
"""The decoder's last residual block and output convolution (full sample rate, 64 channels)."""
DECODER_LAST_STAGE: Final = (
    "/dec/ups.2/",
    "/dec/resblocks.6/",
    "/dec/resblocks.7/",
    "/dec/resblocks.8/",
    "/dec/conv_post/",
)
"""The last upsampling stage of the HiFi-GAN decoder: ~38 % of FP32 time on the joe voice."""


def make_feed(ids: Sequence[int], scales: Scales) -> Feed:
    """The model inputs for one sentence."""
    return {
        "input": np.array([list(ids)], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(scales, dtype=np.float32),
    }


@dataclass(frozen=True)
class BuildInputs:
    """What every builder gets: the FP32 model and the calibration material."""

    source: Path
    calibration_ids: list[list[int]]
    """Phoneme ids of the calibration sentences (not the evaluation sentences)."""
    calibration_scales: Scales
    """(noise_scale, length_scale, noise_w) while calibrating: the voice's defaults."""


Builder = Callable[[BuildInputs, Path], list[str]]


@dataclass(frozen=True)
class Variant:
    """One candidate model: how to build it, and what it is."""

    name: str
    description: str
    build: Builder | None = None
    """Writes the variant to the given path and returns notes; None means the source itself."""


class FeedReader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime is untyped
    """Hands quantize_static one prepared feed at a time."""

    def __init__(self, feeds: Sequence[Feed]) -> None:
        self._feeds: Iterator[Feed] = iter(feeds)

    def get_next(self) -> Feed | None:
        """The next feed, or None when calibration data is exhausted."""
        return next(self._feeds, None)


@dataclass
class LogTally:
    """Log records of onnxruntime's tools, swallowed during a build and summarized in notes."""

    levels: Counter[str] = field(default_factory=Counter)
    first: list[str] = field(default_factory=list)

    def notes(self) -> list[str]:
        """A one-line summary, or nothing when the tools were quiet."""
        if not self.levels:
            return []
        counts = ", ".join(f"{level} x{n}" for level, n in sorted(self.levels.items()))
        return [f"onnxruntime tools logged {counts}; first: {' | '.join(self.first)}"]


class _Swallow(logging.Filter):
    def __init__(self, tally: LogTally) -> None:
        super().__init__()
        self._tally = tally

    def filter(self, record: logging.LogRecord) -> bool:
        if "onnxruntime" not in record.pathname:
            return True
        self._tally.levels[record.levelname] += 1
        message = record.getMessage().splitlines()[0][:100]
        if record.levelno >= logging.WARNING and len(self._tally.first) < 2:
            self._tally.first.append(message)
        return False


@contextlib.contextmanager
def quiet_onnxruntime_tools() -> Iterator[LogTally]:
    """Swallow (and count) the quantizers' root-logger messages and prints during a build.

    quantize_dynamic alone logs hundreds of shape-inference warnings through the root logger;
    the percentile calibrator prints its progress to stdout. ONNX Runtime's own (C++) log is
    raised to errors only for the build and put back to its default (warnings) afterwards.
    """
    tally = LogTally()
    swallow = _Swallow(tally)
    root = logging.getLogger()
    named = logging.getLogger("onnxruntime")
    old_level = named.level
    root.addFilter(swallow)
    named.setLevel(logging.CRITICAL)
    ort.set_default_logger_severity(_ORT_ERROR)  # calibration sessions warn about initializers
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield tally
    finally:
        root.removeFilter(swallow)
        named.setLevel(old_level)
        ort.set_default_logger_severity(_ORT_WARNING)


def build_dynamic(inputs: BuildInputs, destination: Path) -> list[str]:
    """INT8 dynamic quantization with the default op types (Conv becomes ConvInteger)."""
    quantize_dynamic(str(inputs.source), str(destination))
    return []


@dataclass(frozen=True)
class StaticOptions:
    """How one static (calibrated) INT8 variant is made; always QDQ format, per-channel."""

    unsigned_activations: bool = False
    """uint8 activations (x86's fast u8s8 kernels) instead of the default int8."""
    op_types: tuple[str, ...] | None = None
    """Operator types to quantize; None is quantize_static's default (all it supports)."""
    percentile: float | None = None
    """Percentile calibration (clips rare peaks, finer steps) instead of min/max."""
    exclude_prefixes: tuple[str, ...] = ()
    """Nodes whose names start with one of these stay in float."""


def _excluded_nodes(source: Path, prefixes: Sequence[str]) -> tuple[list[str], list[str]]:
    names = [node.name for node in onnx.load(str(source), load_external_data=False).graph.node]
    excluded = [n for n in names if n.startswith(tuple(prefixes))]
    unmatched = [p for p in prefixes if not any(n.startswith(p) for n in names)]
    return excluded, unmatched


def _calibration_feeds(inputs: BuildInputs, joined: bool) -> list[Feed]:
    if joined:
        ids = [i for sentence in inputs.calibration_ids for i in sentence]
        return [make_feed(ids, inputs.calibration_scales)]
    return [make_feed(ids, inputs.calibration_scales) for ids in inputs.calibration_ids]


def static_builder(options: StaticOptions) -> Builder:
    """A builder for quantize_static (QDQ, per-channel) with these options."""

    def build(inputs: BuildInputs, destination: Path) -> list[str]:
        notes = [
            f"calibrated on {len(inputs.calibration_ids)} sentences with scales "
            f"{inputs.calibration_scales} (noise on, seed {CALIBRATION_SEED}) so the ranges "
            "cover the sampled latents the agent produces"
        ]
        excluded, unmatched = _excluded_nodes(inputs.source, options.exclude_prefixes)
        if options.exclude_prefixes:
            notes.append(
                f"{len(excluded)} nodes kept in float ({', '.join(options.exclude_prefixes)})"
            )
        if unmatched:
            notes.append(f"no node matches {', '.join(unmatched)}")
        method = CalibrationMethod.MinMax
        extra: dict[str, object] = {}
        if options.percentile is not None:
            method = CalibrationMethod.Percentile
            extra["CalibPercentile"] = options.percentile
            notes.append(
                "percentile calibration stacks each tensor over all calibration runs, which fails "
                "for sentences of different lengths ('inhomogeneous shape'): the calibration "
                "sentences are joined into one input"
            )
        ort.set_seed(CALIBRATION_SEED)
        quantize_static(
            str(inputs.source),
            str(destination),
            FeedReader(_calibration_feeds(inputs, joined=options.percentile is not None)),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            op_types_to_quantize=list(options.op_types) if options.op_types else None,
            activation_type=QuantType.QUInt8 if options.unsigned_activations else QuantType.QInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=excluded,
            calibrate_method=method,
            extra_options=extra,
        )
        return notes

    return build


def build_fp16(inputs: BuildInputs, destination: Path) -> list[str]:
    """FP16 weights and compute, float32 inputs and outputs (keep_io_types)."""
    model = convert_float_to_float16(onnx.load(str(inputs.source)), keep_io_types=True)
    onnx.save(model, str(destination))
    return []


def default_variants() -> list[Variant]:
    """The variants a run builds, baseline first."""
    u8_conv = StaticOptions(unsigned_activations=True, op_types=CONV_OPS)
    u8_conv_p = StaticOptions(unsigned_activations=True, op_types=CONV_OPS, percentile=99.99)
    return [
        Variant("fp32", "the published FP32 model (baseline)"),
        Variant("int8-dynamic", "quantize_dynamic, default op types", build_dynamic),
        Variant(
            "int8-static-qdq",
            "quantize_static defaults: all supported ops, int8 activations, min/max",
            static_builder(StaticOptions()),
        ),
        Variant(
            "int8-static-qdq-u8",
            "all supported ops, uint8 activations, min/max",
            static_builder(StaticOptions(unsigned_activations=True)),
        ),
        Variant(
            "int8-static-conv-u8",
            "Conv/ConvTranspose/MatMul only, uint8 activations, min/max",
            static_builder(u8_conv),
        ),
        Variant(
            "int8-static-conv-u8-keep-last-stage",
            "as int8-static-conv-u8, decoder's last upsampling stage in float",
            static_builder(replace(u8_conv, exclude_prefixes=DECODER_LAST_STAGE)),
        ),
        Variant(
            "int8-static-conv-u8-p9999",
            "Conv/ConvTranspose/MatMul, uint8 activations, 99.99th-percentile calibration",
            static_builder(u8_conv_p),
        ),
        Variant(
            "int8-static-conv-u8-p9999-keep-tail",
            "as int8-static-conv-u8-p9999, decoder's last resblock and conv_post in float",
            static_builder(replace(u8_conv_p, exclude_prefixes=DECODER_TAIL)),
        ),
        Variant("fp16", "convert_float_to_float16, keep_io_types=True", build_fp16),
    ]
