"""Peak-memory model of a training step: buffer liveness over the forward, then the backward.

Each graph is a straight-line program, so memory at every step is the sum of the buffers
alive then. A view shares its base's buffer; a buffer dies after the last use of any value
aliasing it, unless it outlives the graph (an output, or an input the caller owns). The
model ignores allocator rounding and what a backend fuses away; `bench/` checks it against
`torch.cuda.max_memory_allocated`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx


@dataclass(frozen=True)
class MemoryEstimate:
    input_bytes: int  # parameters, buffers and user inputs: alive throughout
    saved_bytes: int  # new memory the forward keeps for the backward
    forward_peak_bytes: int
    backward_peak_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_peak_bytes, self.backward_peak_bytes)


def tensor_bytes(val) -> int:
    if isinstance(val, torch.Tensor):
        return val.numel() * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(tensor_bytes(v) for v in val)
    return 0


def is_alias(node: fx.Node) -> bool:
    """The node's value shares memory with its first argument."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and target.is_view


class _Buffers:
    """Which buffer each value lives in, and how big each buffer is."""

    def __init__(self):
        self.owner: dict[fx.Node, int] = {}
        self.size: list[int] = []

    def new(self, node: fx.Node, nbytes: int) -> int:
        self.owner[node] = len(self.size)
        self.size.append(nbytes)
        return self.owner[node]

    def alias(self, node: fx.Node, of: fx.Node) -> None:
        self.owner[node] = self.owner[of]

    def total(self, ids) -> int:
        return sum(self.size[i] for i in set(ids))


def _assign(graph: fx.Graph, buffers: _Buffers) -> None:
    for node in graph.nodes:
        if node in buffers.owner or node.op == "output":
            continue
        if node.op == "call_function" and is_alias(node) and node.args[0] in buffers.owner:
            buffers.alias(node, node.args[0])
        elif node.op == "call_function" and _is_tuple(node):
            buffers.owner[node] = -1  # a tuple owns nothing; its getitems own its elements
        else:
            buffers.new(node, tensor_bytes(node.meta.get("val")))


def _is_tuple(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


def _simulate(graph: fx.Graph, buffers: _Buffers, live: set[int], keep: set[int]) -> int:
    """Walk the graph; return the peak of live bytes. `live` is updated in place."""
    nodes = list(graph.nodes)
    dies_at: dict[int, int] = {b: 0 for b in live}
    for i, node in enumerate(nodes):
        dies_at.setdefault(buffers.owner.get(node, -1), i)
        for inp in node.all_input_nodes:
            dies_at[buffers.owner[inp]] = i
    deaths: dict[int, list[int]] = {}
    for b, i in dies_at.items():
        if b >= 0 and b not in keep:
            deaths.setdefault(i, []).append(b)
    current = peak = buffers.total(live)
    for i, node in enumerate(nodes):
        b = buffers.owner.get(node, -1)
        if b >= 0 and b not in live:
            live.add(b)
            current += buffers.size[b]
            peak = max(peak, current)
        for b in deaths.get(i, ()):
            if b in live:
                live.discard(b)
                current -= buffers.size[b]
    return peak


def estimate_peak(fw: fx.GraphModule, bw: fx.GraphModule, num_fw_outputs: int) -> MemoryEstimate:
    """Estimated peak bytes of one forward+backward with this partition."""
    buffers = _Buffers()
    primals = [n for n in fw.graph.nodes if n.op == "placeholder"]
    _assign(fw.graph, buffers)
    inputs = {buffers.owner[p] for p in primals}
    fw_outs = [o for o in fw.graph.output_node().args[0] if isinstance(o, fx.Node)]
    kept = inputs | {buffers.owner[o] for o in fw_outs} - {-1}
    live = set(inputs)
    fw_peak = _simulate(fw.graph, buffers, live, kept)

    saved_outs = list(fw.graph.output_node().args[0])[num_fw_outputs:]
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(bw_inputs, saved_outs):
        buffers.alias(ph, value)
    _assign(bw.graph, buffers)  # tangents and backward values get buffers of their own
    grads = {buffers.owner[g] for g in bw.graph.output_node().args[0] if isinstance(g, fx.Node)}
    user_outs = {buffers.owner[o] for o in fw_outs[:num_fw_outputs]}
    live = set(kept) | {buffers.owner[p] for p in bw_inputs}
    bw_peak = _simulate(bw.graph, buffers, live, inputs | user_outs | grads)
    saved = {buffers.owner[o] for o in saved_outs if isinstance(o, fx.Node)} - inputs
    return MemoryEstimate(buffers.total(inputs), buffers.total(saved), fw_peak, bw_peak)
