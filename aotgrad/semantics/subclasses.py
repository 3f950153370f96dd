"""Tensor subclasses at the edges: traceable wrapper subclasses (TwoTensor, ...) in and out.

The graphs only ever hold plain tensors. A traceable wrapper subclass (one with
`__tensor_flatten__`/`__tensor_unflatten__`) is split into its inner tensors, recursively,
and rebuilt around the graph twice over:

- at trace time, inside the traced function (`plain_function`): the subclass is rebuilt from
  the fake inner placeholders, so its `__torch_dispatch__` runs while tracing and leaves
  plain ATen ops on the inner tensors; outputs are split again;
- at run time (`Boundary`): the caller's subclass inputs are split into the plain inputs
  the compiled graphs take, their outputs and input gradients are rebuilt into subclasses
  from metadata recorded while tracing, and the gradients flowing into the backward are
  split like the tangents the backward was traced for.

Analysis and the runtime plan see the caller's tensors (a `TwoTensor` is one input, one
output); only the compiled graphs and their partition count plain tensors. A call without
any subclass gets an empty `Boundary` and runs exactly as before.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..schema import FunctionInfo, Layout, OpaqueMeta, PlainMeta, SubclassMeta
from .dynamic import DynamicShapesUnsupported, SizeBindings, is_symbolic

_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)




# ---- recognising ---------------------------------------------------------------------------

def is_subclass(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and is_traceable_wrapper_subclass(t)


def unsized_nested(t: torch.Tensor) -> bool:
    """A nested tensor of strided layout: asking its sizes raises (a jagged one is a
    subclass, with sizes); `check_supported` refuses it."""
    return t.is_nested and not is_subclass(t)


def check_supported(t: torch.Tensor, what: str) -> None:
    """Refuse tensors a trace cannot stand in for: other layouts than strided (a sparse
    input's fake would be dense: its ops, and `is_sparse` branches, traced as dense ones),
    and subclasses that cannot be split into plain tensors."""
    if (t.layout is not torch.strided or t.is_nested) and not is_subclass(t):  # NJT is one
        raise NotImplementedError(
            f"aotgrad: {what} is a {'nested' if t.is_nested else t.layout} tensor; aotgrad "
            "traces strided (dense) tensors only. Pass it densified (t.to_dense()), or run "
            "that part outside the compiled function (torch.compiler.disable).")
    if type(t) in _PLAIN_TYPES or isinstance(t, (FakeTensor, FunctionalTensor)) or \
            is_subclass(t) or _plain_parameter(t):
        return
    raise NotImplementedError(
        f"aotgrad: {what} is a tensor subclass ({type(t).__name__}) that is not a traceable "
        "wrapper subclass (it lacks __tensor_flatten__/__tensor_unflatten__), so aotgrad "
        "cannot split it into plain tensors for the graph. Implement those two methods, or "
        "pass t.as_subclass(torch.Tensor) and rebuild the subclass outside.")


def _plain_parameter(t: torch.Tensor) -> bool:
    """A subclass of nn.Parameter that overrides neither torch function: Parameter turns
    __torch_function__ off, so eager runs its ops as a plain tensor's."""
    cls = type(t)
    return isinstance(t, torch.nn.Parameter) and \
        cls.__torch_function__ is torch.nn.Parameter.__torch_function__ and \
        cls.__torch_dispatch__ is torch.nn.Parameter.__torch_dispatch__


def describe(t: Any) -> "PlainMeta | SubclassMeta | None":
    """The layout of a value: None for non-tensors, else how it splits into plain tensors."""
    if not isinstance(t, torch.Tensor):
        return None
    if not is_subclass(t):
        return PlainMeta(tuple(t.shape), t.dtype, t.device)
    attrs, ctx = t.__tensor_flatten__()
    inner = tuple(_describe_part(getattr(t, a)) for a in attrs)
    return SubclassMeta(type(t), tuple(attrs), ctx, inner, tuple(t.shape), tuple(t.stride()))


def _describe_part(part: Any) -> "PlainMeta | SubclassMeta | OpaqueMeta":
    return describe(part) if isinstance(part, torch.Tensor) else OpaqueMeta(part)


def signature(t: torch.Tensor, seen: dict[int, int]) -> tuple:
    """What a graph compiled for subclass `t` specializes on beyond the outer tensor's own
    metadata: its layout, and each plain part's strides and identity (parts shared with
    other inputs, as `seen` numbers them)."""
    layout = describe(t)
    try:
        hash(layout)
    except TypeError:  # an unhashable flatten context: only the same object matches
        layout = (layout.cls, id(layout.ctx))
    return layout, tuple((p.stride(), p.storage_offset(), p.requires_grad,
                          seen.setdefault(id(p), len(seen))) for p in unwrap(t))


# ---- splitting and rebuilding --------------------------------------------------------------

def unwrap(t: Any) -> list:
    """The plain tensors inside `t`, depth first; anything else is its own one-item list
    (a subclass's non-tensor parts are none: they travel in its layout)."""
    if not is_subclass(t):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    parts = (getattr(t, a) for a in attrs)
    return [p for part in parts if isinstance(part, torch.Tensor) for p in unwrap(part)]


def wrap(layout: Layout, plain: Iterator) -> Any:
    """The value of `layout`, consuming its plain tensors from `plain`."""
    if isinstance(layout, OpaqueMeta):
        return layout.value
    if not isinstance(layout, SubclassMeta):
        return next(plain)
    inner = {a: wrap(m, plain) for a, m in zip(layout.attrs, layout.inner)}
    return layout.cls.__tensor_unflatten__(inner, layout.ctx, layout.size, layout.stride)


def map_plain(t: torch.Tensor, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """`t` rebuilt with `fn` applied to every plain tensor inside it (`fn(t)` if plain)."""
    if not isinstance(t, torch.Tensor):  # a subclass's non-tensor part
        return t
    if not is_subclass(t):
        return fn(t)
    attrs, ctx = t.__tensor_flatten__()
    inner = {a: map_plain(getattr(t, a), fn) for a in attrs}
    return type(t).__tensor_unflatten__(inner, ctx, t.shape, t.stride())


def empty(layout: "PlainMeta | SubclassMeta") -> torch.Tensor:
    """A contiguous tensor of `layout` (fake under a fake mode): a tangent to trace with."""
    return _build(layout, torch.empty)


def zeros(layout: "PlainMeta | SubclassMeta") -> torch.Tensor:
    """The gradient of an output the loss did not use."""
    return _build(layout, torch.zeros)


def _build(layout: "PlainMeta | SubclassMeta | OpaqueMeta", make: Callable) -> Any:
    if isinstance(layout, OpaqueMeta):
        return layout.value
    if isinstance(layout, PlainMeta):
        return make(layout.shape, dtype=layout.dtype, device=layout.device)
    inner = {a: _build(m, make) for a, m in zip(layout.attrs, layout.inner)}
    stride = torch.empty(layout.size, device="meta").stride()
    return layout.cls.__tensor_unflatten__(inner, layout.ctx, layout.size, stride)


def _plain_shapes(layout: "PlainMeta | SubclassMeta | OpaqueMeta") -> list[tuple[int, ...]]:
    if isinstance(layout, OpaqueMeta):
        return []
    if isinstance(layout, PlainMeta):
        return [layout.shape]
    return [s for m in layout.inner for s in _plain_shapes(m)]


# ---- at trace time -------------------------------------------------------------------------

def plain_function(fn: Callable, args: tuple[list, ...]) -> tuple[Callable, tuple[list, ...], list]:
    """`fn`, taking lists of tensors that may be subclasses and returning a list of values, as
    a function of lists of plain tensors returning plain values. Subclass arguments are
    rebuilt inside (a primal that requires grad as a fresh leaf that does); the returned
    list, filled by the trace, holds each output's layout before it was split."""
    layouts = [[(describe(a), a.requires_grad) if is_subclass(a) else None for a in group]
               for group in args]
    traced: list = []

    @functools.wraps(fn)  # keeps the parameter names that name the placeholders
    def plain_fn(*groups):
        outs = fn(*[_rebuild(g, ls) for g, ls in zip(groups, layouts)])
        traced[:] = [describe(o) for o in outs]
        return [p for o in outs for p in unwrap(o)]

    return plain_fn, tuple([p for a in group for p in unwrap(a)] for group in args), traced


def _rebuild(plain: list, layouts: list) -> list:
    it = iter(plain)
    return [next(it) if slot is None else wrap(slot[0], it).requires_grad_(slot[1])
            for slot in layouts]


def num_plain(layouts: Sequence[Layout]) -> int:
    return sum(1 if m is None else m.num_plain for m in layouts)


# ---- at run time ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Boundary:
    """How the compiled graphs' plain inputs and outputs map to the caller's tensors."""

    subclass_inputs: frozenset[int]  # graph inputs that are subclasses
    outputs: tuple[Layout, ...]  # per forward graph output (mutated inputs, outputs, bases)
    tangents: tuple["PlainMeta | SubclassMeta", ...]  # per differentiable forward output
    grads: tuple[Layout, ...]  # per graph input: the gradient the backward returns
    bumped: tuple[int, ...] = ()  # subclass inputs the graph itself copies new values into
    # Where the symbolic sizes of subclass outputs are found in a call's inputs (dynamic
    # shapes); None where they are all static.
    sizes: SizeBindings | None = None
    # The same for the gradients of subclass inputs, found in the backward's inputs.
    grad_sizes: SizeBindings | None = None

    @property
    def is_plain(self) -> bool:
        layouts = self.outputs + self.grads
        return not self.subclass_inputs and not any(isinstance(m, SubclassMeta) for m in layouts)

    def plain_count(self, num_outputs: int) -> int:
        """How many plain graph outputs the first `num_outputs` forward outputs make."""
        return num_plain(self.outputs[:num_outputs])

    def grads_per_input(self, plain_grads: Sequence) -> list[list]:
        it = iter(plain_grads)
        return [[next(it) for _ in range(num_plain([m]))] for m in self.grads]

    def unwrap_inputs(self, inputs: Sequence) -> list:
        subs = self.subclass_inputs
        return [p for i, t in enumerate(inputs) for p in (unwrap(t) if i in subs else (t,))]

    def wrap_forward(self, compiled: Callable) -> Callable:
        """The compiled forward (or inference graph) taking and returning the caller's
        tensors; the saved values after the outputs stay plain."""
        def forward(inputs: list) -> list:
            plain = compiled(self.unwrap_inputs(inputs))
            it = iter(plain)
            layouts = self.outputs
            if self.sizes is not None:  # this call's sizes, not the trace's symbols
                concrete = self.sizes.concrete(inputs)
                layouts = [_concrete(m, concrete) for m in layouts]
            outs = [wrap(m, it) for m in layouts]
            for i in self.bumped:  # eager bumps the subclass's own version counter
                torch.autograd.graph.increment_version(inputs[i])
            return outs + list(it)
        return forward

    def wrap_backward(self, compiled: Callable) -> Callable:
        """The compiled backward taking (saved values, the caller's gradients) and returning
        one gradient per input, rebuilt as the subclass eager would give."""
        num_tangents = len(self.tangents)

        def backward(args: list) -> list:
            k = len(args) - num_tangents
            plain = args[:k]
            for layout, g in zip(self.tangents, args[k:]):
                plain += _split_tangent(layout, g)
            args.clear()
            grads = self.grads
            if self.grad_sizes is not None:  # read before the call empties `plain`
                concrete = self.grad_sizes.concrete(plain)
                grads = [_concrete(m, concrete) for m in grads]
            it = iter(compiled(plain))
            return [wrap(m, it) for m in grads] + list(it)  # then new values of inputs
        return backward


def tangent_like(out: torch.Tensor) -> torch.Tensor:
    """`out` as its gradient is traced: a subclass may ask for another layout
    (`__coerce_tangent_metadata__`: a Partial DTensor's gradient is a Replicate one, which
    is what eager's backward of a reduction hands it)."""
    if not is_subclass(out) or not hasattr(out, "__coerce_tangent_metadata__"):
        return out
    with torch.no_grad():
        return out.__coerce_tangent_metadata__()


def _coerced(layout: "PlainMeta | SubclassMeta", g: Any) -> Any:
    """Gradient `g` in the layout the backward was traced for, where its class can move it
    there (`__coerce_same_metadata_as_tangent__`: a DTensor redistributes). Splitting a
    gradient of other placements as it is would hand the backward local shards that mean
    something else (a Replicate gradient read as Partial is summed over the ranks)."""
    if not isinstance(layout, SubclassMeta) or type(g) is not layout.cls or \
            not hasattr(g, "__coerce_same_metadata_as_tangent__"):
        return g
    # A symbolic layout's context holds SymInts: comparing them would specialize the sizes.
    if not is_symbolic(_outer_sizes([layout])) and g.__tensor_flatten__()[1] == layout.ctx:
        return g
    coerced = g.__coerce_same_metadata_as_tangent__(layout.ctx)
    return g if coerced is None else coerced


def _split_tangent(layout: "PlainMeta | SubclassMeta", g: Any) -> list:
    expected = layout.cls if isinstance(layout, SubclassMeta) else None
    g = _coerced(layout, g)
    got = type(g) if is_subclass(g) else None
    plain = [p.contiguous() for p in unwrap(g)] if got is expected else []
    if got is not expected or not _fits(plain, _plain_shapes(layout)):
        raise RuntimeError(
            f"aotgrad: a gradient of shape {tuple(g.shape)} reached the compiled backward as "
            f"{_name(got)}, but the backward was traced for {_name(expected)} with parts of "
            f"shapes {_plain_shapes(layout)}, the layout of the output it belongs to. This "
            "happens when a loss mixes a tensor subclass output with a plain one (e.g. "
            "two.sum() + plain.sum()) or when .backward(gradient) passes another type. Keep "
            "each output's gradient of the output's own type.")
    return plain


def _fits(plain: list, shapes: list) -> bool:
    """Whether the gradient's parts have the traced shapes; a symbolic size (a plain output
    of a graph with dynamic shapes) fits any."""
    if len(plain) != len(shapes):
        return False
    return all(len(p.shape) == len(shape) and
               all(isinstance(e, torch.SymInt) or n == e for n, e in zip(p.shape, shape))
               for p, shape in zip(plain, shapes))


def _name(cls: type | None) -> str:
    return "a plain tensor" if cls is None else f"a {cls.__name__}"


def make_boundary(fakes: Sequence[torch.Tensor], traced: Sequence[Layout], info: FunctionInfo,
                  copied_in_graph: Sequence[int] = ()) -> Boundary:
    """The boundary of one compile, from its fake inputs, its `FunctionInfo` and the layouts
    of its traced graph's outputs (`TRACED_OUTPUTS`; inference or joint: a joint graph's
    outputs after the forward's are the input gradients)."""
    n = info.num_graph_outputs
    subs = frozenset(i for i, f in enumerate(fakes) if is_subclass(f))
    tangents = tuple(tangent_layout(m)
                     for m, d in zip(info.graph_output_metas, info.gets_tangent) if d)
    grads = tuple(traced[n:n + len(fakes)])
    # After the gradients, a joint graph returns the inputs the backward writes into.
    return Boundary(subs, tuple(traced[:n]), tangents, grads,
                    bumped=tuple(i for i in copied_in_graph if i in subs),
                    sizes=_output_sizes(fakes, traced[:n]))


def _outer_sizes(layouts: Sequence[Layout]) -> list:
    return [(m.size, m.stride) for m in layouts if isinstance(m, SubclassMeta)]


def bind_grad_sizes(edge: Boundary, backward: "torch.fx.GraphModule") -> Boundary:
    """`edge` knowing where each call of `backward` finds the symbolic sizes of the subclass
    gradients it rebuilds (its saved sizes and activations hold them)."""
    sizes = _outer_sizes(edge.grads)
    if not is_symbolic(sizes):
        return edge
    fakes = [n.meta.get("val") for n in backward.graph.find_nodes(op="placeholder")]
    bindings = SizeBindings(fakes)
    if bindings.unbound(sizes):
        raise DynamicShapesUnsupported(
            "aotgrad: a tensor subclass input's gradient has sizes the backward's inputs do "
            "not hold.")
    return dataclasses.replace(edge, grad_sizes=bindings)


def _output_sizes(fakes: Sequence[Any], outputs: Sequence[Layout]) -> SizeBindings | None:
    """Where a call finds the sizes of its subclass outputs, where they are symbolic."""
    sizes = _outer_sizes(outputs)
    if not is_symbolic(sizes):
        return None
    bindings = SizeBindings(fakes)
    if bindings.unbound(sizes):
        raise DynamicShapesUnsupported(
            "aotgrad: a tensor subclass output has sizes no input's size determines.")
    return bindings


def _concrete(layout: Layout, concrete: Callable) -> Layout:
    """`layout` with one call's sizes for its symbolic outer sizes (its flatten context may
    keep symbols: DTensor rebuilds its spec from the outer size and stride it is given)."""
    if not isinstance(layout, SubclassMeta):
        return layout
    inner = tuple(_concrete(m, concrete) for m in layout.inner)
    return dataclasses.replace(layout, inner=inner, size=concrete(layout.size),
                               stride=concrete(layout.stride))


def tangent_layout(meta) -> "PlainMeta | SubclassMeta":
    """A gradient is assumed to have the layout of its output, as eager's would."""
    return meta.subclass or PlainMeta(meta.shape, meta.dtype, meta.device)
