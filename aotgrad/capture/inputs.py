"""Stage 1, capture: from a user call to a flat function of tensors, and fake inputs for it.

The user calls `fn(*args, **kwargs)` with arbitrary pytrees. Capture decides which flat
leaves are graph inputs (tensors, each distinct tensor once, and Dynamo's symbolic sizes)
and which are constants of the trace (everything else), and makes the fake tensors that
every later stage traces with: with symbolic sizes when compiling for dynamic shapes.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Collection, Sequence

import torch
import torch.utils._pytree as pytree
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor

from ..semantics import eager_errors, mends, subclasses
from ..semantics.dynamic import DynamicShapesUnsupported, is_size, symbolic_fake, symbolic_fake_mode
from ..semantics.effects import CheckingFunctionalMode, refuse_effectful_op
from .graph_runs import interpreted, node_by_node


@dataclass(frozen=True)
class CallLayout:
    """Where each flat argument of a call comes from when the graph runs.

    `graph_input[i]` is the graph input that flat argument i is, or None when the argument is
    a constant baked into the trace (`constants[i]`). A tensor passed twice maps both
    positions to one graph input, so the graph sees the aliasing that eager sees.
    """

    in_spec: pytree.TreeSpec
    graph_input: tuple[int | None, ...]
    constants: tuple[Any, ...]
    first_position: tuple[int, ...]  # flat position of each graph input

    @property
    def num_graph_inputs(self) -> int:
        return len(self.first_position)

    def graph_inputs(self, flat_args: Sequence[Any]) -> list[torch.Tensor]:
        return [flat_args[p] for p in self.first_position]

    def graph_positions(self, flat_positions: Sequence[int]) -> tuple[int, ...]:
        """The graph inputs that are the flat arguments at `flat_positions`, in order."""
        wanted = set(flat_positions)
        return tuple(g for g, p in enumerate(self.first_position) if p in wanted)

    def placeholder_labels(self, gm: torch.fx.GraphModule, labels: Sequence[str]
                           ) -> dict[str, str]:
        """Placeholder name -> `labels` of its flat argument, where the placeholders are the
        graph inputs one for one (not so after a subclass split or a merge of aliased inputs)."""
        placeholders = gm.graph.find_nodes(op="placeholder")
        if len(placeholders) != self.num_graph_inputs:
            return {}
        return {node.name: labels[p] for node, p in zip(placeholders, self.first_position)
                if labels[p]}

    def rebuild(self, graph_inputs: Sequence[Any]) -> list[Any]:
        """The flat argument list, from graph inputs plus the baked constants."""
        return [
            self.constants[i] if g is None else graph_inputs[g]
            for i, g in enumerate(self.graph_input)
        ]


def layout_call(flat_args: Sequence[Any], in_spec: pytree.TreeSpec) -> CallLayout:
    refuse_opaque_tensors(flat_args, "an argument")
    first: dict[int, int] = {}
    graph_input: list[int | None] = []
    for a in flat_args:
        if isinstance(a, torch.Tensor) or is_size(a):
            graph_input.append(first.setdefault(id(a), len(first)))
        else:
            graph_input.append(None)
    constants = tuple(None if g is not None else a for a, g in zip(flat_args, graph_input))
    return CallLayout(in_spec, tuple(graph_input), constants, tuple(_first_positions(graph_input)))


def refuse_opaque_tensors(leaves: Sequence[Any], what: str) -> None:
    """Refuse a pytree leaf that is an object holding tensors (a class or a dataclass that
    pytree does not flatten). As an argument, a call is keyed by the object itself and its
    tensors are baked into the graph: the same object holding another tensor later would
    reuse the first call's values. As an output, the graph cannot return it."""
    for leaf in leaves:
        name = _tensor_attribute(leaf)
        if name is not None:
            raise NotImplementedError(
                f"aotgrad: {what} of type {type(leaf).__name__} holds a tensor ({name!r}) that "
                "pytree does not flatten: a compiled graph can neither follow nor return "
                "it. Register "
                "the type (torch.utils._pytree.register_dataclass or register_pytree_node), "
                "pass its tensors themselves, compile a module itself (aotgrad.compile("
                "module)), or use torch.compile(backend='aotgrad').")


