"""Inputs that share memory while one of them is mutated: one synthetic base per group.

Functionalization treats every graph input as memory of its own, so a mutation of one input
would not reach another input viewing the same memory (`f(x, x.view(-1))`). For each group of
inputs whose memory overlaps and of which one is mutated, the compiled graph takes one more
input, the group's *base*: memory spanning every member. Inside the graph the members are
views of a copy of the base (`as_strided`), so a mutation of one is seen by the others, and
the graph returns each mutated member's new value. After the call, the runtime copies those
into the real members, as for any mutated input; that writes exactly the memory eager writes.

The base is, by preference, the members' common autograd base (`x._base`, or `x` itself), so
that gradients reach it as in eager, where autograd sees a view's in-place update through its
base. Members that share memory without sharing an autograd base (through `.data`,
`.detach()` or `set_()`) get a fresh tensor over their storage, which autograd cannot follow:
such groups are refused when a member requires grad.

A compiled entry assumes its call's aliasing. `InputAliasing.graph_inputs` checks each call
(which inputs share a storage, at which offsets, and the groups' bases) and raises
`AliasingChanged` when they differ; `aotgrad.compile` then compiles for the new aliasing.
Storage identity is checked, not `_base`: aliasing through `.data` or `set_()` is caught too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..capture import analysis
from . import subclasses
from .. import tables
from ..schema import OVERWRITTEN, FunctionInfo, Geometry, OutputKind, primals_of
from .dynamic import geometry, is_size

# Which storage a tensor uses: the address of its StorageImpl, in one C call where torch has
# one (a storage object is built otherwise).
storage_key = getattr(torch._C, "_storage_address", None) or (
    lambda t: t.untyped_storage()._cdata)



def storage_keys(inputs: Sequence[Any]) -> list:
    """One storage key per input. A size input (Dynamo's SymInt, an int when called) owns no
    memory: a key of its own, by position (negative: no address)."""
    return [storage_key(t) if isinstance(t, torch.Tensor) else -1 - i
            for i, t in enumerate(inputs)]


# Exact overlap tests enumerate addresses; above this many, assume overlap (always correct:
# a base is only slower).
MAX_EXACT_OVERLAP_ELEMENTS = 1 << 22


class BaseKind(enum.Enum):
    ROOT = "the members' common autograd base itself"
    ROOT_SPAN = "a 1-D view of the common autograd base, from its storage's start"
    STORAGE = "a fresh tensor over the members' storage (they share no autograd base)"


@dataclass(frozen=True)
class Member:
    """One input of an alias group, as the compiled graph regenerates it from the base."""

    input: int
    dtype: torch.dtype
    geometry: Geometry  # size, stride, storage offset (in its own elements)
    requires_grad: bool
    mutated: bool
    mutation_hidden_from_autograd: bool  # copy its new value back without autograd
    version_bumps: int  # how much the user's mutations advance its version counter
    conj: bool = False  # a conjugate view of the memory (`x.conj()` of another member)
    neg: bool = False  # a negative view of the memory (`torch._neg_view`, `.imag` of a conj)


@dataclass(frozen=True)
class AliasGroup:
    members: tuple[Member, ...]
    kind: BaseKind
    base_geometry: Geometry  # storage offset always 0: as_strided offsets are absolute
    base_dtype: torch.dtype
    base_requires_grad: bool
    base_is_leaf: bool

    def base(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        """This call's base, after checking the members still share it."""
        first = inputs[self.members[0].input]
        if self.kind is BaseKind.STORAGE:
            size, stride, _ = self.base_geometry
            empty = torch.empty((0,), dtype=self.base_dtype, device=first.device)
            return empty.set_(first.untyped_storage(), 0, size, stride)
        root = _root(first)
        if any(_root(inputs[m.input]) is not root for m in self.members) or \
                root.dtype != self.base_dtype:
            raise AliasingChanged(sorted(m.input for m in self.members))
        if self.kind is BaseKind.ROOT_SPAN:
            return root.as_strided(*self.base_geometry)
        if geometry(root) != self.base_geometry:
            raise AliasingChanged(sorted(m.input for m in self.members))
        return root


@dataclass(frozen=True)
class InputAliasing:
    """How the inputs of a compiled entry share memory, and the groups it merged."""

    storage_classes: tuple[int, ...]  # per graph input: the first input on the same storage
    shared: tuple[int, ...]  # inputs on a storage with another input
    shared_offsets: tuple[int, ...]  # their storage offsets (overlap depends on them)
    groups: tuple[AliasGroup, ...]
    # Subclass inputs are never merged: their parts must alias no mutated input (checked
    # through their parts, with the mutated inputs).
    subclass_inputs: tuple[int, ...] = ()
    mutated: tuple[int, ...] = ()
    has_sizes: bool = False  # some inputs are sizes (Dynamo's dynamic shapes), not tensors

    def graph_inputs(self, inputs: list) -> list:
        """Check this call's aliasing (one storage lookup per input) and append the groups'
        bases."""
        keys = storage_keys(inputs) if self.has_sizes else map(storage_key, inputs)
        if not self.shared:  # the common case, compiled for inputs on distinct storages
            if len(set(keys)) != len(inputs):
                raise AliasingChanged(_sharing(inputs))
            if self.subclass_inputs:
                refuse_aliased_subclass_parts(inputs, self.mutated)
            return inputs
        first: dict[int, int] = {}
        classes = tuple(first.setdefault(k, i) for i, k in enumerate(keys))
        if classes != self.storage_classes or \
                tuple(inputs[i].storage_offset() for i in self.shared) != self.shared_offsets:
            raise AliasingChanged(_first_difference(classes, self.storage_classes))
        if self.subclass_inputs:
            refuse_aliased_subclass_parts(inputs, self.mutated)
        if not self.groups:
            return inputs
        return [*inputs, *(g.base(inputs) for g in self.groups)]  # inputs may be a tuple


class AliasingChanged(NotImplementedError):
    """A call whose inputs share memory differently from the call its graph was compiled for."""

    def __init__(self, inputs: Sequence[int]):
        super().__init__(
            f"aotgrad: inputs {list(inputs)} share memory differently from the call this "
            "graph was compiled for (a graph assumes the aliasing of its inputs; "
            "aotgrad.compile compiles again, a graph compiled for fixed inputs cannot). Pass "
            "tensors aliased as in the first call, or independent ones (e.g. .clone()).")
        self.inputs = list(inputs)


def aliased_mutation_error(inputs: Sequence[int], why: str = "mutating aliased tensor "
                           "subclasses is not supported yet.") -> NotImplementedError:
    what = (f"inputs {list(inputs)}" if len(inputs) > 1
            else f"the inner tensors of input {inputs[0]} (a tensor subclass)")
    return NotImplementedError(
        f"aotgrad: {what} share memory and at least one of them is mutated inside the "
        f"function; {why} Pass independent tensors (e.g. .clone()) or move the mutation "
        "outside the compiled function.")


def refuse_aliased_subclass_parts(inputs: Sequence[torch.Tensor], mutated: Sequence[int]) -> None:
    """Subclass inputs share memory through their parts; none may be shared with (or
    within) a mutated input."""
    owners: dict[int, list[int]] = {}
    for i, t in enumerate(inputs):
        for part in subclasses.unwrap(t) if isinstance(t, torch.Tensor) else ():
            owners.setdefault(storage_key(part), []).append(i)
    for group in owners.values():
        if len(group) > 1 and any(i in mutated for i in group) and \
                any(subclasses.is_subclass(inputs[i]) for i in group):
            raise aliased_mutation_error(sorted(set(group)))


def alias_pattern(inputs: Sequence[torch.Tensor]) -> tuple:
    """A hashable summary of how `inputs` alias: storages, offsets and autograd bases."""
    storages: dict[int, int] = {}
    roots: dict[int, int] = {}
    return tuple((storages.setdefault(storage_key(t), i), t.storage_offset(),
                  roots.setdefault(id(_root(t)), i)) for i, t in enumerate(inputs))


# ---- finding the groups (compile time) ----------------------------------------------------

def plan_aliasing(inputs: Sequence[torch.Tensor], info: FunctionInfo) -> InputAliasing | None:
    """The aliasing a compiled entry assumes; None when no input is mutated (then aliasing
    cannot change the result, and calls are not checked)."""
    # An input set_() to another input's storage is addressed through that input: its
    # storage and offset must be those of this call too.
    mutated = tuple(i for i, x in enumerate(info.inputs)
                    if x.mutated or x.storage_swap is not None)
    if not mutated:
        return None
    subs = tuple(i for i, t in enumerate(inputs) if subclasses.is_subclass(t))
    if subs:
        refuse_aliased_subclass_parts(inputs, mutated)
    first: dict[int, int] = {}
    classes = tuple(first.setdefault(k, i) for i, k in enumerate(storage_keys(inputs)))
    shared = tuple(i for i, c in enumerate(classes) if classes.count(c) > 1)
    groups = tuple(_group(inputs, info, members) for members in _overlapping(inputs, classes)
                   if any(info.inputs[i].mutated for i in members))  # not by set_ alone
    return InputAliasing(classes, shared, tuple(inputs[i].storage_offset() for i in shared),
                         groups, subs, mutated,
                         has_sizes=not all(isinstance(t, torch.Tensor) for t in inputs))


def _overlapping(inputs: Sequence[torch.Tensor], classes: tuple[int, ...]) -> list[list[int]]:
    """Groups (of two or more) of inputs whose memory overlaps, transitively."""
    parent = list(range(len(inputs)))

    def find(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i
    for j, c in enumerate(classes):
        for i in range(c, j):
            if classes[i] == c and find(i) != find(j) and overlaps(inputs[i], inputs[j]):
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(inputs)):
        groups.setdefault(find(i), []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors on one storage share a byte, from sizes, strides and offsets."""
    (a_lo, a_hi), (b_lo, b_hi) = _byte_range(a), _byte_range(b)
    if a_hi <= b_lo or b_hi <= a_lo:
        return False
    if a.numel() + b.numel() > MAX_EXACT_OVERLAP_ELEMENTS:
        return True
    unit = math.gcd(a.element_size(), b.element_size())
    with unset_fake_temporarily():
        return bool(torch.isin(_addresses(a, unit), _addresses(b, unit)).any())


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    if t.numel() == 0:
        return 0, 0
    size = t.element_size()
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.storage_offset() * size, (last + 1) * size


def _addresses(t: torch.Tensor, unit: int) -> torch.Tensor:
    """The storage addresses of every element of `t`, in units of `unit` bytes."""
    per = t.element_size() // unit
    addr = torch.tensor([t.storage_offset()], dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        addr = (addr[:, None] + torch.arange(n, dtype=torch.int64) * s).reshape(-1)
    return (addr[:, None] * per + torch.arange(per, dtype=torch.int64)).reshape(-1)


def _group(inputs: Sequence[torch.Tensor], info: FunctionInfo, members: list[int]) -> AliasGroup:
    for i in members:
        if info.inputs[i].mutates_metadata:
            raise aliased_mutation_error(members, "changing the shape or strides of one "
                                         "(t_, resize_, as_strided_...) is not supported.")
        if info.inputs[i].storage_swap is not None:
            raise aliased_mutation_error(members, "set_() on one is not supported.")
    roots = [_root(inputs[i]) for i in members]
    if any(r.is_conj() or r.is_neg() for r in roots):
        raise aliased_mutation_error(members, "their base is itself a conjugate or negative "
                                     "tensor (its bit set in place), which aotgrad cannot view.")
    if any(r is not roots[0] for r in roots):
        return _storage_group(inputs, info, members)
    return _root_group(inputs, info, members, roots[0])


def _member(inputs, info: FunctionInfo, i: int) -> Member:
    t, x = inputs[i], info.inputs[i]
    return Member(i, t.dtype, geometry(t), t.requires_grad, x.mutates_data,
                  x.mutation_hidden_from_autograd, x.version_bumps, t.is_conj(), t.is_neg())


def _root_group(inputs, info: FunctionInfo, members: list[int], root) -> AliasGroup:
    ms = tuple(_member(inputs, info, i) for i in members)
    if any(m.requires_grad and not root.requires_grad for m in ms):
        raise aliased_mutation_error(members, "one requires grad while their common base "
                                     "does not (requires_grad_() on a view).")
    if root.is_leaf and root.requires_grad and info.grad_enabled and any(
            m.mutated and not m.mutation_hidden_from_autograd for m in ms):
        raise RuntimeError("a view of a leaf Variable that requires grad is being used in an "
                           "in-place operation.")
    if root.storage_offset() == 0 and root.is_contiguous() and \
            max(_byte_range(inputs[i])[1] for i in members) <= _byte_range(root)[1]:
        return AliasGroup(ms, BaseKind.ROOT, geometry(root), root.dtype,
                          root.requires_grad, root.is_leaf)
    span = _span_geometry(inputs, members, root.dtype, root.untyped_storage().nbytes())
    return AliasGroup(ms, BaseKind.ROOT_SPAN, span, root.dtype, root.requires_grad, False)


def _storage_group(inputs, info: FunctionInfo, members: list[int]) -> AliasGroup:
    ms = tuple(_member(inputs, info, i) for i in members)
    if any(m.requires_grad for m in ms):
        raise aliased_mutation_error(
            members, "they share no autograd base (aliased through .data, .detach() or "
            "set_()), and one requires grad, which autograd could not follow.")
    first = inputs[members[0]]
    span = _span_geometry(inputs, members, first.dtype, first.untyped_storage().nbytes())
    return AliasGroup(ms, BaseKind.STORAGE, span, first.dtype, False, True)


def _span_geometry(inputs, members: list[int], dtype: torch.dtype, nbytes: int) -> Geometry:
    """1-D, from the storage's start to the end of the last member, in `dtype` elements,
    rounded up (within the storage) so that each member's dtype can view it."""
    size = dtype.itemsize
    end = max(_byte_range(inputs[i])[1] for i in members)
    step = math.lcm(size, *(inputs[i].element_size() for i in members))
    end = min(-(-end // step) * step, nbytes)
    return (-(-end // size),), (1,), 0


def refuse_writes_into_overlapping(inputs: Sequence[Any], info: FunctionInfo) -> None:
    """An input whose elements share memory (`expand`: stride 0): eager's write into one
    element writes them all, where the traced function, functionalized, sees independent
    elements, and the copy of the new value back into the input would be refused by torch."""
    for i in info.data_mutated_inputs:
        if torch._debug_has_internal_overlap(inputs[i]) == 1:
            raise NotImplementedError(
                f"aotgrad: the function writes in place into input {i}, whose elements share "
                f"memory (stride {tuple(inputs[i].stride())}: an expanded tensor); a write into "
                "one element writes them all in eager, which a traced function does not "
                "follow. Pass a copy (x.clone() or x.contiguous()), or write into the tensor "
                "it was expanded from.")


def unview_plain_outputs(gm: fx.GraphModule, info: FunctionInfo) -> None:
    """An output eager returns as a tensor of its own (`_unsafe_view`'s: a batched matmul's,
    attention's) may come out of the trace as a `view` of an intermediate (the python
    dispatcher's decompositions): the compiled function would return a view, which autograd
    then refuses to change in place, where eager's output takes it. That output reads an
    `_unsafe_view` of it instead (the same memory, no view relation). So too the base of a
    user output's view, never itself a view in eager: the trace makes it one where the
    function wrote into it through a view (`y = x * 1; y.view(-1).add_(1)`)."""
    outputs = list(gm.graph.output_node().args[0])
    first = info.first_user_output
    bases = range(first + len(info.outputs), first + len(info.outputs)
                  + info.num_intermediate_bases)
    views = [first + i for i, o in enumerate(info.outputs) if o.kind is OutputKind.PLAIN
             and not (o.made_leaf or o.returned_as_view) and _is_view_op(outputs[first + i])]
    views += [k for k in bases if _is_view_op(outputs[k])]
    if not views:  # most graphs: nothing to regenerate
        return
    for k in views:
        node = outputs[k]
        with gm.graph.inserting_before(gm.graph.output_node()):  # sizes first, in order
            own = gm.graph.call_function(torch.ops.aten._unsafe_view.default,
                                         (node, _size_args(gm.graph, node)))
        own.meta = dict(node.meta)
        outputs[k] = own
    gm.graph.output_node().args = (tuple(outputs),)
    gm.recompile()


_SCALARS = (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)


def repeated_plain_outputs(gm: fx.GraphModule, info: FunctionInfo) -> tuple[int, ...]:
    """The user outputs computed by the graph whose value the graph also returns for another
    user output, and that the runtime must hand out as tensors of their own (eager's are:
    a pass drops `h.detach()` as a no-op, so `return h, h.detach()` returns `h` twice):
    those needing no gradient where one of the group does (in either order), else all but
    the first. The runtime detaches them."""
    outputs = gm.graph.output_node().args[0]
    first = info.first_user_output
    groups: dict[fx.Node, list[int]] = {}
    for i, o in enumerate(info.outputs):
        node = outputs[first + i]
        # A SymInt returned for several outputs (Dynamo's `x.shape, x.size()` under
        # dynamic shapes) is a plain int for each: nothing to detach.
        if (o.kind is OutputKind.PLAIN and isinstance(node, fx.Node)
                and not isinstance(node.meta.get("val"), _SCALARS)):
            groups.setdefault(node, []).append(i)
    repeated = []
    for group in (g for g in groups.values() if len(g) > 1):
        gradless = [i for i in group if not info.outputs[i].requires_grad]
        repeated += gradless if len(gradless) < len(group) else group[1:]
    return tuple(sorted(repeated))


def counter_sharing_outputs(gm: fx.GraphModule, info: FunctionInfo
                            ) -> tuple[tuple[int, int], ...]:
    """(k, m) for each forward output k that needs no gradient and is an alias, through view
    ops, of the memory of another output m the forward returns (a value saved for the
    backward, another output): eager's `h.detach()` shares h's version counter, so that an
    in-place change through it makes a backward that saved h raise. The graph's alias has a
    counter of its own: the change reached the saved value silently, and so the gradient.
    The runtime hands out k over m's memory with m's counter instead."""
    outputs = gm.graph.output_node().args[0]
    first = info.first_user_output
    aliases = [first + i for i, o in enumerate(info.outputs) if o.kind is OutputKind.PLAIN
               and not o.requires_grad and not o.made_leaf and o.detached_from is None]
    bases = range(first + len(info.outputs), first + len(info.outputs)
                  + info.num_intermediate_bases)
    aliases += [k for k in bases if not info.differentiable[k]]
    aliases = [k for k in aliases if _is_alias_op(outputs[k])]
    if not aliases:  # most graphs
        return ()
    roots: dict[fx.Node, int] = {}
    for m, node in enumerate(outputs):
        if m not in aliases and isinstance(node, fx.Node) \
                and isinstance(node.meta.get("val"), torch.Tensor):
            roots.setdefault(_alias_root(node), m)
    found = ((k, roots.get(_alias_root(outputs[k]))) for k in aliases)
    return tuple((k, m) for k, m in found if m is not None)


def _is_alias_op(node: Any) -> bool:
    return _is_view_op(node) or (isinstance(node, fx.Node)
                                 and node.target in tables.VIEWS_IN_PRACTICE)


def _alias_root(node: fx.Node) -> fx.Node:
    """The node whose memory `node` reads through view ops."""
    while _is_alias_op(node) and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def memory_root(node: Any) -> Any:
    """As `_alias_root`, items of a view op's list included, read from the graph alone: a
    graph loaded from aotgrad's cache by Inductor's key may hold no fake values."""
    while isinstance(node, fx.Node) and node.args and isinstance(node.args[0], fx.Node) and (
            node.target is operator.getitem or node.target in tables.VIEWS_IN_PRACTICE
            or isinstance(node.target, torch._ops.OpOverload) and node.target.is_view):
        node = node.args[0]
    return node


def _size_args(graph: fx.Graph, node: fx.Node) -> list:
    """`node`'s sizes as graph arguments: a symbolic one is read from `node` itself (a
    sym_size node), since no other node need hold that size."""
    args = []
    for d, size in enumerate(node.meta["val"].shape):
        if is_size(size) and size.node.maybe_as_int() is None:
            size_node = graph.call_function(torch.ops.aten.sym_size.int, (node, d))
            size_node.meta["val"] = size
            size = size_node
        args.append(size)
    return args


def _is_view_op(node: Any) -> bool:
    return isinstance(node, fx.Node) and isinstance(node.target, torch._ops.OpOverload) \
        and node.target.is_view and isinstance(node.meta.get("val"), torch.Tensor)


# ---- the merged function (trace time) -----------------------------------------------------

def analyze_merged(graph_fn: Callable, inputs: Sequence[torch.Tensor], fakes: list, fake_mode,
                   box: Any, aliasing: InputAliasing) -> tuple[Callable, list, FunctionInfo]:
    """The function taking the groups' bases too, its fake inputs, and its analysis."""
    merged = merge_aliased_inputs(graph_fn, aliasing, len(inputs), box)
    devices = [inputs[g.members[0].input].device for g in aliasing.groups]
    fakes = fakes + base_fakes(fake_mode, aliasing, devices)
    is_leaf = [getattr(t, "is_leaf", True) for t in inputs]  # sizes are leaves
    is_leaf += [g.base_is_leaf for g in aliasing.groups]
    info = analysis.analyze(merged, fakes, is_leaf, box, fake_mode)
    return merged, fakes, with_first_pass_versions(info, aliasing)


def merge_aliased_inputs(graph_fn: Callable, aliasing: InputAliasing, num_inputs: int,
                         box: Any) -> Callable:
    """`graph_fn` as a function of its inputs plus one base per group: members are read as
    views of a copy of their base, and mutated members receive their new value."""
    groups = aliasing.groups

    def merged(*args):
        inputs, bases = list(args[:num_inputs]), args[num_inputs:]
        views = list(inputs)
        box.input_aliases = []  # read by analysis: these tensors are the inputs they stand for
        for k, (group, base) in enumerate(zip(groups, bases)):
            copy = base.clone()  # the base itself stays intact for the gradient taken for it
            box.input_aliases.append((copy, num_inputs + k))
            for m in group.members:
                views[m.input] = member_view(copy, m)
                box.input_aliases.append((views[m.input], m.input))
        outs = graph_fn(*views)
        for m in (m for g in groups for m in g.members if m.mutated):
            with torch.no_grad() if m.mutation_hidden_from_autograd else contextlib.nullcontext():
                inputs[m.input].copy_(views[m.input])
        return outs

    return merged


def member_view(base: torch.Tensor, m: Member) -> torch.Tensor:
    """Member `m` as a view of `base`. `as_strided` comes first in the view chain: it is the
    one place functionalization accepts it when the member is mutated."""
    if base.dtype == m.dtype:
        view = base.as_strided(*m.geometry)
    else:
        view = base.as_strided(*_in_units_of(m, base.dtype)).view(m.dtype)
    # The bits last: as_strided of a plain base reads the memory; they say how to read it.
    view = view.conj() if m.conj else view
    view = torch._neg_view(view) if m.neg else view
    # A member made under no_grad from a base that requires grad does not require it.
    return view.detach() if base.requires_grad and not m.requires_grad else view


def _in_units_of(m: Member, dtype: torch.dtype) -> Geometry:
    """The geometry, in `dtype` elements, of the memory member `m` views; `view(m.dtype)`
    then makes it the member (so its last dimension must be contiguous)."""
    size, stride, offset = m.geometry
    own, other = m.dtype.itemsize, dtype.itemsize
    scaled = [*(s * own for s in stride[:-1]), size[-1] * own if size else own, offset * own]
    if not size or (stride[-1] != 1 and size[-1] > 1) or any(v % other for v in scaled):
        raise RuntimeError(f"a {m.dtype} view of geometry {m.geometry} is not a view of a "
                           f"{dtype} tensor")
    return ((*size[:-1], scaled[-2] // other), (*(v // other for v in scaled[:-2]), 1),
            scaled[-1] // other)


def base_fakes(fake_mode, aliasing: InputAliasing, device_of: Sequence[torch.device]) -> list:
    """A fake of each group's base; the members must be views of it (checked here, so that
    a layout the base cannot view is refused before tracing)."""
    fakes = []
    for group, device in zip(aliasing.groups, device_of):
        size, stride, _ = group.base_geometry
        with fake_mode:
            fake = torch.empty_strided(size, stride, dtype=group.base_dtype, device=device)
            try:
                for m in group.members:
                    member_view(fake, m)
            except RuntimeError as e:
                raise aliased_mutation_error([m.input for m in group.members],
                                             f"their layouts cannot be views of one base ({e}).")
        fakes.append(fake.requires_grad_(group.base_requires_grad))
    return fakes


def with_first_pass_versions(info: FunctionInfo, aliasing: InputAliasing) -> FunctionInfo:
    """The merged function mutates members by one `copy_`; how far the user's mutations
    advance the version counter (not at all through .data) is what the first analysis saw."""
    inputs = list(info.inputs)
    for m in (m for g in aliasing.groups for m in g.members if m.mutated):
        inputs[m.input] = dataclasses.replace(inputs[m.input], version_bumps=m.version_bumps)
    return dataclasses.replace(info, inputs=tuple(inputs))


def mark_bases_overwritten(gm: torch.fx.GraphModule, aliasing: InputAliasing | None) -> None:
    """The runtime writes into a base's memory after the forward (through the members):
    a partitioner must not save it for the backward."""
    if aliasing is None or not aliasing.groups:
        return
    primals = primals_of(gm.graph)
    for node in primals[len(primals) - len(aliasing.groups):]:
        node.meta[OVERWRITTEN] = True


# ---- helpers ------------------------------------------------------------------------------

def _root(t: torch.Tensor) -> torch.Tensor:
    return t._base if t._base is not None else t


def _sharing(inputs: Sequence[torch.Tensor]) -> list[int]:
    """Two inputs on one storage."""
    first: dict[int, int] = {}
    for i, k in enumerate(storage_keys(inputs)):
        j = first.setdefault(k, i)
        if j != i:
            return [j, i]
    return []


def _first_difference(observed: tuple[int, ...], expected: tuple[int, ...]) -> list[int]:
    """Two inputs whose sharing changed (any two sharing a storage, if only offsets did)."""
    for i, (o, e) in enumerate(zip(observed, expected)):
        if o != e:
            return sorted({i, min(o, e)})
    return [i for i, c in enumerate(observed) if observed.count(c) > 1][:2]
