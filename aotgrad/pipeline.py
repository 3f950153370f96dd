"""The stages in order: capture, analyze, trace, partition, compile, and the runtime plan.

`compile_call` turns one call signature of a flat function into a `CompiledCall`; the
front doors (`api`, `compat`, `dynamo`) add pytrees, caching and modules around it.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import itertools
import logging
import operator
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx

from .semantics import aliasing, regions, subclasses
from .semantics.autocast import autocast_cache
from .capture.region_graphs import build_region
from .capture import analysis, inputs as capture, joint, oplog, pure
from .replay import random_values
from .backends.compilers import (CompileScope, as_boxed, compiling, copy_graph,
                                 one_compile_at_a_time, graph_being_compiled)
from .replay.double_backward import DoubleBackward
from .replay.old_values import old_values_read
from .semantics.dynamic import (DynamicShapesUnsupported, hint, is_size, is_symbolic,
                                runtime_sizes, shape_guard)
from .partition.split import (call_partitioner, default_partition, find_joint,
                              is_own_partitioner, tag_backward)
from .backends.fxcache import lacks_fake_values
from .backends.passes import inference_passes, joint_passes
from .partition.donate import mark_donated, without_donations
from .runtime.call import (BackwardParts, CompiledCall, CompiledOnFirstCall, RuntimePlan,
                           run_graph_boxed)
from .runtime.mutations import BackwardWrites
from .capture.stale import StaleBackward, find_stale_outputs, freed_graph
from .cache.entry import Lookup
from .cache.program import ProgramLookup
from .artifact import Artifact, SavedValue, count_ops, format_bytes
from .tables import CONSTANT_FILLS, FILLS_WITH_VALUE
from .verify import verify_partition
from .schema import (DONATED, GRAPH_INFO, JOINT, OUTPUT_STRIDES, TRACED_VAL, Backend,
                     FunctionInfo, GraphInfo, Partition, TraceFacts)


@dataclass(frozen=True)
class Options:
    backend: Backend
    partition_fn: Callable = default_partition
    keep_inference_input_mutations: bool = False
    dynamic: bool = False  # symbolic sizes for real inputs, checked by a guard per call
    # Flat argument positions of the inputs that live across calls (parameters, buffers):
    # their sizes stay static, and Inductor skips its per-call checks of them. A module's
    # come first (functorch's `num_params_buffers`); Dynamo's, as its modules use them. A
    # partition_fn is told `partitioner_static_inputs` (None: the same; functorch's: none).
    static_inputs: tuple[int, ...] = ()
    partitioner_static_inputs: tuple[int, ...] | None = None
    # When the backward compiles: "lazy" at the first backward (as torch's AOTAutograd), "ahead"
    # at the first call; always ahead for symbolic sizes (its compiler may add to the guard).
    compile_backward: str = "lazy"
    # For reports only: the names of the leading flat arguments (a module's state, as in
    # `named_parameters`), and the function whose parameters name the others (default: the
    # compiled one). `Artifact.saved` shows `blocks.0.attn.weight`, not `primals_3`.
    input_names: tuple[str, ...] = ()
    named_like: Callable | None = None
    # Replay each graph from a recorded CUDA graph (backends/cudagraphs.py), where it can be.
    cudagraphs: bool = False

    def __post_init__(self):
        if self.compile_backward not in ("lazy", "ahead"):
            raise ValueError(f"aotgrad: compile_backward={self.compile_backward!r}; use "
                             "'lazy' (at the first backward) or 'ahead' (at the first call)")


log = logging.getLogger(__name__)


class _Timer(dict):
    """Seconds per stage (`Artifact.timings`). Each stage logs one INFO line: its time and
    the sizes it puts in the dict it is given."""

    def __init__(self, name: str = "function"):
        super().__init__()
        self.name = name

    @contextmanager
    def __call__(self, stage: str):
        log.debug("%s: %s...", self.name, stage)
        sizes: dict[str, Any] = {}
        start = time.perf_counter()
        yield sizes
        elapsed = time.perf_counter() - start
        self[stage] = self.get(stage, 0.0) + elapsed
        facts = "".join(f", {k} {v}" for k, v in sizes.items())
        log.info("%s: %s %.0f ms%s", self.name, stage, elapsed * 1000, facts)


@dataclass(frozen=True)
class Captured:
    """A call captured and analyzed: everything the tracing stage needs."""

    graph_fn: Callable
    layout: capture.CallLayout
    inputs: list  # the graph inputs as the caller passed them (real, or Dynamo's fakes)
    fake_mode: Any
    fakes: list
    info: FunctionInfo | None  # None: captured, not analyzed yet
    aliasing: aliasing.InputAliasing | None = None  # the graph takes a base per alias group
    stale: StaleBackward | None = None  # outputs whose backward raises as eager's would
    pure: bool = False  # mutates nothing: traced without functionalization (pure.py)
    box: Any = None  # receives the output's tree spec when the analysis runs the function


def capture_and_analyze(fn: Callable, flat_args: Sequence[Any], in_spec: pytree.TreeSpec,
                        timer: _Timer | None = None, dynamic: bool = False,
                        static_inputs: Sequence[int] = ()) -> Captured:
    timer = timer if timer is not None else _Timer()
    return analyze_call(capture_call(fn, flat_args, in_spec, timer, dynamic, static_inputs),
                        timer)


def capture_call(fn: Callable, flat_args: Sequence[Any], in_spec: pytree.TreeSpec,
                 timer: _Timer, dynamic: bool, static_inputs: Sequence[int]) -> Captured:
    with timer("capture") as sizes:
        layout = capture.layout_call(flat_args, in_spec)
        inputs = layout.graph_inputs(flat_args)
        sizes["graph inputs"] = len(inputs)
        fake_mode = capture.fake_mode_for(inputs, dynamic)
        fakes = capture.fake_inputs(fake_mode, inputs, dynamic,
                                    set(layout.graph_positions(static_inputs)))
        box = capture.OutputBox()
        graph_fn = capture.flat_graph_fn(fn, layout, box)
    return Captured(graph_fn, layout, inputs, fake_mode, fakes, None, box=box)


def analyze_call(c: Captured, timer: _Timer) -> Captured:
    graph_fn, inputs, fakes, fake_mode, box = c.graph_fn, c.inputs, c.fakes, c.fake_mode, c.box
    with timer("analysis") as sizes, autocast_cache(False):
        is_leaf = [getattr(t, "is_leaf", True) for t in inputs]  # sizes are leaves
        info = pure.analyze(graph_fn, fakes, is_leaf, box, fake_mode)
        is_pure = info is not None
        if not is_pure:
            info = analysis.analyze(graph_fn, fakes, is_leaf, box, fake_mode)
        aliasing.refuse_writes_into_overlapping(inputs, info)
        alias = aliasing.plan_aliasing(inputs, info)
        if alias is not None and alias.groups:
            if is_symbolic(fakes):  # a group's base and members are addressed by geometry
                raise DynamicShapesUnsupported(
                    "aotgrad: inputs that share memory with a mutated input are compiled "
                    "for static shapes only.")
            graph_fn, fakes, info = aliasing.analyze_merged(graph_fn, inputs, fakes, fake_mode,
                                                            box, alias)
        sizes.update(outputs=len(info.outputs), functionalized=not is_pure)
    return dataclasses.replace(c, graph_fn=graph_fn, fakes=fakes, info=info, aliasing=alias,
                               pure=is_pure)


@contextmanager
def _collector_paused():
    """Tracing allocates objects by the hundred thousand and frees most of them by reference
    counting: the cyclic collector's passes over them cost about 5% of a compile. It runs
    again as usual once the compile is done."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@one_compile_at_a_time
