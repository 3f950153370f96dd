"""Double backward: gradients that are themselves differentiable (`create_graph=True`).

The compiled backward computes gradients as plain values: its inputs are the forward's
saved values, produced under no_grad, so nothing it computes has autograd history. A
backward that runs with grad mode on (that is what `create_graph=True` means) re-derives
the gradients instead, the way eager computes them:

- On first use, `trace_replay` traces the user function and `torch.autograd.grad(...,
  create_graph=True)` of it into one graph of the ATen ops eager runs, *not* functionalized
  (in-place ops, views and `detach` stay as eager runs them), each op tagged with the grad
  mode it ran under (a `no_grad` region, a backward formula). The shallow copies autograd
  makes of the outputs it saves are not ops in eager: the replay uses the outputs.
- The backward replays that graph op by op, under each op's grad mode, on the inputs the
  forward held (they carry their autograd history) and the incoming gradients (they may
  carry history too). Autograd records the replay as it records eager's ops, so the
  gradients differentiate like eager's. No decomposition: eager's kernels and formulas.
- Random ops do not draw again: the replay takes their values from the compiled forward,
  which saves them (random_values.py; dropout's mask is saved anyway).
- A custom autograd.Function is called, not replayed as its ops: the replay applies it and
  runs autograd on that application with create_graph=True, so that its backward is the
  user's, differentiable or `once_differentiable`, as in eager (custom_functions.py).
- The replay is checked once, on fake values, against the autograd graph the trace itself
  recorded (node by node, edge by edge); where they differ, it is refused, never silently
  different.

Refused with an error naming the construct: random ops whose other outputs depend on their
draw in a way not tabled (rrelu's slopes, attention's dropout) or that run in a backward,
custom Functions that Dynamo captured (it traces their backward under no_grad, losing what
eager would record), modify an input in place or draw random numbers, gradients that read
the old value of an input the function mutates (but for a buffer without history, whose
old value the forward holds: old_values.py), backward formulas that branch on values.

Cost: the forward holds a reference to its inputs until a backward without `retain_graph`
releases them with the saved values. Parameters, buffers and the caller's own tensors are
alive anyway and cost nothing; an activation that nothing else keeps alive (its producer
saved nothing of it) lives until the backward. The forward also records the version
counters of the inputs it does not save (a fraction of a microsecond each), so that a
replay refuses an input modified in place since. A graph with random ops also saves the
drawn values its backward does not read (noise added to an activation; not dropout's
mask, which it reads). The first-order backward is otherwise unchanged: the compiled
graph, saved values freed early.
"""

from __future__ import annotations

import collections
import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ..capture.analysis import graph_outputs, version_of
from ..schema import AUTOGRAD_COPY, GRAD_ENABLED, RANDOM_OP, FunctionInfo
from ..capture.inputs import differentiating, fake_inputs, nan_checks_off
from ..backends.codegen import python_function
from .custom_functions import CustomFunctionUnsupported, FunctionCalls, call_functions
from ..semantics import checkpoints, effects, regions
from ..semantics.autocast import eager_cast_cache, with_autocast_cache
from ..semantics.dynamic import no_new_guards
from ..capture.joint import fake_tangents, input_grads, mutable_copies
from ..capture.oplog import autograd_nodes
from .old_values import refuse_old_values_of_mutated_inputs, with_old_values
from .random_values import ForwardRandomValues, NotTakenFromForward, draw_from_forward, draws
from ..tables import ERROR_CHECKS

_DEVICES = ("cpu", "cuda")
aten = torch.ops.aten


# ---- at run time: hold the inputs, replay -------------------------------------------------

def release_inputs(ctx) -> None:
    """Drop the inputs with the saved values: unless retain_graph, no backward follows."""
    if not torch._C._autograd._get_current_graph_task_keep_graph():
        ctx.primals = None


