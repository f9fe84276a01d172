"""Graph surgery of the streaming decoder: a VITS decoder (HiFi-GAN: convolutions, transposed
convolutions, residual sums) rewritten to decode a latent chunk by chunk carrying every layer's
context forward, so each layer's activations are computed once however many chunks there are
(docs/measurements.md, "Streaming decoder"). Imported only by `split_graph` (a build process)
and the measurements (`bench/split.py`).

Up to and through the first `STREAMED_UPSAMPLINGS` transposed convolutions, each convolution
keeps the last inputs it needs from the chunk before (a state: an input of the graph and an
output of it), runs unpadded on them and the new chunk, and gives the outputs its inputs so far
determine; a transposed convolution keeps its overlapping input frame; where two branches of
different lags are summed, the less late one waits in a delay line. The layers after them (the
tail) run as they are on the chunk with their reach of context before and after it (kept in a
state too) and their output is cropped: there, copying states would cost more than the few
samples of context. So a chunk's audio ends `lag` samples before the end of its frames, and the
last chunk (`STREAM_END` of length 1) pads every layer as the whole decoder does and gives the
rest. The first chunk starts from the states' initial lengths (a convolution's left padding,
zeros), so chunks join into the whole decoding: the same sums in the same layers (to rounding),
nothing computed twice but the tail's context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

STREAM_END: Final = "stream_end"
"""The graph input that says whether a chunk is a clause group's last: float32 [n], n 1 for the
last chunk and 0 for the others (its length is what the graph reads)."""
_LAST: Final = np.iinfo(np.int64).max
_UNARY: Final = frozenset(
    {"LeakyRelu", "Relu", "Tanh", "Sigmoid", "Identity", "Neg", "Abs", "Exp", "Sin", "Softplus"}
)
"""Operators that act on each sample alone: the time axis passes through."""
_BINARY: Final = frozenset({"Add", "Sub", "Mul", "Div"})


class NotStreamableError(Exception):
    """The decoder has an operation the streaming rewrite does not carry (the message says
    which): the voice decodes its chunks with context instead."""


@dataclass(frozen=True, slots=True)
class _Time:
    """Where a tensor of the rewrite stands in time: samples per latent frame, the samples its
    chunks end before the end of their latent frames, and its dimensions before the time axis."""

    rate: Fraction
    lag: int
    lead: tuple[int, ...]


@dataclass(slots=True)
class _Rewrite:
    """The rewritten graph as it is built."""

    graph: onnx.GraphProto
    weights: dict[str, tuple[int, ...]]
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    constants: list[onnx.TensorProto] = field(default_factory=list)
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    time: dict[str, _Time] = field(default_factory=dict)
    count: int = 0

    def name(self, what: str) -> str:
        self.count += 1
        return f"/stream/{self.count}/{what}"

    def node(self, op: str, inputs: Sequence[str], **attributes: Any) -> str:
        output = self.name(op)
        self.nodes.append(helper.make_node(op, list(inputs), [output], output, **attributes))
        return output

    def ints(self, *values: int) -> str:
        name = self.name("const")
        self.constants.append(numpy_helper.from_array(np.array(values, np.int64), name))
        return name

    def length(self, tensor: str) -> str:
        """The time length of a tensor (int64 [1]): its last dimension."""
        return self.node("Shape", [tensor], start=-1)

    def state(self, lead: tuple[int, ...], initial: int) -> str:
        """A new state: an input (and, by `carry`, an output) of shape lead + [frames]."""
        name = f"stream_state_{len(self.states)}"
        dims: list[int | str] = [*lead, f"{name}_t"]
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dims))
        self.states[name] = {"lead": list(lead), "initial": initial}
        return name

    def carry(self, state: str, value: str, lead: tuple[int, ...]) -> None:
        """The state's value for the next chunk."""
        output = f"{state}_next"
        self.nodes.append(helper.make_node("Identity", [value], [output], self.name("next")))
        self.outputs.append(
            helper.make_tensor_value_info(output, TensorProto.FLOAT, [*lead, f"{output}_t"])
        )
        self.states[state]["next"] = output