@_collector_paused()
@capture.global_state_restored_on_error()  # an error raised to the user's code
@capture.nan_checks_off()
@regions.reused_in_compile(lambda options: functools.partial(
    build_region, options, capture_and_analyze, lambda *args: _trace_joint(*args)))
def compile_call(fn: Callable, flat_args: Sequence[Any], in_spec: pytree.TreeSpec,
                 options: Options) -> CompiledCall:
    named = options.named_like or fn  # a module's forward, for CompiledModule
    timer = _Timer(getattr(named, "__qualname__", type(fn).__name__))
    if options.backend.warm_up is not None:
        options.backend.warm_up(flat_args)
    c = capture_call(fn, flat_args, in_spec, timer, options.dynamic, options.static_inputs)
    with compiling(), \
            ProgramLookup(fn, c, options) as program:  # keyed before the analysis, if it can be
        if program.hit:  # the entry holds what the analysis and the trace found
            c = program.captured(c)
            built = _build_from_entry(c, options, timer, program)
        else:
            with oplog.session(program.keys_by_ops) as ops:
                c = analyze_call(c, timer)
            if ops is not None:  # a plain function: keyed by the ops its analysis ran
                program.after_analysis(c, *ops.key())
            if program.hit:
                built = _build_from_entry(c, options, timer, program)
            else:
                build = _build_training if c.info.needs_autograd else _build_inference
                built = build(c, options, timer, program)
    # Last: backends add guards while compiling.
    # Over the graph inputs the call passes: aliased inputs' merged bases come after them.
    graph_fakes = c.fakes[:len(c.layout.first_position)]
    guard = shape_guard(c.fake_mode, graph_fakes) if options.dynamic else None
    labels = c.layout.placeholder_labels(built.graphs[0], capture.input_labels(
        named, in_spec, options.input_names))
    # The timer is the same dict: a backward compiled later adds its time.
    artifact = Artifact(built.plan.info, *built.graphs, timings=timer, input_names=labels)
    forward, backward = built.forward, built.backward
    if not built.edge.is_plain:  # decided once: plain calls run the compiled graphs directly
        forward = built.edge.wrap_forward(forward)
        backward = backward and backward.wrapped(built.edge.wrap_backward)
    return CompiledCall(built.plan, forward, artifact, backward, guard)


