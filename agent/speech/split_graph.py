"""Graph surgery of the split decoder: where a Piper VITS graph is cut into prior, flow and
decoder, and the parts extracted as models of their own. The only module that imports `onnx`,
and only in the build's child processes (`decoder_parts` runs `python -m agent.speech.split_graph`):
the whole model is parsed once, to move its weights into a data file, and every later step
handles the graph without them.
"""

from __future__ import annotations

import argparse
import json
import mmap
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import onnx
import onnx.shape_inference
import onnx.utils

from agent.speech.sessions import (
    EXTERNAL_MIN_BYTES,
    PER_UTTERANCE,
    PHONEMES_INPUT,
    WEIGHTS_SUFFIX,
    peak_rss_mb,
)
from agent.speech.stream_graph import NotStreamableError, stream_decoder

_DECODER_CONV: Final = re.compile(r"(?:^|/)dec/conv_pre/Conv$")
_FLOW_NODE: Final = re.compile(r"(?:^|/)flow/")


def externalize(model_path: Path, target: Path) -> None:
    """Save a model as `target`, its weights in `target` + WEIGHTS_SUFFIX beside it.

    The model is parsed from a read-only memory map, so its bytes are page cache rather than a
    second copy on the heap (measured: 172 MB at the peak for the 63 MB joe voice, against 417
    for loading it and inferring shapes with the weights in).
    """
    proto = onnx.ModelProto()
    with (
        model_path.open("rb") as source,
        mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as m,
    ):
        proto.ParseFromString(memoryview(m))  # type: ignore[arg-type]  # a buffer: no copy
    onnx.save_model(
        proto,
        str(target),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=target.name + WEIGHTS_SUFFIX,
        size_threshold=EXTERNAL_MIN_BYTES,
    )


def split_model(model_path: Path) -> dict[str, Any]:
    """Cut a Piper VITS graph saved by `externalize` into parts saved beside it as
    `<part>.onnx`, their weights left in its data file, and rewrite its decoder for streaming
    (`stream.onnx`, `stream_graph`) where it can. Returns `{"parts": [...]}` (in order:
    `prior`, `flow` when it could be cut out, `decoder`) with `"stream"` (how to run the
    streaming decoder) or `"stream_reason"`; or `{"reason": ...}` when the graph does not
    split. The weights are never loaded: shapes are inferred on the graph alone."""
    graph_only = onnx.load(str(model_path), load_external_data=False)
    model = onnx.shape_inference.infer_shapes(graph_only)
    try:
        cut = _find_cut(model)
    except UnsplittableError as err:
        return {"reason": str(err)}
    parts = _extract(model, cut)
    for name, part in parts.items():
        onnx.save_model(part, str(model_path.with_name(f"{name}.onnx")))
    result: dict[str, Any] = {"parts": list(parts)}
    try:
        streamed, spec = stream_decoder(parts["decoder"], cut.z, cut.output)
    except NotStreamableError as err:
        result["stream_reason"] = str(err)
    else:
        onnx.save_model(streamed, str(model_path.with_name("stream.onnx")))
        result["stream"] = spec
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The build's graph steps in this process (run by `decoder_parts`, not by hand)."""
    parser = argparse.ArgumentParser(
        prog="python -m agent.speech.split_graph",
        description="The graph steps of building a voice's split parts.",
    )
    parser.add_argument("target", type=Path, help="the model with its weights apart")
    parser.add_argument("--externalize", type=Path, metavar="MODEL", help="save MODEL as target")
    parser.add_argument(
        "--split",
        type=Path,
        metavar="RESULT",
        help='cut target into parts beside it; RESULT gets {"parts": [...]} or {"reason": ...}',
    )
    args = parser.parse_args(argv)
    if args.externalize is not None:
        externalize(args.externalize, args.target)
    if args.split is not None:
        args.split.write_text(json.dumps(split_model(args.target)), encoding="utf-8")
    print(json.dumps({"peak_mb": peak_rss_mb()}))  # the last line: read by the build
    return 0


@dataclass(frozen=True, slots=True)
class _Cut:
    """Where a graph is cut, by tensor name."""

    frames: tuple[str, ...]
    """The flow's inputs that carry frames (`z_p` and its mask); `(z,)` without a flow part."""
    z: str
    output: str


class UnsplittableError(Exception):
    """The graph does not split as a Piper VITS graph does (the message says why)."""


