"""Stage 5, compile: hand each graph to a backend compiler.

A compiler is `compiler(gm, example_inputs) -> callable`, as in functorch's compile API. The
callable either takes the arguments spread out, or (marked `_boxed_call`) one list it may
clear early to free inputs. What the pipeline knows about a graph (its role, how many of
its inputs are parameters, which outputs the user sees) travels in `gm.meta[GRAPH_INFO]`,
so a backend needs no side channel.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import logging
import operator
import threading
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import fx

from ..semantics.effects import run_checks_after, split_checks
from . import cudagraphs, fxcache, inductor_defaults
from .layouts import keeping_layout
from .passes import undo_transpose_pairs
from ..schema import (DONATED, GRAPH_INFO, INDUCTOR_FX_KEY, OUTPUT_STRIDES, Backend,
                      GraphInfo, is_tangent)

log = logging.getLogger("aotgrad.cache")
# Per compile: (the graph being compiled, as `<compile id>_<role>`; the compile's id).
_compiling: contextvars.ContextVar[tuple[list[str], int]] = contextvars.ContextVar(
    "aotgrad_compiling", default=([], 0))
_compile_ids = itertools.count()
_graphs_compiled = 0  # graphs handed to a compiler so far, in this process


@contextlib.contextmanager
def compiling():
    """Numbers one compile, for `compat.get_aot_compilation_context()`."""
    token = _compiling.set(([], next(_compile_ids)))
    try:
        yield
    finally:
        _compiling.reset(token)


@contextlib.contextmanager
def graph_being_compiled(role: str):
    """Names the graph a compiler is handed: functorch's tools name files after it."""
    global _graphs_compiled
    graphs, compile_id = _compiling.get()
    graphs[:] = [f"{compile_id}_{role}"]
    try:
        yield
    finally:
        graphs.clear()
        _graphs_compiled += 1


@dataclass(frozen=True)
class CompileScope:
    """The context of a compile, captured to compile one of its graphs later (a backward at
    its first use, maybe in autograd's engine thread) as it would have been compiled then:
    the compile's name (`compat.get_aot_compilation_context`), Dynamo's tracing and compile
    contexts (its fake mode, the compile id); grad mode off, as torch compiles a backward."""

    compilation: tuple[list[str], int]
    tracing: Any  # torch._guards.TracingContext, or None outside Dynamo
    dynamo_compile: Any  # torch._guards.CompileContext, or None

    @staticmethod
    def capture() -> "CompileScope":
        from torch._guards import CompileContext, TracingContext
        return CompileScope(_compiling.get(), TracingContext.try_get(), CompileContext.try_get())

    @contextlib.contextmanager
    def resumed(self):
        from torch._guards import TracingContext, compile_context, tracing
        # Leaving a tracing context cleans its shape env up: not while the compile that
        # entered it (compiling ahead, inside Dynamo's) still runs.
        inside = self.tracing is not None and TracingContext.try_get() is self.tracing
        token = _compiling.set(self.compilation)
        try:
            with compile_context(self.dynamo_compile), torch.no_grad(), \
                    contextlib.nullcontext() if inside else tracing(self.tracing):
                yield
        finally:
            _compiling.reset(token)


def compilation_context() -> tuple[list[str], str, int]:
    """(the graph being compiled, model name, graphs compiled before it), as functorch's:
    its model is always "model"."""
    return list(_compiling.get()[0]), "model", _graphs_compiled


def make_boxed_func(f: Callable) -> Callable:
    """`f` taking one list of arguments instead of spread-out arguments."""

    def boxed(args):
        return f(*args)

    boxed._boxed_call = True
    return boxed


def make_boxed_compiler(compiler: Callable) -> Callable:
    @functools.wraps(compiler)
    def boxed_compiler(gm, example_inputs):
        return make_boxed_func(compiler(gm, example_inputs))

    return boxed_compiler