@dataclass(frozen=True)
class _Built:
    """What a build compiled: a CompiledCall's parts before the guard and names are known."""

    plan: RuntimePlan
    forward: Callable
    backward: BackwardParts | None
    graphs: tuple[fx.GraphModule, ...]  # forward (or inference), backward, joint
    edge: subclasses.Boundary  # where subclass values are split into plain ones


def _build_from_entry(c: Captured, options: Options, timer: _Timer,
                      program: ProgramLookup) -> _Built:
    """A hit keyed before the trace: its graphs and what the trace found, from the entry."""
    if program.facts.num_fw_outputs is None:
        return _compile_inference(c, options, timer, None, program.facts, program)
    return _compile_training(c, options, timer, None, program.facts, program)


def _build_inference(c: Captured, options: Options, timer: _Timer,
                     program: ProgramLookup) -> _Built:
    with timer("trace"):
        trace = pure.trace_inference if c.pure else joint.trace_inference
        gm = trace(c.graph_fn, c.info, c.fakes, c.fake_mode, options.backend.decompositions,
                   _keeps_mutations(c.info, options))
    facts = TraceFacts.of(gm)
    # Keyed by the graph as traced.
    with Lookup("inference", gm, c, options, program, facts) as lookup:
        return _compile_inference(c, options, timer, gm, facts, lookup)


def _keeps_mutations(info: FunctionInfo, options: Options) -> bool:
    # A resized input gets its memory from the runtime, after the graph: no copy before it.
    return options.keep_inference_input_mutations and \
        all(x.storage_bytes is None for x in info.inputs)


def _compile_inference(c: Captured, options: Options, timer: _Timer, gm: fx.GraphModule | None,
                       facts: TraceFacts, lookup: Lookup | ProgramLookup) -> _Built:
    info, keep = c.info, _keeps_mutations(c.info, options)
    with timer("passes") as sizes:  # skipped on a cache hit: the entry holds their result
        if lookup.graphs is None:
            gm = inference_passes(options.backend, gm)
            lookup.keep([gm])
        else:  # a cache hit: the graph after the passes
            gm, = lookup.graphs
        sizes["inference graph ops"] = count_ops(gm)
    copied = info.inference_mutations_in_graph if keep else ()
    edge = _boundary(c, facts, copied)
    if edge.is_plain:
        aliasing.unview_plain_outputs(gm, info)
    repeated = aliasing.repeated_plain_outputs(gm, info)
    gm.meta[GRAPH_INFO] = GraphInfo("inference", _static_graph_inputs(gm, options, c.layout),
                                    _plain_range(edge, info), _cudagraphs(options))
    with timer("compile_forward") as sizes:
        compiled = _compile(options.backend.inference_compiler, gm)
        sizes["ops"] = count_ops(gm)
    plan = dataclasses.replace(_plan(info, c, info.num_graph_outputs, copied_in_graph=copied),
                               repeated_outputs=repeated)
    return _Built(plan, compiled, None, (gm,), edge)


