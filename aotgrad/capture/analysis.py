"""Stage 2, analysis: run the function functionalized once and record what eager would do.

The facts recorded here (which inputs are mutated and how, which outputs alias what, which
need gradients) decide everything later: which graph to trace, what the graph returns, and
what the runtime does around it. They are plain frozen dataclasses, printable and comparable,
kept in schema.py (FunctionInfo and its parts), since every later stage reads them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Sequence

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._prims_common import suggest_memory_format
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.multiprocessing.reductions import StorageWeakRef
import torch.utils._pytree as pytree

from ..semantics import subclasses, swaps
from . import oplog
from .user_checks import RefuseRequiresGradOff, requires_grad_turned_off, user_code_checks
from .own_saves import saved_by_own_node
from .fed_outputs import fed_outputs
from .inputs import OutputBox, functional_mode, saved_values_hook, to_functional
from ..semantics.dynamic import (DynamicShapesUnsupported, fresh_unbacked_ignored, geometry,
                                 hint, is_size, is_symbolic)
from ..schema import (SIZE_INPUT, FunctionInfo, InputInfo, OutputInfo, OutputKind, StorageSwap,
                      SubclassMeta, TensorMeta)



def analyze(graph_fn: Callable, fake_args: Sequence[torch.Tensor], is_leaf: Sequence[bool],
            box: OutputBox, fake_mode: FakeTensorMode) -> FunctionInfo:
    """Run `graph_fn` once, functionalized, on fake inputs and describe its effects."""
    with on_fakes(fake_mode, fake_args), functional_mode(observe=oplog.note) as mode:
        f_args = to_functional(fake_args)
        before = [_state(a) for a in f_args]
        originals = swaps.originals(f_args)
        held = storages(f_args)
        with user_code_checks(f_args), RefuseRequiresGradOff(f_args, is_leaf), \
                oplog.recording(f_args, saved_values_hook) as ops:
            outs = graph_fn(*f_args)
        if ops is not None:  # out of the user code's checks: it reads grad_fn
            ops.returned(outs, f_args)
        versions = [version_of(a) for a in f_args]
        made_leaves = leaves_made_inside(outs, f_args)  # reads grad_fn: views replay here
        saved = [saved_by_own_node(o) for o in outs]  # its saved values check versions here
    tensors = [a for a in f_args if isinstance(a, torch.Tensor)]  # not sizes
    for a in tensors:
        for inner in subclasses.unwrap(a):
            torch._sync(inner)
    swapped = _swaps(f_args, before, originals, mode.set_calls)
    _refuse_other_resizes(mode.storage_bytes, f_args)
    _refuse_data_assignment(held, storages(f_args), swapped)
    _refuse_view_metadata_writes_on_leaves(mode.view_metadata_writes, f_args, is_leaf)
    inputs = tuple(_input_info(f, leaf, b, v, s, mode.storage_bytes)
                   if isinstance(f, torch.Tensor) else SIZE_INPUT
                   for f, leaf, b, v, s in zip(f_args, is_leaf, before, versions, swapped))
    return describe(inputs, f_args, outs, box, made_leaves, saved)


def describe(inputs: tuple[InputInfo, ...], args: Sequence[Any], outs: Sequence[Any],
             box: OutputBox, made_leaves: Sequence[bool] | None = None,
             saved: Sequence[tuple | None] = ()) -> FunctionInfo:
    """The call's facts, from what it did to its inputs and the outputs it returned (`args`:
    the inputs as the function saw them; `made_leaves`: `leaves_made_inside`, if known;
    `saved`: `saved_by_own_node` per output, if known)."""
    outputs, num_bases = _classify_outputs(outs, args, box.input_aliases)
    if made_leaves is None:
        made_leaves = leaves_made_inside(outs, args)
    outputs = _with_made_leaves(outputs, outs, made_leaves)
    outputs = tuple(_with_saver(o, s) for o, s in zip(outputs, saved)) + outputs[len(saved):]
    info = FunctionInfo(inputs, outputs, box.spec, num_bases, (), (), torch.is_grad_enabled())
    values = graph_outputs(info, args, outs)
    _refuse_history_under_inference_mode(
        [v for v, o in zip(outs, outputs) if o.kind is OutputKind.PLAIN])
    _refuse_hooked_views(outputs, outs)
    # Not differentiable: mutations autograd did not see, and leaves (their gradient is
    # their own .grad, autograd's business once the runtime sets requires_grad).
    hidden = [x.mutation_hidden_from_autograd for x in inputs if x.mutates_data]
    hidden += [o.made_leaf for o in outputs]  # every user output has its slot
    hidden += [False] * (len(values) - len(hidden))
    for k in info.rebuilt_outputs:  # no tangent: the rebuilt alias carries the gradient
        hidden[k] = True
    info = dataclasses.replace(
        info,
        differentiable=tuple(_requires_grad(v) and not h for v, h in zip(values, hidden)),
        graph_output_metas=tuple(_tensor_meta(v) for v in values),
        fed_outputs=fed_outputs(values, _written_inputs(info) + _hookable_outputs(info)),
        hooked_outputs=_hooked_inside(info, outs),
    )
    _check_leaf_mutations(info)
    return info


def _hookable_outputs(info: FunctionInfo) -> list[int]:
    """Graph outputs of the user outputs with a gradient that are the compiled node's own
    outputs or views the runtime rebuilds (each a tensor the caller may put a hook on)."""
    first = info.first_user_output
    return [first + i for i, o in enumerate(info.outputs) if o.kind in _HOOKABLE and _graded(o)]


def _hooked_inside(info: FunctionInfo, outs: Sequence[Any]) -> tuple[int, ...]:
    """Graph outputs of the user outputs the function put a tensor hook on itself."""
    first = info.first_user_output
    return tuple(first + i for i, (o, out) in enumerate(zip(info.outputs, outs))
                 if o.kind is OutputKind.PLAIN and _graded(o)
                 and isinstance(out, torch.Tensor) and out._backward_hooks)


def _written_inputs(info: FunctionInfo) -> list[int]:
    """Graph outputs of the inputs written in place where autograd sees it: the caller's
    tensor gets a new node, on which it may put a hook after the call."""
    return [k for k, i in enumerate(info.data_mutated_inputs)
            if not info.inputs[i].mutation_hidden_from_autograd]


def _graded(o: OutputInfo) -> bool:
    """The output gets its gradient through the compiled node (not a leaf made inside, a
    view the user returns of an input, or a detached value)."""
    return (o.requires_grad and not o.made_leaf and not o.returned_as_view
            and o.detached_from is None)


_HOOKABLE = (OutputKind.PLAIN, OutputKind.VIEW_OF_INPUT, OutputKind.VIEW_OF_INTERMEDIATE,
             OutputKind.VIEW_OF_OUTPUT)


def _with_saver(info: OutputInfo, saved: tuple[str | None, int, int] | None) -> OutputInfo:
    plain = info.kind is OutputKind.PLAIN and _graded(info)
    return dataclasses.replace(info, saved_by_node=saved) if plain and saved else info


def _refuse_hooked_views(outputs: Sequence[OutputInfo], outs: Sequence[Any]) -> None:
    """An output the runtime rebuilds as a view, after the graph, that the function put a
    tensor hook on: its gradient flows through the rebuilt view's node, outside the graph,
    and the hook traced into the graph never ran (x.grad was half of eager's, silently)."""
    for i, (o, out) in enumerate(zip(outputs, outs)):
        if o.kind in _REBUILT_VIEWS and isinstance(out, torch.Tensor) and out._backward_hooks:
            raise NotImplementedError(
                f"aotgrad: the function registers a tensor hook on output {i}, a view (of an "
                "input, an intermediate or another output) that the compiled call rebuilds "
                "after its graph, so the hook would never run. Return a copy (`v.clone()`) "
                "or register the hook on the output after the call.")


_REBUILT_VIEWS = (OutputKind.VIEW_OF_INPUT, OutputKind.VIEW_OF_INTERMEDIATE,
                  OutputKind.VIEW_OF_OUTPUT)


def _refuse_history_under_inference_mode(computed: Sequence[Any]) -> None:
    """Under inference_mode, an output with autograd history was computed where the function
    turned it off (`torch.inference_mode(False)`): the compiled call runs whole in the
    caller's mode, where autograd records nothing (no gradient, silently)."""
    if torch.is_inference_mode_enabled() and any(
            isinstance(v, torch.Tensor) and v.grad_fn is not None for v in computed):
        raise NotImplementedError(
            "aotgrad: the function, called under torch.inference_mode(), turns it off inside "
            "(torch.inference_mode(False)) and computes a value that requires grad there; "
            "the compiled call runs whole in inference mode, which records no gradient. Call "
            "it outside inference_mode, or run that part outside the compiled function.")


def _tensor_meta(v: Any) -> TensorMeta | None:
    if not isinstance(v, torch.Tensor):  # a symbolic size
        return None
    subclasses.check_supported(v, "an output")
    layout = subclasses.describe(subclasses.tangent_like(v))
    subclass = layout if isinstance(layout, SubclassMeta) else None
    return TensorMeta(tuple(v.shape), v.dtype, v.device, subclass, _gradient_format(v))


def _gradient_format(v: torch.Tensor) -> torch.memory_format:
    """The output's memory format, unless its sizes or strides are symbolic (reading the
    layout of those would guard on them) or it is a subclass (its inner tensors' own)."""
    if subclasses.is_subclass(v) or v.layout != torch.strided or any(
            isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride())):
        return torch.contiguous_format
    return suggest_memory_format(v)