def copy_graph(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` whose nodes and their meta dicts may be changed freely."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {})).meta = dict(gm.graph.output_node().meta)
    copy = fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    return copy


def as_boxed(compiled: Callable) -> Callable:
    return compiled if getattr(compiled, "_boxed_call", False) else make_boxed_func(compiled)


@make_boxed_compiler
def nop(fx_g: fx.GraphModule, _) -> fx.GraphModule:
    """Run the graph as it is."""
    return fx_g


def eager_compiler(gm: fx.GraphModule, example_inputs) -> Callable:
    """Run the graph's ops one by one, as straight-line Python (see codegen.py)."""
    from .codegen import python_function
    return python_function(gm)


eager_compiler.keeps_graph = True


def own_static_marks(example_inputs: Sequence[Any], static: Sequence[int]) -> None:
    """Inductor marks the fakes of a graph's static inputs (on a GPU) and keys its FX graph
    cache on their storage. A saved parameter's fake is shared by the forward and the
    backward when traced, so the backward inherited the forward's mark; read from our cache,
    its graphs have fakes of their own, unmarked: another key, and a warm process compiled
    the backward again. A graph's marks are its own static inputs, however it was built."""
    for i, t in enumerate(example_inputs):
        if i not in static and hasattr(t, "_is_inductor_static"):
            del t._is_inductor_static


def inductor_compiler(gm: fx.GraphModule, example_inputs) -> Callable:
    """Inductor on one graph. Torch's AOTAutograd does not run: the graph is final. A graph
    read from aotgrad's cache loads Inductor's compiled code by the key it was stored under,
    where the context is the same (fxcache.py); otherwise it is compiled."""
    from torch._guards import TracingContext, detect_fake_mode, tracing
    from torch._inductor.virtualized import V

    info: GraphInfo = gm.meta[GRAPH_INFO]
    outputs = gm.graph.output_node().args[0]
    gm.graph.output_node().meta["user_visible_output_idxs"] = [
        i for i in info.user_outputs if isinstance(outputs[i], fx.Node)]
    fake_mode = detect_fake_mode(example_inputs)
    context = TracingContext(fake_mode)
    donated = donated_inputs(gm) if info.role == "backward" else None
    if donated is not None:
        context.fw_metadata = _InductorBackwardMeta(donated)
    graphed = cudagraphs.inductor_kwargs(info)
    was_graphed = bool(graphed.get("cudagraphs"))  # a box Inductor clears if it cannot record
    own_static_marks(example_inputs, info.static_inputs)
    negate_negative_constants(gm)
    _constant_outputs_dropped(gm)
    with V.set_fake_mode(fake_mode), tracing(context), _cache_key_tag(donated), \
            cudagraphs.inductor_config(info), _our_settings(info, example_inputs), \
            _shape_env_for_graph_cache(fake_mode), \
            TracingContext.report_output_strides() as strides:
        # In the compile's own context (the cache key tag, the config it patches): the
        # context a stored Inductor key is filed under names them.
        compiled, (body, checks) = _load_or_compile(gm, example_inputs, info, donated, graphed)
    gm.meta[OUTPUT_STRIDES] = list(strides)[:len(outputs)]
    cudagraphs.report_inductor(info, compiled, was_graphed, body, example_inputs)
    if checks is not None:
        compiled = run_checks_after(as_boxed(compiled), checks, len(outputs))
    compiled = resolving_lazy_bits(compiled, example_inputs, gm)
    return batched_gradients_as_ops(compiled, gm) if info.role == "backward" else compiled


def batched_gradients_as_ops(compiled: Callable, gm: fx.GraphModule) -> Callable:
    """A boxed backward that runs `gm`'s ops one by one when its gradients are batched
    (`torch.autograd.grad(..., is_grads_batched=True)` vmaps the backward): those hold no
    memory for Inductor's kernels to read, where each ATen op has a batching rule."""
    is_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", None)
    tangents = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if is_tangent(n)]
    if is_batched is None or not tangents:
        return compiled
    compiled = as_boxed(compiled)

    def run(args):  # the common call only looks
        for i in tangents:
            if is_batched(args[i]):
                return gm(*args)
        return compiled(args)
    run._boxed_call = True
    return run


def _constant_outputs_dropped(gm: fx.GraphModule) -> None:
    """None for the constants the graph returns (functorch's convention: `return x, 0.5`),
    which the runtime takes from the analysis: Inductor's lowering accepts ints and None
    only (a float, a string, a dtype or a slice failed its assertion)."""
    output = gm.graph.output_node()
    outs = output.args[0]
    if any(not isinstance(o, (fx.Node, int, type(None))) for o in outs):
        output.args = (tuple(o if isinstance(o, (fx.Node, int, type(None))) else None
                             for o in outs),)
        gm.recompile()


def negate_negative_constants(gm: fx.GraphModule) -> None:
    """A tensor the graph holds (a closed-over `torch._neg_view(t)`) that is negative: the
    graph holds its memory as a plain view and negates it with an op, since Inductor's code
    reads memory as values. Still the caller's tensor (a view of it), not a copy."""
    reads = [n for n in gm.graph.find_nodes(op="get_attr")
             if isinstance(getattr(gm, n.target), torch.Tensor) and getattr(gm, n.target).is_neg()]
    if not reads:
        return
    for target in {n.target for n in reads}:
        setattr(gm, target, torch._neg_view(getattr(gm, target)))
    for node in reads:
        node.meta["val"] = torch._neg_view(node.meta["val"])
        with gm.graph.inserting_after(node):
            negated = gm.graph.call_function(torch.ops.aten.neg.default, (node,))
        node.replace_all_uses_with(negated, delete_user_cb=lambda user: user is not negated)
        negated.meta["val"] = torch.neg(node.meta["val"])
    gm.recompile()


def resolving_lazy_bits(compiled: Callable, example_inputs: Sequence[Any],
                        gm: fx.GraphModule) -> Callable:
    """Inductor's code reads an input's memory as its values: a negative input (`_neg_view`,
    a conjugate's `.imag`) reads negated. Such inputs (guards key a call by the bit), and a
    backward's gradients (which no guard sees), are handed over resolved where negative.
    (A conjugate input needs nothing: complex ops run as ATen's, which read the bit, and a
    real view of one starts with the `_conj` that undoes it.)"""
    checked = [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))
               if is_tangent(n) or isinstance(example_inputs[i], torch.Tensor)
               and example_inputs[i].is_neg()]
    return negatives_resolved(compiled, checked, gm) if checked else compiled


def negatives_resolved(compiled: Callable, checked: Sequence[int], gm: fx.GraphModule
                       ) -> Callable:
    """A boxed `compiled` whose tensor inputs at `checked`, where negative at a call, it
    takes resolved, in their strides; what the graph writes into one is copied back."""
    compiled, written = as_boxed(compiled), set(cudagraphs.mutated_inputs(gm))

    def resolving(args):
        given = {i: args[i] for i in checked if args[i].is_neg()}
        for i, t in given.items():
            args[i] = _resolved_neg(t)
        resolved = {i: args[i] for i in given if i in written}
        outs = compiled(args)
        for i, t in resolved.items():
            given[i].copy_(t)
        return outs

    def run(args):  # the common call (no negative input) only looks
        for i in checked:
            if args[i].is_neg():
                return resolving(args)
        return compiled(args)
    run._boxed_call = True
    return run


def _resolved_neg(t: torch.Tensor) -> torch.Tensor:
    # Its strides kept: Inductor's code asserts them (resolve_neg() would be contiguous).
    resolved = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    return resolved.copy_(t)


def _load_or_compile(gm: fx.GraphModule, example_inputs: Sequence[Any], info: GraphInfo,
                     donated: Any, graphed: dict) -> tuple[Callable, tuple]:
    """Inductor's code for `gm`, loaded by its stored key or compiled, with the graph's
    split into its body and the error checks that run after it (Inductor would drop or
    reorder them)."""
    _wait_for_cpu_isa_probe()
    split = split_checks(gm)
    slot = gm.meta.get(INDUCTOR_FX_KEY)  # set by aotgrad's cache on graphs it stores or reads
    state = fxcache.context_state(info, donated) if slot is not None else None
    where = fxcache.digest(state)
    compiled = _load_by_key(slot, state, where, split[0], example_inputs, info)
    if compiled is not None:
        return compiled, split
    if fxcache.lacks_fake_values(gm):  # read by key, but not found: trace values
        fxcache.fill_fake_values(gm)
        split = split_checks(gm)
    # Inductor's passes rewrite the graph they compile: they get a copy (split_checks made
    # one already where it split), and the graph stays as given (`keeps_graph`).
    body = split[0] if split[1] is not None else _without_own_meta(copy_graph(split[0]))
    compiled = _compile_inner(body, example_inputs, info, graphed)
    if slot is not None:
        slot.remember(where, fxcache.record_of(compiled, state))
    return compiled, split


def _load_by_key(slot: Any, state: dict | None, where: str | None, body: fx.GraphModule,
                 example_inputs: Sequence[Any], info: GraphInfo) -> Callable | None:
    if slot is None or where is None:
        return None
    record = slot.records.get(where)
    if record is None:
        if slot.records:
            log.info("aotgrad cache: Inductor's stored key of this %s graph not entered: %s",
                     info.role, fxcache.why_not_entered(slot.records, state))
        return None
    compiled = fxcache.load(record, body, example_inputs, info)
    slot.loaded(compiled is not None)
    return compiled


def _without_own_meta(gm: fx.GraphModule) -> fx.GraphModule:
    """Inductor's FX graph cache hashes the GraphModule's attributes, `meta` among them:
    what aotgrad keeps there (the graph's info, its cache slot with the keys stored in
    other contexts) would change Inductor's key from one process to the next. (A graph
    split_checks made has an empty `meta`.)"""
    for k in [k for k in gm.meta if k.startswith("aotgrad")]:
        del gm.meta[k]
    return gm


def _compile_inner(body: fx.GraphModule, example_inputs, info: GraphInfo,
                   graphed: dict) -> Callable:
    from torch._inductor import config
    from torch._inductor.compile_fx import compile_fx_inner
    with config.patch({**_by_reference(body), **_fx_cache_for(example_inputs)}):
        return compile_fx_inner(body, example_inputs,
                                static_input_idxs=list(info.static_inputs),
                                is_backward=info.role == "backward",
                                is_inference=info.role == "inference", **graphed)


def _our_settings(info: GraphInfo, example_inputs: Sequence[Any]):
    """aotgrad's Inductor defaults for this graph (inductor_defaults.py), patched around the
    lookup by key as around the compile: a key stored with pointwise combos must not serve a
    process whose user turned them off (`combo_kernels=False`, torch's default value)."""
    from torch._inductor import config
    return config.patch(inductor_defaults.for_graph(config, info.role, example_inputs))


def _fx_cache_for(example_inputs: Sequence[Any]) -> dict:
    """Inductor's FX graph cache off for a graph taking a size that is an expression of
    symbols (a backward given `s0 // 2` saved by the forward): the guard Inductor stores with
    the entry names `s0` by its source outside the graph (Dynamo's `L['x']`), and every later
    lookup of that graph raised KeyError, so a compile fell back to static shapes."""
    derived = any(isinstance(v, torch.SymInt) and not v.node.expr.is_Symbol
                  for v in example_inputs)
    return {"fx_graph_cache": False} if derived else {}


def _by_reference(gm: fx.GraphModule) -> dict:
    """Inductor's settings for a graph that holds the user's objects (get_attr): a tensor the
    function closes over or a module's plain tensor attribute, a `torch.Generator`. Each
    must be read where it lives at every call, as eager reads it: Inductor would compile a
    0-d or small 1-d tensor's values into its code (an in-place write after the compile was
    lost), and a hit in its FX graph cache loads pickled copies (the second compile of
    `x * torch.rand(n, generator=g)` drew from a copy of `g` and left `g` as it was).
    A tensor the function made itself (`torch.tensor(2.0)`, which the graph copies with
    `lift_fresh_copy`) is the trace's own, which nothing else can write: Inductor compiles
    its value in, and the graph keeps Inductor's FX graph cache."""
    held = [operator.attrgetter(n.target)(gm) for n in gm.graph.find_nodes(op="get_attr")
            if any(u.target is not torch.ops.aten.lift_fresh_copy.default for u in n.users)]
    if not any(isinstance(v, (torch.Tensor, torch.Generator)) for v in held):
        return {}
    return {"fx_graph_cache": False, "always_keep_tensor_constants": True}


inductor_compiler.records_cudagraphs = True  # through compile_fx_inner's own box
# A compiler that leaves the graph it is given as it was (its ops may be run by others: a
# tracer inlining the backward); any other compiler gets a copy.
inductor_compiler.keeps_graph = True


def warm_inductor_workers(inputs: Sequence[Any] = ()) -> None:
    """Start Inductor's pool of kernel-compile workers now, as torch's own `inductor` backend
    does when Dynamo hands it a graph. The pool takes seconds to start; until it is ready each
    Triton kernel compiles in this process, one after another, so a first compile in a process
    that starts it only at its first kernel pays for that (issue 20). No-op without Triton.
    With CPU tensors among `inputs`, the CPU's vector ISA is probed meanwhile too."""
    from torch._inductor import async_compile
    warm = getattr(async_compile, "maybe_warm_pool", None)
    if warm is not None:
        warm()
    if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in inputs):
        _probe_cpu_isa_in_background()