def _build_training(c: Captured, options: Options, timer: _Timer,
                    program: ProgramLookup) -> _Built:
    with timer("trace") as sizes:
        random_ops = random_values.RandomValueTags()  # for a double backward's replay
        c, joint_gm = _trace_joint(c, options, random_ops)
        sizes["joint graph ops"] = count_ops(joint_gm)
    facts = TraceFacts.of(joint_gm, random_ops.ops, joint.tangents_read_by_grads(joint_gm))
    # Keyed by the joint graph as traced; a hit holds the partition's graphs.
    with Lookup("training", joint_gm, c, options, program, facts) as lookup:
        return _compile_training(c, options, timer, joint_gm, facts, lookup)


def _compile_training(c: Captured, options: Options, timer: _Timer,
                      joint_gm: fx.GraphModule | None, facts: TraceFacts,
                      lookup: Lookup | ProgramLookup) -> _Built:
    """`joint_gm`: None on a hit keyed before the trace (the artifact has no joint graph)."""
    hit = lookup.graphs is not None
    if not hit:
        with timer("passes"):  # skipped on a cache hit: the entry holds the partition
            joint_gm = random_values.through_passes(joint_gm,
                                                    lambda gm: joint_passes(options.backend, gm))
            aliasing.mark_bases_overwritten(joint_gm, c.aliasing)
            joint.snapshot_overwritten_inputs(joint_gm)
    info = c.info
    edge = _boundary(c, facts, info.mutations_in_graph)
    n = facts.num_fw_outputs  # plain forward outputs
    with timer("partition") as sizes:
        if hit:
            p = Partition(*lookup.graphs, n)
            _share_saved_values(p)
        else:
            # Found once, after the last pass: every partitioner (and explain) reads it here.
            joint_gm.meta[JOINT] = find_joint(joint_gm, n)
            told = options.partitioner_static_inputs
            static = c.layout.graph_positions(options.static_inputs if told is None else told)
            with graph_being_compiled("joint"):  # functorch's name for it, in a partition_fn
                p = Partition(*call_partitioner(options.partition_fn, joint_gm, n, static), n)
        fw, bw = p.forward, p.backward
        tag_backward(bw)
        edge = subclasses.bind_grad_sizes(edge, bw)
        held = random_values.hold_random_values(fw, bw, n, facts.random_ops)
        if not (hit and (lacks_fake_values(fw) or lacks_fake_values(bw))):
            # a hit loaded by Inductor's key: verified when stored
            verify_partition(fw, bw, n, allow_unread=not is_own_partitioner(options.partition_fn))
        if not hit:  # a hit's graphs hold the marks already
            mark_donated(p)
            lookup.keep([fw, bw])
        sizes.update(_partition_sizes(p))
    if edge.is_plain:
        aliasing.unview_plain_outputs(fw, info)
    repeated = aliasing.repeated_plain_outputs(fw, info)
    graphed = _cudagraphs(options)  # one state for the forward and its backward
    fw.meta[GRAPH_INFO] = GraphInfo("forward", _static_graph_inputs(fw, options, c.layout),
                                    _plain_range(edge, info), graphed)
    bw.meta[GRAPH_INFO] = GraphInfo("backward", _static_saved_values(p, fw, graphed),
                                    range(len(bw.graph.output_node().args[0])), graphed)
    with timer("compile_forward") as sizes:
        compiled_fw = _compile(options.backend.fw_compiler, fw)
        sizes["ops"] = count_ops(fw)
    restride_saved(p)
    plan = dataclasses.replace(
        _plan(info, c, info.num_graph_outputs, copied_in_graph=info.mutations_in_graph),
        repeated_outputs=repeated, shared_counters=aliasing.counter_sharing_outputs(fw, info))
    grads = edge.grads_per_input(bw.graph.output_node().args[0])  # plain grads per input
    plan = dataclasses.replace(
        plan,
        num_saved_sizes=sum(not isinstance(v.meta.get("val"), torch.Tensor) for v in p.saved),
        gradless_inputs=_gradless_inputs(c, grads),
        unreached_grads=_unreached_grads(facts.grad_reads, edge, plan.tangent_outputs),
        overwritten_inputs=tuple(i for i, g in enumerate(grads)
                                 if info.inputs[i].mutates_data and all(map(_is_zero_fill, g))))
    backward = _backward_parts(c, options, timer, bw, facts, _double_backward(c, edge, p, held))
    return _Built(plan, compiled_fw, backward, (fw, bw, joint_gm), edge)