def _tensor_attribute(value: Any) -> str | None:
    """The name of an attribute of `value` holding a tensor (directly, or in a list, tuple
    or dict; a module's parameter or buffer); None if none does."""
    if isinstance(value, (torch.Tensor, type)) or is_size(value) or _is_device_mesh(value):
        return None
    if isinstance(value, torch.nn.Module):  # the door for modules is aotgrad.compile(module)
        state = itertools.chain(value.named_parameters(), value.named_buffers())
        return next((name for name, _ in state), None)
    attributes = dict(getattr(value, "__dict__", None) or {})
    for slot in getattr(type(value), "__slots__", ()):
        if isinstance(slot, str) and hasattr(value, slot):
            attributes[slot] = getattr(value, slot)
    for name, item in attributes.items():
        items = item.values() if isinstance(item, dict) else (
            item if isinstance(item, (list, tuple)) else (item,))
        if any(isinstance(x, torch.Tensor) for x in items):
            return name
    return None


def _is_device_mesh(value: Any) -> bool:
    """A DTensor's mesh: its tensor (the ranks' layout) is fixed when it is made, so the
    mesh is a constant like any other (DTensor's flatten gives it as one)."""
    mesh = getattr(getattr(torch.distributed, "device_mesh", None), "DeviceMesh", None)
    return mesh is not None and isinstance(value, mesh)


def _first_positions(graph_input: Sequence[int | None]) -> list[int]:
    seen: dict[int, int] = {}
    for pos, g in enumerate(graph_input):
        if g is not None:
            seen.setdefault(g, pos)
    return [seen[g] for g in range(len(seen))]


def flatten(tree) -> tuple[list, pytree.TreeSpec]:
    """Pytree leaves, with `torch.Size` a leaf (pytree would make it a plain tuple)."""
    return pytree.tree_flatten(tree, is_leaf=lambda v: isinstance(v, torch.Size))


def input_labels(fn: Callable, in_spec: pytree.TreeSpec, leading: Sequence[str] = ()
                 ) -> list[str]:
    """A readable name per flat argument, for reports: the leading ones as given (a module's
    state), the others by the argument of `fn` they come from (`x`, `batch['ids']`,
    `args[2]`); "" where unknown."""
    labels = [*leading, *[""] * (in_spec.num_leaves - len(leading))]
    try:
        args, kwargs = pytree.tree_unflatten(list(range(in_spec.num_leaves)), in_spec)
        names, rest = _positional_names(fn)
        for i, arg in enumerate(args[len(leading):]):
            _label(arg, names[i] if i < len(names) else f"{rest}[{i - len(names)}]", labels)
        for key, arg in kwargs.items():
            _label(arg, key, labels)
    except (TypeError, ValueError):  # an input type pytree has no key paths for
        pass
    return labels