_isa_probe: threading.Thread | None = None


def _probe_cpu_isa_in_background() -> None:
    """Inductor's CPU code picks its vector ISA by building and loading a test library per
    candidate, in child processes, once per process: about a second, most of it waiting, paid
    at the first CPU graph compiled or loaded (a third of a warm cache's first step on a
    2-core CPU). Probed in a thread as the compile starts, it overlaps our capture, analysis
    and cache lookup. The modules it uses are imported before it starts: imports racing
    across threads can meet half-initialized modules."""
    global _isa_probe
    if _isa_probe is not None:
        return
    from torch._inductor import codecache, cpp_builder, cpu_vec_isa  # noqa: F401
    import torch.utils._filelock  # noqa: F401
    _isa_probe = threading.Thread(target=cpu_vec_isa.valid_vec_isa_list, daemon=True,
                                  name="aotgrad-cpu-isa-probe")
    _isa_probe.start()
    # What Inductor's generated code imports (its lowerings, ~0.6 s), imported while the
    # probe waits on its children rather than after it.
    import torch._inductor.select_algorithm  # noqa: F401


def _wait_for_cpu_isa_probe() -> None:
    """Before Inductor reads the ISA: its cached list is the thread's, not a second probe."""
    if _isa_probe is not None:
        _isa_probe.join()