def storages(args: Sequence[Any]) -> list:
    """Each tensor argument's storage, as a weak reference (None for others)."""
    refs = []
    for a in args:
        try:
            refs.append(StorageWeakRef(a.untyped_storage()) if isinstance(a, torch.Tensor)
                        else None)
        except (RuntimeError, NotImplementedError):  # a wrapper subclass without storage
            refs.append(None)
    return refs


def _refuse_data_assignment(before: list, after: list, swapped: Sequence) -> None:
    """`x.data = y` swaps an input's tensor without an op (unlike `set_`): no graph would
    hold it, and the compiled function would silently use the old value."""
    changed = [i for i, (b, a, s) in enumerate(zip(before, after, swapped))
               if b != a and s is None]
    if changed:
        raise NotImplementedError(
            f"aotgrad: the function assigns `.data` of input {changed[0]}, which tracing cannot "
            "follow. Assign it outside the compiled function, or write the new values with "
            "`x.copy_(new)` (or `x.set_(new)`) inside it.")


@contextlib.contextmanager
def on_fakes(fake_mode: FakeTensorMode, fakes: Sequence[Any]):
    """Where an analysis runs the user's code on fake inputs (this one and pure.py's): their
    fake mode, the python dispatcher for symbolic sizes, and the unbacked symbols the run
    makes left aside (the trace after it makes its own)."""
    with fake_mode, fresh_unbacked_ignored(fake_mode), python_dispatcher(is_symbolic(fakes)):
        yield


