"""Outputs their own eager node saved for its backward (`exp`, `tanh`, `relu`, a custom
Function's `ctx.save_for_backward(out)`).

The caller may change such an output in place after the call; eager's backward through it
then raises, where the compiled backward reads its own saved values and would run on
(stale.SavedOutputs checks the version at run time). Three kinds of node keep what they
saved in three places:

- a C++ node shows each saved value as a `_saved_*` attribute;
- a custom Function's node as `saved_tensors`;
- Dynamo replaces a custom Function by `autograd_function_apply`, whose node (an
  `ApplyTemplate` Function's) keeps the values in its forward's closure, unchecked; the
  ones the user's `ctx.save_for_backward` got are `saved_for_backward_idx` among them.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from ..semantics.dynamic import is_size


def saved_by_own_node(o: Any) -> tuple[str | None, int, int] | None:
    """Whether `o`'s autograd node saved `o` itself: the node's name as eager's error names
    it (None where unknown), `o`'s output number and version; else None. A saved output
    unpacks as a tensor whose grad_fn is the node that saved it."""
    node = o.grad_fn if isinstance(o, torch.Tensor) and not is_size(o) else None
    if node is None:
        return None
    for v in _saved_values(node):
        if isinstance(v, torch.Tensor) and v.grad_fn is node and v.output_nr == o.output_nr:
            return eager_name(node), o.output_nr, o._version
    return None


def _saved_values(node: Any) -> list[Any]:
    captured = _captured_function_saves(node)
    if captured is not None:
        return captured
    if isinstance(node, BackwardCFunction):  # a custom Function's
        names = ["saved_tensors"]
    else:  # a C++ node
        names = [name for name in dir(node) if name.startswith("_saved_")]
    values = []
    for name in names:
        try:
            value = getattr(node, name)
        except RuntimeError:  # modified in place since (stale.py's case) or freed
            continue
        values += value if isinstance(value, (tuple, list)) else [value]
    return values


def _captured_function_saves(node: Any) -> list[Any] | None:
    """What the user's `ctx.save_for_backward` got, for the node of a custom Function that
    Dynamo captured (None for any other node)."""
    cells = _forward_closure(node)
    if cells is None or not {"saved_values", "saved_for_backward_idx"} <= cells.keys():
        return None
    values = cells["saved_values"].cell_contents or ()
    return [values[i] for i in cells["saved_for_backward_idx"].cell_contents]


def check_saves_at_backward(out: Any) -> None:
    """Where the trace runs Dynamo's `autograd_function_apply`: what the user's
    `ctx.save_for_backward` got is packed by the trace's saved-tensor hooks (which check
    versions as eager's node does) and unpacked before the node's backward runs. Its
    closure kept them unchecked: a saved input written in place later in the function ran
    on, where eager's backward raises."""
    node = next((t.grad_fn for t in out if isinstance(t, torch.Tensor)
                 and t.grad_fn is not None), None) if isinstance(out, (tuple, list)) else None
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
    saves = _captured_function_saves(node) if node is not None else None
    # only the trace's own hooks: the user's run at the compiled call, on its saved values
    if not saves or hooks is None or hooks[0].__module__ != "aotgrad.capture.inputs":
        return
    pack, unpack = hooks
    packed = [pack(v) for v in saves if isinstance(v, torch.Tensor)]
    backward = node._forward_cls.backward

    def checked_backward(ctx, *grads):
        for p in packed:
            unpack(p)
        return backward(ctx, *grads)
    node._forward_cls.backward = staticmethod(checked_backward)


def _forward_closure(node: Any) -> dict[str, Any] | None:
    forward_cls = getattr(node, "_forward_cls", None)
    if forward_cls is None or forward_cls.__name__ != "ApplyTemplate":
        return None
    forward = forward_cls.forward
    return dict(zip(forward.__code__.co_freevars, forward.__closure__ or ()))


def eager_name(node: Any) -> str | None:
    """Eager names a custom Function's node after its class; the class Dynamo captured is
    named where the graph's stack traces show one `Name.apply(` call or else a frame of one
    Function's `forward` (None: not named, which eager's error then leaves out)."""
    cells = _forward_closure(node)
    if cells is None:
        return node.name()
    fwd = cells["fwd"].cell_contents if "fwd" in cells else None
    nodes = fwd.graph.nodes if isinstance(fwd, torch.fx.GraphModule) else ()
    traces = [n.meta.get("stack_trace") or "" for n in nodes]
    names = {m for trace in traces for m in _applied(trace)}
    if len(names) != 1:  # two applied on one line, and no column marks (torch 2.11)
        names = {m for trace in traces for m in _forward_of(trace)}
    return f"{names.pop()}Backward" if len(names) == 1 else None


def _applied(trace: str) -> list[str]:
    """The class of the `Name.apply(` call in the last frame of a stack trace that makes
    one: the Function Dynamo replaced (an enclosing Function's forward calls it from a
    frame further up). Where the frame marks the call's columns (`^^^`), from there: a
    line may apply two."""
    lines = trace.splitlines()
    found: list[str] = []
    for k, line in enumerate(lines):
        marks = lines[k + 1] if k + 1 < len(lines) else ""
        if "^" in marks and marks.strip(" ^~") == "":
            call = _MARKED_APPLY.match(line[marks.find("^"):])
            calls = [call[1]] if call else []
        else:  # unmarked: only a line that applies one Function names it
            calls = list(set(_APPLY.findall(line)))
        if calls:
            found = calls
    return found if len(found) == 1 else []


_APPLY = re.compile(r"\b(\w+)\.apply\(")
_MARKED_APPLY = re.compile(r"(?:\w+\.)*?(\w+)\.apply\(")


def _forward_of(trace: str) -> list[str]:
    """The Function whose `forward` the innermost such frame of a stack trace runs in,
    found among its module's classes by the frame's file and line (a Function defined in a
    function's body is not found)."""
    for file, line in reversed(_FORWARD_FRAME.findall(trace)):
        modules = [m for m in list(sys.modules.values()) if getattr(m, "__file__", 0) == file]
        found = [name for m in modules for name, cls in vars(m).items()
                 if isinstance(cls, type) and issubclass(cls, torch.autograd.Function)
                 and _runs_at(vars(cls).get("forward"), file, int(line))]
        if found:
            return found
    return []


def _runs_at(forward: Any, file: str, line: int) -> bool:
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    return (code is not None and code.co_filename == file
            and line in {n for _, _, n in code.co_lines()})


_FORWARD_FRAME = re.compile(r'File "([^"]+)", line (\d+), in forward\b')
