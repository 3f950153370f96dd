"""The graph passes before the partition: the backend's own rewrites of the whole graph,
then aotgrad's (masks moved next to what they test, one node per repeated computation).

A persistent cache hit skips them: its entry holds their result (cache/entry.py).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch.multiprocessing.reductions import StorageWeakRef

from ..capture.cse import eliminate_common_subexpressions
from .fxcache import fake_value
from ..partition.memory import base_of
from ..partition.remat import hoist_narrow_copies
from ..partition.split import find_joint
from ..schema import JOINT_FW_OUTPUTS, Backend
from ..verify import verify


def inference_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    """The backend's passes, then one node per repeated pure computation (cse.py)."""
    gm = backend_passes(backend, scalars_as_tensors(gm))
    eliminate_common_subexpressions(gm)
    return with_code(gm)


def with_code(gm: fx.GraphModule) -> fx.GraphModule:
    """`gm` as a plain GraphModule, as torch hands graphs to compilers. A trace makes a lazy
    one (its code generated at first use; the joint is only partitioned), which TorchScript
    cannot script: ts_compile failed on every inference graph."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    if not isinstance(gm, _LazyGraphModule):
        return gm
    plain = fx.GraphModule(gm, gm.graph)
    plain.meta.update(gm.meta)
    return plain


def joint_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    """The backend's passes, copying reshapes made explicit, cuDNN attention's gradients
    laid out as it needs, masks and casts the forward may save moved next to what they read,
    then one node per repeated pure computation (cse.py)."""
    gm = backend_passes(backend, scalars_as_tensors(gm))
    split_copying_reshapes(gm)
    attention_grads_laid_like_outputs(gm)
    j = find_joint(gm, gm.meta[JOINT_FW_OUTPUTS])
    hoist_narrow_copies(j)
    return eliminate_common_subexpressions(gm, j.forward)


def scalars_as_tensors(gm: fx.GraphModule) -> fx.GraphModule:
    """A float Dynamo made dynamic (one that changed between calls: a module's `scale`)
    comes as a 0-d tensor that the graph reads with `.item()`, an unbacked symbol no
    compiler can take into its kernels. torch's pass turns the arithmetic on it into tensor
    ops, as torch's AOTAutograd has it do; where it cannot, it raises Dynamo's request to
    trace again with that float specialized, which Dynamo honours."""
    if not gm.graph.find_nodes(op="call_function",
                               target=torch.ops.aten._local_scalar_dense.default):
        return gm
    fake_mode = detect_fake_mode([n.meta.get("val")
                                  for n in gm.graph.find_nodes(op="placeholder")])
    if fake_mode is None or fake_mode.shape_env is None:
        return gm
    from torch.fx.passes._tensorify_python_scalars import tensorify_python_scalars
    tensorify_python_scalars(gm, fake_mode.shape_env, fake_mode)
    return gm


def backend_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    verify(gm)
    if backend.graph_passes is None:
        return gm
    meta = dict(gm.meta)
    fresh = [shared is None for shared in shared_storages(gm)]
    dtypes = {node: _input_dtypes(node) for node in gm.graph.nodes}
    # The graph holds autocast's casts already. Pattern replacements are traced (Inductor's
    # bmm_to_mm, on a GPU): under the call's autocast they would be cast again, against the
    # dtypes the graph's values were traced with (Llama's float32 rotary matmul ran in
    # bfloat16 and its backward read the bfloat16 buffer as float32: a CUDA fault).
    with torch._C._DisableAutocast():
        gm = backend.graph_passes(gm)
    gm.meta.update(meta)
    keep_outputs_fresh(gm, fresh)
    check_retyped(gm, dtypes)
    return verify(gm)


def check_retyped(gm: fx.GraphModule, before: dict[fx.Node, tuple]) -> None:
    """A pass that hands a node inputs of other dtypes, and leaves the node's own value as it
    was, makes the graph lie: the compiler allocates by what the nodes compute, the next graph
    reads by their metadata (the autocast fault above read bfloat16 buffers as float32). Each
    node whose inputs' dtypes changed is run again on fake values; a value of another dtype
    than its metadata says is refused, by name."""
    for node in gm.graph.nodes:
        if node in before and len(before[node]) == len(_input_dtypes(node)) \
                and before[node] != _input_dtypes(node):
            _check_dtype(node)


def _input_dtypes(node: fx.Node) -> tuple:
    return tuple(getattr(n.meta.get("val"), "dtype", None) for n in node.all_input_nodes)


def _check_dtype(node: fx.Node) -> None:
    from torch._guards import detect_fake_mode
    want = node.meta.get("val")
    if not isinstance(node.target, torch._ops.OpOverload) or not isinstance(want, torch.Tensor) \
            or node.target._schema.is_mutable:  # run again, it would write into a fake input
        return
    with detect_fake_mode([want]), torch._C._DisableAutocast():
        got = fake_value(node)
    if isinstance(got, torch.Tensor) and got.dtype != want.dtype:
        raise RuntimeError(
            f"aotgrad: the backend's graph passes changed what `{node.name}` ({node.target}) "
            f"computes: {want.dtype} in the traced graph, {got.dtype} after the passes. "
            "This is a bug in aotgrad or in the backend's passes: please report it.")


def split_copying_reshapes(gm: fx.GraphModule) -> None:
    """`reshape` is a view where its input's strides allow one, and a copy elsewhere (a
    permuted activation flattened for a matmul, in ConvNeXt), yet its schema says alias. The
    partitioner took such a copy for a free view: it saved the input, which the forward then
    wrote out in its permuted layout besides the copy, and the backward copied it again
    (ConvNeXt-T: 1.34x Inductor's step on an H200). Each reshape that copies becomes what it
    does: a contiguous clone, then a view of it."""
    aten = torch.ops.aten
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.reshape.default)):
        source, val = node.args[0].meta.get("val"), node.meta.get("val")
        if not (isinstance(source, torch.Tensor) and isinstance(val, torch.Tensor)) or \
                StorageWeakRef(source.untyped_storage()) == StorageWeakRef(val.untyped_storage()):
            continue
        with gm.graph.inserting_before(node):
            copy = gm.graph.call_function(aten.clone.default, (node.args[0],),
                                          {"memory_format": torch.contiguous_format})
            view = gm.graph.call_function(aten.view.default, (copy, node.args[1]))
        copy.meta = {**node.meta, "val": source.clone(memory_format=torch.contiguous_format)}
        view.meta = {**node.meta, "val": copy.meta["val"].view(val.shape)}
        node.replace_all_uses_with(view)
        gm.graph.erase_node(node)
    gm.recompile()


def undo_transpose_pairs(gm: fx.GraphModule) -> fx.GraphModule:
    """A view that puts back the dims the view it reads reordered is that view's input: the
    backward's `mm(grad, t(t(w)))` reads `w`. Inductor's own pattern folds only permute pairs
    whose first permute has no other user, and a linear's transposed weight has one in the
    forward: each linear left two nodes to the backward (196 of the 474 permutes of
    DeBERTa-v2's), which took their share of Inductor's compile; backend="eager" ran each.
    One of the named backends' own rewrites (compilers.py): a compiler of the user's, the
    compat door's among them, gets the graph as torch's AOTAutograd would hand it. An
    output keeps its own view, as eager's."""
    outputs = set(gm.graph.output_node().all_input_nodes)
    for node in list(gm.graph.nodes):
        second = _dims_order(node)
        if second is None or node in outputs:
            continue
        inner = node.args[0]
        first = _dims_order(inner)
        if first is not None and all(first[d] == i for i, d in enumerate(second)):
            node.replace_all_uses_with(inner.args[0])
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


# The views that only reorder their input's dims: for each, its input's dim at each of its
# own dims, from the input's rank and the node's arguments.
_REORDERING_VIEWS = {
    torch.ops.aten.permute.default: lambda rank, args: [d % rank for d in args[1]],
    torch.ops.aten.t.default: lambda rank, args: list(range(rank))[::-1],
    torch.ops.aten.transpose.int: lambda rank, args: _swapped(rank, args[1] % rank,
                                                              args[2] % rank),
}


def _swapped(rank: int, a: int, b: int) -> list[int]:
    dims = list(range(rank))
    dims[a], dims[b] = b, a
    return dims


def _dims_order(node) -> list[int] | None:
    """Where each dim of `node`'s value comes from in its input's, if `node` is a view that
    only reorders dims; else None."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return None
    order = _REORDERING_VIEWS.get(node.target)
    source = node.args[0] if order is not None else None
    if not isinstance(source, fx.Node) or "val" not in source.meta:
        return None
    rank = source.meta["val"].dim()
    return order(max(rank, 1), node.args)[:rank]  # a 0-d value: no dims, and `% rank` defined


def attention_grads_laid_like_outputs(gm: fx.GraphModule) -> None:
    """cuDNN's attention backward takes the output's gradient in the output's own layout.
    torch 2.11 (cuDNN 9.19, H200) caches the kernel it builds per shape without the
    gradient's strides: a later call whose gradient comes in another layout reuses it and
    returns wrong gradients, silently (a contiguous gradient after one laid out like the
    output: errors of 2 on values of 1). Eager's gradient is the output's layout wherever it
    flows back through a transpose and reshape, as in every transformer block; ours is too,
    copied into it where the graph made it otherwise."""
    backward = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
    aten = torch.ops.aten
    for node in gm.graph.find_nodes(op="call_function", target=backward):
        grad, out = node.args[0], node.args[4]
        if _strides(grad) == _strides(out):
            continue
        with gm.graph.inserting_before(node):
            like = gm.graph.call_function(aten.empty_like.default, (out,))
            laid = gm.graph.call_function(aten.copy.default, (like, grad))
        for new in (like, laid):
            new.meta = {**node.meta, "val": fake_value(new)}
        node.replace_input_with(grad, laid)
    gm.recompile()


def _strides(node: fx.Node) -> list:
    """A value's strides as expressions: equal ones are equal at every size, and comparing
    them adds no guard."""
    return [s.node.expr if isinstance(s, torch.SymInt) else s for s in node.meta["val"].stride()]


def keep_outputs_fresh(gm: fx.GraphModule, fresh: Sequence[bool]) -> None:
    """Copy the outputs that a backend's rewrites made share memory with an input or an
    earlier output (Inductor simplifies `zeros(4) + y[:4]` to `y[:4]`): eager returns a
    tensor of their own, which the caller may write to."""
    aliased = [i for i, shared in enumerate(shared_storages(gm))
               if shared is not None and fresh[i]]
    if not aliased:
        return
    output = gm.graph.output_node()
    outs = list(output.args[0])
    for i in aliased:
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(torch.ops.aten.clone.default, (outs[i],))
        copy.meta["val"] = outs[i].meta["val"].clone()
        outs[i] = copy
    output.args = (type(output.args[0])(outs),)
    gm.recompile()


def shared_storages(gm: fx.GraphModule) -> list[fx.Node | None]:
    """Per graph output: the graph input or earlier output whose memory it is a view of."""
    seen = set(gm.graph.find_nodes(op="placeholder"))
    shared = []
    for out in gm.graph.output_node().args[0]:
        base = base_of(out) if isinstance(out, fx.Node) else None
        shared.append(base if base in seen else None)
        seen.add(base)
    return shared