@dataclass(frozen=True)
class Replay:
    """The graph that recomputes the input gradients differentiably, ready to run."""

    gm: fx.GraphModule  # grad mode switches included (`switch_grad_modes`)
    inputs_read: frozenset[int]  # primals the graph reads: their versions are checked
    fn: Callable[[list], list]  # the graph as straight-line Python (codegen.py)
    # The forward's saved tensors (by position) that the graph takes after the tangents:
    # the values of its random ops (random_values.py).
    random_values: tuple[int, ...] = ()

    def run(self, args: Sequence[torch.Tensor]) -> list:
        # The trace holds the call's autocast casts; the graph ends in the mode it began in.
        with torch._C._DisableAutocast(), torch.enable_grad():
            return self.fn(list(args))


class DoubleBackward:
    """What a backward with create_graph=True needs, traced on its first use only: most
    training never asks, and the trace costs about as much as the joint graph's."""

    def __init__(self, graph_fn: Callable, info: FunctionInfo, fakes: Sequence[torch.Tensor],
                 fake_mode: Any, saved_inputs: Sequence[int],
                 random: ForwardRandomValues = ForwardRandomValues(),
                 old_values: tuple[tuple, tuple] = ((), ())):
        # Mutated inputs without history whose value before the call the replay reads (the
        # forward holds a copy of it), and those whose old value nothing reads (old_values_read).
        self.old_values = old_values[0]
        self._replayed_on_old_values = old_values[0] + old_values[1]
        self._trace_args = (graph_fn, info, list(fakes), fake_mode, _autocast_state(), random)
        # The inputs the compiled forward does not save itself: their versions are recorded
        # at the call (save_for_backward checks the others').
        saved = set(saved_inputs)
        self.unsaved_inputs = tuple(i for i in range(len(fakes)) if i not in saved
                                    and isinstance(fakes[i], torch.Tensor))  # not sizes
        self._result: Replay | BaseException | None = None

    @classmethod
    def refused(cls, construct: str) -> "DoubleBackward":
        """A compiled function whose double backward raises, naming the construct."""
        refused = cls(None, None, (), None, ())
        refused._result = NotImplementedError(
            f"aotgrad: double backward (create_graph=True) through a compiled function with "
            f"{construct} is not supported yet. Compute the higher-order gradient outside "
            "the compiled function.")
        return refused

    def hold(self, ctx, inputs: tuple) -> None:
        """Keep the inputs, and the versions of those not saved, for a later backward with
        create_graph=True.

        Not `save_for_backward`: that would make a first-order backward fail where eager's
        works (a second backward when nothing else is saved, an input modified in place
        after the call). The versions are checked only when a replay reads the input."""
        if self.old_values:  # before the forward writes them
            inputs = with_old_values(inputs, self.old_values)
        ctx.primals = inputs
        try:
            ctx.primal_versions = [inputs[i]._version for i in self.unsaved_inputs]
        except RuntimeError:  # inference tensors have no version counter
            ctx.primal_versions = [version_of(inputs[i]) for i in self.unsaved_inputs]

    def replay(self) -> Replay:
        if self._result is None:
            try:
                # With dynamic shapes the replay is traced for symbolic sizes too, and may not
                # assume more about them than the compiled entry's guard checks.
                with no_new_guards(self._trace_args[3], "double backward"):
                    self._result = trace_replay(*self._trace_args,
                                                self._replayed_on_old_values)
            except Exception as error:  # the same refusal each time, without tracing again
                self._result = _said_for_symbolic_sizes(error, self._trace_args[3])
        if isinstance(self._result, BaseException):
            raise self._result
        return self._result

    def input_grads(self, ctx, tangents: Sequence[torch.Tensor]) -> list:
        """The backward with grad mode on: replay, so that the gradients carry history.
        `tangents` are contiguous, as traced (a traced `view` of an expanded one fails)."""
        replay = self.replay()
        primals = ctx.primals
        if primals is None:
            raise RuntimeError(_FREED)
        saved = ctx.saved_tensors  # (checks the versions of the inputs the forward saved)
        # (none held when every input is saved: CompiledFunction's short forward)
        versions = getattr(ctx, "primal_versions", ())
        self._check_versions(primals, versions, replay.inputs_read)
        random_values = [saved[i].detach() for i in replay.random_values]
        ctx.maybe_clear_saved_tensors()  # the replay needs no other saved value
        release_inputs(ctx)
        return replay.run(list(primals) + list(tangents) + random_values)

    def _check_versions(self, primals: Sequence[torch.Tensor], versions: Sequence[int],
                        read: frozenset[int]) -> None:
        for i, version in zip(self.unsaved_inputs, versions):
            if i in read and version_of(primals[i]) != version:
                raise RuntimeError(
                    "one of the variables needed for gradient computation has been modified "
                    f"by an inplace operation: input {i} of the compiled function "
                    f"({primals[i].dtype}{list(primals[i].shape)}) is at version "
                    f"{version_of(primals[i])}; expected version {version} instead. (A backward "
                    "with create_graph=True re-runs the compiled function on its inputs.)")