def _positional_names(fn: Callable) -> tuple[list[str], str]:
    """The names of `fn`'s positional parameters, and of its `*args` ("args" if none)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return [], "args"
    rest = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)], rest


def _label(tree: Any, name: str, labels: list[str]) -> None:
    for path, position in pytree.tree_flatten_with_path(tree)[0]:
        labels[position] = name + pytree.keystr(path)


class OutputBox:
    """Receives the output tree spec of the user function the first time it runs."""

    spec: pytree.TreeSpec | None = None
    # (tensor, graph input index): tensors made inside the function that stand for an input
    # (the views `aliasing` regenerates aliased inputs as).
    input_aliases: Sequence[tuple[torch.Tensor, int]] = ()


def flat_graph_fn(fn: Callable, layout: CallLayout, box: OutputBox) -> Callable:
    """`fn` as a function of the graph inputs only, returning a flat list of leaves."""
    fn = node_by_node(fn)
    # Asked now, not inside the analysis: its probe traces an op, which the analysis's op
    # log (a cache key) would take for the user's and refuse.
    mends.generators_traceable()

    def graph_fn(*graph_inputs):
        args, kwargs = pytree.tree_unflatten(layout.rebuild(graph_inputs), layout.in_spec)
        with mends.default_generators_dropped(), mends.cumulative_batch_norm(), \
                mends.attention_fast_paths_as_eager(), mends.grouped_mm_as_cpu_kernel(), \
                eager_errors.EagerErrorTypes(), _user_code_traced():
            flat_out, box.spec = flatten(fn(*args, **kwargs))
        refuse_opaque_tensors(flat_out, "an output")
        return flat_out

    return graph_fn


class _Traces(threading.local):
    """`depth`: how many of aotgrad's traces this thread runs the user's code for. A
    compiled callable called there (a block compiled alone, inside a model compiled whole)
    runs its original code, which the outer trace records: compiled again on the trace's
    tensors, it confused the outer trace, and its forward's Python ran once per nesting.
    Read at each compiled call (`TRACES.depth`: 40 ns; a function with getattr took 400)."""

    depth = 0


TRACES = _Traces()


@contextlib.contextmanager
def _user_code_traced():
    TRACES.depth += 1
    try:
        yield
    finally:
        TRACES.depth -= 1


# ---- fake inputs -------------------------------------------------------------------------

def fake_mode_for(graph_inputs: Sequence[torch.Tensor], dynamic: bool = False) -> FakeTensorMode:
    """Reuse the caller's fake mode (Dynamo's inputs are fake already), else a fresh one,
    with a ShapeEnv for symbolic sizes when `dynamic`."""
    mode = detect_fake_mode(graph_inputs)
    if mode is not None:
        return mode
    # Real tensors the function closes over become constants of the graph (analysis refuses
    # those that require grad: their gradient would be lost).
    return symbolic_fake_mode() if dynamic else FakeTensorMode(allow_non_fake_inputs=True)


def fake_inputs(mode: FakeTensorMode, graph_inputs: Sequence[Any], dynamic: bool = False,
                static: Collection[int] = ()) -> list[Any]:
    """Fresh fake tensors with the inputs' metadata; tracing may mutate them freely.
    A subclass input becomes the same subclass around fresh fake inner tensors. With
    `dynamic`, real tensors get symbolic sizes, except those at the positions `static`
    (parameters and buffers, whose sizes do not change); Dynamo's fakes keep theirs, and its
    symbolic sizes (graph inputs too) are used as they are."""
    for i, t in enumerate(graph_inputs):
        if not is_size(t):
            subclasses.check_supported(t, f"graph input {i}")
    return [_fake_input(mode, t, i, dynamic and i not in static)
            for i, t in enumerate(graph_inputs)]


def _fake_input(mode: FakeTensorMode, t: Any, index: int, dynamic: bool) -> Any:
    if is_size(t):
        return t
    if dynamic and not isinstance(t, FakeTensor):
        if subclasses.is_subclass(t):
            raise DynamicShapesUnsupported(
                "aotgrad: tensor subclass inputs are compiled for static shapes only.")
        with _of_the_kind_of(t):
            return _lazy_bits_like(symbolic_fake(mode, t, index), t)
    return _lazy_bits_like(_fresh_fake(mode, t), t)


def _lazy_bits_like(fake: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The input's conjugate and negative bits on its fake: ops that read them (resolve_conj,
    `.imag`, view_as_real) trace as eager runs them on it, where a plain fake would make
    resolve_conj return the input itself. Guards key a call by both bits."""
    if t.is_conj():
        torch._C._set_conj(fake, True)
    if t.is_neg():
        torch._C._set_neg(fake, True)
    return fake


