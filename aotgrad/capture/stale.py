"""Saved values modified in place: eager raises when, and only when, a backward reads one.

Eager runs `y = x.sin(); x.mul_(3)` and raises at `.backward()`, when sin's backward finds
the `x` it saved at a newer version. The joint trace runs autograd while compiling, so it
meets the error at the call instead (`capture.StaleSavedValue`, raised by the trace's
saved-tensor hooks). Then `find_stale_outputs` runs the function once more, functionalized,
and takes the gradient of each differentiable graph output alone: the outputs whose backward
reads a modified value are *stale*. The joint graph is traced without them (they get no
tangent); the compiled forward still returns them as differentiable outputs, so they require
grad as in eager, and the backward raises eager's error when one of them receives a gradient
(`StaleBackward.check`). A call under no_grad, or whose stale outputs take no part in a
backward, runs as eager's does.

An output whose graph the function's own backward freed (`torch.autograd.grad(loss, ...)`
inside, without `retain_graph`, then `return loss`) is stale the same way: the joint trace
meets eager's "backward through the graph a second time" at the call, where eager raises it
only at a backward through that output.
"""

from __future__ import annotations

import concurrent.futures
import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch._dispatch.python import enable_python_dispatcher

from .analysis import graph_outputs
from ..schema import FunctionInfo, OutputKind
from .inputs import (StaleSavedValue, compiled_autograd_off, differentiating, functional_mode,
                     to_functional)
from .joint import mutable_copies, traced_grad
from .own_saves import eager_name
from ..semantics import checkpoints


@dataclass(frozen=True)
class StaleSaved:
    """The saved value a stale output's backward finds modified, as eager's error names it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    input: int | None  # the input whose version counter it shares (it, or a view of it)
    # The input itself, with the history it came in with (the trace's copy of it, never
    # modified where autograd sees it): eager names the caller's tensor's node.
    as_passed: bool
    node: str | None  # the autograd node it is an output of
    output_nr: int
    saved_version: int  # relative to the input's version at the call, when `input` is set
    version: int  # at the end of the forward, for a value made inside
    # The graph output whose version counter a value made inside shares (it, or a view of
    # it): the caller's changes to it after the call count in eager's version too.
    output: int | None = None

    def error(self, ctx) -> str:
        return _message(self, ctx)


@dataclass(frozen=True)
class FreedGraph:
    """A value the function's own backward freed: eager's `message` at a backward."""

    message: str
    input: None = None  # no caller's tensor to hold, as `StaleSaved.input` may name
    output: None = None  # nor output, as `StaleSaved.output` may

    def error(self, ctx) -> str:
        return self.message


def freed_graph(e: BaseException) -> bool:
    """Is `e` autograd's error for a backward through values a backward freed?"""
    return isinstance(e, RuntimeError) and FREED_MESSAGE in str(e)


FREED_MESSAGE = "Trying to backward through the graph a second time"


@dataclass(frozen=True)
class StaleBackward:
    """Which forward outputs are stale, and the error a backward through one raises."""

    outputs: tuple[int, ...]
    saved: StaleSaved | FreedGraph

    def hold(self, ctx, inputs: Sequence[Any]) -> None:
        """Keep the input the saved value belongs to, and its version at the call."""
        i = self.saved.input
        if i is not None:
            ctx.stale_input, ctx.stale_version = inputs[i], inputs[i]._version

    def hold_output(self, ctx, outs: Sequence[Any]) -> None:
        """A detached alias of the output the saved value belongs to, and its version now."""
        k = self.saved.output
        if k is not None:
            ctx.stale_output = (outs[k].detach(), outs[k]._version)

    def check(self, ctx, grads: Sequence[Any]) -> None:
        if any(grads[k] is not None for k in self.outputs):
            raise RuntimeError(self.saved.error(ctx))


