"""What a call writes into the caller's tensors beyond the graphs' outputs, as eager would
have: input mutations after the forward (new data, metadata, storages), writes a backward
makes into inputs, and the version counters eager's in-place ops would have left."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..schema import FunctionInfo, InputInfo
from ..semantics import swaps
from ..semantics.dynamic import SizeBindings


@dataclass(frozen=True)
class BackwardWrites:
    """Inputs the backward writes into in place (a custom Function's backward zeroing a
    tensor saved on ctx). Eager changes the caller's tensors when that backward runs: the
    backward graph returns their new values after the gradients, and the runtime copies them
    in then, bumping each version counter as eager's in-place ops would."""

    inputs: tuple[int, ...]  # graph input indices
    version_bumps: tuple[int, ...]  # per input: eager's in-place ops on it in the backward
    num_grads: int  # the backward's outputs before the new values: one per graph input

    def hold(self, ctx, inputs: Sequence[torch.Tensor]) -> None:
        ctx.written = [inputs[i] for i in self.inputs]

    def apply(self, ctx, outs: Sequence) -> Sequence:
        """Copy the new values in, with eager's version counters; the gradients."""
        versions = [t._version for t in ctx.written]
        grads = self.copy_in(ctx, outs)
        _set_version_counters(ctx.written, [v + n for v, n in zip(versions, self.version_bumps)])
        return grads

    def copy_in(self, ctx, outs: Sequence) -> Sequence:
        """Copy the new values in (what a tracer such as Dynamo can record); the gradients."""
        with torch.no_grad():  # as eager's backward runs (create_graph=True is refused)
            for t, value in zip(ctx.written, outs[self.num_grads:]):
                t.copy_(value)
        return outs[:self.num_grads]

    def refuse_create_graph(self) -> None:
        """As torch's AOTAutograd does: with grad mode on, a write into an input would have
        to be recorded by autograd, and the replay of the backward cannot (RuntimeError)."""
        raise RuntimeError(
            f"aotgrad: the backward mutates inputs {list(self.inputs)} in place (a custom "
            "autograd.Function's backward writing into a tensor saved on ctx), which a "
            "backward with create_graph=True does not support. Run this backward with "
            "create_graph=False, or save a copy in the Function (ctx.save_for_backward("
            "t.clone())).")


def mutation_steps(info: FunctionInfo, copied_in_graph: tuple[int, ...],
                   sizes: SizeBindings | None) -> list[Callable]:
    """One step per mutated input: restore its metadata, then copy its new data in. Inputs
    set_() to another storage go first, while their sources keep their geometry.
    `copied_in_graph`: the inputs the graph itself writes."""
    steps = _swap_steps(info)
    data_index = {i: k for k, i in enumerate(info.data_mutated_inputs)}
    for i, x in enumerate(info.inputs):
        if x.storage_bytes is not None:  # first: the new values need the memory
            steps.append(_resize_storage(i, x.storage_bytes, x.version_bumps if
                                         x.mutates_data and x.storage_bytes == 0 else 0))
        if x.mutates_metadata:
            # Eager's in-place ops step the version counter once each: the copy of new data
            # counts them, else this step.
            bumps = 0 if x.mutates_data else x.version_bumps
            steps.append(_restore_metadata(i, x.final_geometry, x.mutation_hidden_from_autograd,
                                           sizes, bumps))
        # A storage freed at the end holds no value to copy (FSDP writes, then frees): only
        # the version counter shows the writes.
        if x.mutates_data and i not in copied_in_graph and x.storage_bytes != 0:
            steps.append(_copy_back(i, data_index[i], x.mutation_hidden_from_autograd,
                                    x.version_bumps))
    return steps


def _resize_storage(i: int, nbytes: int, bumps: int) -> Callable:
    """resize_storage_bytes_() as the function did (neither autograd nor the version counter
    sees it); `bumps`: the version counter's advance by writes whose values it drops."""
    def step(inputs, raw):
        inputs[i].untyped_storage().resize_(nbytes)
        if bumps:
            _set_version_counters([inputs[i]], [inputs[i]._version + bumps])
    return step


def _swap_steps(info: FunctionInfo) -> list[Callable]:
    from_graph = info.storages_from_graph
    first = info.num_graph_outputs - len(from_graph)  # the graph returns them last
    return [_swap_storage(i, x, first + from_graph.index(i) if i in from_graph else None)
            for i, x in enumerate(info.inputs) if x.storage_swap is not None]


