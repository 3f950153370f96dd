"""Stage 3, tracing: one functional graph of ATen ops, for inference or forward+backward.

Both graphs return, in order: the new values of data-mutated inputs, the plain user outputs,
the intermediate bases of aliased outputs (see `FunctionInfo`). The joint graph then returns
one gradient (or None) per input, then the new values of the inputs its backward writes
into (`BACKWARD_WRITES`). Placeholders are named as compilers written for functorch's compile
API expect: `primals_N` and `tangents_N` in a joint graph, `argN_1` in an inference graph.
"""

from __future__ import annotations

import contextlib
import functools
import operator
from typing import Callable, Mapping, Sequence

import torch
import torch.fx.traceback as fx_traceback
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.fx.experimental.proxy_tensor import make_fx

from ..semantics import checkpoints, mends, subclasses
from . import oplog
from .analysis import graph_outputs, unseen_writes
from .kernel_choice import attention_masks_dense
from ..schema import (BACKWARD_WRITES, JOINT_FW_OUTPUTS, JOINT_ROLE, OVERWRITTEN, PRIMAL, TANGENT,
                      TORCH_PARTITIONER_TAG, TRACED_OUTPUTS, FunctionInfo, InputInfo, primals_of)
from .inputs import (differentiating, from_functional, functional_mode, to_functional,
                     to_functional_leaves)
from ..semantics.autocast import with_autocast_cache
from ..semantics.dynamic import is_symbolic
from ..semantics.effects import BACKWARD
from ..tables import ALLOWED_INPUT_MUTATIONS, NO_OP_AT_RUNTIME

aten = torch.ops.aten



def trace_inference(graph_fn: Callable, info: FunctionInfo, fake_args: Sequence[torch.Tensor],
                    fake_mode: FakeTensorMode, decompositions: Mapping | None,
                    keep_input_mutations: bool = False) -> torch.fx.GraphModule:
    """Trace the forward alone. With `keep_input_mutations`, the graph itself copies new
    values into the mutated inputs (`copy_`), and returns the updated inputs."""
    in_graph = {i: k for k, i in enumerate(info.data_mutated_inputs)
                if keep_input_mutations and i in info.inference_mutations_in_graph}

    def inference(primals):
        with functional_mode():
            f_primals = to_functional(primals)
            outs = graph_outputs(info, *_call(graph_fn, f_primals))
            refuse_unseen_writes(info, f_primals)
        outs = [from_functional(o) for o in outs]
        # The output is then the updated input itself. No gradient flows through an
        # inference graph: a leaf that requires grad (mutated under no_grad) may be written.
        with torch.no_grad():
            for i, k in in_graph.items():
                outs[k] = primals[i].copy_(outs[k])
        return outs

    return name_inputs_as_args(trace(inference, (list(fake_args),), fake_mode, decompositions,
                                     differentiates=False))


