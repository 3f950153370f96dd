"""Which of the backward's inputs it may consume: saved values nothing else holds.

The compiler may free them early or reuse their memory; the runtime gives them up to the
backward (CompiledGraph.backward says when it cannot).
"""

from __future__ import annotations

import collections

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..backends.compilers import copy_graph
from ..schema import DONATED, HELD_FOR_REPLAY, Partition
from ..tables import STORAGE_SWAPS
from .memory import base_of

aten = torch.ops.aten


def mark_donated(p: Partition) -> None:
    """Mark the backward's inputs whose memory nothing but the backward holds: saved values
    that are no input's, no constant's, no other output's, and that no gradient is a view of.
    The compiler may free them early or reuse their memory; the runtime gives them up to the
    backward (CompiledGraph.backward says when it cannot)."""
    fw, bw = p.forward, p.backward
    if _swaps_storage(fw) or _swaps_storage(bw):  # the traced storages are not the real ones
        return
    outputs = list(fw.graph.output_node().args[0])
    # Each holder of a memory counts once: the inputs, the constants (tensors the traced code
    # closed over, which the graph module keeps for every call), and every output (one listed
    # twice is held twice).
    holders = [*fw.graph.find_nodes(op="placeholder"), *fw.graph.find_nodes(op="get_attr"),
               *outputs, *_copied_into_inputs(fw)]
    memory = collections.Counter(key for node in holders for key in _memory_keys(node))
    returned = {base_of(g) for g in bw.graph.output_node().args[0] if isinstance(g, fx.Node)}
    for value, inp in zip(p.saved, bw.graph.find_nodes(op="placeholder")):
        keys = _memory_keys(value)
        if keys and all(memory[k] == 1 for k in keys) and inp not in returned \
                and not inp.meta.get(HELD_FOR_REPLAY):
            inp.meta[DONATED] = True


def _copied_into_inputs(fw: fx.GraphModule) -> list[fx.Node]:
    """The new values of inputs the forward writes: Inductor may compute one in the input's
    own memory (a functionalized custom op's result, copied back), so the input holds it."""
    return [n.args[1] for n in fw.graph.find_nodes(op="call_function", target=aten.copy_.default)
            if base_of(n.args[0]).op == "placeholder" and isinstance(n.args[1], fx.Node)]


def without_donations(bw: fx.GraphModule) -> fx.GraphModule:
    keeping = copy_graph(bw)
    for node in keeping.graph.find_nodes(op="placeholder"):
        node.meta.pop(DONATED, None)
    return keeping


def _memory_keys(node) -> tuple:
    """Who owns a value's memory, as the graph says (its base node) and as the trace saw it
    (its storage); none where unknown, which donates nothing."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return ()
    return base_of(node), StorageWeakRef(val.untyped_storage())


def _swaps_storage(gm: fx.GraphModule) -> bool:
    return any(getattr(n.target, "overloadpacket", None) in STORAGE_SWAPS
               for n in gm.graph.nodes)
