"""Stage 4, partition: split the joint graph into a forward and a backward graph.

The forward returns its outputs followed by the values saved for backward; the backward
takes the saved values followed by the tangents and returns one gradient per primal. A
partitioner decides only which values are saved; `split_joint` does the rest, so every
partitioner produces graphs of the same shape.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import AbstractSet, Callable, Iterable, Sequence

import torch
from torch import fx

from ..schema import JOINT, OVERWRITTEN, Joint, is_tangent, primals_of
from ..semantics.dynamic import DynamicShapesUnsupported, free_symbols, is_size

aten = torch.ops.aten

from ..semantics.effects import checks_by_phase
from .memory import is_alias


def joint_of(joint: fx.GraphModule, num_fwd_outputs: int) -> Joint:
    """The graph's Joint: the one the pipeline found after its joint passes, else (a graph
    traced elsewhere, handed to a functorch-signature partitioner) found now."""
    found = joint.meta.get(JOINT)
    if found is not None and found.module is joint and found.num_fw_outputs == num_fwd_outputs:
        return found
    return find_joint(joint, num_fwd_outputs)


def find_joint(joint: fx.GraphModule, num_fwd_outputs: int) -> Joint:
    placeholders = joint.graph.find_nodes(op="placeholder")
    outs = list(joint.graph.output_node().args[0])
    fw_checks, bw_checks = checks_by_phase(joint.graph)
    primals = [n for n in placeholders if not is_tangent(n)]
    fw_outs = outs[:num_fwd_outputs]
    # The forward: the inputs, the ancestors of its outputs and checks, the elements of its
    # tuples, and the sizes computed from them (a few bytes to save, where the backward would
    # need a tensor to read them from).
    computed = with_sizes(with_tuple_elements(ancestors(fw_outs + fw_checks) | set(primals)),
                          joint)
    return Joint(joint, num_fwd_outputs, tuple(primals),
                 tuple(n for n in placeholders if is_tangent(n)), tuple(fw_outs),
                 tuple(outs[num_fwd_outputs:]), tuple(fw_checks), tuple(bw_checks),
                 frozenset(computed), frozenset(with_narrow_copies(computed, joint)))


def ancestors(roots: Iterable[fx.Node | None], stop: set[fx.Node] = frozenset()) -> set[fx.Node]:
    """`roots` and every node they read, not looking past the nodes in `stop`."""
    seen: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            if node not in stop:
                stack.extend(node.all_input_nodes)
    return seen


def with_sizes(forward: set[fx.Node], joint: fx.GraphModule) -> set[fx.Node]:
    """Add the sizes (symbolic ints) computed from forward values alone: the forward can
    save them for a few bytes, where the backward would need a tensor to read them from."""
    forward = set(forward)
    for node in joint.graph.nodes:
        if (node not in forward and node.op == "call_function" and is_size_node(node)
                and all(i in forward for i in node.all_input_nodes)):
            forward.add(node)
    return forward


def with_narrow_copies(forward: set[fx.Node], joint: fx.GraphModule) -> set[fx.Node]:
    """Add the values the backward computes from forward values alone that are smaller than
    what they read, and the views they read: a boolean mask (a relu's `x <= 0`), a byte per
    element where the backward would need the value it tests at two or four; a cast to a
    narrower float (autocast's bfloat16 copy of a float32 activation for a backward matmul),
    which torch's partitioner saves too, where ours recomputed it in the backward with its
    chain of views and copies (BERT: a copy kernel per attention operand a layer). The
    forward can save them. Not for values in a checkpointed region (tagged "recompute"):
    the region is recomputed as a whole."""
    forward = set(forward)
    views: set[fx.Node] = set()  # backward views of forward values
    for node in joint.graph.nodes:
        if node in forward or node.op != "call_function":
            continue
        if all(i in forward or i in views for i in node.all_input_nodes):
            if is_alias(node):
                views.add(node)
            elif _is_mask(node) or is_narrowing_cast(node):
                added = ancestors([node], stop=forward)
                if not any(n.meta.get("recompute") is not None for n in added & forward):
                    forward |= added
    return forward


def _is_mask(node: fx.Node) -> bool:
    """A pointwise op making booleans from a tensor that is not."""
    val = node.meta.get("val")
    return (isinstance(node.target, torch._ops.OpOverload)
            and torch.Tag.pointwise in node.target.tags
            and isinstance(val, torch.Tensor) and val.dtype == torch.bool
            and any(isinstance(i.meta.get("val"), torch.Tensor)
                    and i.meta["val"].dtype != torch.bool for i in node.all_input_nodes))


def is_narrowing_cast(node: fx.Node) -> bool:
    """A cast from a float dtype to a narrower one."""
    if node.target is not torch.ops.prims.convert_element_type.default:
        return False
    source, val = node.args[0].meta.get("val"), node.meta.get("val")
    return (isinstance(source, torch.Tensor) and isinstance(val, torch.Tensor)
            and source.dtype.is_floating_point and val.dtype.is_floating_point
            and val.dtype.itemsize < source.dtype.itemsize)


def is_size_node(node: fx.Node) -> bool:
    return is_size(node.meta.get("val"))


def with_tuple_elements(forward: set[fx.Node]) -> set[fx.Node]:
    """Add the `getitem`s of forward multi-output ops: a tuple cannot be saved, its elements
    can, and taking them costs nothing."""
    return forward | {user for node in forward for user in node.users
                      if user.target is operator.getitem}


def call_partitioner(partition_fn: Callable, joint_gm: fx.GraphModule, num_fwd_outputs: int,
                     static_inputs: Sequence[int] = ()) -> tuple[fx.GraphModule, fx.GraphModule]:
    """`partition_fn` called as functorch calls one: with the joint graph's inputs (fake
    primals, fake tangents) and the positions of the inputs that live across calls
    (parameters, buffers), for partitioners written for torch."""
    placeholders = joint_gm.graph.find_nodes(op="placeholder")
    primals = [n.meta.get("val") for n in placeholders if not is_tangent(n)]
    tangents = [n.meta.get("val") for n in placeholders if is_tangent(n)]
    with _fake_mode_found(partition_fn, primals):
        fw, bw = partition_fn(joint_gm, (primals, tangents), num_fwd_outputs=num_fwd_outputs,
                              static_lifetime_input_indices=list(static_inputs))
    snapshot_saved_overwritten(fw, primals_of(joint_gm.graph), num_fwd_outputs)
    fw, bw = fill_fake_values(fw), fill_fake_values(bw)
    take_saved_in_forward_order(fw, bw, num_fwd_outputs)
    return fw, bw


def take_saved_in_forward_order(fw: fx.GraphModule, bw: fx.GraphModule,
                                num_fwd_outputs: int) -> None:
    """torch's partitioners give a backward taking the saved sizes before the saved tensors
    (torch's runtime keeps them apart); ours takes them in the forward's order, which
    returns tensors first. The backward's saved inputs are reordered to match (each kind in
    its own order): the runtime passed a size where a tensor was read."""
    kinds = [is_size_node(v) for v in fw.graph.output_node().args[0][num_fwd_outputs:]]
    placeholders = bw.graph.find_nodes(op="placeholder")
    saved = placeholders[:len(kinds)]
    taken = [is_size_node(p) for p in saved]
    if taken == kinds or sorted(taken) != sorted(kinds):
        return
    groups = {kind: [p for p in saved if is_size_node(p) is kind] for kind in (False, True)}
    ordered = [groups[kind].pop(0) for kind in kinds]
    anchor = next((n for n in bw.graph.nodes if n.op != "placeholder"), None)
    for node in ordered + placeholders[len(kinds):]:
        anchor.prepend(node)
    bw.recompile()


def fill_fake_values(gm: fx.GraphModule) -> fx.GraphModule:
    """Give each op a partitioner made without a fake value one (torch's min-cut adds RNG
    state ops bare): the pipeline reads every value's from `meta["val"]`."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    if all("val" in n.meta for n in gm.graph.nodes if n.op == "call_function"):
        return gm
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]

    class KeepValues(FakeTensorProp):
        def run_node(self, n):
            had = n.meta.get("val")
            result = super().run_node(n)
            if had is not None:
                n.meta["val"] = had
            return result
    KeepValues(gm, detect_fake_mode(inputs)).propagate_dont_convert_inputs(*inputs)
    return gm