_FREED = (
    "aotgrad: trying to backward through the graph a second time, with create_graph=True: "
    "a compiled function's inputs are released, like its saved values, by a backward "
    "without retain_graph. Specify retain_graph=True on the earlier backward.")


# ---- tracing -------------------------------------------------------------------------------

def _said_for_symbolic_sizes(error: Exception, fake_mode: Any) -> Exception:
    """torch's own error from a replay traced for symbolic sizes (an op whose double
    backward needs concrete ones: `pad`'s reads a storage offset), said as what to do."""
    if str(error).startswith("aotgrad:") or getattr(fake_mode, "shape_env", None) is None:
        return error
    first_line = (str(error).strip().splitlines() or [""])[0][:200]
    said = NotImplementedError(
        "aotgrad: the double backward of this function cannot be traced for dynamic shapes "
        f"({type(error).__name__}: {first_line}). Compile with dynamic=False.")
    said.__cause__ = error
    return said


@nan_checks_off()
def trace_replay(graph_fn: Callable, info: FunctionInfo, fakes: Sequence[torch.Tensor],
                 fake_mode: Any, autocast: tuple, random: ForwardRandomValues,
                 replayed_on_old_values: tuple[int, ...] = ()) -> Replay:
    """Trace `graph_fn` and its create_graph gradients, refusing what a replay would get
    wrong; primals + tangents + the forward's random values -> one gradient (or None) per
    primal."""
    eager_history, random_ops, functions = [], [], []

    def grads_of(primals, tangents):
        tags = _GradModeTags(get_proxy_mode().tracer.graph, random_ops)
        calls = FunctionCalls(tags.graph)
        with tags, _DataReads(tags), _no_saved_tensor_hooks(), calls:
            args = mutable_copies(info, primals)
            outs = graph_outputs(info, args, graph_fn(*args))
            refuse_custom_functions(outs, calls.nodes)
            tags.random_ops = None  # the forward's random ops only
            grads = input_grads(outs, info.gets_tangent, primals, tangents, create_graph=True)
        eager_history.append(autograd_fingerprint(grads))
        functions.extend(calls.calls)
        return grads

    # The joint graph was traced under the python dispatcher, which calls some composite
    # ops differently (dropout: native_dropout); for the same random ops, so is the replay.
    # (Eager's dropout on CPU multiplies by a bernoulli_ draw instead: the same values, but
    # half-precision second-order gradients round differently, by about an ulp.)
    dispatcher = enable_python_dispatcher() if random.ops else contextlib.nullcontext()
    with fake_mode, torch.set_grad_enabled(info.grad_enabled), _autocast_as(autocast), \
            _explain_data_dependence(), _explain_custom_functions(), dispatcher, \
            differentiating(), checkpoints.run_plainly(), \
            regions.inlined() as inlined_regions:
        # The forward's casts as the joint trace made them (one per leaf where eager's are).
        traced = with_autocast_cache(grads_of, autocast[1]) if eager_cast_cache(info) else grads_of
        gm = make_fx(traced)(fake_inputs(fake_mode, fakes), fake_tangents(info, fake_mode))
        call_functions(gm.graph, functions, GRAD_ENABLED)
    gm.graph._codegen = fx.graph.CodeGen()  # flat arguments, as the backward passes them
    if tuple(random_ops) != random.ops:
        raise _random_refusal(_unmatched_random_ops(random_ops, random, inlined_regions))
    drop_autograd_copies(gm.graph)
    remove_unused(gm.graph)
    random_values = take_random_values(gm.graph, random)
    refuse_old_values_of_mutated_inputs(gm.graph, info, replayed_on_old_values)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # A mutated input's value is not read (refused above otherwise), only cloned: the
    # version its own mutation gave it is fine.
    read = frozenset(i for i, (p, x) in enumerate(zip(placeholders, info.inputs))
                     if p.users and not x.mutated)
    switch_grad_modes(gm.graph)
    gm.recompile()
    replay = Replay(gm, read, python_function(gm), random_values)
    with fake_mode:
        args = fake_inputs(fake_mode, fakes) + fake_tangents(info, fake_mode)
    args += [p.meta["val"] for p in placeholders[len(args):]]  # the random values
    refuse_other_history(replay, args, fake_mode, eager_history[0])
    return replay