def _share_saved_values(p: Partition) -> None:
    """A hit whose ops have no fake values (Inductor loads them by key): the saved values
    get their backward inputs', stored with the entry, for what reads them here."""
    saved = p.backward.graph.find_nodes(op="placeholder")
    for node, taken in zip(p.saved, saved):
        node.meta.setdefault("val", taken.meta["val"])


def _backward_parts(c: Captured, options: Options, timer: _Timer, bw: fx.GraphModule,
                    facts: TraceFacts, double_backward: DoubleBackward) -> BackwardParts:
    """The backward compiled when first called (or now, where asked or sizes are symbolic),
    and what else a backward may run instead (runtime.call.CompiledFunction chooses)."""
    compile_bw = functools.partial(random_values.compile_without_held_values,
                                   functools.partial(_compile, options.backend.bw_compiler))
    compiled_bw = _compile_later(lambda: compile_bw(bw), timer, count_ops(bw))
    if options.compile_backward == "ahead" or is_symbolic(c.fakes):
        compiled_bw = compiled_bw.compiled()
    keeping_saved = None
    if any(node.meta.get(DONATED) for node in bw.graph.find_nodes(op="placeholder")):
        keeping_saved = _compile_later(lambda: compile_bw(without_donations(bw)), timer,
                                       count_ops(bw))
    # The backward graph as partitioned, for a tracer to inline its ops (Dynamo, for compiled
    # autograd). Copied where a compiler may rewrite it in place (aotgrad's Inductor and eager
    # compilers do not: `keeps_graph`; the eager one's code calls ops Dynamo cannot trace).
    inlined_bw = bw if getattr(options.backend.bw_compiler, "keeps_graph", False) \
        else copy_graph(bw)
    return BackwardParts(compiled=compiled_bw, ops=run_graph_boxed(inlined_bw),
                         double_backward=double_backward, keeping_saved=keeping_saved,
                         writes=_backward_writes(facts, len(c.fakes)), stale=c.stale)


def _backward_writes(facts: TraceFacts, num_inputs: int) -> BackwardWrites | None:
    """The inputs the backward writes into, whose new values follow its gradients."""
    writes = facts.backward_writes  # none through pure.trace_joint
    if not writes:
        return None
    return BackwardWrites(inputs=tuple(i for i, _ in writes),
                          version_bumps=tuple(n for _, n in writes), num_grads=num_inputs)


def _compile_later(compile: Callable[[], Callable], timer: _Timer,
                   num_ops: int) -> CompiledOnFirstCall:
    """A backward compiled at its first call, maybe in autograd's engine thread, in the
    context its forward was compiled in; its time is added to `compile_backward`."""
    scope = CompileScope.capture()

    def compile_now() -> Callable:
        with scope.resumed(), _collector_paused(), timer("compile_backward") as sizes:
            sizes["ops"] = num_ops
            return compile()
    return CompiledOnFirstCall(compile_now)


def _gradless_inputs(c: Captured, grads: Sequence[Sequence]) -> tuple[int, ...]:
    """The inputs the runtime detaches: every tensor without a gradient, whether it required
    grad here or not (Dynamo, torch 2.11, may reuse the graph once a buffer requires grad).
    Stale outputs must stay connected to the inputs, to require grad as in eager. So must
    one input when none has a gradient: eager's outputs still require grad where a backward
    formula gives no gradient at all (`linalg.norm(x, ord=0)`)."""
    if c.stale is not None:
        return ()
    gradless = [i for i, g in enumerate(grads)
                if all(x is None for x in g) and not is_size(c.fakes[i])]
    requiring = [i for i, f in enumerate(c.fakes) if not is_size(f) and f.requires_grad]
    if requiring and set(requiring) <= set(gradless):
        gradless.remove(requiring[0])
    return tuple(gradless)