def python_dispatcher(symbolic: bool):
    """Symbolic sizes need ops decomposed by the python dispatcher (an in-place op's
    decomposition would otherwise expand a real scalar tensor to a symbolic size)."""
    return enable_python_dispatcher() if symbolic else contextlib.nullcontext()


def graph_outputs(info: FunctionInfo, args: Sequence, outs: Sequence) -> list:
    """What the forward graph returns: new values of data-mutated inputs, every user output
    (functorch's convention: aliases and constants too, though the runtime rebuilds those),
    the intermediate bases of outputs that are views, then the tensors inputs were set_() to."""
    mutated = [args[i] for i in info.data_mutated_inputs]
    user = [_in_graph(o, out) for o, out in zip(info.outputs, outs)]
    swapped = [args[i] for i in info.storages_from_graph]
    return mutated + user + _intermediate_bases(info, outs) + swapped


def _in_graph(o: OutputInfo, out: Any) -> Any:
    """A user output as the graph returns it. A constant the graph's output would flatten
    into several values (a `torch.Size`) leaves its slot None, to keep one slot per output."""
    if o.kind is OutputKind.CONSTANT and not pytree.tree_is_leaf(out):
        return None
    return out


def _intermediate_bases(info: FunctionInfo, outs: Sequence) -> list:
    bases = [None] * info.num_intermediate_bases
    for o, out in zip(info.outputs, outs):
        if o.kind is OutputKind.VIEW_OF_INTERMEDIATE and bases[o.source] is None:
            bases[o.source] = out._base
    return bases