def name_inputs_as_args(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Torch names the inputs of a graph without tangents `arg0_1`, `arg1_1`, ...: compilers
    and export tools look them up by name."""
    for i, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        node.target = f"arg{i}_1"
        node._rename(node.target)
    gm.recompile()
    return gm


def trace_joint(graph_fn: Callable, info: FunctionInfo, fake_args: Sequence[torch.Tensor],
                fake_mode: FakeTensorMode, decompositions: Mapping | None) -> torch.fx.GraphModule:
    """Trace forward plus `torch.autograd.grad` of the differentiable outputs."""
    in_graph = {i: k for k, i in enumerate(info.data_mutated_inputs)
                if i in info.mutations_in_graph}

    written: list[tuple[int, int]] = []  # (input, eager's in-place ops on it) per backward write

    def joint(primals, tangents):
        with functional_mode() as mode:
            f_primals, f_tangents = to_functional_leaves(primals, leaves), to_functional(tangents)
            args = mutable_copies(info, f_primals)
            outs = graph_outputs(info, *_call(graph_fn, args))
            refuse_unseen_writes(info, f_primals)
            # The forward's values as they are now: the backward may write into them after.
            fw_values = [from_functional(o) for o in outs]
            before = [current_values(v) for v in args + outs]
            counts = mutation_counts(args)
            tag_traced_forward()
            mode.phase = BACKWARD
            grads = input_grads(outs, info.gets_tangent, f_primals, f_tangents)
            changed = backward_writes(info, args, outs, before)
            written[:] = zip(changed, _bumps(changed, args, counts))
        new_values = [args[i] for i, _ in written]
        outs = fw_values + [from_functional(v) for v in grads + new_values]
        for i, k in in_graph.items():  # the forward output is then the updated input itself
            outs[k] = primals[i].copy_(outs[k])
        return outs

    leaves = leaf_wrappers(info, fake_args)
    tangents = fake_tangents(info, fake_mode)
    gm = trace(joint, (list(fake_args), tangents), fake_mode, decompositions, differentiates=True,
               cast_cache=True)
    gm.meta[JOINT_FW_OUTPUTS] = num_forward_outputs(gm, info)
    gm.meta[BACKWARD_WRITES] = tuple(written)
    mark_overwritten_inputs(gm, info, fake_args)
    return gm


def leaf_wrappers(info: FunctionInfo, fake_args: Sequence[torch.Tensor]) -> list[bool]:
    """Which inputs a functionalized joint wraps as leaves: the leaves that require grad and
    that the call leaves untouched. Other wrappers are not leaves, so autocast's cast cache,
    which takes leaves only, reuses the casts of the caller's leaves alone, as eager's does:
    with them the trace keeps the cache on whatever the inputs (semantics/autocast.py)."""
    return [x.is_leaf and x.requires_grad and _untouched(x) and not subclasses.is_subclass(p)
            for x, p in zip(info.inputs, fake_args)]


def _untouched(x: InputInfo) -> bool:
    """The call neither writes this input nor swaps, resizes or marks its storage."""
    return not (x.mutated or x.storage_swap is not None or x.storage_bytes is not None
                or x.gains_requires_grad)


def tag_traced_forward() -> None:
    """Tag the ops traced so far (the forward's, before the gradients are taken) as torch's
    AOTAutograd does: torch's `default_partition` puts in the forward only what precedes the
    last node so tagged, and without the tags moved every op (a dropout too) to the backward,
    which then drew new random numbers: silently wrong gradients."""
    proxy_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.PROXY)
    if proxy_mode is None:
        return
    for node in proxy_mode.tracer.graph.nodes:
        if node.op != "placeholder":  # torch tells primals from tangents by their names
            node.meta[TORCH_PARTITIONER_TAG] = "is_forward"


def refuse_unseen_writes(info: FunctionInfo, f_primals: Sequence) -> None:
    """The analysis runs without the python dispatcher (it doubles its time), the trace with
    it: an op whose declared form only the dispatcher's decompositions show writes an input
    here that the analysis saw unchanged. The graph would drop that write: raise instead."""
    unseen = unseen_writes(info, f_primals)
    if unseen:
        raise NotImplementedError(
            f"aotgrad: an op writes into input {unseen[0]} without its schema saying so, and "
            "only its decomposition shows it: the compiled function would not update the "
            "input. Add the op with its declared form to aotgrad.tables.UNMARKED_MUTATIONS, "
            "or make its schema mark the write (Tensor(a!)).")


def current_values(value) -> tuple:
    """What the functional tensor(s) of `value` stand for now: a write replaces them."""
    if not isinstance(value, torch.Tensor):
        return ()
    parts = subclasses.unwrap(value)
    for t in parts:
        torch._sync(t)
    return tuple(torch._from_functional_tensor(t.elem) for t in parts)


def mutation_counts(args: Sequence) -> list[int]:
    """In-place ops applied to each functional argument so far (0 for others)."""
    return [_mutation_count(a) for a in args]


def _mutation_count(a) -> int:
    count = getattr(torch, "_functionalize_mutation_counter", None)  # newer torch only
    if count is None or not isinstance(a, FunctionalTensor):
        return 0
    return count(a.elem)


def _bumps(changed: Sequence[int], args: Sequence, before: Sequence[int]) -> list[int]:
    """How far eager's version counter moves for each write: one per in-place op (one when
    the count is unknown)."""
    return [max(1, _mutation_count(args[i]) - before[i]) for i in changed]


def backward_writes(info: FunctionInfo, args: Sequence, outs: Sequence,
                    before: Sequence[tuple]) -> list[int]:
    """The inputs the backward writes into (a custom Function's backward zeroing a tensor
    saved on ctx): eager changes the caller's tensor when the backward runs, so the backward
    graph returns their new values after the gradients, for the runtime to copy in. `args`
    are the tensors the function saw (a forward-mutated input's copy), `before` what they
    and the forward's outputs stood for when the forward ended. Refuses the writes the
    runtime could not apply."""
    changed = [k for k, v in enumerate(list(args) + list(outs))
               if any(a is not b for a, b in zip(current_values(v), before[k]))]
    written = [k for k in changed if k < len(args)]
    returned = _returned_as_is(info)
    if any(k - len(args) in returned for k in changed if k >= len(args)):
        raise NotImplementedError(
            "aotgrad: the backward writes in place into a tensor the function returns (a "
            "custom autograd.Function's backward modifying a tensor it saved on ctx), which "
            "eager shows in the returned tensor after the backward. Save a copy in the "
            "Function (ctx.save_for_backward(t.clone())).")
    for i in written:
        _refuse_backward_write(i, args[i], info)
    return written


def _returned_as_is(info: FunctionInfo) -> set[int]:
    """Graph outputs the caller gets as they are (not rebuilt from inputs by the runtime)."""
    first = info.first_user_output
    return set(range(first, info.num_graph_outputs)) - set(info.rebuilt_outputs)


def _refuse_backward_write(i: int, arg: torch.Tensor, info: FunctionInfo) -> None:
    if subclasses.is_subclass(arg):
        why = "a tensor subclass input (its inner tensors are not copied back)"
    elif not info.inputs[i].mutated and torch._functionalize_has_metadata_mutation(arg.elem):
        why = "a change of its shape or strides"
    else:
        return
    raise NotImplementedError(
        f"aotgrad: the backward mutates input {i} in place (e.g. a custom autograd.Function's "
        f"backward writing into a tensor saved on ctx), through {why}, which the compiled "
        "backward cannot apply to the caller's tensor. Save a copy (ctx.save_for_backward("
        "t.clone())) or make that change outside the compiled function.")


def fake_tangents(info: FunctionInfo, fake_mode: FakeTensorMode) -> list[torch.Tensor]:
    """One fake gradient per differentiable graph output."""
    with fake_mode:
        return [_tangent(m) for m, d in zip(info.graph_output_metas, info.gets_tangent) if d]


def _tangent(meta) -> torch.Tensor:
    if meta.subclass is not None:  # the gradient of a subclass output is one too
        return subclasses.empty(meta.subclass)
    return torch.empty(meta.shape, dtype=meta.dtype, device=meta.device,
                       memory_format=meta.memory_format)


def num_forward_outputs(gm: torch.fx.GraphModule, info: FunctionInfo) -> int:
    """How many of the graph's (plain) outputs are the forward's."""
    return subclasses.num_plain(gm.meta[TRACED_OUTPUTS][:info.num_graph_outputs])


def mark_overwritten_inputs(gm: torch.fx.GraphModule, info: FunctionInfo,
                            fake_args: Sequence[torch.Tensor]) -> None:
    """Tag the primals the runtime overwrites after the forward: a partitioner must not
    save them for the backward (their clone holds the value the backward needs). A
    subclass input is overwritten through each of its plain primals."""
    primals = primals_of(gm.graph)
    # set_() gives the input other memory, and a resize frees or reallocates it, after the
    # forward: as good as overwritten.
    mutated = [x.mutated or x.storage_swap is not None or x.storage_bytes is not None
               for x, a in zip(info.inputs, fake_args)
               for _ in subclasses.unwrap(a)]
    for node, flag in zip(primals, mutated):
        node.meta[OVERWRITTEN] = flag


def snapshot_overwritten_inputs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Make every read of an input the runtime overwrites go through one copy of it.

    The trace reads such inputs through a clone; a backend's passes may drop that clone as a
    no-op and read the input itself, which the partitioner then can neither save (the
    runtime overwrites it) nor recompute from. A fresh clone restores the snapshot. Reads of
    its sizes and strides stay on the input: an overwrite keeps them, and the forward can
    save them (through a clone only the backward reads, the backward would need the input)."""
    graph = gm.graph
    for node in [n for n in graph.nodes if n.op == "placeholder" and n.meta.get(OVERWRITTEN)]:
        readers = [u for u in node.users if not _snapshots_or_writes(u, node)]
        if not readers:
            continue
        with graph.inserting_after(node):
            snapshot = graph.call_function(torch.ops.aten.clone.default, (node,))
        snapshot.meta["val"] = node.meta["val"]
        for user in readers:
            user.replace_input_with(node, snapshot)
    graph.lint()
    gm.recompile()
    return gm


def _snapshots_or_writes(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """A clone of `node`, the graph's own copy of a new value into it, or a read of its
    geometry."""
    return user.target in (torch.ops.aten.clone.default, *GEOMETRY_READS) or (
        user.target in ALLOWED_INPUT_MUTATIONS and user.args[0] is node)


GEOMETRY_READS = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                  torch.ops.aten.sym_numel.default, torch.ops.aten.sym_storage_offset.default)


def trace_loss_joint(graph_fn: Callable, info: FunctionInfo, fake_args: Sequence[torch.Tensor],
                     fake_mode: FakeTensorMode, decompositions: Mapping | None,
                     loss_output: int, wrt: Sequence[int]) -> torch.fx.GraphModule:
    """Forward plus the gradients of one scalar user output, seeded with 1 (no tangents),
    with respect to the inputs `wrt`: the joint graph that export hands out."""
    def loss_joint(primals):
        with functional_mode() as mode:
            f_primals = to_functional_leaves(primals, leaves)
            args, outs = _call(graph_fn, mutable_copies(info, f_primals))
            refuse_unseen_writes(info, f_primals)
            before = [current_values(v) for v in args]
            tag_traced_forward()
            mode.phase = BACKWARD
            grads = traced_grad(outs[loss_output], [f_primals[i] for i in wrt],
                                allow_unused=True)
            refuse_exported_backward_writes(backward_writes(info, args, (), before))
            values = graph_outputs(info, args, outs) + list(grads)
        return [from_functional(v) for v in values]

    leaves = leaf_wrappers(info, fake_args)
    gm = trace(loss_joint, (list(fake_args),), fake_mode, decompositions, differentiates=True,
               cast_cache=True)
    gm.meta[JOINT_FW_OUTPUTS] = num_forward_outputs(gm, info)
    return gm


def exported_backward_writes(gm: torch.fx.GraphModule) -> list[int]:
    """The inputs the backward of a joint graph from `trace_joint` writes into."""
    return [i for i, _ in gm.meta.get(BACKWARD_WRITES, ())]


def refuse_exported_backward_writes(written: Sequence[int]) -> None:
    """An exported joint graph has no place for the inputs its backward writes into."""
    if written:
        raise NotImplementedError(
            f"aotgrad: the backward mutates input {written[0]} in place (e.g. a custom "
            "autograd.Function's backward writing into a tensor saved on ctx), which an "
            "exported joint graph cannot return. Save a copy in the Function "
            "(ctx.save_for_backward(t.clone())), or compile with aotgrad.compile.")


def mutable_copies(info: FunctionInfo, f_primals: list) -> list:
    """Mutate copies: each primal stays intact as the leaf gradients are taken for, and no
    saved-for-backward value is an input that the runtime later overwrites."""
    return [p.clone() if x.mutated else p for p, x in zip(f_primals, info.inputs)]


def _call(graph_fn: Callable, args: list) -> tuple[list, list]:
    return args, graph_fn(*args)


def input_grads(outs, differentiable, primals, tangents, create_graph: bool = False) -> list:
    """One gradient (or None) per primal, of the differentiable outputs weighted by tangents."""
    diff_outs = [o for o, d in zip(outs, differentiable) if d]
    follow_forward_nodes(diff_outs)
    needs_grad = [isinstance(p, torch.Tensor) and p.requires_grad for p in primals]  # not sizes
    wrt = [p for p, n in zip(primals, needs_grad) if n]
    with _backward_errors_explained():
        grads = iter(traced_grad(diff_outs, wrt, tangents, allow_unused=True,
                                 create_graph=create_graph) if wrt and diff_outs else ())
    return [next(grads, None) if n else None for n in needs_grad]


@contextlib.contextmanager
def _backward_errors_explained():
    """An error of a backward (a custom op without `register_autograd` on an input that
    requires grad, a Function whose backward raises) comes at the call: the joint trace
    differentiates every output ahead of it, where eager raises only at a backward that
    reaches that node (tests/test_semantics.py, xfail). Said so."""
    try:
        yield
    except RuntimeError as e:
        if "but no autograd formula was registered" not in str(e):
            if not str(e).startswith("aotgrad:"):  # ours say what to do
                e.add_note(_RAISED_AHEAD)
            raise
        raise NotImplementedError(
            f"aotgrad: {e} aotgrad differentiates every output when it compiles, where eager "
            "raises only at a backward that reaches the op. Register its backward "
            "(register_autograd), or pass it detached inputs (or call it under "
            "torch.no_grad()) where its gradient is not needed.") from e


_RAISED_AHEAD = ("aotgrad: raised by the backward, which aotgrad traces when the compiled "
                 "function is first called (eager would raise it at a backward that reaches it)")


def traced_grad(outputs, inputs, grad_outputs=None, **kwargs):
    """`torch.autograd.grad` with the backward's nodes run in this thread. On a GPU autograd
    runs a CUDA backward in its device thread, where a trace's context variables and
    thread-local state are not, and hands each graph task across threads; torch's
    AOTAutograd also traces with the engine's threads off.

    Autocast is off meanwhile: eager's backward runs where `.backward()` is called, outside
    the forward's autocast region as torch advises, so a custom Function's backward (one
    without `custom_bwd`) computes in the precision its operands have."""
    with torch.autograd.set_multithreading_enabled(False), _autocast_off_everywhere():
        return torch.autograd.grad(outputs, inputs, grad_outputs, **kwargs)


def _autocast_off_everywhere() -> contextlib.ExitStack:
    """Every enabled autocast turned off for a while (restored on exit)."""
    stack = contextlib.ExitStack()
    devices = getattr(torch._C, "_autocast_supported_devices", lambda: ("cpu", "cuda"))()
    for device in devices:
        if torch.is_autocast_enabled(device):
            stack.enter_context(torch.autocast(device, enabled=False))
    return stack


def follow_forward_nodes(outputs: Sequence) -> None:
    """While autograd runs a node's backward, the ops it traces take the sequence number
    of the forward op that made the node (`seq_nr`), as torch's trace does: so that
    `copy_forward_stack_traces` can point them at the user's code."""
    set_seq_nr = getattr(fx_traceback, "set_grad_fn_seq_nr", None)
    reset_seq_nr = getattr(fx_traceback, "reset_grad_fn_seq_nr", None)
    if set_seq_nr is None or reset_seq_nr is None:  # an older torch: no stack traces
        return
    for node in oplog.autograd_nodes(outputs):
        seq = node._sequence_nr()
        node.register_prehook(lambda grads, seq=seq: set_seq_nr(seq))
        node.register_hook(lambda grad_inputs, grad_outputs: reset_seq_nr())


def copy_forward_stack_traces(gm: torch.fx.GraphModule) -> None:
    """Give each node without a stack trace that of the first node of its `seq_nr`: a
    backward op that of the forward op it differentiates."""
    first: dict[int, str] = {}
    for node in gm.graph.nodes:
        seq = node.meta.get("seq_nr")
        if seq is None:
            continue
        trace = node.meta.get("stack_trace")
        if trace:
            first.setdefault(seq, trace)
        elif seq in first:
            node.meta["stack_trace"] = first[seq]


def trace(fn: Callable, args: tuple, fake_mode: FakeTensorMode, decompositions: Mapping | None,
          differentiates: bool, cast_cache: bool = False) -> torch.fx.GraphModule:
    """`fn`'s graph; `differentiates`: `fn` runs autograd (a joint); `cast_cache`: with
    autocast's cast cache as the caller has it."""
    # The graph holds plain tensors only: subclass arguments are split into their inner
    # tensors here and rebuilt inside, so that their __torch_dispatch__ is traced through.
    plain_fn, plain_args, traced_outputs = subclasses.plain_function(fn, args)
    if cast_cache:
        plain_fn = with_autocast_cache(plain_fn, torch.is_autocast_cache_enabled())
    # Selective checkpointing needs the python dispatcher: without it, a random op in a
    # checkpointed region fails SAC's cache checks. (Its cost is within noise here.)
    # Preserving node metadata carries each op's checkpoint policy onto its nodes (torch 2.11
    # tags them only this way) and the ATen op each node came from (Inductor names kernels
    # after it).
    # The code of the graph is generated when first read or run: the joint graph is only
    # partitioned, and its code was generated three times over.
    with fake_mode, enable_python_dispatcher(), checkpoints.run_once(), \
            fx_traceback.preserve_node_meta(), _lazy_graph_modules(), \
            mends.grouped_mm_as_cpu_kernel(), mends.dropout_returns_input_as_eager(), \
            attention_masks_dense(), \
            differentiating() if differentiates else mends.rnns_mended():
        gm = make_fx(plain_fn, decomposition_table=dict(decompositions or {}))(*plain_args)
    mark_valueless(gm.graph)
    gm.meta[TRACED_OUTPUTS] = tuple(traced_outputs)
    # Each placeholder's role, from the argument it stands for: `fn` takes the primals, then
    # (a joint) the tangents. Partitioners read it (schema.is_tangent), not the node's name.
    roles = [role for role, group in zip((PRIMAL, TANGENT), plain_args) for _ in group]
    for node, role in zip(gm.graph.find_nodes(op="placeholder"), roles, strict=True):
        node.meta[JOINT_ROLE] = role
    copy_forward_stack_traces(gm)
    read_unbacked_sizes_from_forward(gm.graph)
    return cleanup(gm)


def mark_valueless(graph: torch.fx.Graph) -> None:
    """Ops that return nothing carry the value None. make_fx records none for the runtime
    checks Dynamo puts in its graph (`aten._assert_scalar` of a symbolic size: `torch._check`,
    the bounds of `nonzero`'s unbacked size, `sym_constrain_range_for_size`), and `verify`
    refuses a node without a value."""
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op == "call_function" and schema is not None and not schema.returns:
            node.meta.setdefault("val", None)


def read_unbacked_sizes_from_forward(graph: torch.fx.Graph) -> None:
    """A size the forward computes from data (`.item()`, `nonzero`'s count) is also a size of
    the tangent of an output shaped by it. make_fx reads a symbol from the first tensor that
    has it, the tangent placeholders before the forward's ops ran: the forward's
    `x.new_ones(n)` read `n` from a tangent, which the forward does not have. Each use of
    such a read of a symbol no primal has is given the forward's own value instead."""
    placeholders = graph.find_nodes(op="placeholder")
    tangents = {n for n in placeholders if n.meta.get(JOINT_ROLE) == TANGENT}
    bound = set().union(*(_symbols(n.meta.get("val")) for n in placeholders if n not in tangents))
    for read in [u for t in tangents for u in t.users]:
        val = read.meta.get("val")
        if not isinstance(val, torch.SymInt) or not val.node.expr.is_Symbol \
                or val.node.expr in bound:
            continue
        own = _forward_value_of(graph, val.node.expr, tangents)
        if own is not None:
            read.replace_all_uses_with(own)


def _symbols(val) -> set:
    if isinstance(val, torch.Tensor):
        return set().union(*(_symbols(s) for s in (*val.shape, *val.stride())))
    return set(val.node.expr.free_symbols) if isinstance(val, torch.SymInt) else set()


def _forward_value_of(graph: torch.fx.Graph, symbol, tangents: set) -> torch.fx.Node | None:
    """The first node that does not read a tangent and whose value is `symbol`, or has it as
    a size (a size read is added after it); None where the forward has none."""
    from_tangents = set(tangents)
    for node in graph.nodes:
        if node in from_tangents or any(i in from_tangents for i in node.all_input_nodes):
            from_tangents.add(node)
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr == symbol:
            return node
        if isinstance(val, torch.Tensor) and node.op == "call_function":
            for dim, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt) and size.node.expr == symbol:
                    return _size_read(graph, node, dim, size)
    return None


def _size_read(graph: torch.fx.Graph, node: torch.fx.Node, dim: int, size) -> torch.fx.Node:
    with graph.inserting_after(node):
        read = graph.call_function(aten.sym_size.int, (node, dim))
    read.meta["val"] = size
    return read


def tangents_read_by_grads(gm: torch.fx.GraphModule) -> tuple[int, ...]:
    """TraceFacts.grad_reads of a joint graph: one pass, each node with the set (bits) of
    tangents it reads."""
    reads: dict[torch.fx.Node, int] = {}
    tangents = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.meta.get(JOINT_ROLE) == TANGENT:
                reads[node], tangents = 1 << tangents, tangents + 1
        else:
            reads[node] = functools.reduce(
                operator.or_, (reads.get(a, 0) for a in node.all_input_nodes), 0)
    grads = gm.graph.output_node().args[0][gm.meta[JOINT_FW_OUTPUTS]:]
    return tuple(reads.get(g, 0) if isinstance(g, torch.fx.Node) else 0 for g in grads)


def _lazy_graph_modules():
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # then the code is generated at once
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def cleanup(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Flat calling convention, outputs in a tuple (as torch's graphs return them), no
    runtime no-ops, no dead code."""
    gm.graph._codegen = torch.fx.graph.CodeGen()
    output = gm.graph.output_node()
    if isinstance(output.args[0], list):
        output.args = (tuple(output.args[0]),)
    remove_no_ops(gm.graph)
    allocate_overwritten_clones(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def allocate_overwritten_clones(graph: torch.fx.Graph) -> None:
    """A clone whose values nothing reads (an input's mutable copy, overwritten whole by
    `copy_`) becomes an allocation: its source may have no memory (an FSDP parameter,
    freed until the function resizes and fills it), which eager never reads either."""
    for node in list(graph.find_nodes(op="call_function", target=aten.clone.default)):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or is_symbolic(val) or not node.users or any(
                not _reads_only_geometry(u, node) for u in node.users):
            continue
        with graph.inserting_before(node):
            empty = graph.call_function(aten.empty_strided.default, (
                tuple(val.shape), tuple(val.stride())),
                {"dtype": val.dtype, "device": val.device})
        empty.meta.update(node.meta)
        node.replace_all_uses_with(empty)
        graph.erase_node(node)


def _reads_only_geometry(user: torch.fx.Node, node: torch.fx.Node) -> bool:
    """The functional `copy(node, src)` takes only node's geometry, so do size reads."""
    if user.target in GEOMETRY_READS:
        return True
    return user.target is aten.copy.default and user.args[0] is node and \
        all(a is not node for a in user.args[1:])


def remove_no_ops(graph: torch.fx.Graph) -> None:
    """Drop ops such as `detach` that do nothing once autograd is done, except where the graph
    returns them: there they keep an output from being the input object itself."""
    output = graph.output_node()
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target in NO_OP_AT_RUNTIME and output not in node.users:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