def _trace_joint(c: Captured, options: Options, random_ops: random_values.RandomValueTags
                 ) -> tuple[Captured, fx.GraphModule]:
    """The joint graph, without the outputs whose backward reads a saved value the function
    modified in place or freed (stale.py); `random_ops` tags the random values
    (random_values.py)."""
    def trace(c: Captured) -> fx.GraphModule:
        trace_joint = pure.trace_joint if c.pure else joint.trace_joint
        return trace_joint(random_ops.wrap(c.graph_fn), c.info, c.fakes, c.fake_mode,
                           options.backend.decompositions)
    try:
        return c, trace(c)
    except RuntimeError as e:  # StaleSavedValue, or a graph the function's backward freed
        if not isinstance(e, capture.StaleSavedValue) and not freed_graph(e):
            raise
        stale = find_stale_outputs(c.graph_fn, c.info, c.fakes, c.fake_mode)
        c = dataclasses.replace(c, info=dataclasses.replace(c.info, stale_outputs=stale.outputs),
                                stale=stale, pure=False)
        return c, trace(c)


def _partition_sizes(p: Partition) -> dict[str, Any]:
    saved = [SavedValue.of(node) for node in p.saved]
    if log.isEnabledFor(logging.DEBUG):
        log.debug("saved for backward: %s", ", ".join(
            f"{s.name} {list(s.shape)} {format_bytes(s.nbytes)}" for s in saved))
    return {"forward ops": count_ops(p.forward), "backward ops": count_ops(p.backward),
            "saved": f"{len(saved)} values, {format_bytes(sum(s.nbytes for s in saved))}"}


def _double_backward(c: Captured, edge: subclasses.Boundary, p: Partition,
                     held: random_values.ForwardRandomValues) -> DoubleBackward:
    if not edge.is_plain:  # the replay would have to split and rebuild subclasses too
        return DoubleBackward.refused("tensor subclass inputs or outputs")
    if any(x.gains_requires_grad for x in c.info.inputs):  # the replay's inputs have it early
        return DoubleBackward.refused("requires_grad_() on an input inside it")
    return DoubleBackward(c.graph_fn, c.info, c.fakes, c.fake_mode, p.saved_inputs, held,
                          old_values_read(p.forward, p.num_fw_outputs, c.info))


def _boundary(c: Captured, facts: TraceFacts, copied_in_graph) -> subclasses.Boundary:
    return subclasses.make_boundary(c.fakes, facts.traced_outputs, c.info, copied_in_graph)


def _plain_range(edge: subclasses.Boundary, info: FunctionInfo) -> range:
    """The graph's (plain) outputs the user sees: after the mutated inputs' new values."""
    return range(edge.plain_count(len(info.data_mutated_inputs)),
                 edge.plain_count(info.num_graph_outputs))


def _unreached_grads(grad_reads: tuple[int, ...], edge: subclasses.Boundary,
                     tangent_outputs: tuple) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """RuntimePlan.unreached_grads: per input, the outputs whose tangents its gradient reads
    in the joint graph as traced (TraceFacts.grad_reads), where those are some of the
    outputs only."""
    if len(tangent_outputs) < 2 or not edge.is_plain or len(grad_reads) != len(edge.grads):
        return ()
    every = (1 << len(tangent_outputs)) - 1
    unreached = []
    for i, bits in enumerate(edge.grads_per_input(grad_reads)):
        bits = functools.reduce(operator.or_, bits, 0)
        if bits and bits != every:  # no bits: a constant gradient (a zero fill) stays so
            outputs = tuple(k for j, k in enumerate(tangent_outputs) if bits >> j & 1)
            unreached.append((i, outputs))
    return tuple(unreached)


def _is_zero_fill(grad) -> bool:
    """A gradient that is a constant zero fill: the input's old value never reaches an
    output (it is overwritten first), so autograd need not follow it into its history."""
    return isinstance(grad, fx.Node) and grad.target in CONSTANT_FILLS and _fills_zero(grad)


def _fills_zero(node: fx.Node) -> bool:
    value = node.args[1] if node.target in FILLS_WITH_VALUE else 0
    return value == 0


def restride_saved(p: Partition) -> None:
    """Give the backward's saved-value inputs the strides the compiled forward really
    produces, where the forward's compiler reported choosing its own layouts."""
    strides = p.forward.meta.get(OUTPUT_STRIDES) or []
    saved = p.backward.graph.find_nodes(op="placeholder")
    for node, stride in zip(saved, strides[p.num_fw_outputs:]):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or stride is None:
            continue
        # Symbolic strides compare by their value in the example inputs: no guard.
        if tuple(hint(s) for s in val.stride()) == tuple(stride):
            continue
        if is_symbolic(val):  # Inductor's CPU convolutions save channels-last copies
            stride = _symbolic_dense_strides(val, stride, node.name)
        node.meta.setdefault(TRACED_VAL, val)  # what the backward's ops were traced from
        node.meta["val"] = val.as_strided(val.shape, stride, val.storage_offset())