def _fresh_fake(mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    if subclasses.is_subclass(t):  # inner tensors never require grad: the subclass does
        fake = subclasses.map_plain(t, lambda inner: _fresh_fake(mode, inner.detach()))
        return fake.requires_grad_(t.requires_grad)
    with _of_the_kind_of(t), mode:
        fake = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        if t.layout is torch.strided and t.storage_offset():
            _offset_like(fake, t)
    # A number Dynamo passes as a 0-d tensor (a float made dynamic) knows its symbolic value,
    # which its graph reads with .item().
    if getattr(t, "item_memo", None) is not None:
        fake.item_memo = t.item_memo
    return fake.requires_grad_(t.requires_grad)


def _of_the_kind_of(t: torch.Tensor):
    """Under inference_mode, a tensor made here (a fake, a functional wrapper) is an
    inference tensor only where `t` is one: a normal one keeps views and version counts, as
    in eager. (Dynamo compiles outside inference_mode.)"""
    return torch.inference_mode(t.is_inference() and torch.is_inference_mode_enabled())


def _offset_like(fake: torch.Tensor, t: torch.Tensor) -> None:
    """The fake at the input's storage offset (a slice starts past its storage's start),
    not a view: what the trace finds of its geometry (`as_strided_` with an offset,
    `unsqueeze_` keeping one, a view's offset) is the caller's own. Guards key the compiled
    call by the offsets of the inputs that it addresses by geometry."""
    offset, extent = t.storage_offset(), fake.untyped_storage().nbytes()
    storage = torch.empty(offset * t.element_size() + extent, dtype=torch.uint8,
                          device=t.device).untyped_storage()
    with torch.no_grad():
        fake.set_(storage, offset, t.shape, t.stride())


# ---- functional execution ----------------------------------------------------------------

@contextlib.contextmanager
def functional_mode(observe: Callable | None = None):
    """Run the user function functionalized: mutations and views become out-of-place ops,
    and error checks stay as they are (effects.py); `observe` is told of every op.

    The caller's saved-tensor hooks (save_on_cpu, ...) are for the values the compiled
    forward saves at run time, not for the fake values tracing saves: identity hooks
    shadow them meanwhile. They check the version counter as autograd does without hooks:
    a saved view must not be read after a mutation through an alias, whose new value
    functionalization would hand out instead of raising as eager does."""
    mode = CheckingFunctionalMode(observe)
    try:
        with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack), \
                mends.saved_tensor_hooks_step_aside(_pack, _unpack), mode:
            yield mode
    except AssertionError as e:
        if "Could not find a token for effect" not in str(e):
            raise
        raise refuse_effectful_op(e) from e
    except RuntimeError as e:
        if "Attempted to set the storage of a tensor" not in str(e):
            raise
        raise NotImplementedError(
            "aotgrad: tracing lost a tensor's storage, as PyTorch's functionalization does "
            "when a view of a tensor grown by resize_() inside the function is taken (under "
            "torch.use_deterministic_algorithms(True), resize_() fills the memory it grows "
            "through such a view: torch.utils.deterministic.fill_uninitialized_memory = False "
            f"avoids it), or on set_() to a storage rather than a tensor ({e}). Resize the "
            "tensor before calling the compiled function; set_() it to a tensor "
            "(x.set_(y)).") from e


