"""A captured backward program, specialized for the sizes of a run, and guarded.

The program (capture.py) calls each C++ formula as one opaque call, so it holds for any
sizes. Specializing it traces those calls on fake tensors whose sizes are symbols of the
run's tensors and lifted sizes: the formulas' ATen ops land in the graph a compiler sees,
and whatever they branched on (a dim is 1 when a broadcast is reduced, two dims are equal, a
size is at least 2) becomes a guard. `Captured`, the object the engine keeps per cache
entry, checks the guards of each specialization before running it (generated straight-line
code over the lifted inputs, sizes and scalars); sizes that break every guard specialize
again, before anything ran, the failed guard logged. A trace that fails runs the program
itself, on real tensors: each formula then runs as the eager engine runs it.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.fx.experimental.proxy_tensor import (
    PythonKeyTracer, ProxyTorchDispatchMode, fetch_object_proxy, track_tensor_tree)

from . import hooks, state, undefined
from .guard import Guard, exact_guard
from .layouts import restride_effect_results
from .ready import eager_order, made_by
from ..schema import ENGINE_NODE, READY, READY_QUEUE
from ..tables import written_arguments

log = logging.getLogger("aotgrad.autograd")
# The graph's inputs, in the order the engine passes them to the runtime wrapper.
PLACEHOLDERS = ("inputs", "sizes", "scalars", "hooks", "packed_data")
GUARDED = PLACEHOLDERS[:3]  # what guards read; `L['sizes_3']` in torch's guard text


class Trace:
    """A tracer over the five graph inputs, fake tensors and symbols standing for them."""

    def __init__(self):
        self.stack = contextlib.ExitStack()
        self.tracer = new_tracer()
        self.proxies = {name: self.tracer.create_proxy("placeholder", name, (), {})
                        for name in PLACEHOLDERS}
        self.symbols: dict[Any, fx.Proxy] = {}

    def open(self, inputs: Sequence, sizes: Sequence, scalars: Sequence, duck: bool,
             dynamic: bool = True) -> tuple:
        """Fakes and symbols for the lifted values, bound to the graph's inputs (static:
        fakes of these sizes, the sizes and scalars themselves)."""
        self.dynamic = dynamic
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.shape_env = ShapeEnv(duck_shape=duck)
        self.fake_mode = FakeTensorMode(allow_fallback_kernels=True,
                                        allow_non_fake_inputs=True, shape_env=self.shape_env)
        fakes = [self._fake(x, i) for i, x in enumerate(inputs)]
        self._bind(fakes, self.proxies["inputs"])
        syms = [self._symbol(v, "sizes", i) for i, v in enumerate(sizes)]
        sym_scalars = [self._symbol(v, "scalars", i) for i, v in enumerate(scalars)]
        enter_tracing(self.stack, self.fake_mode, self.tracer)
        return fakes, syms, sym_scalars

    def _fake(self, x: torch.Tensor, index: int) -> torch.Tensor:
        from torch._dynamo.source import LocalSource
        from torch.fx.experimental.symbolic_shapes import (
            DimDynamic, StatelessSymbolicContext)
        dim = DimDynamic.DYNAMIC if self.dynamic else DimDynamic.STATIC
        context = StatelessSymbolicContext(dynamic_sizes=[dim] * x.dim())
        return self.fake_mode.from_tensor(x, source=LocalSource(f"inputs_{index}"),
                                          symbolic_context=context)

    def _symbol(self, value: Any, kind: str, index: int) -> Any:
        """A lifted size or scalar: a symbol, read from the graph's input list."""
        if not self.dynamic:
            return value
        sym = lifted_symbol(self.shape_env, value, kind, index)
        if isinstance(sym, (torch.SymInt, torch.SymFloat)):
            proxy = self.proxies[kind][index]
            self.symbols[sym.node] = proxy
            track_tensor_tree(sym, proxy, constant=None, tracer=self.tracer)
        return sym

    def close(self) -> None:
        self.stack.close()

    def to_proxy(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_proxy(v) for v in x)
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            found = self.symbols.get(x.node)
            return found if found is not None else fetch_object_proxy(self.tracer, x).force()
        if isinstance(x, torch.Tensor):
            return fetch_object_proxy(self.tracer, x).proxy
        return x

    def _call(self, fn: Callable, *args: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", fn, self.to_proxy(args), {})

    def _bind(self, objects: Sequence, proxies: Any) -> None:
        proxies = [proxies[i] for i in range(len(objects))]
        track_tensor_tree(list(objects), proxies, constant=None, tracer=self.tracer)


class Specialization(Trace):
    """Runs a program's calls on fakes of one run's values: formulas trace into ATen ops,
    the calls in `hooks.EFFECTS` stay calls. For `create_graph`, an aotgrad region's
    backward stays a call too (`hooks.replay_region_backward`)."""

    def __init__(self, create_graph: bool = False):
        super().__init__()
        self.create_graph = create_graph

    def run(self, program: fx.Graph, args: Sequence, dynamic: bool) -> fx.Graph:
        inputs, sizes, scalars, hook_list, packed = args
        opened = self.open(inputs, sizes, scalars, duck=False, dynamic=dynamic)
        values = dict(zip(PLACEHOLDERS, (*opened, hook_list, packed)))
        self.values: dict[fx.Node, Any] = {}
        self.graph_args: dict[fx.Node, Any] = {}  # a hook's read of the graph's inputs
        self.sources = undefined.gradient_sources(program)
        self.maybe_undefined: list[tuple[fx.Node, int, Any]] = []  # see undefined.py
        try:
            # Grad mode as the run's: formulas branch on it (silu's, logit's, mish's
            # no-grad kernels have no derivative; create_graph needs eager's grad-mode ones).
            with torch.set_grad_enabled(self.create_graph):
                for node in program.nodes:
                    last = self.tracer.graph._root.prev
                    self._step(node, values)
                    _tag_since(last, node.meta.get(ENGINE_NODE))
        finally:
            self.close()
        return self.tracer.graph

    def _step(self, node: fx.Node, placeholders: dict) -> None:
        if node.op == "placeholder":
            self.values[node] = placeholders[node.target]
            self.graph_args[node] = self.proxies[node.target]
        elif node.op == "output":
            outputs = self.to_proxy(self._load(node.args[0]))
            out = self.tracer.create_node("output", "output",
                                          (self.tracer.create_arg(outputs),), {})
            self.maybe_undefined.append((out, 0, undefined.defining_nodes(self, node.args[0])))
        elif node.target in hooks.EFFECTS:
            self.values[node] = self._effect(node)
        elif node.target is hooks.run_region_backward and self.create_graph:
            self.values[node] = self._region_replay(node)
        else:
            self.values[node] = node.target(*self._load(node.args), **self._load(node.kwargs))
            if node.target is operator.getitem and node.args[0] in self.graph_args:
                self.graph_args[node] = self.graph_args[node.args[0]][node.args[1]]

    def _load(self, args: Any) -> Any:
        return fx.node.map_arg(args, self.values.__getitem__)

    def _effect(self, node: fx.Node) -> Any:
        return self._keep_call(node, node.target,
                               hooks.RESULT_LIKE[node.target](*self._load(node.args)))

    def _region_replay(self, node: fx.Node) -> Any:
        """create_graph: the region's backward replays its forward from this run's inputs,
        so it runs at each backward, a call. Its ops are traced too, for the sizes of its
        gradients and the guards they assume (drop_unused drops the ops)."""
        # Grad mode off: the region's backward traces as its backward graph's ops, on the
        # lifted saved values (grad mode on, it would replay its forward from the inputs
        # its ctx holds, baked into the graph as constants).
        with torch.no_grad():
            inlined = node.target(*self._load(node.args))
        return self._keep_call(node, hooks.replay_region_backward,
                               tuple(hooks._like(g) for g in inlined))

    def _keep_call(self, node: fx.Node, target: Callable, result: Any) -> Any:
        graph_args = fx.node.map_arg(node.args, lambda n: self.graph_args[n] if n in
                                     self.graph_args else self.to_proxy(self.values[n]))
        proxy = self.tracer.create_proxy("call_function", target, graph_args, {})
        for i in undefined.GRADIENT_ARGS.get(target, ()):
            self.maybe_undefined.append((proxy.node, i,
                                         undefined.defining_nodes(self, node.args[i])))
        for key in (READY, READY_QUEUE):
            if key in node.meta:
                proxy.node.meta[key] = node.meta[key]
        track_tensor_tree(result, proxy, constant=None, tracer=self.tracer)
        return result

    def guard(self) -> "Guard":
        """What the trace assumed about the lifted values, as one check of them."""
        from torch._dynamo.source import LocalSource
        values = [v for name in GUARDED for v in self.values_of(name)]
        sources = [LocalSource(f"{name}_{i}") for name in GUARDED
                   for i in range(len(self.values_of(name)))]
        values = [v if _guardable(v) else None for v in values]
        clauses = self.shape_env.produce_guards(values, sources, ignore_static=False)
        return Guard.of([_readable(c) for c in clauses])

    def values_of(self, name: str) -> list:
        return next(v for n, v in self.values.items() if n.op == "placeholder"
                    and n.target == name)


def _tag_since(last: fx.Node, engine_node: int | None) -> None:
    """The graph nodes after `last` were traced from one call of the engine's node."""
    node = last.next
    while node.op != "root" and engine_node is not None:
        node.meta.setdefault(ENGINE_NODE, engine_node)
        node = node.next


def _guardable(value: Any) -> bool:
    # A lifted bool or constant size is part of what was traced: guarded equal (`== 1`).
    return isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, int, float))


def _readable(clause: str) -> str:
    """torch's guard text reads `L['sizes_3']`: read the engine's lists instead."""
    return re.sub(r"L\['(inputs|sizes|scalars)_(\d+)'\]", r"\1[\2]", clause)


@dataclass(frozen=True)
class Variant:
    """One specialization: its graph, compiled, served where its guard holds. With
    create_graph=True (grad mode on) it runs `differentiable` instead: code autograd
    records, so the gradient is differentiable (by default the graph's ops, uncompiled)."""
    graph: Callable
    compiled: Callable
    guard: Guard
    differentiable: Callable | None = None  # None: `graph`

    def __post_init__(self):
        if self.differentiable is None:
            object.__setattr__(self, "differentiable", self.graph)

    def __call__(self, *args: Any) -> Any:
        if torch.is_grad_enabled():
            return self.differentiable(*args)
        return self.compiled(*args)


class CompiledOnFirstRun:
    """A specialization's code, built at its first run from that run's arguments (the code
    for create_graph=True: most graphs never run with grad mode on). Where the build fails,
    `fallback` runs instead (uncompiled ops, as autograd records them): slower, never a
    different gradient."""

    def __init__(self, build: Callable[[Sequence], Callable], fallback: Callable,
                 failed: Callable[[Exception], None]):
        self.build, self.fallback, self.failed = build, fallback, failed
        self.run: Callable | None = None

    def __call__(self, *args: Any) -> Any:
        if self.run is None:
            self.run = self._build(args)
        return self.run(*args)

    def _build(self, args: Sequence) -> Callable:
        try:
            return self.build(args)
        except Exception as error:  # noqa: BLE001 - `fallback` computes the same values
            self.failed(error)
            return self.fallback


class Captured:
    """What the engine keeps for one cache entry: the program, and its specializations."""

    def __init__(self, session: Any, program: fx.GraphModule, index: int,
                 resized: bool = False):
        self.session, self.program, self.index = session, program, index
        self.resized = resized  # the same walk was captured before, for other sizes
        self.static_only = False  # its symbolic trace failed: one graph per size
        self.variants: list[Variant] = []

    def __call__(self, inputs: list, sizes: list, scalars: list, hook_list: list,
                 packed: list) -> Any:
        for variant in self.variants:
            if variant.guard.check(inputs, sizes, scalars):
                return variant(inputs, sizes, scalars, hook_list, packed)
        variant = self.session.specialize(self, (inputs, sizes, scalars, hook_list, packed),
                                          self._miss_reason(inputs, sizes, scalars))
        self.variants.append(variant)
        return variant(inputs, sizes, scalars, hook_list, packed)

    def _miss_reason(self, inputs: list, sizes: list, scalars: list) -> str | None:
        if not self.variants:
            return None
        failed = [v.guard.first_failure(inputs, sizes, scalars) for v in self.variants]
        return f"guard {failed[-1]} failed"


def specialize(program: fx.GraphModule, args: Sequence,
               compiler: Callable[[fx.GraphModule], Callable], dynamic: bool = True) -> Variant:
    """Trace `program` for the values of one run; compile it; guard it. Static (the first
    specialization of a program): this run's sizes are constants, guarded equal. Symbolic
    sizes cost many times more to trace (each view's reasoning goes through sympy) and to
    compile, so they wait until a size does change."""
    trace = Specialization()
    gm = _traced(trace, program, args, dynamic)
    compiled = compiler(gm)
    guard = trace.guard() if dynamic else exact_guard(args)
    return Variant(gm, compiled, guard)  # guards last: a compiler may add some


def specialize_create_graph(program: fx.GraphModule, args: Sequence,
                            dynamic: bool) -> fx.GraphModule:
    """`program` traced for create_graph=True, for a run that a specialization's guard
    admitted (its trace takes the branches that one took: the same guard holds)."""
    return _traced(Specialization(create_graph=True), program, args, dynamic)


def _traced(trace: Specialization, program: fx.GraphModule, args: Sequence,
            dynamic: bool) -> fx.GraphModule:
    graph = trace.run(program.graph, args, dynamic)
    order_like_eager(graph)
    undefined.wrap_undefined(graph, trace.maybe_undefined)
    drop_unused(graph)
    undefined.zeros_after_hooks(graph)
    zeros_for_none(graph)
    restride_effect_results(graph)
    return fx.GraphModule(trace.tracer.root, graph, "CompiledAutograd")


def unspecialized(program: fx.GraphModule) -> Variant:
    """The program run as it is: each formula on real tensors, as the engine runs it (its
    accumulations in eager's order, on a copy: the program is traced again later)."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(program.graph, {}))
    order_like_eager(graph)
    gm = fx.GraphModule(program, graph, "BackwardProgram")
    return Variant(gm, gm, Guard.of([]))


# -- passes over a specialized graph -------------------------------------------------------
def order_like_eager(graph: fx.Graph) -> None:
    """The engine's walk is a topological order, not eager's: eager runs AccumulateGrad
    (highest priority) as soon as the engine's node giving its gradient's last contribution
    is done: the leaf's tensor and node pre-hooks, the accumulation, then that parameter's
    post-accumulate-grad hooks; several made ready by one node run in the order of its
    outputs. Move each accumulation there, with its hooks, so hooks observe the same order
    and `.grad` values as in eager."""
    reads = _hoist_input_reads(graph)
    read = set(reads)
    order = {n: i for i, n in enumerate(graph.nodes)}  # before anything moves
    writes = _in_place_writes(graph)
    accs = [n for n in graph.nodes if n.target is hooks.accumulate_into]
    ends = _block_ends(graph, accs)
    placed: dict[fx.Node, fx.Node] = {}  # an anchor -> the last group placed after it
    for acc in _in_eager_order(accs, order):
        group = [*_pre_accumulate_hooks(acc), acc, *_post_accumulate_hooks(acc)]
        # The inputs are all read up front: one point, where ties keep eager's order.
        needs = {reads[-1] if a in read else a
                 for n in group for a in n.all_input_nodes} - set(group)
        # A formula may finish its result through a view of it, after the op that made it
        # (irfft's backward doubles a slice with `mul_`): the gradient is ready after those.
        needs |= {w for v in needs for w in writes.get(storage_of(v), ())
                  if order[w] < order[group[0]]}
        end = _block_end(ends, acc.meta.get(READY))
        if end is not None:
            needs.add(end)
        anchor = max(needs, key=_position)
        after = placed.get(anchor, anchor)
        placed[anchor] = group[-1]
        for node in group:
            after.append(node)
            after = node


def _block_ends(graph: fx.Graph, accs: list[fx.Node]) -> list[tuple[int, fx.Node]]:
    """(engine node, its last graph node), in the walk's order (the graph's, unmoved); not
    the AccumulateGrad nodes', which move."""
    moving = {acc.meta.get(ENGINE_NODE) for acc in accs}
    ends: dict[int, fx.Node] = {}
    for node in graph.nodes:
        engine_node = node.meta.get(ENGINE_NODE)
        if engine_node is not None and engine_node not in moving:
            ends[engine_node] = node
    return sorted(ends.items(), key=operator.itemgetter(0))


def _block_end(ends: list[tuple[int, fx.Node]], engine_node: int | None) -> fx.Node | None:
    """Where the walk is done with `engine_node` (its ops, or where an op-less node's
    calls would be: after the last node before it that has ops)."""
    if engine_node is None:
        return None
    i = bisect.bisect_right(ends, engine_node, key=operator.itemgetter(0))
    return ends[i - 1][1] if i else None


def _in_eager_order(accs: list[fx.Node], order: dict) -> list[fx.Node]:
    """By the node that readied them; those one node readied, in its ready queue's order."""
    ranked = sorted(accs, key=lambda a: _ready_key(a, order))
    result = []
    for ready, group in itertools.groupby(ranked, key=lambda a: a.meta.get(READY)):
        group = list(group)
        result += group if ready is None else eager_order(group)
    return result


def _ready_key(acc: fx.Node, order: dict) -> tuple:
    """Eager's order among accumulations: by the node that readied them, then by that
    node's outputs. Eager pops those in the order its engine pushed them, the outputs'; the
    engine's walk keeps the nodes to visit on a stack, so it visits them the other way."""
    ready = acc.meta.get(READY)
    return (ready, -order[acc]) if ready is not None else (math.inf, order[acc])


def mark_readiness(program: fx.Graph) -> None:
    """Each accumulation's READY, from its gradient's path back through the leaf's own
    hooks and gradient sums to the `validate_outputs` result that produced it."""
    for acc in program.find_nodes(op="call_function", target=hooks.accumulate_into):
        ready = _producer(acc.args[1])
        if ready is not None:
            acc.meta[READY] = ready


def _producer(node: Any) -> int | None:
    """The engine node that made a gradient whole: its last contribution's."""
    found = made_by(node)
    return None if found is None else found[0].meta.get(ENGINE_NODE)


def _in_place_writes(graph: fx.Graph) -> dict[StorageWeakRef, list[fx.Node]]:
    """The in-place ops, by the memory they write."""
    writes: dict[StorageWeakRef, list[fx.Node]] = {}
    for node in graph.nodes:
        if mutates(node.target):
            written = written_arguments(node.target, node.args, node.kwargs)
            for storage in {storage_of(a) for a in written} - {None}:
                writes.setdefault(storage, []).append(node)
    return writes


def storage_of(node: Any) -> StorageWeakRef | None:
    """The memory of a node's tensor value (fake: views share it as in eager); None else
    (a sparse tensor has no one storage)."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return None
    return StorageWeakRef(val.untyped_storage())


def drop_unused(graph: fx.Graph) -> None:
    """Drop what nothing reads: size comparisons the formulas branched on, size reads. The
    Python calls stay: they are run for their effects."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and node.target not in hooks.EFFECTS \
                and not mutates(node.target):
            graph.erase_node(node)


def zeros_for_none(graph: fx.Graph) -> None:
    """A custom backward may return None for an input that needs a gradient (eager: no
    contribution). Where ATen ops read that gradient, they read zeros instead; the Python
    calls (`.grad` accumulation, hooks, other custom backwards) take the None, as in eager."""
    for call in graph.find_nodes(op="call_function", target=hooks.run_python_backward):
        metas = call.args[2]
        for read in [u for u in call.users if u.target is operator.getitem]:
            # (`or_else`: a hook's None read as the zeros made for this None)
            traced = [u for u in read.users
                      if u.target not in hooks.EFFECTS or u.target is hooks.or_else]
            if not traced:
                continue
            with graph.inserting_after(read):
                zeros = graph.call_function(hooks.none_as_zeros, (read, metas[read.args[1]]))
            zeros.meta = dict(read.meta)
            for user in traced:
                user.replace_input_with(read, zeros)


def mutates(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _hoist_input_reads(graph: fx.Graph) -> list[fx.Node]:
    """`hooks[3]` is read where the hook runs: read every input up front instead, so that
    moving a hook's call never moves it before its read. Returns the placeholders and
    reads, in order."""
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    reads = list(graph.find_nodes(op="placeholder"))
    for node in list(graph.nodes):
        if node.target is operator.getitem and node.args[0].op == "placeholder":
            last.append(node)
            last = node
            reads.append(node)
    return reads


# The hooks an AccumulateGrad node runs on its gradient before accumulating it.
_PRE_HOOKS = (hooks.run_tensor_hook, hooks.run_cpp_tensor_hooks, hooks.run_node_pre_hook)


def _pre_accumulate_hooks(acc: fx.Node) -> list[fx.Node]:
    """The hooks the AccumulateGrad node ran on its gradient before `acc` (a pre-hook's
    result read through a getitem), in graph order: the chain back from `acc` whose every
    link only the next (and the node's post-hooks) reads."""
    found, grad, reader = [], acc.args[1], acc
    while isinstance(grad, fx.Node) and _only_feeds(grad, reader):
        hook = grad.args[0] if grad.target is operator.getitem else grad
        if hook.target not in _PRE_HOOKS or hook is not grad and not _only_feeds(hook, grad):
            break
        found[:0] = [hook] if hook is grad else [hook, grad]
        grad, reader = hook.args[1], hook
        if hook.target is hooks.run_node_pre_hook:  # hook(grad_outputs): a one-item list
            grad = grad[0]
    return found


def _only_feeds(node: fx.Node, reader: fx.Node) -> bool:
    return all(u is reader or u.target is hooks.run_node_post_hook for u in node.users)


def _post_accumulate_hooks(acc: fx.Node) -> list[fx.Node]:
    """The parameter's post-accumulate-grad hooks and the node's post-hooks (given its
    gradient), as the engine ran them after `acc`."""
    found, node = [], acc.next
    while node.op != "output" and node.target is not hooks.accumulate_into:
        if node.target is hooks.run_post_accumulate_hook and node.args[1] is acc.args[0] or \
                node.target is hooks.run_node_post_hook and acc.args[1] in node.args[2]:
            found.append(node)
        node = node.next
    return found


def _position(node: fx.Node) -> int:
    position, cursor = 0, node
    while cursor.op != "root":
        cursor, position = cursor.prev, position + 1
    return position


# -- shared with capture.py ------------------------------------------------------------------
def new_tracer() -> PythonKeyTracer:
    tracer = PythonKeyTracer()
    tracer.root = torch.nn.Module()
    tracer.graph = fx.Graph(tracer_cls=PythonKeyTracer)
    tracer.tensor_attrs = {}
    return tracer


def enter_tracing(stack: contextlib.ExitStack, fake_mode: Any, tracer: PythonKeyTracer) -> None:
    from torch._dispatch.python import enable_python_dispatcher
    stack.enter_context(enable_python_dispatcher())
    stack.enter_context(fake_mode)
    stack.enter_context(ProxyTorchDispatchMode(tracer, "symbolic"))
    state.capturing = True
    stack.callback(setattr, state, "capturing", False)


def lifted_symbol(env: Any, value: Any, kind: str, index: int) -> Any:
    """A symbol for a lifted size or float scalar (0 and 1 stay constants, guarded so)."""
    from torch._dynamo.source import ConstantSource  # Source.name is a property from 2.12
    from torch.fx.experimental.symbolic_shapes import DimDynamic
    source = ConstantSource(f"{kind}_{index}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, int):
        return env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)
    return env.create_symfloatnode(env.create_unspecified_symbol(
        value, source=source, dynamic_dim=DimDynamic.DYNAMIC), hint=value, source=source)