def _find_cut(model: onnx.ModelProto) -> _Cut:
    """Where a Piper VITS graph splits: before the decoder's first convolution, whose data
    input is `z` [1, channels, frames], and at the flow's inputs."""
    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in constants]
    if len(graph.output) != 1 or PHONEMES_INPUT not in inputs:
        raise UnsplittableError("its graph does not have Piper's inputs and single output")
    output = graph.output[0].name
    z = _decoder_input(graph)
    depends = _dependencies(graph, inputs)
    if PHONEMES_INPUT not in depends.get(z, frozenset()):
        raise UnsplittableError(f"the decoder's input {z} does not come from the phonemes")
    reached = _reached(graph, [output], {z})
    if not reached <= PER_UTTERANCE:
        others = sorted(reached - PER_UTTERANCE)
        raise UnsplittableError(f"the decoder also depends on {others}")
    frames = _flow_inputs(graph, depends)
    if frames and z not in frames and _reached(graph, [z], set(frames)) <= PER_UTTERANCE:
        return _Cut(frames, z, output)
    return _Cut((z,), z, output)  # no flow part: the prior runs the flow too


def _decoder_input(graph: onnx.GraphProto) -> str:
    """The data input of the decoder's first convolution, checked to be [batch, channels,
    frames] with the convolution's input channels."""
    convs = [n for n in graph.node if n.op_type == "Conv" and _DECODER_CONV.search(n.name)]
    if len(convs) != 1:
        raise UnsplittableError("its graph has no decoder convolution like /dec/conv_pre/Conv")
    conv = convs[0]
    z = conv.input[0]
    weights = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    kernel = weights.get(conv.input[1]) if len(conv.input) > 1 else None
    shape = _shape(graph, z)
    if kernel is None or len(kernel) != 3 or shape is None or len(shape) != 3:
        raise UnsplittableError(f"the decoder's input {z} is not [1, channels, frames]")
    if shape[1] != kernel[1] or isinstance(shape[2], int):
        raise UnsplittableError(
            f"the decoder's input {z} has shape {shape}, not [1, {kernel[1]}, frames]"
        )
    return str(z)


def _shape(graph: onnx.GraphProto, name: str) -> tuple[int | str, ...] | None:
    for info in (*graph.value_info, *graph.input, *graph.output):
        if info.name == name and info.type.HasField("tensor_type"):
            dims = info.type.tensor_type.shape.dim
            return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims)
    return None


def _dependencies(graph: onnx.GraphProto, inputs: Sequence[str]) -> dict[str, frozenset[str]]:
    """For each tensor, the graph inputs it is computed from (nodes are in topological order)."""
    depends = {name: frozenset({name}) for name in inputs}
    none: frozenset[str] = frozenset()
    for node in graph.node:
        sources = none.union(*(depends.get(name, none) for name in node.input))
        for name in node.output:
            depends[name] = sources
    return depends


def _reached(graph: onnx.GraphProto, targets: Sequence[str], stops: set[str]) -> set[str]:
    """The graph inputs that the targets are computed from without passing a stop tensor."""
    producer = {name: node for node in graph.node for name in node.output}
    inputs = {i.name for i in graph.input}
    seen: set[str] = set()
    reached: set[str] = set()
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in seen or name in stops or not name:
            continue
        seen.add(name)
        if name in inputs:
            reached.add(name)
        elif name in producer:
            stack.extend(producer[name].input)
    return reached


def _flow_inputs(graph: onnx.GraphProto, depends: Mapping[str, frozenset[str]]) -> tuple[str, ...]:
    """The tensors that enter the nodes named like /flow/ from before them and carry frames."""
    flow = [node for node in graph.node if _FLOW_NODE.search(node.name)]
    after = {name for node in flow for name in node.output}
    for node in graph.node:  # everything computed from the flow's own outputs
        if any(name in after for name in node.input):
            after.update(node.output)
    found: list[str] = []
    for node in flow:
        for name in node.input:
            if (
                name
                and name not in after
                and name not in found
                and PHONEMES_INPUT in depends.get(name, frozenset())
            ):
                found.append(name)
    return tuple(found)


def _extract(model: onnx.ModelProto, cut: _Cut) -> dict[str, onnx.ModelProto]:
    """The parts as models of their own (onnx.utils.Extractor), in order."""
    graph = model.graph
    constants = {tensor.name for tensor in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in constants]
    extractor = onnx.utils.Extractor(model)

    def part(starts: Sequence[str], ends: Sequence[str]) -> onnx.ModelProto:
        speaker = sorted(_reached(graph, ends, set(starts)) & PER_UTTERANCE)
        return extractor.extract_model([*starts, *speaker], list(ends))

    parts = {"prior": extractor.extract_model(inputs, list(cut.frames))}
    if cut.frames != (cut.z,):
        parts["flow"] = part(cut.frames, [cut.z])
    parts["decoder"] = part([cut.z], [cut.output])
    return parts


if __name__ == "__main__":
    sys.exit(main())