STREAMED_UPSAMPLINGS: Final = 1
"""Transposed convolutions (upsamplings) the stateful rewrite goes through; the layers after
them (the tail: short reach, but many samples a frame, where the states' copies would cost
more than they save) run on the chunk with a few samples of context instead
(docs/measurements.md, "Streaming decoder")."""
_REACH_MARGIN: Final = 1
"""Samples of the tail's input added to its measured reach on each side."""


def stream_decoder(
    decoder: onnx.ModelProto, z: str, output: str, upsamplings: int = STREAMED_UPSAMPLINGS
) -> tuple[onnx.ModelProto, dict[str, Any]]:
    """The streaming rewrite of a decoder part (its weights left where they are), and what
    running it needs: `{"z", "output", "end", "lag", "hop", "first", "states": {input:
    {"lead", "initial", "next"}}}` (a state starts as zeros of lead + [initial]; `first`: the
    fewest frames of a first chunk that is not also the last). The layers up to and through
    the `upsamplings`-th transposed convolution carry their context in states; the rest (the
    tail) run on the chunk with `reach` samples of its input before and after it, kept in a
    state too, and their output cropped. Raises NotStreamableError."""
    graph = decoder.graph
    weights = {tensor.name: tuple(tensor.dims) for tensor in graph.initializer}
    rewrite = _Rewrite(graph, weights)
    (z_info,) = (i for i in graph.input if i.name == z)
    lead = _lead(z_info)
    rewrite.time[z] = _Time(Fraction(1), 0, lead)
    end_flag = helper.make_tensor_value_info(STREAM_END, TensorProto.FLOAT, ["stream_end_n"])
    rewrite.inputs.extend([z_info, end_flag])
    last = rewrite.node("Shape", [STREAM_END])
    upsampling = [node for node in graph.node if node.op_type == "ConvTranspose"]
    cut = upsampling[upsamplings].input[0] if len(upsampling) > upsamplings else None
    tail = _Tail(cut) if cut is not None else None
    for node in graph.node:
        if tail is not None and tail.takes(node):
            tail.add(rewrite, node)
            continue
        timed = [name for name in node.input if name in rewrite.time]
        if not timed:
            rewrite.nodes.append(node)
            continue
        _rewrite_node(rewrite, node, timed, last)
    if tail is not None:
        timing = tail.close(rewrite, output, last)
    elif output in rewrite.time:
        timing = rewrite.time[output]
    else:
        raise NotStreamableError(f"the output {output} does not come from {z}")
    if timing.rate.denominator != 1:
        raise NotStreamableError(f"the output has {timing.rate} samples a frame")
    hop = int(timing.rate)
    first = -(-timing.lag // hop) + 1
    if tail is not None:
        entry = rewrite.time[tail.cut]
        needed = entry.lag + tail.reach[0] + tail.reach[1]
        first = max(first, -(-needed // int(entry.rate)) + 1)
    out_info = next(o for o in graph.output if o.name == output)
    others = [i for i in graph.input if i.name != z and i.name not in weights]
    streamed = helper.make_graph(
        rewrite.nodes,
        f"{graph.name}_stream",
        [*rewrite.inputs[:1], *others, *rewrite.inputs[1:]],
        [out_info, *rewrite.outputs],
        [*graph.initializer, *rewrite.constants],
    )
    model = helper.make_model(streamed, opset_imports=list(decoder.opset_import))
    model.ir_version = decoder.ir_version
    spec = {
        "z": z,
        "output": output,
        "end": STREAM_END,
        "lag": timing.lag,
        "hop": hop,
        "first": first,
        "states": rewrite.states,
    }
    return model, spec


@dataclass(slots=True)
class _Tail:
    """The layers after the cut: run as they are on the cut tensor's chunk with its context
    before and after it; their reach (in samples of the cut tensor) found as they are added."""

    cut: str
    reach_of: dict[str, tuple[Fraction, Fraction, Fraction]] = field(default_factory=dict)
    """Tensor -> (its samples per cut sample, how far back and ahead it reaches, in cut
    samples)."""
    start: str = ""
    """The tail's input: the context kept from before, then the chunk."""
    state: str = ""
    reach: tuple[int, int] = (0, 0)
    """Context samples before and after a chunk that the output needs (with a margin): set
    by `close`."""

    def takes(self, node: onnx.NodeProto) -> bool:
        return any(name == self.cut or name in self.reach_of for name in node.input)

    def add(self, rewrite: _Rewrite, node: onnx.NodeProto) -> None:
        if not self.start:
            self._begin(rewrite)
        origin = (Fraction(1), Fraction(0), Fraction(0))
        timed = [
            origin if name == self.cut else self.reach_of[name]
            for name in node.input
            if name == self.cut or name in self.reach_of
        ]
        rate, back, ahead = timed[0]
        op = node.op_type
        attributes = _attributes(node)
        if op == "Conv":
            left, right = (int(p) for p in attributes.get("pads", [0, 0]))
            if list(attributes.get("strides", [1])) != [1] or "auto_pad" in attributes:
                raise NotStreamableError(f"{node.name} has a stride or pads automatically")
            back, ahead = back + Fraction(left) / rate, ahead + Fraction(right) / rate
        elif op == "ConvTranspose":
            kernel = rewrite.weights.get(node.input[1])
            (stride,) = (int(s) for s in attributes.get("strides", [1]))
            left = int(next(iter(attributes.get("pads", [0]))))
            if kernel is None or len(kernel) != 3:
                raise NotStreamableError(f"{node.name} is not a 1-D transposed convolution")
            back += Fraction(kernel[2] - 1 - left, stride) / rate
            ahead += Fraction(left, stride) / rate
            rate *= stride
        elif op in _BINARY and len(timed) > 1:  # both operands streamed
            if timed[0][0] != timed[1][0]:
                raise NotStreamableError(f"{node.name} joins tensors of different rates")
            back, ahead = max(t[1] for t in timed), max(t[2] for t in timed)
        elif not (op in _UNARY or op in _BINARY or op == "Unsqueeze"):
            raise NotStreamableError(f"its decoder has {op} ({node.name}) on the frames")
        changed = onnx.NodeProto()
        changed.CopyFrom(node)
        for index, name in enumerate(changed.input):
            if name == self.cut:
                changed.input[index] = self.start
        rewrite.nodes.append(changed)
        for name in node.output:
            self.reach_of[name] = (rate, back, ahead)

    def _begin(self, rewrite: _Rewrite) -> None:
        entry = rewrite.time.get(self.cut)
        if entry is None:
            raise NotStreamableError(f"the tail's input {self.cut} is not streamed")
        self.state = rewrite.state(entry.lead, 0)
        self.start = rewrite.node("Concat", [self.state, self.cut], axis=-1)

    def close(self, rewrite: _Rewrite, output: str, last: str) -> _Time:
        """Crop the tail's output to what its input determines; the output's timing."""
        if output not in self.reach_of:
            raise NotStreamableError(f"the output {output} does not come from the tail")
        rate, back, ahead = self.reach_of[output]
        if rate.denominator != 1:
            raise NotStreamableError(f"the tail gives {rate} samples per input sample")
        before, after = (math.ceil(x) + _REACH_MARGIN for x in (back, ahead))
        self.reach = (before, after)
        kept = rewrite.node(
            "Slice",
            [self.start, rewrite.ints(-(before + after)), rewrite.ints(_LAST), rewrite.ints(-1)],
        )
        entry = rewrite.time[self.cut]
        rewrite.carry(self.state, kept, entry.lead)
        per = int(rate)
        # The first chunk starts at the true start (the tail's own padding is right there);
        # after it, the first `before` samples of context are cropped. The last chunk ends at
        # the true end; before it, the last `after` samples wait for the next chunk.
        held = rewrite.node("Div", [rewrite.length(self.state), rewrite.ints(before + after)])
        start = rewrite.node("Mul", [held, rewrite.ints(before * per)])
        whole = rewrite.name("tail_output")
        for node in rewrite.nodes:
            for index, name in enumerate(node.output):
                if name == output:
                    node.output[index] = whole
        waiting = rewrite.node("Mul", [last, rewrite.ints(after * per)])
        trimmed = rewrite.node("Sub", [rewrite.length(whole), rewrite.ints(after * per)])
        end = rewrite.node("Add", [trimmed, waiting])
        rewrite.nodes.append(
            helper.make_node(
                "Slice", [whole, start, end, rewrite.ints(-1)], [output], rewrite.name("crop")
            )
        )
        return _Time(entry.rate * per, (entry.lag + after) * per, entry.lead)


def _lead(info: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = info.type.tensor_type.shape.dim
    lead = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in dims[:-1])
    if len(dims) != 3 or not dims[1].HasField("dim_value"):
        raise NotStreamableError(f"{info.name} is not [batch, channels, frames]")
    return lead


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _rewrite_node(rewrite: _Rewrite, node: onnx.NodeProto, timed: list[str], last: str) -> None:
    op = node.op_type
    if op == "Conv":
        _conv(rewrite, node, last)
    elif op == "ConvTranspose":
        _transposed(rewrite, node, last)
    elif op in _UNARY or (op in _BINARY and len(timed) == 1) or op == "Unsqueeze":
        if op == "Unsqueeze":
            _check_unsqueeze(rewrite, node)
        rewrite.nodes.append(node)
        before = rewrite.time[timed[0]]
        lead = before.lead if op != "Unsqueeze" else (*before.lead, 1)
        rewrite.time[node.output[0]] = _Time(before.rate, before.lag, lead)
    elif op in _BINARY:
        _aligned(rewrite, node)
    else:
        raise NotStreamableError(f"its decoder has {op} ({node.name}) on the frames")


def _check_unsqueeze(rewrite: _Rewrite, node: onnx.NodeProto) -> None:
    """An Unsqueeze keeps time last only if every new axis comes before it."""
    axes_name = node.input[1] if len(node.input) > 1 else ""
    axes = next(
        (numpy_helper.to_array(t) for t in rewrite.graph.initializer if t.name == axes_name),
        _attributes(node).get("axes"),
    )
    rank = len(rewrite.time[node.input[0]].lead) + 1
    if axes is None or any(int(a) < 0 or int(a) >= rank for a in np.atleast_1d(axes)):
        raise NotStreamableError(f"{node.name} moves the time axis")


def _conv(rewrite: _Rewrite, node: onnx.NodeProto, last: str) -> None:
    attributes = _attributes(node)
    kernel = rewrite.weights.get(node.input[1])
    if kernel is None or len(kernel) != 3:
        raise NotStreamableError(f"{node.name} is not a 1-D convolution with constant weights")
    if attributes.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotStreamableError(f"{node.name} pads automatically")
    if list(attributes.get("strides", [1])) != [1]:
        raise NotStreamableError(f"{node.name} has a stride")
    dilation = int(next(iter(attributes.get("dilations", [1]))))
    left, right = (int(p) for p in attributes.get("pads", [0, 0]))
    span = (kernel[2] - 1) * dilation + 1
    if left + right != span - 1:
        raise NotStreamableError(f"{node.name} changes the length of its input")
    x = node.input[0]
    before = rewrite.time[x]
    lead = (before.lead[0], kernel[1] * int(attributes.get("group", 1)))
    pieces = [x]
    if span > 1:
        state = rewrite.state(lead, left)
        pieces.insert(0, state)
    if right:
        zeros = rewrite.name("zeros")
        rewrite.constants.append(
            numpy_helper.from_array(np.zeros((*lead, right), np.float32), zeros)
        )
        size = rewrite.node("Mul", [last, rewrite.ints(right)])
        pieces.append(rewrite.node("Slice", [zeros, rewrite.ints(0), size, rewrite.ints(-1)]))
    joined = rewrite.node("Concat", pieces, axis=-1) if len(pieces) > 1 else x
    if span > 1:
        kept = rewrite.node(
            "Slice", [joined, rewrite.ints(-(span - 1)), rewrite.ints(_LAST), rewrite.ints(-1)]
        )
        rewrite.carry(pieces[0], kept, lead)
    conv = onnx.NodeProto()
    conv.CopyFrom(node)
    conv.input[0] = joined
    del conv.attribute[:]
    conv.attribute.extend(helper.make_attribute(k, v) for k, v in attributes.items() if k != "pads")
    rewrite.nodes.append(conv)
    rewrite.time[node.output[0]] = _Time(before.rate, before.lag + right, (lead[0], kernel[0]))


def _transposed(rewrite: _Rewrite, node: onnx.NodeProto, last: str) -> None:
    attributes = _attributes(node)
    kernel = rewrite.weights.get(node.input[1])
    if kernel is None or len(kernel) != 3:
        raise NotStreamableError(f"{node.name} is not a 1-D transposed convolution")
    unsupported = {"auto_pad", "output_shape"} & set(attributes)
    if unsupported or any(attributes.get("output_padding", [0])):
        raise NotStreamableError(f"{node.name} sets {sorted(unsupported) or 'output_padding'}")
    if list(attributes.get("dilations", [1])) != [1]:
        raise NotStreamableError(f"{node.name} is dilated")
    (stride,) = (int(s) for s in attributes.get("strides", [1]))
    left, right = (int(p) for p in attributes.get("pads", [0, 0]))
    size = kernel[2]
    if size - left - right != stride:
        raise NotStreamableError(f"{node.name} does not give {stride} samples a frame")
    x = node.input[0]
    before = rewrite.time[x]
    group = int(attributes.get("group", 1))
    lead = (before.lead[0], kernel[0])
    overlap = (size - 1) // stride
    """Input frames before a chunk that reach into its outputs."""
    joined = x
    if overlap:
        state = rewrite.state(lead, 0)
        joined = rewrite.node("Concat", [state, x], axis=-1)
        kept = rewrite.node(
            "Slice", [joined, rewrite.ints(-overlap), rewrite.ints(_LAST), rewrite.ints(-1)]
        )
        rewrite.carry(state, kept, lead)
        # From the state's length (0 at the first chunk, `overlap` after): where the new
        # outputs begin, `left` (the whole decoder's crop) first, then after the state's frames.
        held = rewrite.node("Div", [rewrite.length(state), rewrite.ints(overlap)])
        step = rewrite.node("Mul", [held, rewrite.ints(stride * overlap - left)])
        start = rewrite.node("Add", [step, rewrite.ints(left)])
    else:
        start = rewrite.ints(0)
    full = rewrite.name("ConvTranspose")
    transposed = onnx.NodeProto()
    transposed.CopyFrom(node)
    transposed.input[0] = joined
    transposed.output[0] = full
    del transposed.attribute[:]
    transposed.attribute.extend(
        helper.make_attribute(k, v) for k, v in attributes.items() if k != "pads"
    )
    rewrite.nodes.append(transposed)
    # Up to the last output all of whose inputs are in (the others wait for the next chunk);
    # the last chunk gives everything up to the whole decoder's crop on the right.
    extra = rewrite.node("Mul", [last, rewrite.ints(size - stride - right)])
    trimmed = rewrite.node("Sub", [rewrite.length(full), rewrite.ints(size - stride)])
    end = rewrite.node("Add", [trimmed, extra])
    rewrite.nodes.append(
        helper.make_node(
            "Slice", [full, start, end, rewrite.ints(-1)], [node.output[0]], rewrite.name("crop")
        )
    )
    rewrite.time[node.output[0]] = _Time(
        before.rate * stride, before.lag * stride + left, (lead[0], kernel[1] * group)
    )


def _aligned(rewrite: _Rewrite, node: onnx.NodeProto) -> None:
    """A sum (or product) of two streamed tensors: the less late one waits in a delay line."""
    a, b = (rewrite.time[name] for name in node.input[:2])
    if a.rate != b.rate:
        raise NotStreamableError(f"{node.name} joins tensors of different rates")
    if a.lag != b.lag:
        early = 0 if a.lag < b.lag else 1
        late = node.input[1 - early]
        lead = (a, b)[early].lead
        state = rewrite.state(lead, 0)
        joined = rewrite.node("Concat", [state, node.input[early]], axis=-1)
        count = rewrite.length(late)
        delayed = rewrite.node("Slice", [joined, rewrite.ints(0), count, rewrite.ints(-1)])
        kept = rewrite.node("Slice", [joined, count, rewrite.ints(_LAST), rewrite.ints(-1)])
        rewrite.carry(state, kept, lead)
        changed = onnx.NodeProto()
        changed.CopyFrom(node)
        changed.input[early] = delayed
        node = changed
    rewrite.nodes.append(node)
    wider = a.lead if len(a.lead) >= len(b.lead) else b.lead
    rewrite.time[node.output[0]] = _Time(a.rate, max(a.lag, b.lag), wider)