def _state(a: Any) -> tuple | None:
    """What a mutation inside the function could change, before the call."""
    if not isinstance(a, torch.Tensor):
        return None
    return a.grad_fn, version_of(a), a.requires_grad


def _requires_grad(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.requires_grad


def _swaps(f_args: Sequence[Any], before: Sequence, originals: Sequence,
           set_calls: swaps.SetCalls) -> list[StorageSwap | None]:
    """Per input: the storage it ends on, if the function swapped it (set_)."""
    return [swaps.find_swap(i, f_args, originals, set_calls, b[2])
            if isinstance(a, torch.Tensor) and swaps.was_swapped(subclasses.unwrap(a)) else None
            for i, (a, b) in enumerate(zip(f_args, before))]


def _input_info(a: torch.Tensor, is_leaf: bool, before: tuple, version: int,
                swap: StorageSwap | None, resized: dict[int, int]) -> InputInfo:
    grad_fn, old_version, old_requires_grad = before
    # A subclass: each tensor it wraps. A swapped input takes its new storage as it is.
    inner = [t.elem for t in subclasses.unwrap(a)] if swap is None else []
    mutates_data = writes_seen(inner)
    # A data mutation by a value that requires grad makes the input require it too.
    gains = a.requires_grad and not old_requires_grad and not mutates_data
    if old_requires_grad and not a.requires_grad:  # detach_(), or requires_grad_(False)
        raise requires_grad_turned_off()
    return InputInfo(
        requires_grad=old_requires_grad,
        is_leaf=is_leaf,
        mutates_data=mutates_data,
        mutates_metadata=any(torch._functionalize_has_metadata_mutation(t) for t in inner),
        # Autograd recorded none of the mutations (no_grad, .detach(), .data).
        mutation_hidden_from_autograd=a.grad_fn is grad_fn,
        # Mutations through .data, and kernels that update an argument themselves (BatchNorm's
        # running statistics), leave the version counter alone.
        version_bumps=version - old_version,
        final_geometry=geometry(a),
        storage_swap=swap,
        storage_bytes=_storage_bytes(a, resized),
        gains_requires_grad=gains,
    )


def writes_seen(wrappers: Sequence[torch.Tensor]) -> bool:
    """Did functionalization see a write into any of these C++ functional wrappers?"""
    return any(torch._functionalize_has_data_mutation(t) for t in wrappers)


def unseen_writes(info: FunctionInfo, f_args: Sequence[Any]) -> list[int]:
    """The inputs a trace wrote into although the analysis saw them unchanged."""
    return [i for i, (a, x) in enumerate(zip(f_args, info.inputs))
            if isinstance(a, torch.Tensor) and not x.mutated and x.storage_swap is None
            and writes_seen([t.elem for t in subclasses.unwrap(a)])]


def _refuse_other_resizes(resized: dict[int, int], f_args: Sequence[Any]) -> None:
    """Only an input's own resize is replayed: one through a view or of an intermediate
    would be lost."""
    if set(resized) - {id(a) for a in f_args}:
        raise NotImplementedError(
            "aotgrad: the function calls resize_storage_bytes_() on a tensor that is not an "
            "input (a view of one, or a tensor made inside); only inputs themselves are "
            "supported. Resize the input itself.")


def _storage_bytes(a: torch.Tensor, resized: dict[int, int]) -> int | None:
    """The storage size after a resize_storage_bytes_() inside the function, else None."""
    if subclasses.is_subclass(a):
        if any(id(t) in resized for t in subclasses.unwrap(a)):
            raise NotImplementedError(
                "aotgrad: the function resizes the storage of a tensor subclass input's inner "
                "tensor (resize_storage_bytes_), which is not supported; resize it outside "
                "the compiled function.")
        return None
    nbytes = resized.get(id(a))
    if is_symbolic(nbytes):
        raise DynamicShapesUnsupported("aotgrad: resize_storage_bytes_() of an input is "
                                       "compiled for static shapes only.")
    return nbytes


def version_of(t: Any) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    return 0 if t.is_inference() else t._version  # inference tensors have no counter


def leaves_made_inside(outs: Sequence[Any], args: Sequence[Any]) -> tuple[bool, ...]:
    """Per output: whether it is a leaf requiring grad made inside the function
    (`requires_grad_()`, `torch.ones(..., requires_grad=True)`). Such outputs are supported;
    a value computed from one is not: the compiled graph has no node whose gradient
    reaches it."""
    if _reaches_leaves_made_inside(list(outs) + list(args), args):
        raise NotImplementedError(
            "aotgrad: the function computes a value from a tensor that it made require grad "
            "(requires_grad_() or requires_grad=True on a tensor that is not an input); its "
            "gradient cannot be followed. Create that tensor outside and pass it in.")
    inputs = {id(a) for a in args}
    return tuple(_requires_grad(o) and id(o) not in inputs and o.is_leaf for o in outs)


def _with_made_leaves(infos: tuple[OutputInfo, ...], outs: Sequence[Any],
                      made_leaves: Sequence[bool]) -> tuple[OutputInfo, ...]:
    marked = []
    for info, o, made in zip(infos, outs, made_leaves):
        if made and info.kind is OutputKind.PLAIN and subclasses.is_subclass(o):
            raise NotImplementedError(
                "aotgrad: the function returns a tensor subclass made inside from tensors "
                "that require grad (in eager a new leaf tensor that requires grad, cut from "
                "them); build it outside the compiled function.")
        made = made and info.kind in _MADE_LEAF_KINDS
        marked.append(dataclasses.replace(info, made_leaf=True) if made else info)
    return tuple(marked)


_MADE_LEAF_KINDS = frozenset({OutputKind.PLAIN, OutputKind.VIEW_OF_INPUT,
                              OutputKind.VIEW_OF_INTERMEDIATE, OutputKind.VIEW_OF_OUTPUT})


def _reaches_leaves_made_inside(values: Sequence[Any], args: Sequence[Any]) -> bool:
    """Whether the autograd graph of `values` accumulates into a leaf other than `args`."""
    inputs = {id(a) for a in args}
    stack = [v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn is not None]
    seen = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable") and id(node.variable) not in inputs:  # AccumulateGrad
            return True
        stack.extend(f for f, _ in node.next_functions)
    return False


def _classify_outputs(outs: Sequence[Any], f_args: Sequence[Any], aliases: Sequence = ()):
    """Each output's kind, and the intermediate bases the graph must return as well."""
    input_index = {id(a): i for i, a in enumerate(f_args)}
    input_index.update((id(t), i) for t, i in aliases)
    held = {ref: i for i, ref in enumerate(storages(f_args)) if ref is not None}
    first_seen: dict[int, int] = {}
    plain_index: dict[int, int] = {}
    for i, o in enumerate(outs):
        first_seen.setdefault(id(o), i)
        if isinstance(o, torch.Tensor) and id(o) not in input_index and not _is_alias(o):
            plain_index.setdefault(id(o), i)
    bases: list[torch.Tensor] = []
    base_index: dict[int, int] = {}
    infos = []
    for i, o in enumerate(outs):
        if is_size(o):  # symbolic: computed by the graph, like a tensor
            infos.append(OutputInfo(OutputKind.PLAIN, None, False))
        elif not isinstance(o, torch.Tensor):
            infos.append(OutputInfo(OutputKind.CONSTANT, None, False, constant=o))
        elif first_seen[id(o)] != i:
            infos.append(OutputInfo(OutputKind.SAME_AS_OUTPUT, first_seen[id(o)], o.requires_grad))
        elif id(o) in input_index:
            infos.append(OutputInfo(OutputKind.INPUT, input_index[id(o)], o.requires_grad))
        elif not _is_alias(o):
            detached = _detached_from(o, held, f_args)
            infos.append(OutputInfo(OutputKind.PLAIN, None, o.requires_grad,
                                    None if detached is None else geometry(o),
                                    returned_as_view=o._is_view(), detached_from=detached,
                                    made_in_inference_mode=detached is None and
                                    _made_in_inference_mode(o)))
        elif id(o._base) not in input_index and id(o._base) not in plain_index and \
                (j := _detached_input(o._base, held, f_args)) is not None:
            infos.append(dataclasses.replace(_view_info(o, OutputKind.VIEW_OF_INPUT, j),
                                             detached_base=True))
        else:
            kind, source = _view_source(o._base, input_index, plain_index, base_index, bases)
            infos.append(_view_info(o, kind, source))
    return tuple(infos), len(bases)


def _detached_input(base: torch.Tensor, held: dict, f_args: Sequence[Any]) -> int | None:
    """The input whose `.detach()` `base` is, as the function returned no view of it
    (`x.detach()[1:]`): the output's base shares x's version counter in eager. An input's
    own `_base` (that of a conjugate view, say) lies over its memory too, and is no detach."""
    if any(base is getattr(a, "_base", None) for a in f_args if isinstance(a, torch.Tensor)):
        return None
    i = _detached_from(base, held, f_args)
    return i if i is not None and geometry(base) == geometry(f_args[i]) else None


def _made_in_inference_mode(o: torch.Tensor) -> bool:
    """An inference tensor computed inside a `torch.inference_mode()` block of a call
    outside it: the graph's value, computed outside, is a normal tensor."""
    return o.is_inference() and not torch.is_inference_mode_enabled()


def _detached_from(o: torch.Tensor, held: dict, f_args: Sequence[Any]) -> int | None:
    """The input whose memory `o`, no view and of its dtype, lies over (`x.detach()`), if
    any. (`x.data` too, whose version counter eager does not share: rebuilt as a detach, a
    later in-place change through it raises at a backward where eager's would not, never
    silently.) A view to another dtype the graph computes, as before."""
    if o._is_view() or o.requires_grad or subclasses.is_subclass(o):
        return None  # a detach never requires grad; unsafe_chunk's outputs do, and are own
    i = held.get(storages([o])[0])
    return i if i is not None and f_args[i].dtype == o.dtype else None


def _is_alias(o: torch.Tensor) -> bool:
    """A view the runtime may rebuild from its base: one whose gradient flows to the base
    through view ops alone. A custom Function that returns its input (or a view of it) makes
    a view whose gradient is the Function's own backward (autograd marks it, and views of
    it, as made in a custom Function): the graph computes it instead, and returns it from
    the compiled node, which (as eager's Function) makes it a view again. (Reading grad_fn
    instead would regenerate a view whose base was mutated, outside the functional mode.)"""
    if not o._is_view():
        return False
    made = _creation_meta(o)
    return made != _IN_CUSTOM_FUNCTION and not (  # one of several outputs of a Function
        made == _MULTI_OUTPUT_NODE and isinstance(o.grad_fn, _FUNCTION_NODE))


_creation_meta = torch._C._autograd._get_creation_meta
_IN_CUSTOM_FUNCTION = torch._C._autograd.CreationMeta.IN_CUSTOM_FUNCTION
_MULTI_OUTPUT_NODE = torch._C._autograd.CreationMeta.MULTI_OUTPUT_NODE
_FUNCTION_NODE = torch.autograd.function.BackwardCFunction
_IN_NO_GRAD_MODE = torch._C._autograd.CreationMeta.NO_GRAD_MODE
_IN_INFERENCE_MODE = torch._C._autograd.CreationMeta.INFERENCE_MODE


def _view_source(base, input_index, plain_index, base_index, bases):
    if id(base) in input_index:
        return OutputKind.VIEW_OF_INPUT, input_index[id(base)]
    if id(base) in plain_index:
        return OutputKind.VIEW_OF_OUTPUT, plain_index[id(base)]
    if id(base) not in base_index:
        base_index[id(base)] = len(bases)
        bases.append(base)
    return OutputKind.VIEW_OF_INTERMEDIATE, base_index[id(base)]


def _replay_matches(o: torch.Tensor) -> bool:
    """Whether the view ops recorded for `o` rebuild it: functionalization leaves them
    unchanged by a later in-place view op (`o.transpose_(0, 1)`, `o.unsqueeze_(0)` on a
    view), whose output the replay would return with the old shape; `as_strided` then."""
    # here, not at import: symbolic_shapes loads sympy, which `import aotgrad` spares
    from torch.fx.experimental.symbolic_shapes import statically_known_true, sym_eq
    base = o._base
    if isinstance(base, FunctionalTensor):  # out of its mode: replay on the fake inside
        base = torch._from_functional_tensor(base.elem)
    with torch.no_grad():
        rebuilt = o._view_func_unsafe(base)
    return all(statically_known_true(sym_eq(a, b))
               for a, b in zip(geometry(rebuilt), geometry(o)))


def _view_info(o: torch.Tensor, kind: OutputKind, source: int) -> OutputInfo:
    made = _creation_meta(o)
    replay = o._view_func_unsafe if _replay_matches(o) else None
    return OutputInfo(kind, source, o.requires_grad, geometry(o), o.dtype, replay,
                      made_without_grad=made == _IN_NO_GRAD_MODE,
                      made_in_inference_mode=made == _IN_INFERENCE_MODE)


def _refuse_view_metadata_writes_on_leaves(roots: Sequence[int], f_args, is_leaf) -> None:
    """Eager's error for an in-place view op (`v.unsqueeze_(0)`) on a view of a leaf that
    requires grad: the input's data and shape stay as they were, so no mutation shows it."""
    leaves = {id(a) for a, leaf in zip(f_args, is_leaf)
              if leaf and isinstance(a, torch.Tensor) and a.requires_grad}
    if any(r in leaves for r in roots):
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an "
                           "in-place operation.")


