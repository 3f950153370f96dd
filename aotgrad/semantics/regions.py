"""Compiled regions (`torch.compiler.nested_compile_region`): traced once, called N times.

Dynamo hands a region's calls over as `invoke_subgraph(body, identifier, *operands)` nodes
that share one body. Each call through PyTorch's own HOP rules costs a fake-tensor run of
the body, a schema, a functionalization of its wrapper, a proxy node built by a rule of its
own and an autograd.Function that unpacks its inputs and keys a cache by the tangents'
metadata: compile time that grows with the number of calls, although the body is traced once.

Here a region is handled per body, identifier and operand metadata (`RegionKey`): the first
call runs aotgrad's own stages on the body (analysis, joint trace, the partition the compile
uses) into a forward graph (operands -> outputs, then the values saved for the backward) and
a backward graph (saved values, then tangents -> gradients). Every call, the first included,
then emits `invoke_subgraph(forward, "fw_<id>", ...)` and, in the backward,
`invoke_subgraph(backward, "bw_<id>", ...)`: one node each, whose fake outputs are made from
the metadata kept at the build, without running the body. The compiled graphs still call the
HOP, so that Inductor lowers each shared body once (its `invoke_subgraph` lowering).

Where this does not apply, a call goes to PyTorch's rules as before (`hops.py`): outside a
compile (a double backward's replay), without functionalization (`capture.pure`, which stops
at the HOP and retraces functionalized), with symbolic sizes, and for bodies that mutate or
alias their operands (Dynamo turns those into `auto_functionalized` calls).

A double backward's replay (replay/double_backward.py) traces the ops eager runs, and in
eager a region is a plain call of its body: inside `inlined()`, the graph's interpreter
runs the body in place of the HOP (capture/inputs.py), so that its ops are replayed and
differentiated like the rest.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.functional_tensor import PythonFunctionalizeAPI
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, track_tensor_tree
from torch.utils._python_dispatch import _disable_current_modes

from ..schema import OutputKind
from .dynamic import is_symbolic

INVOKE_SUBGRAPH = torch.ops.higher_order.invoke_subgraph
# Dynamo's call of a `torch.utils.checkpoint` block: its body, run in place by a replay.
CHECKPOINT = torch.ops.higher_order.tag_activation_checkpoint
# What the regions of this process cost, for tests and reports: "built" (a body traced and
# partitioned), "reused" (a call served by an earlier build), "torch" (a call left to
# PyTorch's rules).
stats: collections.Counter = collections.Counter()


@dataclass(frozen=True)
class OutputMeta:
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, node: fx.Node) -> "OutputMeta":
        v = node.meta["val"]
        return cls(tuple(v.shape), tuple(v.stride()), v.dtype, v.device)

    def empty(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)


@dataclass(frozen=True)
class Region:
    """One body traced and partitioned for one operand layout. Without a backward (no
    operand needs a gradient), `forward` returns the outputs only."""

    identifier: str
    body: fx.GraphModule  # held: the cache key holds its id
    forward: fx.GraphModule  # operands -> outputs, then saved values
    backward: fx.GraphModule | None  # saved values, then tangents -> the gradients it gives
    num_outputs: int
    differentiable: tuple[bool, ...]  # per output: whether the backward takes its tangent
    has_grad: tuple[bool, ...]  # per operand: whether the backward returns its gradient
    # per output: the layout its tangent was traced in (`TensorMeta.memory_format`)
    formats: tuple[torch.memory_format, ...]


# The body, its identifier, grad mode, and each operand's layout and requires_grad.
RegionKey = tuple


class RegionCache:
    """The regions of one compile, built on first use by `build(body, identifier, fakes)`
    (the pipeline's stages, passed in: they sit above this module). None: not ours."""

    def __init__(self, build: Callable[..., Region | None]):
        self.build = build
        self.regions: dict[RegionKey, Region | None] = {}
        self.graphs: dict[fx.GraphModule, tuple[OutputMeta, ...]] = {}

    def region(self, body, identifier: str, operands: Sequence) -> Region | None:
        key = (id(body), identifier, torch.is_grad_enabled(), tuple(map(_layout, operands)))
        if key in self.regions:
            stats["reused" if self.regions[key] else "torch"] += 1
            return self.regions[key]
        with _disable_current_modes():  # traced as a function of its own
            region = self.build(body, identifier, fresh_fakes(operands))
        self.regions[key] = region
        stats["built" if region else "torch"] += 1
        if region is not None:
            self.graphs[region.forward] = _output_metas(region.forward)
            if region.backward is not None:
                self.graphs[region.backward] = _output_metas(region.backward)
        return region


_CACHE: contextvars.ContextVar[RegionCache | None] = contextvars.ContextVar(
    "aotgrad_regions", default=None)
# Inside `inlined()`: the identifiers of the regions whose bodies ran in place.
_INLINED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "aotgrad_inlined_regions", default=None)