def _fake_mode_found(partition_fn: Callable, values: Sequence):
    """torch's partitioners find the trace's fake mode through the tracing context, as
    torch's door sets it (its min-cut makes fake RNG states for a random op in a
    checkpointed region: without one it failed)."""
    from torch._guards import TracingContext, detect_fake_mode, tracing
    if is_own_partitioner(partition_fn) or TracingContext.try_get() is not None:
        return contextlib.nullcontext()
    mode = detect_fake_mode(values)
    return contextlib.nullcontext() if mode is None else tracing(TracingContext(mode))


def is_own_partitioner(partition_fn: Callable) -> bool:
    """One of aotgrad's partitioners (or a partial of one: a memory budget's), whose graphs
    hold every invariant verify checks."""
    while isinstance(partition_fn, functools.partial):
        partition_fn = partition_fn.func
    return (getattr(partition_fn, "__module__", None) or "").startswith("aotgrad.")


def snapshot_saved_overwritten(fw: fx.GraphModule, joint_primals: Sequence[fx.Node],
                               num_fwd_outputs: int) -> None:
    """A partitioner written for torch's functional joint may save a primal that our
    forward overwrites (torch's min-cut recomputes the snapshot clone from the primal in the
    backward): the backward would read the new value, silently. It gets a clone taken
    before the forward's first op instead, the value the joint's primal stands for."""
    placeholders = fw.graph.find_nodes(op="placeholder")
    overwritten = {ph for ph, primal in zip(placeholders, joint_primals)
                   if primal.meta.get(OVERWRITTEN)}
    output = fw.graph.output_node()
    outs = list(output.args[0])
    if not overwritten.intersection(outs[num_fwd_outputs:]):
        return
    first_op = next(n for n in fw.graph.nodes if n.op != "placeholder")
    snapshots: dict[fx.Node, fx.Node] = {}
    for k in range(num_fwd_outputs, len(outs)):
        if outs[k] in overwritten and outs[k] not in snapshots:
            with fw.graph.inserting_before(first_op):
                snapshots[outs[k]] = fw.graph.call_function(aten.clone.default, (outs[k],))
            snapshots[outs[k]].meta["val"] = outs[k].meta.get("val")
        outs[k] = snapshots.get(outs[k], outs[k])
    output.args = (type(output.args[0])(outs),)
    fw.recompile()