@contextlib.contextmanager
def global_state_restored_on_error():
    """Grad mode, autocast and saved-tensor hooks as they were, if the user's code stops
    midway. Dynamo's graphs switch them with plain calls (`with torch.no_grad()` is
    `_set_grad_enabled(False)` then `(True)`; torch.func.grad's region turns saved-tensor
    hooks off), where eager's `with` would restore them on the way out: a run stopped in
    between (an in-place op that the plain analysis hands over to the functionalized one,
    an error) would leave grad off for the next run of the function, which then took the
    outputs computed before the region as not differentiable, autocast on for the ops
    after it, or, after an error, the user's thread so (checkpointing then refused). So
    for torch.func's levels: a vmap left open ran the retried trace's later ops under it."""
    grad = torch.is_grad_enabled()
    transforms = torch._C._functorch.get_dynamic_layer_stack_depth()
    devices = getattr(torch._C, "_autocast_supported_devices", lambda: ("cpu", "cuda"))()
    autocast = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices]
    cache = torch.is_autocast_cache_enabled()
    nesting = _autocast_nesting()
    hooks = torch._C._autograd._saved_tensors_hooks_is_enabled()  # Dynamo turns them off
    hooks_off_because = torch._C._autograd._saved_tensors_hooks_get_disabled_error_message()
    try:
        yield
    except BaseException:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(transforms)
        torch._C._set_grad_enabled(grad)
        if hooks:
            torch._C._autograd._saved_tensors_hooks_enable()
        elif hooks_off_because is not None:
            torch._C._autograd._saved_tensors_hooks_disable(hooks_off_because)
        for device, enabled, dtype in autocast:
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(cache)
        for _ in range(_autocast_nesting() - nesting):  # regions entered, not exited
            torch.autocast_decrement_nesting()
        if nesting == 0:
            torch.clear_autocast_cache()
        raise


def _autocast_nesting() -> int:
    """How many autocast regions are open (torch reads it only through its setters)."""
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return level


@contextlib.contextmanager
def differentiating():
    """Around a trace that runs autograd (a joint, a double backward's replay): autograd's
    own engine, and torch's decompositions of the kinds that keep a backward."""
    with compiled_autograd_off(), mends.lstm_for_training():
        yield


@contextlib.contextmanager
def nan_checks_off():
    """Anomaly mode (`set_detect_anomaly(True)`) without its NaN checks while tracing: on
    fake values a backward node's check reads data (`.item()`) and would stop the trace. At
    run time the compiled backward is one node of the engine's graph, whose outputs the
    engine checks as it checks any node's (eager names the op, aotgrad the compiled node)."""
    check_nan = torch.is_anomaly_enabled() and torch.is_anomaly_check_nan_enabled()
    if not check_nan:  # the common case: the (process-wide) setting stays untouched
        yield
        return
    torch.set_anomaly_enabled(True, False)
    try:
        yield
    finally:
        torch.set_anomaly_enabled(True, True)


@contextlib.contextmanager
def compiled_autograd_off():
    """Differentiate with autograd's own engine while tracing. Under torch's compiled
    autograd, every backward, the `torch.autograd.grad` a trace runs on fake tensors
    included, would be captured and compiled again (torch's AOTAutograd turns it off too).
    Through the C++ binding: aotgrad does not use torch's Python compiled-autograd module."""
    bindings = getattr(torch._C._dynamo, "compiled_autograd", None)
    if bindings is None:  # no compiled autograd in this build
        yield
        return
    compiler, dynamic = bindings.set_autograd_compiler(None, False)
    try:
        yield
    finally:
        bindings.set_autograd_compiler(compiler, dynamic)


def _pack(t: torch.Tensor) -> tuple[torch.Tensor, int | None, tuple]:
    # Its node now: for an output its node saved, eager's error names that node, not the
    # in-place op that later changed it.
    return t, None if t.is_inference() else t._version, (t.grad_fn, t.output_nr)


saved_values_hook = _pack  # the pack hook of functional_mode, by which oplog knows it


def _unpack(saved: tuple[torch.Tensor, int | None, tuple]) -> torch.Tensor:
    t, version, (node, output_nr) = saved
    if version is not None and t._version != version:
        if node is not torch._C._current_autograd_node():  # saved as an input: eager
            node = t.grad_fn  # names its node now (the in-place op's)
        raise StaleSavedValue(t, version, (node, output_nr))
    return t