@contextlib.contextmanager
def _shape_env_for_graph_cache(fake_mode):
    """Inductor's FX graph cache serves only compiles whose fake mode has a shape env (it
    records the guards a graph was compiled under). A static-shapes trace has none: one is
    lent for the compile alone. Its fake tensors stay static (the mode was made with static
    shapes); afterwards the mode has none again, so later traces raise on data-dependent
    shapes as before."""
    if fake_mode is None or fake_mode.shape_env is not None:
        yield
        return
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    fake_mode.shape_env = ShapeEnv()
    try:
        yield
    finally:
        fake_mode.shape_env = None


def donated_inputs(gm: fx.GraphModule) -> list[int]:
    return [i for i, n in enumerate(gm.graph.find_nodes(op="placeholder")) if n.meta.get(DONATED)]


@dataclass(frozen=True)
class _InductorBackwardMeta:
    """The one field of AOTAutograd's metadata that `compile_fx_inner` reads for a backward:
    the inputs it may reuse the memory of (`DonatedBuffer`s)."""

    bw_donated_idxs: list[int]


def _cache_key_tag(donated: list[int] | None):
    """Inductor's FX graph cache keys a graph by its code, not by which inputs it may write
    into. A backward compiled to reuse a saved value's memory must never be served where that
    value is still held elsewhere (an input, or a `retain_graph` backward): the donated inputs
    go into the key. All of aotgrad's backwards are tagged, so none shares an entry with a
    backward that torch's AOTAutograd compiled with its own donations."""
    if donated is None:
        return contextlib.nullcontext()
    tag = torch.compiler.config.cache_key_tag
    return torch.compiler.config.patch(cache_key_tag=f"{tag}|aotgrad backward donates {donated}")


