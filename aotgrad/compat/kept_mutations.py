"""Graphs that copy into their mutated inputs, handed to a compiler as torch hands them.

With `keep_inference_input_mutations=True`, a graph writes a mutated input's new value into
the input itself (`copy_`). aotgrad's graphs then still return that input, in the output slot
the runtime reads a mutated input's new value from; torch's return nothing for it, so a
compiler written for torch that indexes the outputs (or counts them) would read a mutated
input where it expects a user output. A compiler is handed the graph without those slots,
and what it compiles is wrapped to put the inputs back where the runtime reads them.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Callable, Sequence

import torch
from torch import fx

from ..backends.compilers import as_boxed, copy_graph
from ..schema import GRAPH_INFO

aten = torch.ops.aten


def torch_outputs(compiler: Callable) -> Callable:
    """`compiler`, handed graphs without the outputs that are inputs copied into."""

    @functools.wraps(compiler)
    def compile_graph(gm: fx.GraphModule, example_inputs: Sequence) -> Callable:
        slots = copied_input_slots(gm)
        if not slots:
            return compiler(gm, example_inputs)
        stripped = without_outputs(gm, [k for k, _ in slots])
        return with_inputs_returned(as_boxed(compiler(stripped, example_inputs)), slots)
    return compile_graph


def copied_input_slots(gm: fx.GraphModule) -> list[tuple[int, int]]:
    """(output position, input position) per output that is `copy_(input, value)`."""
    inputs = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    outputs = gm.graph.output_node().args[0]
    return [(k, inputs[o.args[0]]) for k, o in enumerate(outputs)
            if isinstance(o, fx.Node) and o.target is aten.copy_.default
            and o.args[0] in inputs]


def without_outputs(gm: fx.GraphModule, dropped: list[int]) -> fx.GraphModule:
    """A copy of `gm` returning all but the `dropped` outputs; the `copy_` nodes stay (they
    mutate, so nothing removes them as dead code)."""
    copy = copy_graph(gm)
    output = copy.graph.output_node()
    output.args = (tuple(o for k, o in enumerate(output.args[0]) if k not in dropped),)
    info = copy.meta.get(GRAPH_INFO)
    if info is not None:  # the slots precede the user outputs
        shift = sum(k < info.user_outputs.start for k in dropped)
        users = range(info.user_outputs.start - shift, info.user_outputs.stop - shift)
        copy.meta[GRAPH_INFO] = replace(info, user_outputs=users)
    copy.recompile()
    return copy


def with_inputs_returned(compiled: Callable, slots: list[tuple[int, int]]) -> Callable:
    """`compiled` (boxed) returning, at each slot, the input the graph copied into."""

    def run(args: list) -> list:
        copied = [args[i] for _, i in slots]  # before the callee may clear the list
        outs = list(compiled(args))
        for (k, _), t in zip(slots, copied):
            outs.insert(k, t)
        return outs

    run._boxed_call = True
    return run