def _symbolic_dense_strides(val: torch.Tensor, stride: Sequence[int], name: str) -> list:
    """The compiler's strides for `val`, of symbolic shape, as expressions of its sizes: dense,
    in the order of the strides it reported for the example sizes (the compiled forward
    keeps that layout at every size). Other layouts cannot be written for every size."""
    order = sorted(range(val.dim()), key=lambda d: (stride[d], -d))  # innermost first
    symbolic, step = [0] * val.dim(), 1
    for d in order:
        symbolic[d], step = step, step * val.shape[d]
    if tuple(hint(s) for s in symbolic) != tuple(stride):
        raise DynamicShapesUnsupported(
            f"aotgrad: the forward's compiler chose strides {tuple(stride)} for {name}, a "
            "saved value of symbolic shape, not dense; compile with dynamic=False.")
    return symbolic


def _plan(info: FunctionInfo, c: Captured, num_fw_outputs: int,
          copied_in_graph: tuple[int, ...]) -> RuntimePlan:
    tensors = [m is not None for m in info.graph_output_metas]
    return RuntimePlan(
        info=info,
        graph_input_positions=c.layout.first_position,
        num_fw_outputs=num_fw_outputs,
        tangent_outputs=tuple(i for i, d in enumerate(info.gets_tangent) if d),
        non_differentiable=tuple(i for i, d in enumerate(info.differentiable)
                                 if not d and tensors[i]),
        copied_in_graph=copied_in_graph,
        disable_autocast=torch.is_autocast_enabled() or torch.is_autocast_enabled("cpu"),
        aliasing=c.aliasing,
        sizes=runtime_sizes(info, c.fakes),
    )


def _static_saved_values(p: Partition, fw: fx.GraphModule, cudagraphs) -> tuple[int, ...]:
    """The backward's inputs static to its compiler, as torch's: under CUDA graphs all saved
    values; else what the forward computes (at offsets traced) and saved parameters and
    buffers, not checked for alignment per call. A call's own input, or its view, may move."""
    if cudagraphs is not None:
        return tuple(range(len(p.saved)))
    position = {n: i for i, n in enumerate(fw.graph.find_nodes(op="placeholder"))}
    static = fw.meta[GRAPH_INFO].static_inputs
    return tuple(k for k, n in enumerate(p.saved)
                 if (root := aliasing.memory_root(n)) not in position or position[root] in static)


def _cudagraphs(options: Options):
    """A fresh CUDA-graph state for one compile, where CUDA graphs are asked for."""
    if not options.cudagraphs:
        return None
    from .backends.cudagraphs import CudagraphState
    return CudagraphState.new()


def _static_graph_inputs(gm: fx.GraphModule, options: Options,
                         layout: capture.CallLayout) -> tuple[int, ...]:
    """The graph inputs that live across calls (no per-call alignment check). A graph not
    taking the call's inputs one for one (subclasses split, a synthetic base) maps the first."""
    static = layout.graph_positions(options.static_inputs)
    if len(gm.graph.find_nodes(op="placeholder")) != layout.num_graph_inputs:
        return tuple(itertools.takewhile(lambda k: static[k] == k, range(len(static))))
    return static


def _compile(compiler: Callable, gm: fx.GraphModule) -> Callable:
    example_inputs = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    # The graph holds autocast's casts already. A call's autocast must not reach the compiler:
    # Inductor retraces its pattern replacements (attention, for one), and autocast would
    # recast them against the graph's dtypes. Nor its grad mode: a graph is compiled to be
    # run, not differentiated, and compilers see grad mode off as torch's AOTAutograd
    # hands them graphs (a replacement retraced with grad on may pick another kernel).
    with torch._C._DisableAutocast(), torch.no_grad(), \
            graph_being_compiled(gm.meta[GRAPH_INFO].role):
        compiled = as_boxed(compiler(gm, example_inputs))
    info = gm.meta[GRAPH_INFO]
    if info.cudagraphs is not None and not getattr(compiler, "records_cudagraphs", False):
        from .backends.cudagraphs import record
        compiled = record(compiled, gm, example_inputs, info)
    return compiled