def inductor_graph_passes(gm: fx.GraphModule) -> fx.GraphModule:
    """Inductor's joint-graph rewrites: pattern replacements (attention, matmul padding...)
    and seeded random ops that the forward and a recomputing backward draw alike; then
    transposes that undo each other are gone (passes.py)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes
    from torch._inductor.virtualized import V

    vals = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
    devices = [v.device for v in vals if isinstance(v, torch.Tensor)]
    with V.set_fake_mode(detect_fake_mode(vals)):
        gm = joint_graph_passes(gm, input_device=devices[0] if devices else None)
    return undo_transpose_pairs(gm)


class InductorDecompositions(Mapping):
    """Inductor's decomposition table, loaded at its first use (a trace): importing Inductor
    takes about a second, which `import aotgrad` and eager-backend users should not pay."""

    @functools.cached_property
    def _table(self) -> Mapping:
        import torch._inductor.lowering  # noqa: F401  (some decompositions consult it)
        from torch._inductor.decomposition import select_decomp_table
        return {op: keeping_layout(op, fn) for op, fn in select_decomp_table().items()}

    def __getitem__(self, op):
        return self._table[op]

    def __iter__(self):
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __reduce__(self):  # the singleton (a pickled compiled module holds its options)
        return _inductor_decompositions, ()


INDUCTOR_DECOMPOSITIONS = InductorDecompositions()


def _inductor_decompositions() -> Mapping:
    return INDUCTOR_DECOMPOSITIONS


def resolve_backend(backend: Any, decompositions: Mapping | None = None) -> Backend:
    """A backend name, a `Backend`, or one compiler callable used for every graph."""
    if isinstance(backend, Backend):
        return backend
    if backend == "eager":  # each op runs as traced: a transpose undone is two dispatches
        return Backend(eager_compiler, eager_compiler, eager_compiler, decompositions,
                       undo_transpose_pairs)
    if backend == "inductor":
        decomps = INDUCTOR_DECOMPOSITIONS if decompositions is None else decompositions
        return Backend(inductor_compiler, inductor_compiler, inductor_compiler, decomps,
                       inductor_graph_passes, warm_inductor_workers)
    if callable(backend):
        return Backend(backend, backend, backend, decompositions)
    raise ValueError(f"aotgrad: unknown backend {backend!r}; use 'inductor', 'eager' or a "
                     "compiler callable (gm, example_inputs) -> callable")


class _Compiles:
    """One compile at a time in a process: tracing uses process-wide state (make_fx's
    patcher, the modules whose parameters a trace swaps for fakes), and threads calling a
    compiled function for the first time at once broke each other's traces. `generation`
    moves at each compile's start: a reader of a module's state that saw it move (or a
    compile running) reads again under the lock (`stable_read`)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.active = 0
        self.generation = 0

    def __enter__(self):
        self.lock.acquire()
        self.active += 1
        self.generation += 1

    def __exit__(self, *exc):
        self.active -= 1
        self.lock.release()

    def stable_read(self, read: Callable[[], Any]) -> Any:
        """`read()`, taken while no other thread's trace had the module's state swapped."""
        generation, active = self.generation, self.active
        value = read()
        if active or self.generation != generation:
            with self.lock:
                value = read()
        return value


COMPILES = _Compiles()


def one_compile_at_a_time(compile: Callable) -> Callable:
    @functools.wraps(compile)
    def serialized(*args, **kwargs):
        with COMPILES:
            return compile(*args, **kwargs)
    return serialized
