"""Outputs the function computes other outputs from (`h = x.sin(); return h * 2, h`).

In eager, a hook on such an output (`h.register_hook`, `h.retain_grad()`) sees the whole
gradient of `h`: what reaches it from outside plus what the other outputs send back through
it, and a hook returning a new gradient changes what flows on to `x`. The compiled call is
one autograd node: the engine runs the output's hooks on the gradient from outside alone
(None where only the other outputs are in the loss), and the rest stays inside the backward
graph. Nothing can be run between the two, so the runtime refuses such a backward, by name,
instead of giving the hook (and `.grad`) a partial gradient.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..schema import FunctionInfo, OutputKind


def fed_outputs(values: Sequence[Any], plain: Sequence[int]
                ) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(k, the graph outputs whose autograd history reads k) for each graph output k in
    `plain` that some other graph output is computed from; `values`: the traced graph
    outputs, with their autograd history."""
    if sum(isinstance(v, torch.Tensor) and v.grad_fn is not None for v in values) < 2:
        return ()  # no other output to be computed from it (most training steps: a loss)
    targets = {}
    for k in plain:
        v = values[k]
        if isinstance(v, torch.Tensor) and v.grad_fn is not None:
            targets.setdefault((v.grad_fn, v.output_nr), k)
    if not targets:
        return ()
    readers: dict[int, list[int]] = {k: [] for k in targets.values()}
    for c, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.grad_fn is None:
            continue
        for edge in _edges_below(v.grad_fn):
            k = targets.get(edge)
            if k is not None and values[k] is not v:
                readers[k].append(c)
    return tuple((k, tuple(cs)) for k, cs in readers.items() if cs)


def _edges_below(root: Any) -> set:
    """Every (node, output number) edge reachable from autograd node `root`."""
    edges, seen, stack = set(), {root}, [root]
    while stack:
        for fn, nr in stack.pop().next_functions:
            if fn is None:
                continue
            edges.add((fn, nr))
            if fn not in seen:
                seen.add(fn)
                stack.append(fn)
    return edges


@dataclass(frozen=True)
class FedOutputs:
    """The runtime's side: holds each fed output weakly, and at the backward refuses one the
    caller put a hook or retain_grad() on, where an output read from it has a gradient in
    this backward."""

    fed: tuple[tuple[int, tuple[int, ...]], ...]  # as `fed_outputs`
    first_user_output: int
    rebuilt: tuple[int, ...]  # positions in `fed` of views the runtime makes after the node

    @staticmethod
    def of(info: FunctionInfo) -> "FedOutputs | None":
        if not info.fed_outputs:
            return None
        first = info.first_user_output
        rebuilt = tuple(j for j, (k, _) in enumerate(info.fed_outputs)
                        if info.outputs[k - first].kind is not OutputKind.PLAIN)
        return FedOutputs(info.fed_outputs, first, rebuilt)

    def hold(self, ctx, outs: Sequence[Any]) -> None:
        """At the forward, the node's own outputs (`outs`: the graph's); weakly: the
        output's grad_fn is this ctx, a strong reference would be a cycle."""
        ctx.fed_outputs = [None if j in self.rebuilt else weakref.ref(outs[k])
                           for j, (k, _) in enumerate(self.fed)]

    def hold_rebuilt(self, raw: Sequence[Any], user_outs: Sequence[Any]) -> None:
        """After the call, the views the runtime rebuilt, on the node (the grad_fn of an
        output read from them) that `hold` saw."""
        for j in self.rebuilt:
            k, readers = self.fed[j]
            node = next((raw[c].grad_fn for c in readers
                         if isinstance(raw[c], torch.Tensor) and raw[c].grad_fn is not None),
                        None)
            held = getattr(node, "fed_outputs", None)
            if held is not None:
                held[j] = weakref.ref(user_outs[k - self.first_user_output])

    def check(self, ctx, grads: Sequence[Any]) -> None:
        held = getattr(ctx, "fed_outputs", None)
        if held is None:  # a tracer's stand-in ctx
            return
        for (k, readers), ref in zip(self.fed, held):
            out = ref() if ref is not None else None
            if out is None or all(grads[c] is None for c in readers):
                continue
            if out.retains_grad or out._backward_hooks:
                raise self._error(k - self.first_user_output, out.retains_grad)

    @staticmethod
    def _error(i: int, retained: bool) -> NotImplementedError:
        what = ("retain_grad() (or is among backward()'s inputs=)" if retained
                else "a tensor hook (register_hook)")
        return NotImplementedError(
            f"aotgrad: output {i} of the compiled function has {what}, and the function "
            "computes other outputs (or an input's new value) from it: in eager its gradient "
            "includes what those send back through it, but the compiled call is one autograd "
            "node, whose hooks see only the gradient reaching the output from outside (a "
            "partial .grad, or None). Register the hook inside the compiled function (a hook "
            "returning a new gradient is traced into it), or compile the code that computes "
            "this tensor and the code that reads it as two functions.")