@dataclass(frozen=True)
class SavedOutputs:
    """Outputs whose own eager node saved them (`exp`'s result), each (graph output index,
    node name, output number, version at the save). The caller may change one in place
    after the call; eager's backward through it then raises, where the compiled backward
    reads its own saved values (x, to recompute the exp) and would run on."""

    outputs: tuple[tuple[int, str, int, int], ...]

    @staticmethod
    def of(info: FunctionInfo) -> "SavedOutputs | None":
        first = info.first_user_output
        found = tuple((first + i, *o.saved_by_node) for i, o in enumerate(info.outputs)
                      if o.saved_by_node is not None)
        return SavedOutputs(found) if found else None

    def hold(self, ctx, outs: Sequence[Any]) -> None:
        """A detached alias of each (it shares the version counter, not the history: no
        reference cycle through ctx), and its version now."""
        ctx.saved_outputs = [(outs[k].detach(), outs[k]._version) for k, *_ in self.outputs]

    def check(self, ctx, grads: Sequence[Any]) -> None:
        if torch.compiler.is_compiling():  # Dynamo inlines this backward: see `changed`
            errors = getattr(ctx, "saved_output_errors", None) or ()
            for (k, *_), error in zip(self.outputs, errors):
                if error is not None and grads[k] is not None:
                    raise RuntimeError(error)
            return
        held = getattr(ctx, "saved_outputs", None)
        if held is None:  # a tracer's stand-in ctx, or freed by an earlier backward
            return
        for j, (k, *_) in enumerate(self.outputs):
            if grads[k] is not None and held[j][0]._version != held[j][1]:
                raise RuntimeError(self._error(held, j))
        if not torch._C._autograd._get_current_graph_task_keep_graph():
            ctx.saved_outputs = None  # freed after this backward, as eager's saved output

    def changed(self, ctx) -> int:
        """Under torch's compiled autograd, Dynamo inlines the backward, and the graph it
        captured runs again without `check`'s Python; the engine calls this (through
        `_compiled_autograd_key`) on every backward, before that graph runs. It keeps the
        error for each held output changed since the call, for the traced backward to
        raise where that output has a gradient, and returns a bit per such output: a part
        of the key, so that a graph traced with other outputs changed is not reused."""
        held = getattr(ctx, "saved_outputs", None)
        if held is None:
            return 0
        changed = [alias._version != held_at for alias, held_at in held]
        ctx.saved_output_errors = [self._error(held, j) if c else None
                                   for j, c in enumerate(changed)]
        return sum(1 << j for j, c in enumerate(changed) if c)

    def _error(self, held: Sequence[tuple[torch.Tensor, int]], j: int) -> str:
        """Eager's error for held output `j`, changed since the call."""
        _, node, output_nr, version = self.outputs[j]
        alias, held_at = held[j]
        saved = StaleSaved(tuple(alias.shape), alias.dtype, alias.device, None, False,
                           node, output_nr, version, version + alias._version - held_at)
        return saved.error(None)


def find_stale_outputs(graph_fn: Callable, info: FunctionInfo, fakes: Sequence[Any],
                       fake_mode: Any) -> StaleBackward:
    """Run the function functionalized and differentiate each differentiable graph output
    alone; those whose backward reads a value modified in place are stale."""
    found: dict[int, StaleSaved | FreedGraph] = {}
    # Checkpoints as the joint trace runs them: once, noting what their regions close over
    with fake_mode, enable_python_dispatcher(), functional_mode(), differentiating(), \
            checkpoints.run_once(), checkpoints.noting_closed_over():
        primals = to_functional(fakes)
        args = mutable_copies(info, primals)
        outs = graph_outputs(info, args, graph_fn(*args))
        wrt = [p for p in primals if isinstance(p, torch.Tensor) and p.requires_grad]
        for k in (k for k, d in enumerate(info.differentiable) if d):
            try:
                traced_grad(outs[k], wrt, torch.ones_like(outs[k]), retain_graph=True,
                            allow_unused=True)
            except StaleSavedValue as e:
                checkpoints.refuse_closed_over_write(e.tensor)
                found[k] = _describe(e, args, _plain_outputs(info, outs))
            except RuntimeError as e:
                if not freed_graph(e):
                    raise
                found[k] = FreedGraph(str(e))
    if not found:
        raise RuntimeError("aotgrad: the joint trace found a saved value modified in place "
                           "or freed, but no single output's backward reads it; please "
                           "report this.")
    return StaleBackward(tuple(found), next(iter(found.values())))


