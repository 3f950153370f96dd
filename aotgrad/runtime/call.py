"""Stage 6, runtime: run the compiled graphs so that, seen from outside, the call is eager.

Everything a call does beyond running the graphs (copying new values into mutated inputs,
rebuilding outputs that alias inputs or intermediates) is decided at compile time into a
`RuntimePlan`; a call walks precomputed index lists and does no analysis.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from ..semantics.aliasing import InputAliasing
from ..schema import FunctionInfo, OutputKind
from ..replay.double_backward import DoubleBackward, release_inputs
from ..semantics.dynamic import ShapeGuard, SizeBindings, is_symbolic
from ..semantics.subclasses import is_subclass
from ..capture.stale import SavedOutputs, StaleBackward
from ..capture.fed_outputs import FedOutputs
from ..autograd import state as _compiled_autograd
from .outputs import detached_alias, output_order
from .mutations import BackwardWrites, mutation_steps, set_versions, version_or_none
from . import saved_hooks
from .lean import held_inputs, lean_function, left_to_python, none_where_unreached, \
    undetached, tangent as _tangent

@dataclass(frozen=True)
class RuntimePlan:
    """What a call does around the graphs, decided once."""

    info: FunctionInfo
    graph_input_positions: tuple[int, ...]  # flat argument position of each graph input
    num_fw_outputs: int  # forward outputs before the saved values
    tangent_outputs: tuple[int, ...]  # forward outputs that receive a gradient
    non_differentiable: tuple[int, ...]
    copied_in_graph: tuple[int, ...]  # data-mutated inputs the graph copies into itself
    disable_autocast: bool  # the graph already holds autocast's casts
    # Inputs the backward returns no gradient for: passed detached, so that backward does not
    # walk into their history (which may be freed). Mutated inputs whose old value is
    # overwritten before any use get a zero gradient and become fresh leaves instead.
    gradless_inputs: tuple[int, ...] = ()
    overwritten_inputs: tuple[int, ...] = ()
    # The aliasing among the inputs that the graph assumes (None: no input is mutated, any
    # aliasing is fine); the graph takes one more input per group of aliased inputs.
    aliasing: InputAliasing | None = None
    # Saved values that are sizes (symbolic ints), after the saved tensors: autograd saves
    # only tensors, so these travel on the ctx.
    num_saved_sizes: int = 0
    # Where symbolic sizes the runtime applies itself (views it rebuilds, metadata it restores)
    # are read from each call's inputs; None when nothing it applies is symbolic.
    sizes: SizeBindings | None = None
    # (input, the outputs whose gradients its gradient reads) for inputs that some outputs
    # do not reach: when none of those outputs took part in the loss, autograd never
    # reaches the input in eager and its .grad stays None; the backward would give zeros.
    unreached_grads: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # User outputs computed by the graph whose value it returns for an earlier user output
    # too: the runtime returns a tensor of their own over that memory, as eager's `detach()`.
    repeated_outputs: tuple[int, ...] = ()
    # (k, m): forward output k, an alias of output m's memory that needs no gradient, is
    # handed out sharing m's version counter, as eager's `h.detach()` (aliasing.py).
    shared_counters: tuple[tuple[int, int], ...] = ()

    @functools.cached_property  # read on every call
    def mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.info.inputs)
                     if x.mutated or x.storage_swap is not None or x.storage_bytes is not None)


_region_ids = itertools.count(1)


def _region_key(call: "CompiledCall", saved_sizes: Sequence[int]) -> int:
    """A positive id per compiled specialization and the saved sizes its backward reads
    (plain ints at run time, which a traced backward bakes in)."""
    ids = call.compiled_autograd_ids
    sizes = tuple(saved_sizes)
    if sizes not in ids:
        ids[sizes] = next(_region_ids)
    return ids[sizes]


class CompiledFunction(torch.autograd.Function):
    """The compiled forward and backward as one autograd node. Named as torch's: tools find
    compiled regions by `grad_fn.name() == "CompiledFunctionBackward"`. Lean plans run a
    subclass of their own (lean.py); this class runs the others."""

    @staticmethod
    def forward(ctx, call: "CompiledCall", *inputs):
        call.double_backward.hold(ctx, held_inputs(inputs))  # for create_graph=True
        if call.stale is not None:
            call.stale.hold(ctx, inputs)
        if call.backward_writes is not None:
            call.backward_writes.hold(ctx, inputs)
        outs = call.forward(list(inputs))
        if call.stale is not None:
            call.stale.hold_output(ctx, outs)
        plan = call.plan
        if plan.shared_counters:
            outs = _sharing_counters(outs, plan.shared_counters)
        ctx.call = call
        if call.backward_keeping_saved is not None:  # the backward may write into saved values
            # which a saved-tensor hook (checkpoint's, the caller's own) may still hold
            ctx.hooked = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
        # Outputs without a gradient (mutated buffers' new values, unused outputs) get None,
        # not a zero tensor autograd would fill for each of them on every backward.
        ctx.set_materialize_grads(False)
        if call.symbolic_tangents:  # a missing gradient is made at this call's sizes
            ctx.output_shapes = {i: _sized_like(outs[i]) for i in call.symbolic_tangents}
        sizes_at = len(outs) - plan.num_saved_sizes
        ctx.save_for_backward(*outs[plan.num_fw_outputs:sizes_at])
        if call.saved_outputs is not None:
            call.saved_outputs.hold(ctx, outs)
        if call.fed_outputs is not None:
            call.fed_outputs.hold(ctx, outs)
        ctx.saved_sizes = outs[sizes_at:]
        if call.unread_outputs:  # inputs or their aliases, which autograd would wrap in views
            outs = list(outs)
            for k in call.unread_outputs:
                outs[k] = None
        if call.non_differentiable:
            if plan.repeated_outputs:
                outs = _non_differentiable_apart(outs, call.non_differentiable,
                                                 plan.num_fw_outputs)
            ctx.mark_non_differentiable(*[outs[i] for i in call.non_differentiable])
        return tuple(outs[:plan.num_fw_outputs])

    @staticmethod
    def jvp(ctx, *tangents):
        # Called only when an input is a dual tensor; torch's default names a custom Function.
        raise NotImplementedError(
            "aotgrad: forward-mode AD (dual tensors of torch.autograd.forward_ad) through a "
            "compiled function is not supported: it has no forward-mode rule. Call the "
            "function uncompiled for forward-mode AD.")

    @staticmethod
    def _compiled_autograd_key(ctx):
        # Compiled autograd caches a captured backward under this key: the graph it traced
        # is this specialization's, with these saved sizes baked in.
        # Called on every backward: which outputs eager's node saved the caller changed
        # since (SavedOutputs.changed) is a part of it.
        call = ctx.call
        changed = call.saved_outputs.changed(ctx) if call.saved_outputs is not None else 0
        return (_region_key(call, ctx.saved_sizes), changed)

    @staticmethod
    def backward(ctx, *grads):
        call = ctx.call
        if call.fed_outputs is not None and not torch.compiler.is_compiling():
            call.fed_outputs.check(ctx, grads)  # a hook the one node cannot serve as eager
        # Eager's errors, where eager's backward would raise them: first an output's own
        # node, which eager's backward reaches first, finding the caller changed it ...
        if call.saved_outputs is not None:
            call.saved_outputs.check(ctx, grads)
        if call.stale is not None:  # ... then a value the function itself changed
            call.stale.check(ctx, grads)
        metas = call.plan.info.graph_output_metas
        shapes = ctx.output_shapes if call.symbolic_tangents else {}
        tangents = [_tangent(grads[i], metas[i], shapes.get(i))
                    for i in call.plan.tangent_outputs]
        unreached = call.plan.unreached_grads
        if torch.is_grad_enabled():  # only create_graph=True runs a backward with grad on
            if call.backward_writes is not None:
                call.backward_writes.refuse_create_graph()
            return (None, *none_where_unreached(
                unreached, grads, call.double_backward.input_grads(ctx, tangents)))
        if torch.compiler.is_compiling() or _compiled_autograd.capturing:
            # Dynamo inlines this backward into the graph torch's compiled autograd captured,
            # or aotgrad's compiled autograd traces it: run the backward graph's ops for it
            # to record, not one opaque compiled call.
            outs = call.backward_ops([*ctx.saved_tensors, *ctx.saved_sizes, *tangents])
            if call.backward_writes is not None:
                outs = call.backward_writes.copy_in(ctx, outs)
            return (None, *none_where_unreached(unreached, grads, outs))
        # The backward may clear this list to free each saved value after its last use: no
        # other reference may remain, neither autograd's (unless retain_graph) nor ours.
        args = [*ctx.saved_tensors, *ctx.saved_sizes, *tangents]
        ctx.maybe_clear_saved_tensors()
        release_inputs(ctx)
        backward = call.backward
        if call.backward_keeping_saved is not None and (
                ctx.hooked or torch._C._autograd._get_current_graph_task_keep_graph()):
            backward = call.backward_keeping_saved  # retain_graph: a later backward reads them
        outs = backward(args)
        if call.backward_writes is not None:
            outs = call.backward_writes.apply(ctx, outs)
        return (None, *none_where_unreached(unreached, grads, outs))


def _sharing_counters(outs: Sequence[Any], pairs: tuple[tuple[int, int], ...]) -> list:
    """`outs`, each alias k over output m's memory sharing m's version counter (where the
    backend left it over that memory, in m's dtype), a view where the graph's was one."""
    outs = list(outs)
    for k, m in pairs:
        out, source = outs[k], outs[m]
        if type(out) is torch.Tensor and type(source) is torch.Tensor \
                and out.dtype == source.dtype and out.untyped_storage().data_ptr() \
                == source.untyped_storage().data_ptr():
            geometry = (out.size(), out.stride(), out.storage_offset())
            outs[k] = (source.detach().as_strided(*geometry) if out._is_view()
                       else detached_alias(source, geometry))
    return outs


def _non_differentiable_apart(outs: Sequence[Any], non_differentiable: tuple[int, ...],
                              num_outputs: int) -> list[Any]:
    """`outs`, where a non-differentiable output is the very tensor another output is, with
    a tensor of its own over the same memory instead (eager's `detach()`). A backend may
    return one tensor for both (Inductor drops `h.detach()` as a no-op: `return h,
    h.detach()` came back as one tensor), and marking it non-differentiable took the
    gradient off the other output too."""
    outs = list(outs)
    others = {id(o) for k, o in enumerate(outs[:num_outputs]) if k not in non_differentiable}
    for k in non_differentiable:
        if id(outs[k]) in others:
            outs[k] = outs[k].detach()
    return outs


class CompiledOnFirstCall:
    """A boxed compiled graph that is compiled only if it is ever called, once: backwards
    run in autograd's engine threads, and two may reach it at the same time."""

    _boxed_call = True

    def __init__(self, compile: Callable[[], Callable]):
        self._compile = compile
        self._compiled: Callable | None = None
        self._lock = threading.Lock()
        # Told the compiled graph once there is one: its holder may call it directly after.
        self.then: Callable[[Callable], None] | None = None

    def __call__(self, args: list):
        compiled = self._compiled
        if compiled is None:
            compiled = self.compiled()
        return compiled(args)

    def compiled(self) -> Callable:
        """The compiled graph, compiling it now if no call has yet."""
        with self._lock:
            if self._compiled is None:
                self._compiled = self._compile()
                self._compile = None  # what it held (graphs, contexts) is not needed again
                if self.then is not None:
                    self.then(self._compiled)
                    self.then = None
            return self._compiled


def run_graph_boxed(gm: torch.fx.GraphModule) -> Callable[[list], list]:
    """`gm` called with a list of arguments: its ops run one by one, as a tracer sees them."""
    def run(args: list) -> list:
        return gm(*args)
    run._boxed_call = True
    return run


CompiledGraph = CompiledFunction  # the name the rest of aotgrad knows it by
# The engine runs a node by its `apply`, whose Python wrapper (BackwardCFunction.apply) only
# chooses between `backward` and `vjp`: the node calls the backward itself (see lean.py).
CompiledGraph._backward_cls.apply = CompiledGraph.backward


def fast_apply(function: type) -> Callable:
    """`function.apply` without its Python wrapper, which only unwraps functorch transforms:
    with none active, the C++ entry point does the same work a few microseconds sooner."""
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, function)


def apply_compiled(call: "CompiledCall", args: list):
    hooks = saved_hooks.users_hooks()
    if hooks is not None:  # the values it saves, checked as the user's hooks unpack them
        with saved_hooks.checked(hooks):
            return call.function.apply(call, *args)
    if torch._C._are_functorch_transforms_active():
        return call.function.apply(call, *args)
    return call.apply_fast(call, *args)


@dataclass(frozen=True)
class BackwardParts:
    """What a training call's backward may run, all decided at compile time."""

    compiled: Callable  # the compiled backward (a CompiledOnFirstCall until first needed)
    ops: Callable  # the backward graph as partitioned, run op by op (boxed): what a tracer inlines
    double_backward: DoubleBackward  # for a backward with create_graph=True
    # Where the backward may write into saved values (partition.donate.mark_donated): one that
    # does not, for the calls whose saved values outlive the backward.
    keeping_saved: Callable | None = None
    writes: BackwardWrites | None = None  # inputs the backward writes into
    stale: StaleBackward | None = None  # outputs whose backward raises (stale.py)

    def wrapped(self, wrap: Callable[[Callable], Callable]) -> "BackwardParts":
        """The same backward with each graph wrapped (subclass support splits and rebuilds
        subclass values around the plain graphs)."""
        return dataclasses.replace(
            self, compiled=wrap(self.compiled), ops=wrap(self.ops),
            keeping_saved=None if self.keeping_saved is None else wrap(self.keeping_saved))


_INFERENCE = BackwardParts(compiled=None, ops=None, double_backward=None)  # no backward


class CompiledCall:
    """One compiled specialization: graphs plus the plan that wraps them, whole from its
    construction (a lazily compiled backward replaces itself by its compiled graph only)."""

    def __init__(self, plan: RuntimePlan, forward: Callable, artifact: Any,
                 backward: BackwardParts | None = None, guard: ShapeGuard | None = None):
        self.plan = plan
        self.forward = forward
        self.artifact = artifact
        self.guard = guard  # with dynamic shapes: which calls it may serve
        # Read by CompiledFunction on each backward: plain attributes, one lookup each.
        parts = backward if backward is not None else _INFERENCE
        self.backward = parts.compiled
        self.backward_ops = parts.ops
        self.double_backward = parts.double_backward
        self.backward_keeping_saved = parts.keeping_saved
        self.backward_writes = parts.writes
        self.stale = parts.stale
        self.saved_outputs = SavedOutputs.of(plan.info) if backward is not None else None
        self.fed_outputs = FedOutputs.of(plan.info) if backward is not None else None
        self._fed_written = self.fed_outputs is not None and bool(self.fed_outputs.written)
        self.compiled_autograd_ids: dict[tuple, int] = {}  # _region_key's, per saved sizes
        self._call_backward_directly_once_compiled()
        self._mutations = mutation_steps(plan.info, plan.copied_in_graph, plan.sizes)
        # Outputs of symbolic shape that take a gradient: one the loss does not reach is
        # zeros of the shape this call's forward produced.
        metas = plan.info.graph_output_metas
        self.symbolic_tangents = frozenset(i for i in plan.tangent_outputs
                                           if is_symbolic(metas[i].shape))
        self._versioned = tuple((i, plan.info.inputs[i].version_bumps)
                                for i in plan.copied_in_graph)
        if self._versioned:  # set before the forward saves an input: autograd notes its version
            self.forward = functools.partial(self._forward_setting_versions, forward)
        # Graph outputs that are inputs the graph wrote in place: nothing reads them.
        data_index = {i: k for k, i in enumerate(plan.info.data_mutated_inputs)}
        self.written_in_graph = tuple(data_index[i] for i in plan.copied_in_graph)
        # ... and the user outputs the runtime rebuilds from other values.
        self.unread_outputs = self.written_in_graph + plan.info.rebuilt_outputs
        self.non_differentiable = tuple(k for k in plan.non_differentiable
                                        if k not in self.unread_outputs)
        self._outputs = output_order(plan.info, plan.sizes, plan.repeated_outputs)
        self.unflatten = _unflattener(plan.info.out_spec)
        # Decided once, so that a call skips what this plan does not need.
        self._gather = _gatherer(plan.graph_input_positions)
        self._mutated = plan.mutated_inputs
        self._gains_grad = tuple(i for i, x in enumerate(plan.info.inputs)
                                 if x.gains_requires_grad)
        self._detaches = bool(plan.gradless_inputs or plan.overwritten_inputs)
        self._run_graphs = self._run_training if backward is not None else self._run_inference
        self._plain_outputs = (None if plan.repeated_outputs else
                               _plain_output_slice(plan.info))
        self.num_fw_outputs = plan.num_fw_outputs
        self.tangent_outputs = plan.tangent_outputs
        self.lean = backward is not None and _is_lean(self)
        self.holds_versions = self.lean and bool(self.double_backward.unsaved_inputs
                                                 or plan.gradless_inputs
                                                 or self.double_backward.old_values)
        self.function = lean_function(self, CompiledGraph) if self.lean else CompiledGraph
        _general_backward_left_to_python()
        self.apply_fast = fast_apply(self.function)
        self.run = _direct_runner(self) or self._run_and_unflatten

    def _forward_setting_versions(self, graph: Callable, inputs: list) -> Sequence[Any]:
        """The forward graph; then the version counters of the inputs it wrote as eager's
        (the graph's own writes may have moved them, or not)."""
        versions = [version_or_none(inputs[i]) for i, _ in self._versioned]
        written = list(inputs)  # a boxed graph may clear its list
        outs = graph(inputs)
        # from the second call on, only the counters that need it
        self._versioned = set_versions(written, self._versioned, versions)
        return outs

    def _call_backward_directly_once_compiled(self) -> None:
        """Once compiled, a backward runs without the lazy wrapper's frame in between."""
        for role in ("backward", "backward_keeping_saved"):
            lazy = getattr(self, role)
            if isinstance(lazy, CompiledOnFirstCall):
                lazy.then = functools.partial(setattr, self, role)

    def _run_and_unflatten(self, flat_args: Sequence[Any]) -> Any:
        return self.unflatten(self(flat_args))

    def __call__(self, flat_args: Sequence[Any]) -> list[Any]:
        inputs = self._gather(flat_args)
        if self.plan.aliasing is not None:
            inputs = self.plan.aliasing.graph_inputs(inputs)
        for i in self._gains_grad:  # before the graphs: autograd then records their use
            inputs[i].requires_grad_()
        with _autocast_off(self.plan.disable_autocast):
            raw = self._run_graphs(inputs)
        for step in self._mutations:
            step(inputs, raw)
        if self._fed_written:  # the caller's tensors, which the steps gave new nodes
            self.fed_outputs.hold_written(raw, inputs)
        if self._plain_outputs is not None:
            return list(raw[self._plain_outputs])
        return self._user_outputs(inputs, raw)

    def _run_training(self, inputs: Sequence[Any]) -> Sequence[Any]:
        if not self._detaches:
            return self._apply_with_grad(inputs)
        args, held = self._detach(inputs)
        if held is None:
            return self._apply_with_grad(args)
        with undetached(held):
            return self._apply_with_grad(args)

    def _apply_with_grad(self, args: Sequence[Any]) -> Sequence[Any]:
        if torch.is_grad_enabled():
            return apply_compiled(self, args)
        if torch.is_inference_mode_enabled():
            # Eager records no history under inference_mode, even where the function turns
            # grad on (Dynamo compiles outside inference_mode: this plan has a backward).
            return apply_compiled(self, args)
        with torch.enable_grad():  # grad mode was applied when tracing
            return apply_compiled(self, args)

    def _detach(self, inputs: Sequence[Any]) -> tuple[list[Any], list[Any] | None]:
        """The graph's inputs, and the ones a double backward's replay reads where they
        differ (None where they do not): the inputs without a gradient keep their history
        there (undetached)."""
        plan = self.plan
        args = list(inputs)
        for i in plan.overwritten_inputs:
            args[i] = args[i].detach().requires_grad_(args[i].requires_grad)
        if not plan.gradless_inputs:
            return args, None
        held = list(args)
        for i in plan.gradless_inputs:
            if args[i].requires_grad:
                args[i] = args[i].detach()
        return args, held

    def _run_inference(self, inputs: Sequence[Any]) -> Sequence[Any]:
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self.forward(list(inputs))  # a boxed callee may clear its list
        return self.forward(list(inputs))

    def _user_outputs(self, inputs, raw) -> list[Any]:
        outs: list[Any] = [None] * len(self.plan.info.outputs)
        for i, get in self._outputs:
            outs[i] = get(inputs, raw, outs)
        if self.fed_outputs is not None and self.fed_outputs.rebuilt:
            self.fed_outputs.hold_rebuilt(raw, outs)
        return outs


@functools.cache
def _general_backward_left_to_python() -> None:
    """Once: the general backward is run by Dynamo's frame hook as plain Python too (at
    import, `left_to_python` would load Dynamo with aotgrad)."""
    left_to_python(CompiledGraph.backward)


def _is_lean(call: CompiledCall) -> bool:
    """Whether CompiledFunction's forward and backward take their short path: nothing to do
    around the graphs but hold the inputs, save, and pass plain tangents."""
    metas = call.plan.info.graph_output_metas
    return (call.stale is None and call.backward_writes is None and
            call.backward_keeping_saved is None and not call.symbolic_tangents and
            call.plan.num_saved_sizes == 0 and not call.unread_outputs and
            not call.non_differentiable and not call.plan.shared_counters and
            all(metas[i].subclass is None for i in call.plan.tangent_outputs))


def _direct_runner(call: CompiledCall) -> Callable[[Sequence[Any]], Any] | None:
    """Flat arguments -> the user's outputs in one frame, for the plans that need nothing
    around the graphs: no mutations, no autocast to turn off, every output computed by the
    graph. None for the others. Straight-line Python generated per plan (`run.source`): the
    graph inputs picked by position, the outputs by index, no list copied but the boxed one."""
    body = runner_body(call)
    if body is None:
        return None
    lines, scope = body
    source = "def run(a):\n" + lines
    exec(compile(source, "<aotgrad runner>", "exec"), scope)
    run = scope["run"]
    run.source = source
    return run


def runner_body(call: CompiledCall, grad: bool | None = None) -> tuple[str, dict] | None:
    """The direct runner's body over the flat arguments `a` (indented once) and the names it
    reads; None where the plan needs the general path. `grad`: the grad mode the caller
    checked already (a guard that specializes on it), which the body then does not read."""
    plan = call.plan
    if call._mutated or call._versioned or call._gains_grad or plan.overwritten_inputs \
            or plan.disable_autocast or call._plain_outputs is None:
        return None
    gather, outputs, unflatten = call._gather, call._plain_outputs, call.unflatten
    scope = {"_grad": torch.is_grad_enabled, "_no_grad": torch.no_grad, "_call": call,
             "_forward": call.forward, "_apply": call.apply_fast,
             "_transforms": torch._C._are_functorch_transforms_active,
             "_hooks": torch._C._autograd._top_saved_tensors_default_hooks,
             "_finish": lambda raw: unflatten(list(raw[outputs])),
             "_general": lambda a: unflatten(list(call._run_training(gather(a))[outputs]))}
    args = ", ".join(f"a[{p}]" for p in plan.graph_input_positions)
    if call.backward is None:
        result = _picked(call, f"_forward([{args}])", from_tuple=False)
        return _inference_body(result, grad), scope
    gradless = "".join(f" and not a[{plan.graph_input_positions[i]}].requires_grad"
                       for i in plan.gradless_inputs)
    applied = _picked(call, f"_apply(_call, {args})", True)
    if grad is False:  # _run_training turns grad mode on, as the trace had it
        return "    return _general(a)\n", scope
    # a saved-tensor hook: the general path checks what the user's unpacks (saved_hooks.py)
    check = "not _transforms() and _hooks(False) is None"
    check = check if grad else f"_grad() and {check}"
    return (f"    if {check}{gradless}:\n        return {applied}\n"
            "    return _general(a)\n"), scope


def _inference_body(result: str, grad: bool | None) -> str:
    """A graph traced without grad runs without it."""
    if grad is False:
        return f"    return {result}\n"
    if grad:
        return f"    with _no_grad():\n        return {result}\n"
    return (f"    if _grad():\n        with _no_grad():\n            return {result}\n"
            f"    return {result}\n")


def _picked(call: CompiledCall, raw: str, from_tuple: bool) -> str:
    """The user's outputs from the graph's results `raw` (Function.apply's tuple when
    `from_tuple`): one output by index, all of a flat tuple as they are, else `_finish`."""
    outputs, spec = call._plain_outputs, call.plan.info.out_spec
    if spec.is_leaf():
        return f"{raw}[{outputs.start}]"
    if from_tuple and call.unflatten is tuple and outputs == slice(0, call.num_fw_outputs):
        return raw
    return f"_finish({raw})"


def _gatherer(positions: tuple[int, ...]) -> Callable[[Sequence[Any]], Sequence[Any]]:
    """The graph inputs from the flat arguments: a slice when they are the leading ones."""
    if positions == tuple(range(len(positions))):
        leading = slice(0, len(positions))
        return lambda flat_args: flat_args[leading]
    return lambda flat_args: [flat_args[p] for p in positions]


def _plain_output_slice(info: FunctionInfo) -> slice | None:
    """Where the user outputs lie in the graph's results when every one is computed by the
    graph (no aliases to rebuild): a call then slices instead of running the getters."""
    if any(o.kind is not OutputKind.PLAIN or o.made_leaf or o.detached_from is not None
           or o.made_in_inference_mode for o in info.outputs):
        return None
    first = info.first_user_output
    return slice(first, first + len(info.outputs))


def _sized_like(out: torch.Tensor) -> Any:
    """What a missing gradient of `out` is made from: its shape, or for a subclass (whose
    parts have sizes of their own) the output itself, detached (no copy)."""
    return out.detach() if is_subclass(out) else out.shape


def _unflattener(spec: pytree.TreeSpec) -> Callable[[list], Any]:
    """Rebuild the user's output structure; the common shapes skip pytree."""
    if spec.is_leaf():
        return lambda outs: outs[0]
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    if spec.type is tuple and all(child.is_leaf() for child in children):
        return tuple
    return lambda outs: pytree.tree_unflatten(outs, spec)


def _autocast_off(disable: bool):
    return torch._C._DisableAutocast() if disable else contextlib.nullcontext()