def _check_leaf_mutations(info: FunctionInfo) -> None:
    """Eager refuses in-place changes to a leaf that requires grad; so do we."""
    if not info.grad_enabled:
        return
    for x in info.inputs:
        if x.mutated and x.is_leaf and x.requires_grad and not x.mutation_hidden_from_autograd:
            raise RuntimeError(
                "a leaf Variable that requires grad is being used in an in-place operation.")


def regenerate_view(out: OutputInfo, base: torch.Tensor,
                    concrete: Callable[[Any], Any] | None = None) -> torch.Tensor:
    """Rebuild an aliased output from its base at run time, so that `_base`, `grad_fn` and
    later in-place use behave as in eager. With symbolic sizes, `concrete` gives their values
    in this call. Grad mode as where the function made it: a view made under enable_grad()
    inside a call under no_grad is differentiable (the guards fix the caller's mode)."""
    differentiable = out.requires_grad and not out.made_without_grad
    made_in = torch.inference_mode() if out.made_in_inference_mode else contextlib.nullcontext()
    with made_in, torch.set_grad_enabled(differentiable):
        if out.replay is not None:
            # Without `concrete` the geometry is concrete, yet the view op may still hold a
            # size the guards fixed after it was traced (`x.chunk(2)` before Dynamo
            # specialized `x`'s size): replayed symbolic, it would break the view's backward.
            view = out.replay(base, symint_visitor_fn=concrete or hint)
            if view is not None:
                return view
        size, stride, offset = out.geometry if concrete is None else concrete(out.geometry)
        if base.dtype != out.dtype:
            base = base.view(out.dtype)
        return base.as_strided(size, stride, offset)