def _plain_outputs(info: FunctionInfo, outs: Sequence[Any]) -> dict[int, Any]:
    """The graph outputs the caller gets as they are (so may change in place), by index."""
    first = info.first_user_output
    return {first + j: outs[first + j] for j, o in enumerate(info.outputs)
            if o.kind is OutputKind.PLAIN and not o.made_leaf}


def _base(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _describe(e: StaleSavedValue, args: Sequence[Any], outs: dict[int, Any]) -> StaleSaved:
    t = e.tensor
    base = _base(t)
    i = next((j for j, a in enumerate(args) if a is base), None)
    output = next((k for k, o in outs.items()
                   if isinstance(o, torch.Tensor) and _base(o) is base), None)
    node = None if t.grad_fn is None else t.grad_fn.name()
    as_passed = i is not None and t is base and node == "CloneBackward0"  # mutable_copies
    output_nr = t.output_nr
    if i is None:  # made inside: eager names its node when saved, not the op that changed it
        node = None if e.node is None else eager_name(e.node)  # a Function Dynamo captured too
        output_nr = e.output_nr
    return StaleSaved(tuple(t.shape), t.dtype, t.device, i, as_passed, node, output_nr,
                      e.saved_version, t._version, output if i is None else None)


def _message(saved: StaleSaved, ctx) -> str:
    """Eager's error for the saved value, with the caller's tensor where it is one."""
    kind = torch.empty(0, dtype=saved.dtype, device=saved.device).type()
    node, output_nr = saved.node, saved.output_nr
    current, expected = saved.version, saved.saved_version
    if saved.input is not None:  # versions (and the node) of the caller's tensor
        t = ctx.stale_input
        current, expected = t._version, ctx.stale_version + saved.saved_version
        if saved.as_passed:
            node, output_nr = t.grad_fn and t.grad_fn.name(), t.output_nr
    elif saved.output is not None:  # and the caller's changes to the output since
        alias, held_at = ctx.stale_output
        current += alias._version - held_at
    where = f", which is output {output_nr} of {_eager_node_name(node)}," if node else ""
    return (f"one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{kind} {list(saved.shape)}]{where} is at version {current}; "
            f"expected version {expected} instead. {_eager_hint()}")


def _eager_error() -> str:
    x = torch.ones(1, requires_grad=True) * 1
    y = x.sin()
    x.add_(1)
    try:
        with compiled_autograd_off():  # first asked for under it (SavedOutputs.changed)
            y.backward()
    except RuntimeError as e:
        return str(e)
    return ""


def _eager_node_name(name: str) -> str:
    return _eager_style()[0](name)


def _eager_hint() -> str:
    return _eager_style()[1]


@functools.cache
def _eager_style() -> tuple[Callable[[str], str], str]:
    """How this torch's error names an autograd node ("AddBackward0" or "Add") and the hint
    it ends with: learnt from eager raising it once, in a thread of its own (free of the
    caller's grad mode and saved-tensor hooks, which would skip the check)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        message = pool.submit(_eager_error).result()
    strip = "of AddBackward0," not in message
    hint = message[message.index(" instead. ") + len(" instead. "):]
    return (_short_node_name if strip else (lambda n: n)), hint


def _short_node_name(name: str) -> str:
    """As torch's error shortens a node's name: "MulBackward0" is "Mul", "PowBackward1"
    "Pow1" (a foreach write leaves MulBackward1), "ForeachMulBackward1Scalar" stays."""
    return re.sub(r"Backward(\d*)$", lambda m: "" if m[1] in ("", "0") else m[1], name)