class StaleSavedValue(RuntimeError):
    """A value saved for the backward was modified in place before the backward read it
    (eager raises at that backward: stale.py)."""

    def __init__(self, t: torch.Tensor, saved_version: int, origin: tuple = (None, 0)):
        super().__init__(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: a tensor of shape {list(t.shape)} is at version {t._version}; "
            f"expected version {saved_version} instead.")
        self.tensor, self.saved_version = t, saved_version
        self.node, self.output_nr = origin  # its node and output number when saved


def to_functional(args: Sequence[Any]) -> list[Any]:
    """Wrap tensors (a subclass's inner tensors); must run inside `functional_mode()`."""
    return [_functional(a) for a in args]


def _functional(a: Any) -> Any:
    return _to_functional(a) if isinstance(a, torch.Tensor) else a


def _to_functional(t: torch.Tensor) -> torch.Tensor:
    if not subclasses.is_subclass(t):
        with _of_the_kind_of(t):
            return FunctionalTensor.to_functional(t)
    out = subclasses.map_plain(t, FunctionalTensor.to_functional)
    torch._mirror_autograd_meta_to(t, out)  # requires_grad, as to_functional does
    return out


def to_functional_leaves(args: Sequence[Any], leaves: Sequence[bool]) -> list[Any]:
    """`to_functional`, each tensor `leaves` marks wrapped as a leaf that requires grad, where
    the mirrored wrapper is none: autocast's cast cache reuses the casts of leaves only
    (semantics/autocast.py). For inputs the call does not write: functionalization writes
    an input's new value into its wrapper, in place."""
    return [_leaf_wrapper(a) if leaf else _functional(a) for a, leaf in zip(args, leaves)]


def _leaf_wrapper(t: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), _of_the_kind_of(t):
        leaf = FunctionalTensor.to_functional(t.detach())
    return leaf.requires_grad_()


def from_functional(t: Any) -> Any:
    if subclasses.is_subclass(t):
        return subclasses.map_plain(t, from_functional)
    return t.from_functional() if isinstance(t, FunctionalTensor) else t


@dataclass(frozen=True)
class ModuleState:
    """A module's parameters, then its buffers, each distinct tensor once: the graph inputs
    every front door (api, compat, export) lifts them into, in this order, by these names."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]

    @property
    def names(self) -> list[str]:
        return [*self.params, *self.buffers]

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [*self.params.values(), *self.buffers.values()]


def lift_state(module: torch.nn.Module) -> ModuleState:
    return ModuleState(dict(module.named_parameters()), dict(module.named_buffers()))


def call_with_state(module: torch.nn.Module, names: Sequence[str],
                    user_spec: pytree.TreeSpec) -> Callable:
    """`forward(*state, *flat user arguments)`: `module(*args, **kwargs)` with its parameters
    and buffers replaced by the state, the arguments unflattened by `user_spec`."""
    def forward(*flat):
        state = dict(zip(names, flat[:len(names)]))
        user_args, user_kwargs = pytree.tree_unflatten(list(flat[len(names):]), user_spec)
        with state_swapped(module, state):
            return module(*user_args, **user_kwargs)
    return forward


def state_swapped(module: torch.nn.Module, state: dict):
    """`module`'s parameters and buffers replaced by `state` meanwhile, tied names too. Put
    back last in, first out: torch's default order (`functional_call`'s too) puts a module
    registered under two names (`self.b = self.a`) back with the replacement, since its
    second name saved the first's replacement as the original (the module then kept the
    trace's fake tensors as its parameters)."""
    from torch.nn.utils.stateless import _reparametrize_module
    return _reparametrize_module(module, state, tie_weights=True, stack_weights=True)


def run_with_state(module: torch.nn.Module, state: dict, args: tuple) -> Any:
    """`module(*args)` with its parameters and buffers replaced by `state`; a graph module
    node by node, always (torch's aot_module_simplified runs its graph, not its call)."""
    with state_swapped(module, state):
        if not isinstance(module, torch.fx.GraphModule):
            return module(*args)
        return interpreted(module)(*args)