class _GradModeTags(TorchDispatchMode):
    """Tags each node the tracer records with the grad mode its op ran under, marks the
    shallow copies autograd makes of the values it saves for backward, and numbers the
    random ops (while `random_ops`, the list of them, is not None)."""

    # A higher-order op reaching this mode has no rule for it (torch's error would not say
    # what to do): named here instead. Compiled regions are inlined before they reach it.
    supports_higher_order_operators = True

    def __init__(self, graph: fx.Graph, random_ops: list | None):
        super().__init__()
        self.graph = graph
        self.reading_data = False  # inside a `.data` read: a user's detach
        self.random_ops = random_ops
        self.conditions = effects.CheckedConditions()  # the forward graph checks them

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.HigherOrderOperator):
            raise NotImplementedError(
                f"aotgrad: double backward (create_graph=True) through the higher-order op "
                f"{func.name()} is not supported. Call it outside the compiled function, or "
                "take the gradient without create_graph.")
        enabled = torch.is_grad_enabled()
        copy = func is aten.detach.default and self._autograd_copy()
        out = self.conditions.run(func, args, kwargs or {})
        numbered = self.random_ops is not None and draws(func, args, kwargs or {})
        for node in reversed(self.graph.nodes):  # the nodes this op added, newest first
            if GRAD_ENABLED in node.meta:
                break
            node.meta[GRAD_ENABLED] = enabled
            node.meta[AUTOGRAD_COPY] = copy and node.target is func
            if numbered and node.target is func:
                node.meta[RANDOM_OP] = len(self.random_ops)
        if numbered:
            self.random_ops.append(func)
        return out

    def _autograd_copy(self) -> bool:
        """A detach that did not come through the dispatcher's autograd kernels (which
        exclude ADInplaceOrView below them): autograd packing or unpacking a saved output.
        In eager the unpacked value carries the output's history: a replay uses the output."""
        below_autograd = torch._C._dispatch_tls_is_dispatch_key_excluded(
            torch._C.DispatchKey.ADInplaceOrView)
        return not below_autograd and not self.reading_data


class _DataReads(TorchFunctionMode):
    """`.data` reaches the dispatcher like autograd's own copies; it is the user's detach.
    Dynamo's graphs read it through `torch._C._autograd._get_data_attr`, which no mode
    sees: that function is wrapped while tracing."""

    def __init__(self, tags: _GradModeTags):
        super().__init__()
        self.tags = tags

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func != _DATA_GETTER:
            return func(*args, **(kwargs or {}))
        return self.read_data(func, *args, **(kwargs or {}))

    def read_data(self, func, *args, **kwargs):
        self.tags.reading_data = True
        try:
            return func(*args, **kwargs)
        finally:
            self.tags.reading_data = False

    def __enter__(self):
        get_data_attr = _GET_DATA_ATTR
        torch._C._autograd._get_data_attr = lambda t: self.read_data(get_data_attr, t)
        return super().__enter__()

    def __exit__(self, *exc):
        torch._C._autograd._get_data_attr = _GET_DATA_ATTR
        return super().__exit__(*exc)


