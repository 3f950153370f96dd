"""Outputs the function computes other outputs from (`h = x.sin(); return h * 2, h`).

In eager, a hook on such an output (`h.register_hook`, `h.retain_grad()`) sees the whole
gradient of `h`: what reaches it from outside plus what the other outputs send back through
it, and a hook returning a new gradient changes what flows on to `x`. The compiled call is
one autograd node: the engine runs the output's hooks on the gradient from outside alone
(None where only the other outputs are in the loss), and the rest stays inside the backward
graph. Nothing can be run between the two, so the runtime refuses such a backward, by name,
instead of giving the hook (and `.grad`) a partial gradient.

An input the function writes in place is such a tensor too, where other outputs are computed
from its new value (`x.mul_(w); return x.sin()`): eager's in-place op gives the caller's `x`
a new node, which `retain_grad()` moves to and a hook registered after the call sits on; the
runtime's copy into `x` makes a node that sees only the gradient from outside.

An output the function put a hook on itself (`h.register_hook(f); return h`) is checked too:
its hook runs inside the backward graph, after the caller's hooks on the output, where eager
runs it before them.
"""

from __future__ import annotations

import functools
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
    written: tuple[tuple[int, int], ...]  # (position in `fed`, input) of inputs written
    hooked: tuple[int, ...] = ()  # positions in `fed` of outputs hooked inside, read by none

    @staticmethod
    def of(info: FunctionInfo) -> "FedOutputs | None":
        fed_keys = {k for k, _ in info.fed_outputs}
        # An output the function hooked is checked as one read by itself: its gradient.
        hooked = tuple((k, (k,)) for k in info.hooked_outputs if k not in fed_keys)
        fed = info.fed_outputs + hooked
        if not fed:
            return None
        first = info.first_user_output
        rebuilt = tuple(j for j, (k, _) in enumerate(fed)
                        if k >= first and info.outputs[k - first].kind is not OutputKind.PLAIN)
        written = tuple((j, info.data_mutated_inputs[k])
                        for j, (k, _) in enumerate(fed) if k < first)
        return FedOutputs(fed, first, rebuilt, written,
                          tuple(range(len(info.fed_outputs), len(fed))))

    def hold(self, ctx, outs: Sequence[Any]) -> None:
        """At the forward, the node's own outputs (`outs`: the graph's); weakly: the
        output's grad_fn is this ctx, a strong reference would be a cycle. The others, the
        runtime's tensors, are held after the call (`hold_rebuilt`, `hold_written`)."""
        later = self._held_later
        ctx.fed_outputs = [None if j in later else weakref.ref(outs[k])
                           for j, (k, _) in enumerate(self.fed)]

    @functools.cached_property  # read on every call
    def _held_later(self) -> frozenset[int]:
        return frozenset((*self.rebuilt, *(j for j, _ in self.written)))

    @functools.cached_property  # read at every backward
    def _written_input(self) -> dict[int, int]:
        return dict(self.written)

    def hold_rebuilt(self, raw: Sequence[Any], user_outs: Sequence[Any]) -> None:
        """After the call, the views the runtime rebuilt, on the node (the grad_fn of an
        output read from them) that `hold` saw."""
        for j in self.rebuilt:
            self._hold_late(raw, j, user_outs[self.fed[j][0] - self.first_user_output])

    def hold_written(self, raw: Sequence[Any], inputs: Sequence[Any]) -> None:
        """After the runtime copied the new values into the caller's inputs: those inputs."""
        for j, i in self.written:
            self._hold_late(raw, j, inputs[i])

    def _hold_late(self, raw: Sequence[Any], j: int, tensor: torch.Tensor) -> None:
        node = next((raw[c].grad_fn for c in self.fed[j][1]
                     if isinstance(raw[c], torch.Tensor) and raw[c].grad_fn is not None), None)
        held = getattr(node, "fed_outputs", None)
        if held is not None:
            held[j] = weakref.ref(tensor)

    def check(self, ctx, grads: Sequence[Any]) -> None:
        held = getattr(ctx, "fed_outputs", None)
        if held is None:  # a tracer's stand-in ctx
            return
        written = self._written_input
        for j, ((k, readers), ref) in enumerate(zip(self.fed, held)):
            out = ref() if ref is not None else None
            if out is None or all(grads[c] is None for c in readers):
                continue
            if j in written:
                self._check_written(out, written[j])
            elif out.retains_grad or out._backward_hooks:
                i = k - self.first_user_output
                if j in self.hooked:
                    raise self._hooked_error(i, out.retains_grad)
                raise self._error(i, out.retains_grad)

    @staticmethod
    def _check_written(x: torch.Tensor, i: int) -> None:
        """The caller's input i after the call, and the tensor it is a view of, which the
        write changed too. Hooks registered before the call stay on the old node, which
        sees the whole gradient: the write cleared them from the tensor."""
        for t in (x, x._base):
            if t is not None and (t.retains_grad or t._backward_hooks):
                raise FedOutputs._written_error(i, t is x, t.retains_grad)

    @staticmethod
    def _written_error(i: int, itself: bool, retained: bool) -> NotImplementedError:
        what = "retain_grad()" if retained else "a tensor hook registered after the call"
        whose = f"input {i}" if itself else f"the tensor input {i} is a view of"
        return NotImplementedError(
            f"aotgrad: {whose} has {what}, and the compiled function writes into input {i} "
            "in place and computes outputs from its new value: in eager its gradient "
            "includes what those outputs send back through it, but the compiled call is one "
            "autograd node, so the node of the runtime's copy into the input sees only the "
            "gradient from outside (a partial .grad, or None). Register the hook before the "
            "call (on the value passed in), or return the new value as an output instead of "
            "writing it into the input.")

    @staticmethod
    def _hooked_error(i: int, retained: bool) -> NotImplementedError:
        what = "retain_grad()" if retained else "a tensor hook (register_hook)"
        return NotImplementedError(
            f"aotgrad: output {i} of the compiled function has {what}, and the function "
            "registered a tensor hook on that output itself: eager runs the function's hook "
            "first, so the caller's hook and .grad see the gradient it returns, but the "
            "compiled call runs it inside its backward, after the hooks on its outputs (they "
            "would see the gradient before it, and their order would differ). Register both "
            "hooks on one side: inside the function, or on the output after the call.")

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
