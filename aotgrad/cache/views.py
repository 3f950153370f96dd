"""An output view's replay as data, for an entry keyed before the trace (cache/program.py).

The analysis keeps, for an output that is a view, the callable autograd recorded with it
(`Tensor._view_func_unsafe`): it replays the ATen view ops that made the view on a new base,
so that the runtime's view has the grad_fn, `_base` and version counter eager's has. That
callable is native code with no encoding. What it does is a short list of ATen view ops and
their arguments: we run it once on a meta tensor shaped like the base, under a dispatch mode
that writes the calls down, and keep them as a `ViewChain`, which replays the same ops (so
the same autograd nodes) on the base it is given. A chain holds ATen view ops only (checked
again when an entry is decoded) and no tensor but the one it takes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..schema import FunctionInfo, OutputInfo, OutputKind
from .codec import Unencodable


@dataclass(frozen=True)
class ViewStep:
    """One view op applied to the previous step's result: `op(prev, *args, **kwargs)`, then
    element `index` of the list it returns (split, unbind), if it returns a list."""

    op: torch._ops.OpOverload
    args: tuple
    kwargs: tuple[tuple[str, Any], ...] = ()
    index: int | None = None

    def __post_init__(self):  # an entry names ops; only ATen's views may run from one
        if not (isinstance(self.op, torch._ops.OpOverload) and self.op.is_view and
                self.op.namespace == "aten"):
            raise ValueError(f"{self.op} is not an ATen view op")


@dataclass(frozen=True)
class ViewChain:
    """Replays a view on a new base, as `Tensor._view_func_unsafe` does. No steps: that
    view had none to replay (the runtime then uses as_strided, as for the callable's None)."""

    steps: tuple[ViewStep, ...]

    def __call__(self, base: torch.Tensor, symint_visitor_fn: Callable | None = None):
        # symint_visitor_fn: the chain holds no symbolic size (encode refuses them).
        if not self.steps:
            return None
        view = base
        for step in self.steps:
            view = step.op(view, *step.args, **dict(step.kwargs))
            if step.index is not None:
                view = view[step.index]
        return view


def with_encodable_replays(info: FunctionInfo, fakes: list) -> FunctionInfo:
    """`info` with each output's view replay as a `ViewChain`; Unencodable where one cannot
    be written down (a symbolic size, a tensor argument, an op that is not a view)."""
    if all(o.replay is None or isinstance(o.replay, ViewChain) for o in info.outputs):
        return info
    outputs = tuple(o if o.replay is None else
                    dataclasses.replace(o, replay=chain_of(o.replay, _probe_base(info, o, fakes)))
                    for o in info.outputs)
    return dataclasses.replace(info, outputs=outputs)


def chain_of(replay: Callable, base: torch.Tensor) -> ViewChain:
    """The ops `replay` runs on `base`, checked to give the same view again."""
    recorder = _Recorder()
    try:
        with torch.no_grad(), recorder:
            view = replay(base)
    except RuntimeError as exc:
        # The probe base of an intermediate is contiguous, which not every chain takes: an
        # attention's output (laid out as its query, [b, t, h, d]) returned as
        # `.transpose(1, 2).view(b, t, h * d)` refuses it. Such an entry is keyed after
        # the trace instead, quietly (it was a warning for a common attention block).
        raise Unencodable(f"an output view whose replay needs its base's layout ({exc})") \
            from None
    chain = ViewChain(_steps(recorder.calls, base, view))
    with torch.no_grad():
        again = chain(base)
    if _geometry(again) != _geometry(view):
        raise Unencodable("an output view whose replay does not retrace to the same view")
    return chain


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, out))
        return out


def _steps(calls: list, base: torch.Tensor, view: Any) -> tuple[ViewStep, ...]:
    if view is None:
        if calls:
            raise Unencodable("an output view whose replay ran ops and gave no view")
        return ()
    steps, prev = [], base
    for i, (func, args, kwargs, out) in enumerate(calls):
        if not args or args[0] is not prev:
            raise Unencodable(f"an output view whose replay calls {func} on another tensor")
        nxt = calls[i + 1][1][0] if i + 1 < len(calls) and calls[i + 1][1] else view
        index = _index_in(out, nxt)
        steps.append(_step(func, args[1:], kwargs, index))
        prev = out if index is None else out[index]
    if prev is not view:
        raise Unencodable("an output view whose replay's ops do not end on the view")
    return tuple(steps)


def _index_in(out: Any, nxt: Any) -> int | None:
    if isinstance(out, torch.Tensor):
        return None
    for i, x in enumerate(out):
        if x is nxt:
            return i
    raise Unencodable("an output view taken from a list of views the replay did not return")


def _step(func: Any, args: tuple, kwargs: dict, index: int | None) -> ViewStep:
    values = [*args, *kwargs.values()]
    if any(isinstance(v, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool))
           for v in torch.utils._pytree.tree_leaves(values)):
        raise Unencodable(f"an output view made by {func} with a tensor or symbolic argument")
    try:
        return ViewStep(func, tuple(args), tuple(kwargs.items()), index)
    except ValueError:
        raise Unencodable(f"an output view whose replay calls {func}, not an ATen view op") \
            from None


def _probe_base(info: FunctionInfo, o: OutputInfo, fakes: list) -> torch.Tensor:
    """A meta tensor shaped as `o`'s base: an input as given, a graph output contiguous
    (the most permissive layout: a view op that worked on the real base works on it)."""
    if o.kind is OutputKind.VIEW_OF_INPUT:
        t = fakes[o.source]
        return _lazy_bits_of(t, _meta(t.shape, t.stride(), t.storage_offset(), t.dtype))
    first = info.first_user_output
    index = {OutputKind.VIEW_OF_OUTPUT: first + o.source,
             OutputKind.VIEW_OF_INTERMEDIATE: first + len(info.outputs) + o.source}[o.kind]
    meta = info.graph_output_metas[index]
    if meta is None or meta.subclass is not None:
        raise Unencodable("an output view of a symbolic-size or subclass base")
    return _meta(meta.shape, torch.empty(meta.shape, device="meta").stride(), 0, meta.dtype)


def _meta(shape, stride, offset, dtype) -> torch.Tensor:
    if any(not isinstance(s, int) for s in (*shape, *stride, offset)):
        raise Unencodable("an output view of a base with symbolic sizes (dynamic=True)")
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
    # A flat storage that holds the geometry: an as_strided in the chain reads the offset.
    flat = torch.empty(offset + extent, dtype=dtype, device="meta")
    return flat.as_strided(shape, stride, offset)


def _lazy_bits_of(t: torch.Tensor, probe: torch.Tensor) -> torch.Tensor:
    """`probe` with `t`'s conjugate and negative bits: a view of a conjugate input (its
    `.imag`) replays through `_conj`, which only a conjugate base allows."""
    torch._C._set_conj(probe, t.is_conj())
    torch._C._set_neg(probe, t.is_neg())
    return probe


def _geometry(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    return tuple(t.shape), t.stride(), t.storage_offset(), t.dtype, t.is_conj(), t.is_neg()