_DATA_GETTER = torch.Tensor.data.__get__
_GET_DATA_ATTR = torch._C._autograd._get_data_attr


def switch_grad_modes(graph: fx.Graph) -> None:
    """Set the grad mode before each op that ran under another one than the op before it
    (the graph starts with grad mode on; the caller restores the mode after)."""
    enabled = True
    for node in list(graph.nodes):
        wanted = node.meta.get(GRAD_ENABLED, True)
        if node.op == "call_function" and wanted != enabled:
            with graph.inserting_before(node):
                graph.call_function(torch._C._set_grad_enabled, (wanted,))
            enabled = wanted


def drop_autograd_copies(graph: fx.Graph) -> None:
    for node in list(graph.nodes):
        if node.meta.get(AUTOGRAD_COPY):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)


@contextlib.contextmanager
def _explain_data_dependence():
    """Some backward formulas branch on tensor data when they must be differentiable (prod's
    zeros), which a trace with fake tensors cannot follow."""
    try:
        yield
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        raise NotImplementedError(
            f"aotgrad: double backward (create_graph=True) through a compiled function that "
            f"calls {e.func} is not supported: its differentiable backward branches on tensor "
            "values, which ahead-of-time tracing cannot see. Compute the higher-order "
            "gradient outside the compiled function.") from e


@contextlib.contextmanager
def _no_saved_tensor_hooks():
    """Saved values unpack as the tensors themselves, with their history. A pack hook (the
    caller's save_on_cpu, a checkpoint's) gets a detached tensor and autograd re-attaches
    the history on unpack, which a trace of ATen ops would not see."""
    set_tracing = getattr(torch._C._autograd, "_saved_tensors_hooks_set_tracing", None)
    if set_tracing is None:  # older torch: hooks stay on; refuse where any is set
        if torch._C._autograd._top_saved_tensors_default_hooks(False) is not None:
            raise NotImplementedError(
                "aotgrad: double backward (create_graph=True) under saved-tensor hooks "
                "(save_on_cpu, checkpoint) needs torch >= 2.6.")
        yield
        return
    prior = set_tracing(True)
    try:
        yield
    finally:
        set_tracing(prior)


def _autocast_state() -> tuple:
    """Per device (device, enabled, dtype), then whether autocast's cast cache is on."""
    devices = tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                    for d in _DEVICES)
    return devices, torch.is_autocast_cache_enabled()


@contextlib.contextmanager
def _autocast_as(state: tuple):
    """Autocast as it was at the call: the replay re-runs the forward's casts."""
    with contextlib.ExitStack() as stack:
        for device, enabled, dtype in state[0]:
            if enabled or torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, dtype=dtype, enabled=enabled))
        yield


# ---- what a replay would get wrong ---------------------------------------------------------

@contextlib.contextmanager
def _explain_custom_functions():
    try:
        yield
    except CustomFunctionUnsupported as e:
        raise NotImplementedError(
            f"aotgrad: double backward (create_graph=True) through a compiled function that "
            f"calls a custom autograd.Function is not supported for {e}.") from None


def refuse_custom_functions(outs: Sequence[Any], replayed: set) -> None:
    """A custom autograd.Function the replay does not call itself (`replayed`: its class
    overrides `apply`, or the caller bound `apply` before the trace patched it: `op =
    F.apply` at import) would replay as its forward's ops, run outside autograd: without
    the history its backward gives its outputs in eager."""
    for node in autograd_nodes(outs):
        if isinstance(node, torch.autograd.function.BackwardCFunction) and node not in replayed:
            name = node._forward_cls.__name__
            raise CustomFunctionUnsupported(
                f"{name}, applied through an `apply` bound before the compile (`op = "
                f"{name}.apply`) or overridden by its class. Call `{name}.apply(...)` where "
                "it is used, or call the Function outside the compiled function")