@contextlib.contextmanager
def inlined():
    """Regions' calls run their bodies, as eager does (a double backward's replay); yields
    the identifiers of those that did."""
    token = _INLINED.set([])
    try:
        yield _INLINED.get()
    finally:
        _INLINED.reset(token)


def replaying() -> bool:
    """Inside `inlined()`: a double backward's replay, whose higher-order calls run their
    bodies in place, as eager does."""
    return _INLINED.get() is not None


def inline(identifier: str) -> bool:
    """Whether a call of region `identifier` runs its body in place (noted if so)."""
    ran = _INLINED.get()
    if ran is not None:
        ran.append(identifier)
    return ran is not None


def reused_in_compile(build: Callable[..., Callable[..., Region | None]]) -> Callable:
    """Decorates `compile_call(fn, flat_args, in_spec, options)`: its regions are built once,
    by `build(options)`. A compile inside a compile (a region's body) keeps the outer cache."""
    def decorate(compile_call: Callable) -> Callable:
        @functools.wraps(compile_call)
        def compile_with_regions(fn, flat_args, in_spec, options):
            if _CACHE.get() is not None:
                return compile_call(fn, flat_args, in_spec, options)
            token = _CACHE.set(RegionCache(build(options)))
            try:
                return compile_call(fn, flat_args, in_spec, options)
            finally:
                _CACHE.reset(token)
        return compile_with_regions
    return decorate


def call_region(body, identifier: str, *operands):
    """`invoke_subgraph(body, identifier, *operands)` as the graph's interpreter runs it."""
    cache = _CACHE.get()
    if cache is None or not _functionalizing() or is_symbolic(operands) or identifier is None:
        stats["torch"] += 1
        return INVOKE_SUBGRAPH(body, identifier, *operands)
    region = cache.region(body, identifier, operands)
    if region is None:
        return INVOKE_SUBGRAPH(body, identifier, *operands)
    if region.backward is None:
        return tuple(_invoke(region.forward, "fw_" + identifier, operands))
    return _RegionCall.apply(region, *operands)


class _RegionCall(torch.autograd.Function):
    """A region's forward and backward graphs, each called as one `invoke_subgraph`."""

    @staticmethod
    def forward(ctx, region: Region, *operands):
        outs = _invoke(region.forward, "fw_" + region.identifier, operands)
        ctx.region = region
        ctx.save_for_backward(*outs[region.num_outputs:])
        ctx.mark_non_differentiable(*(o for o, d in zip(outs, region.differentiable) if not d))
        return tuple(outs[:region.num_outputs])

    @staticmethod
    def backward(ctx, *grads):
        region = ctx.region
        # In the layouts the backward graph's tangents were traced in (`joint.fake_tangents`).
        tangents = [g.contiguous(memory_format=f)
                    for g, d, f in zip(grads, region.differentiable, region.formats) if d]
        given = iter(_invoke(region.backward, "bw_" + region.identifier,
                             [*ctx.saved_tensors, *tangents]))
        return (None, *(next(given) if has else None for has in region.has_grad))


def _invoke(graph: fx.GraphModule, identifier: str, operands: Sequence) -> list:
    """Below autograd (the caller's autograd.Function is the region's), to the functional
    mode, which hands calls of a built graph to `emit`."""
    with torch._C._AutoDispatchBelowAutograd():
        return list(INVOKE_SUBGRAPH(graph, identifier, *operands))


def is_built(graph: Any) -> bool:
    cache = _CACHE.get()
    return cache is not None and isinstance(graph, fx.GraphModule) and graph in cache.graphs


def emit(mode, graph: fx.GraphModule, identifier: str, *operands) -> tuple:
    """A built graph's call, under the functional `mode`: one node in the trace (if one is
    being made), outputs made from the metadata kept at the build."""
    metas = _CACHE.get().graphs[graph]
    ctx = PythonFunctionalizeAPI(mode)
    inner = ctx.unwrap_tensors(list(operands))
    with ctx.redispatch_to_next():
        with disable_proxy_modes_tracing():
            outs = tuple(m.empty() for m in metas)
        _trace_call(graph, identifier, inner, outs)
    return ctx.wrap_tensors(outs)


def _trace_call(graph: fx.GraphModule, identifier: str, operands: Sequence,
                outs: tuple) -> None:
    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:  # the analysis: no trace
        return
    tracer = proxy_mode.tracer
    if not any(m is graph for m in tracer.root.modules()):
        tracer.root.register_module(tracer.get_fresh_qualname("repeated_subgraph"), graph)
    args = pytree.tree_map(tracer.unwrap_proxy, (graph, identifier, *operands))
    proxy = tracer.create_proxy("call_function", INVOKE_SUBGRAPH, args, {})
    track_tensor_tree(outs, proxy, constant=None, tracer=tracer)


def _functionalizing() -> bool:
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FUNCTIONAL) is not None


def _layout(operand: Any) -> tuple:
    if not isinstance(operand, torch.Tensor):
        return type(operand), repr(operand)
    return (tuple(operand.shape), tuple(operand.stride()), operand.dtype, operand.device,
            operand.requires_grad)


def fresh_fakes(operands: Sequence) -> list:
    """Fake tensors with the operands' metadata (the caller's modes are off)."""
    tensors = [o for o in operands if isinstance(o, torch.Tensor)]
    with torch._guards.detect_fake_mode(tensors):
        return [_fresh(o) if isinstance(o, torch.Tensor) else o for o in operands]


def _fresh(t: torch.Tensor) -> torch.Tensor:
    fresh = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return fresh.requires_grad_(t.requires_grad)


def _output_metas(graph: fx.GraphModule) -> tuple[OutputMeta, ...]:
    return tuple(OutputMeta.of(n) for n in graph.graph.output_node().args[0])


def is_plain_body(info) -> bool:
    """A body that neither mutates nor aliases its operands, whose outputs are all computed:
    its graphs' outputs are its own (what `Region` assumes)."""
    return (not any(x.mutated or x.storage_swap or x.gains_requires_grad for x in info.inputs)
            and all(o.kind is OutputKind.PLAIN for o in info.outputs)
            and info.num_intermediate_bases == 0 and not info.stale_outputs)


def keep_given_grads(backward: fx.GraphModule) -> tuple[bool, ...]:
    """Drop the backward's None gradients (a HOP returns tensors): which it keeps."""
    out = backward.graph.output_node()
    grads = list(out.args[0])
    out.args = ([g for g in grads if g is not None],)
    backward.recompile()
    return tuple(g is not None for g in grads)


def all_tensors(graph: fx.GraphModule) -> bool:
    return all(isinstance(n, fx.Node) and isinstance(n.meta.get("val"), torch.Tensor)
               for n in graph.graph.output_node().args[0])