def default_partition(joint_module: fx.GraphModule, _joint_inputs=None, *, num_fwd_outputs: int,
                      static_lifetime_input_indices=None, static_lifetime_input_nodes=None):
    """Save every forward value the backward reads; recompute nothing.

    The forward holds exactly what its outputs need; whatever else the backward needs is
    computed in the backward, from saved forward values.
    """
    j = joint_of(joint_module, num_fwd_outputs)
    forward = j.computed_forward
    # Only the backward ops the gradients need: a dead op outside the forward (einsum's
    # trace leaves an unused `permute` of an input's view) would get a value saved that the
    # backward graph, pruned, never reads.
    needed = ancestors([*j.grads, *j.bw_checks], stop=forward)
    read_by_backward = {
        inp for node in needed
        if node.op == "call_function" and node not in forward
        for inp in node.all_input_nodes if inp in forward
    }
    read_by_backward |= {g for g in j.grads if g in forward}
    saved = [n for n in joint_module.graph.nodes if n in read_by_backward]
    return split_joint(joint_module, num_fwd_outputs, saved)


def split_joint(joint: fx.GraphModule, num_fwd_outputs: int, saved: Sequence[fx.Node],
                backward_order: Callable[[list[fx.Node]], list[fx.Node]] | None = None):
    """Forward and backward graphs for a given choice of saved values. `backward_order`
    may reorder the backward's ops (given in joint order) before its code is generated."""
    j = joint_of(joint, num_fwd_outputs)
    saved = list(saved) + symbol_bindings(joint, j.primals, [*saved, *j.tangents],
                                          j.computed_forward)
    saved = sorted(saved, key=_is_symbolic)  # tensors first, then sizes (functorch's order)
    fw = _extract(joint, j.primals, [*j.fw_outputs, *saved], j.fw_checks)
    bw = _extract(joint, [*saved, *j.tangents], j.grads, j.bw_checks, backward_order)
    return fw, bw


def tag_backward(bw: fx.GraphModule) -> None:
    """Mark the backward graph's ops `autograd_backward`, as torch's partitioners do (the
    recomputed forward ops too): passes and profilers tell the two halves apart by it,
    whichever partitioner split them."""
    for node in bw.graph.nodes:
        if node.op in ("call_function", "get_attr"):
            node.meta["autograd_backward"] = True


def _is_symbolic(node: fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), torch.Tensor)


# ---- symbolic sizes ------------------------------------------------------------------------

def symbol_bindings(joint: fx.GraphModule, primals: Sequence[fx.Node],
                    bw_inputs: Sequence[fx.Node], forward: AbstractSet[fx.Node] = frozenset()
                    ) -> list[fx.Node]:
    """Sizes to save so that every symbol in the shapes of the backward's inputs is one of
    its inputs, or a size or stride of one: a compiler (Inductor) binds symbols from its
    inputs, and cannot solve `s0` from a shape such as `(2*s0,)`. A size computed from data
    (`nonzero`'s count, unbacked) is found in no input: it is read off the `forward` value
    that has it."""
    vals = [n.meta.get("val") for n in bw_inputs]
    held = {expr for v in vals for expr in _plain_symbols(v)}
    missing = [s for s in free_symbols(vals) if s not in held]
    if not missing:
        return []
    binders = _binders(joint, primals, forward)
    unbound = [str(s) for s in missing if s not in binders]
    if unbound:
        raise DynamicShapesUnsupported(
            f"aotgrad: the backward needs sizes {unbound} that no input's size determines; "
            "compile with dynamic=False.")
    return [binders[s]() for s in missing]


def _plain_symbols(val) -> list:
    """The symbols `val` holds as itself, or as one of its sizes or strides."""
    if is_size(val):
        values = [val]
    elif isinstance(val, torch.Tensor):
        values = [*val.shape, *val.stride()]
    else:
        return []
    return [v.node.expr for v in values if is_size(v) and v.node.expr.is_Symbol]


def _binders(joint: fx.GraphModule, primals: Sequence[fx.Node],
             forward: AbstractSet[fx.Node] = frozenset()) -> dict:
    """symbol -> a function returning a joint node that the forward can compute the symbol
    with: a size input, an existing `sym_size` of an input, or a new one; failing those, a
    forward size of that symbol or a new `sym_size` of a forward tensor."""
    binders: dict = {}
    for node in joint.graph.nodes:
        read = _size_read(node, primals)
        if read is not None:
            binders.setdefault(read, lambda node=node: node)
    for primal in primals:
        val = primal.meta.get("val")
        if isinstance(val, torch.Tensor):
            for op, values in ((aten.sym_size.int, val.shape), (aten.sym_stride.int, val.stride())):
                for d, v in enumerate(values):
                    if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                        binders.setdefault(v.node.expr, _new_read(joint, primal, op, d, v))
    for node in joint.graph.nodes:  # after the inputs: sizes computed from data
        if node in forward and node.op == "call_function":
            _add_forward_binders(binders, joint, node)
    return binders


def _add_forward_binders(binders: dict, joint: fx.GraphModule, node: fx.Node) -> None:
    val = node.meta.get("val")
    if is_size(val) and val.node.expr.is_Symbol:
        binders.setdefault(val.node.expr, lambda: node)
    elif isinstance(val, torch.Tensor):
        for d, v in enumerate(val.shape):
            if isinstance(v, torch.SymInt) and v.node.expr.is_Symbol:
                binders.setdefault(v.node.expr, _new_read(joint, node, aten.sym_size.int, d, v,
                                                          after=node))


def _size_read(node: fx.Node, primals: Sequence[fx.Node]):
    """The symbol `node` is, if it is a size input or a size read directly off inputs (a
    `sym_size`, or the `.item()` of a number Dynamo passes as a tensor)."""
    val = node.meta.get("val")
    if not is_size(val) or not val.node.expr.is_Symbol:
        return None
    is_input = node.op == "placeholder" and node in primals
    reads_inputs = node.op == "call_function" and all(i in primals for i in node.all_input_nodes)
    return val.node.expr if is_input or reads_inputs else None


def _new_read(joint: fx.GraphModule, primal: fx.Node, op, dim: int, val,
              after: fx.Node | None = None) -> Callable:
    def make() -> fx.Node:
        last_input = [n for n in joint.graph.nodes if n.op == "placeholder"][-1]
        with joint.graph.inserting_after(after or last_input):
            node = joint.graph.call_function(op, (primal, dim))
        node.meta["val"] = val
        return node
    return make


def _extract(joint: fx.GraphModule, inputs: Sequence[fx.Node],
             outputs: Sequence[fx.Node | None], checks: Sequence[fx.Node],
             order: Callable | None = None) -> fx.GraphModule:
    """The subgraph computing `outputs` and running `checks` from `inputs`, nodes in their
    joint order (or in `order(nodes)`)."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
        env[node].meta = dict(node.meta)
    needed = ancestors(list(outputs) + list(checks), stop=set(inputs))
    missing = [n.name for n in needed if n.op == "placeholder" and n not in env]
    assert not missing, f"partition: {missing} are needed but are not inputs"
    nodes = [node for node in joint.graph.nodes if node in needed and node not in env]
    for node in (order(nodes) if order is not None else nodes):
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    return fx.GraphModule(joint, graph)