def refuse_other_history(replay: Replay, fake_args: list, fake_mode: Any,
                         eager_history: tuple) -> None:
    """The safety net: replay on fake values and compare the autograd graph it records with
    the one the trace recorded, node by node and edge by edge. A difference means an
    autograd construct the ATen ops do not show (a detach autograd made, a higher-order
    op's own autograd): gradients that would differentiate differently from eager's."""
    with fake_mode, torch.enable_grad():
        history = autograd_fingerprint(replay.run(fake_args))
    if history != eager_history:
        counts, eager_counts = history[1], eager_history[1]
        differ = sorted((counts - eager_counts) + (eager_counts - counts))
        where = differ[0][0] if differ else "the gradients themselves"
        raise NotImplementedError(
            "aotgrad: double backward (create_graph=True) through this compiled function is "
            "not supported: a replay of its ATen ops would not record the autograd history "
            f"eager records (at {where}). Compute the higher-order gradient outside the "
            "compiled function.")


def autograd_fingerprint(tensors: Sequence[Any]) -> tuple:
    """The autograd graph behind `tensors`: each one's node, and a multiset of (node, the
    nodes it leads to). A replay that records eager's history has the same fingerprint.

    Clones are seen through: the clone that materializes a conjugate (or negative) view is
    an op of the trace but not an autograd node in eager, and a clone's gradient is the
    identity either way. So are aliases: the replay applies a custom Function to aliases
    of its inputs (custom_functions.py)."""
    roots = tuple(_names([t.grad_fn]) if isinstance(t, torch.Tensor) else () for t in tensors)
    edges = collections.Counter(
        (node.name(), _names(f for f, _ in node.next_functions))
        for node in autograd_nodes(tensors) if node.name() not in _IDENTITIES)
    return roots, edges


_IDENTITIES = frozenset({"CloneBackward0", "AliasBackward0"})


def _names(nodes) -> tuple[str, ...]:
    """The nodes' names, looking through identities to the nodes behind them."""
    names = []
    for node in nodes:
        if node is not None and node.name() in _IDENTITIES:
            names += _names(f for f, _ in node.next_functions)
        elif node is not None:
            names.append(node.name())
    return tuple(sorted(names))


def remove_unused(graph: fx.Graph) -> None:
    """Dead code elimination that keeps in-place ops (the graph is not functional) and error
    checks, and drops unused random ops (a replay draws nothing)."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and not _mutates(node) \
                and node.target not in ERROR_CHECKS:
            graph.erase_node(node)


def take_random_values(graph: fx.Graph, random: ForwardRandomValues) -> tuple[int, ...]:
    """The replay's random ops take the compiled forward's values (random_values.py)."""
    try:
        return draw_from_forward(graph, random)
    except NotTakenFromForward as e:
        raise _random_refusal(f"the random op {e}") from None


def _unmatched_random_ops(random_ops: list, random: ForwardRandomValues,
                          inlined_regions: list) -> str:
    if inlined_regions and len(random_ops) > len(random.ops):
        # A compiled region's forward graph keeps its draws: the outer forward cannot save them.
        names = ", ".join(sorted(set(inlined_regions)))
        return (f"random ops inside a compiled region ({names}; remove "
                "torch.compiler.nested_compile_region from it for double backward)")
    return "random ops a replay would not call as the compiled forward did"


def _random_refusal(what: str) -> NotImplementedError:
    return NotImplementedError(
        f"aotgrad: double backward (create_graph=True) through a compiled function that "
        f"draws random numbers is not supported for {what}: a replay would draw new ones. "
        "Call the random op outside the compiled function, or use eval mode for the "
        "gradient penalty.")


def _mutates(node: fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable

