"""`enable("inductor")`: a specialized backward graph, its ATen ops compiled by Inductor.

The graph interleaves ATen ops with Python calls Inductor cannot hold (`hooks.EFFECTS`:
hooks, `.grad` accumulation, opaque custom backwards). It is cut into *segments*, the runs
of ATen ops between two such calls, each compiled by Inductor (`compile_fx_inner`, as
backends/compilers.py calls it); an outer graph calls the segments and the Python calls in
turn. To cut as few segments as possible, each ATen op moves up to just after the last
Python call it depends on (`hoist_pure_ops`): ATen ops read only graph values, never
`.grad` or a hook's state, so only the Python calls' order (kept) is observable. A plain
MLP's backward is then one segment, followed by its accumulations.
"""

from __future__ import annotations

import logging
import operator
from typing import Any, Callable

import torch
from torch import fx

from . import hooks
from .layouts import dims_outer_to_inner, from_effect
from .specialize import mutates, storage_of

log = logging.getLogger("aotgrad.autograd")


def compile_captured(gm: fx.GraphModule) -> Callable:
    """The captured graph with its ATen segments compiled by Inductor."""
    return compile_segments(gm, compile_segment)


def compile_differentiable(gm: fx.GraphModule) -> Callable:
    """create_graph=True's graph (run with grad mode on): each ATen segment compiled by
    aotgrad itself, with Inductor, into a differentiable call whose backward is compiled
    too, so the gradients it returns can be differentiated again (a gradient penalty)."""
    return compile_segments(gm, differentiable_segment)


def compile_segments(gm: fx.GraphModule,
                     compile_one: Callable[[fx.GraphModule], Callable[[list], Any]]) -> Callable:
    from ..backends.compilers import copy_graph
    gm = copy_graph(gm)  # the caller's graph is the fallback where a compile fails
    hoist_pure_ops(gm.graph)
    outer = split_segments(gm)
    for node in outer.graph.find_nodes(op="call_module"):
        segment = getattr(outer, node.target)
        setattr(outer, node.target, _Compiled(segment, compile_one(segment)))
    outer.recompile()
    return outer


def _outer_only(node: fx.Node) -> bool:
    """Stays in the outer graph: the inputs, the Python calls, and reads of their lists."""
    if node.op in ("placeholder", "output") or node.target in hooks.EFFECTS:
        return True
    return node.target is operator.getitem and _outer_only(node.args[0])


# -- scheduling ------------------------------------------------------------------------------
def hoist_pure_ops(graph: fx.Graph) -> None:
    """Each ATen op moves just after the last Python call it reads from (directly or not),
    or that was given a tensor sharing memory with one it reads (a hook may write its
    gradient in place: eager's other readers of that memory, a sum's other branch, see
    the write): the order of the Python calls, and each node after what it reads, are
    kept. An op that writes into a tensor (CopySlices' copy_) orders its readers, through
    any view: then nothing moves."""
    if any(mutates(n.target) for n in graph.nodes):
        return
    level: dict[fx.Node, int] = {}
    handed: dict[Any, int] = {}  # a storage -> the last call given a tensor of it
    effects = 0
    for node in graph.nodes:
        if node.target in hooks.EFFECTS:
            effects += 1
            level[node] = effects
            handed.update((s, effects) for s in map(storage_of, _handed(node)) if s)
        else:
            level[node] = max([level[a] for a in node.all_input_nodes] +
                              [handed.get(storage_of(a), 0) for a in node.all_input_nodes],
                              default=0)
    order = sorted(graph.nodes, key=lambda n: (_rank(n, level), _is_effect(n)))
    # Stable sort: within a level, ATen ops (and reads) first, then the level's next call.
    for node, after in zip(order[1:], order):
        after.append(node)


# The arguments of a Python call that hold gradients it may write in place (a hook's
# `g.mul_(2)`): not a parameter (the engine writes only its .grad), nor saved values.
_GRADIENTS: dict[Callable, Callable[[tuple], Any]] = {
    hooks.accumulate_into: lambda args: args[1],
    hooks.run_tensor_hook: lambda args: args[1],
    hooks.run_cpp_tensor_hooks: lambda args: args[1],
    hooks.run_node_pre_hook: lambda args: args[1],
    hooks.run_node_post_hook: lambda args: args[1:],
    hooks.run_python_backward: lambda args: args[3:],
    hooks.replay_region_backward: lambda args: args[2:],
}


def _handed(call: fx.Node) -> list[fx.Node]:
    """The tensors `call` is given that it may write."""
    pick = _GRADIENTS.get(call.target)
    found: list[fx.Node] = []
    if pick is not None:
        fx.node.map_arg(pick(call.args), found.append)
    return found


def _rank(node: fx.Node, level: dict) -> int:
    if node.op == "output":
        return 1 << 30
    return level[node] - 1 if node.target in hooks.EFFECTS else level[node]


def _is_effect(node: fx.Node) -> bool:
    return node.target in hooks.EFFECTS


# -- splitting -------------------------------------------------------------------------------
def split_segments(gm: fx.GraphModule) -> fx.GraphModule:
    """An outer graph of the Python calls, calling a submodule per run of ATen ops."""
    outer, root = fx.Graph(), torch.nn.Module()
    env: dict[fx.Node, fx.Node] = {}  # a node of `gm` -> the outer node holding its value
    run: list[fx.Node] = []
    for node in gm.graph.nodes:
        if not _outer_only(node):
            run.append(node)
            continue
        if run:
            _emit_segment(run, gm, outer, root, env)
            run = []
        env[node] = outer.node_copy(node, env.__getitem__)
    return fx.GraphModule(root, outer, "CompiledAutogradSegments")


def _emit_segment(run: list[fx.Node], gm: fx.GraphModule, outer: fx.Graph,
                  root: torch.nn.Module, env: dict) -> None:
    inside, sub = set(run), fx.Graph()
    local: dict[fx.Node, Any] = {}
    reads: list[fx.Node] = []
    for node in run:
        for arg in node.all_input_nodes:
            if arg not in inside and arg not in local:
                local[arg] = _segment_input(arg, sub, reads)
        local[node] = sub.node_copy(node, local.__getitem__)
    results = [n for n in run if any(u not in inside for u in n.users)]
    sub.output(tuple(local[n] for n in results))
    name = f"segment_{len(list(root.children()))}"
    root.add_module(name, fx.GraphModule(gm, sub, name))
    call = outer.call_module(name, tuple(_as_traced(env[a], outer) for a in reads))
    for i, node in enumerate(results):
        env[node] = outer.call_function(operator.getitem, (call, i))
        env[node].meta = dict(node.meta)


def _segment_input(arg: fx.Node, sub: fx.Graph, reads: list[fx.Node]) -> Any:
    """A placeholder for a value from outside the segment; None (a hook gave no gradient)
    stays a constant."""
    value = arg.meta.get("val")
    if value is None:
        return None
    if not isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, int, float, bool)):
        raise NotImplementedError(f"aotgrad: compiled autograd's Inductor segments take "
                                  f"tensors and sizes, not {type(value).__name__} ({arg})")
    placeholder = sub.placeholder(arg.name)
    placeholder.meta = dict(arg.meta)
    reads.append(arg)
    return placeholder


def _as_traced(node: fx.Node, outer: fx.Graph) -> fx.Node:
    """A Python call's result that `layouts.restride_effect_results` left as it is (its
    stand-in not dense): Inductor's code assumes the traced strides, and no copy gives them."""
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor) and from_effect(node) and \
            dims_outer_to_inner(value) is None:
        raise NotImplementedError("aotgrad: compiled autograd with 'inductor' cannot compile "
                                  "a backward that feeds a hook's overlapping or non-dense "
                                  "gradient to compiled code; use 'eager'")
    return node


# -- compiling -------------------------------------------------------------------------------
def compile_segment(segment: fx.GraphModule) -> Callable[[list], Any]:
    """Inductor on one segment (a boxed function: it takes its inputs as a list)."""
    from torch._guards import TracingContext, detect_fake_mode, tracing
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.virtualized import V
    from ..backends.compilers import negatives_resolved
    from ..backends.inductor_defaults import backward_fusion_limits

    if not any(isinstance(n.target, torch._ops.OpOverload) for n in segment.graph.nodes):
        return lambda args: segment(*args)  # sizes' arithmetic only: nothing to compile
    example = [n.meta["val"] for n in segment.graph.find_nodes(op="placeholder")]
    fake_mode = detect_fake_mode([n.meta.get("val") for n in segment.graph.nodes])
    segment = decompose(segment, example, fake_mode)
    output = segment.graph.output_node()
    output.meta["user_visible_output_idxs"] = list(range(len(output.args[0])))
    # Inductor retraces its pattern replacements: a backward called under autocast must not
    # cast them again (backends/passes.py says what that did to Llama).
    with V.set_fake_mode(fake_mode), tracing(TracingContext(fake_mode)), \
            torch._C._DisableAutocast(), config.patch(backward_fusion_limits(config)):
        compiled = compile_fx_inner(segment, example, is_backward=True)
    # Any lifted tensor may be negative (a gradient, a saved `.imag` of a conjugate): no
    # guard reads the bit, and Inductor's code would read its memory negated.
    tensors = [i for i, v in enumerate(example) if isinstance(v, torch.Tensor)]
    return negatives_resolved(compiled, tensors, segment)


def differentiable_segment(segment: fx.GraphModule) -> Callable[[list], Any]:
    """aotgrad on one segment: traced at its first call, on that call's tensors, with
    symbolic sizes (the segment serves every size the captured graph's guard admits)."""
    from ..api import compile as aotgrad_compile
    if not any(isinstance(n.target, torch._ops.OpOverload) for n in segment.graph.nodes):
        return lambda args: segment(*args)
    constants = lift_constants(segment)
    compiled = aotgrad_compile(segment.forward, backend="inductor", dynamic=True)
    return _TracedOnFirstCall(segment, compiled, constants)


def lift_constants(segment: fx.GraphModule) -> list[torch.Tensor]:
    """The tensors the graph holds as attributes (a region's parameter, read by its inlined
    backward) become inputs, after the others: aotgrad differentiates only its inputs."""
    lifted: dict[str, fx.Node] = {}  # one input per attribute, however often it is read
    constants, last = [], segment.graph.find_nodes(op="placeholder")[-1]
    for node in list(segment.graph.find_nodes(op="get_attr")):
        value = getattr(segment, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        if node.target not in lifted:
            with segment.graph.inserting_after(last):
                last = lifted[node.target] = segment.graph.placeholder(f"lifted_{node.target}")
            last.meta = dict(node.meta)
            constants.append(value)
        node.replace_all_uses_with(lifted[node.target])
        segment.graph.erase_node(node)
    segment.recompile()
    return constants


class _TracedOnFirstCall:
    """A segment compiled by aotgrad, which traces it at the first call. A segment is pure
    (ATen ops on its inputs): where that trace fails, the segment's ops run instead, logged,
    and autograd records them."""

    def __init__(self, segment: fx.GraphModule, compiled: Callable, constants: list):
        self.segment, self.run, self.constants = segment, compiled, constants
        self.traced = False

    def __call__(self, args: list) -> Any:
        if self.traced:
            return self.run(*args, *self.constants)
        try:
            result = self.run(*args, *self.constants)
        except Exception as error:  # noqa: BLE001 - the segment's ops are the fallback
            log.warning("aotgrad: compiled autograd runs a create_graph segment uncompiled: "
                        "aotgrad could not compile it (%s)",
                        f"{type(error).__name__}: {error}".splitlines()[0],
                        exc_info=log.isEnabledFor(logging.DEBUG))
            self.run = self.segment
        self.traced = True
        return result if self.run is not self.segment else self.run(*args, *self.constants)


def decompose(segment: fx.GraphModule, example: list, fake_mode: Any) -> fx.GraphModule:
    """The segment in the ops Inductor lowers (its decompositions applied: the captured
    graph holds the formulas' ATen ops as the engine's kernels call them)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx
    from ..backends.compilers import INDUCTOR_DECOMPOSITIONS
    # The segment holds the casts its kernels were called with: a backward run under autocast
    # must not cast them again.
    with fake_mode, enable_python_dispatcher(), torch._C._DisableAutocast():
        return make_fx(_functional(segment),
                       decomposition_table=dict(INDUCTOR_DECOMPOSITIONS))(*example)


def _functional(segment: fx.GraphModule) -> Callable:
    """The segment without in-place ops on its intermediates: a formula traced with grad
    mode off writes into its temporaries (layer_norm's double backward: `div_`, `sub_`,
    `add_`), and Inductor, which expects a functional graph, computed some of those
    wrong. A write into an input stays one, as a copy at the end."""
    if not any(mutates(n.target) for n in segment.graph.nodes):
        return segment
    return torch.func.functionalize(segment)


class _Compiled(torch.nn.Module):
    """A segment in the outer graph: its inputs boxed into the list Inductor consumes."""

    def __init__(self, segment: fx.GraphModule, compiled: Callable[[list], Any]):
        super().__init__()
        self.segment, self.compiled = segment, compiled

    def forward(self, *args: Any) -> Any:
        return self.compiled(list(args))