def _swap_storage(i: int, x: InputInfo, k: int | None) -> Callable:
    """`set_()` input i to its new storage: another input's, or graph output k."""
    swap, bumps = x.storage_swap, x.version_bumps
    j = swap.source
    source = (lambda inputs, raw: raw[k]) if j is None else (lambda inputs, raw: inputs[j])

    def step(inputs, raw):
        version = inputs[i]._version
        swaps.set_storage(inputs[i], swap, source(inputs, raw))
        if bumps != 1:  # one per set_, and per in-place op on it after
            _set_version_counters([inputs[i]], [version + bumps])
    return step


def version_or_none(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version  # inference tensors have no counter


def set_versions(inputs, versioned: tuple[tuple[int, int], ...],
                  before: list[int | None]) -> tuple[tuple[int, int], ...]:
    """The graph wrote these inputs in place. Whether that moved their version counters
    depends on the backend (ATen's copy_ does, Inductor's kernels do not): set them to what
    eager's would read. Returns the entries that needed it, and those of inference tensors
    (None in `before`: no counter, so nothing learnt): a graph does the same each call."""
    wanted = [None if v is None else v + bumps for (_, bumps), v in zip(versioned, before)]
    wrong = [k for k, ((i, _), v) in enumerate(zip(versioned, wanted))
             if v is not None and inputs[i]._version != v]
    if wrong:
        _set_version_counters([inputs[versioned[k][0]] for k in wrong], [wanted[k] for k in wrong])
    return tuple(entry for k, entry in enumerate(versioned) if k in wrong or wanted[k] is None)


def _version_setter() -> Callable[[list, list], None]:
    set_counter = torch._C._autograd._unsafe_set_version_counter
    try:  # newer torch takes tuples of tensors and versions
        set_counter((torch.zeros(()),), (0,))
        return lambda tensors, versions: set_counter(tuple(tensors), tuple(versions))
    except TypeError:
        def one_by_one(tensors, versions):
            for t, v in zip(tensors, versions):
                set_counter(t, v)
        return one_by_one


_set_version_counters = _version_setter()


def _restore_metadata(i: int, geometry, hidden: bool, sizes: SizeBindings | None,
                      bumps: int) -> Callable:
    """`bumps`: how far the step moves the version counter."""
    if sizes is not None:  # symbolic geometry: evaluated for each call's sizes
        def step(inputs, raw):
            concrete = sizes.concrete(inputs, raw)(geometry)
            _set_geometry(inputs[i], concrete, _extent(concrete), hidden, bumps)
        return step
    extent = _extent(geometry)

    def step(inputs, raw):
        _set_geometry(inputs[i], geometry, extent, hidden, bumps)
    return step


def _extent(geometry) -> int:
    """Elements the geometry spans: more than the storage holds after a growing resize_."""
    size, stride, offset = geometry
    return offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1 if all(size) else 0


def _set_geometry(t: torch.Tensor, geometry, extent: int, hidden: bool, bumps: int) -> None:
    storage = t.untyped_storage()
    version = version_or_none(t)
    if storage.nbytes() < extent * t.element_size():
        storage.resize_(extent * t.element_size())  # as eager's resize_ does
    with _grad_hidden(hidden):
        t.as_strided_(*geometry)
    if version is not None and t._version != version + bumps:
        _set_version_counters([t], [version + bumps])


def _copy_back(i: int, k: int, hidden: bool, bumps: int) -> Callable:
    """`bumps`: eager's in-place ops on the input, each a step of its version counter; the
    copy is one."""
    if bumps == 1:
        def step(inputs, raw):
            with _grad_hidden(hidden):
                inputs[i].copy_(raw[k])
    elif bumps:
        def step(inputs, raw):
            version = inputs[i]._version
            with _grad_hidden(hidden):
                inputs[i].copy_(raw[k])
            _set_version_counters([inputs[i]], [version + bumps])
    else:  # a mutation through .data: invisible to the version counter as well
        def step(inputs, raw):
            if inputs[i].is_inference():  # no counter to preserve
                inputs[i].copy_(raw[k])
                return
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(inputs[i]):
                inputs[i].copy_(raw[k])
    return step


def _grad_hidden(hidden: bool):
    return torch.no_grad() if hidden else contextlib.nullcontext()
