"""How each user output of a compiled call is obtained from its inputs, the graph's results
and the outputs before it: computed by the graph, a constant, an input, or a view rebuilt
from its base (an input, an intermediate the graph returns, an earlier output), in the grad
and inference mode eager made it in, so that `_base`, `grad_fn`, version counters and later
in-place use behave as eager's. Decided once per plan (`output_order`); a call runs the getters.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..capture.analysis import regenerate_view
from ..schema import FunctionInfo, Geometry, OutputInfo, OutputKind
from ..semantics.dynamic import SizeBindings, is_symbolic


def output_order(info: FunctionInfo, sizes: SizeBindings | None, repeated: tuple[int, ...]
                  ) -> list[tuple[int, Callable]]:
    """(output index, getter) with every base ahead of the views of it."""
    first = info.first_user_output
    first_base = first + len(info.outputs)
    rows = []
    for i, o in enumerate(info.outputs):
        k = first_base + o.source if o.kind is OutputKind.VIEW_OF_INTERMEDIATE else first + i
        get = _getter(o, k) if sizes is None else _symbolic_getter(o, k, sizes)
        get = _as_leaf(get) if o.made_leaf else get
        get = _detached(get) if i in repeated else get
        rows.append((_RANK.get(o.kind, 0), i, get))
    return [(i, get) for _, i, get in sorted(rows, key=lambda row: row[:2])]


def _detached(get: Callable) -> Callable:
    return lambda inputs, raw, outs: get(inputs, raw, outs).detach()


def _as_leaf(get: Callable) -> Callable:
    """The output was made a leaf that requires grad inside the function."""
    return lambda inputs, raw, outs: get(inputs, raw, outs).requires_grad_()


_RANK = {OutputKind.VIEW_OF_INPUT: 1, OutputKind.VIEW_OF_INTERMEDIATE: 1,
         OutputKind.VIEW_OF_OUTPUT: 1, OutputKind.SAME_AS_OUTPUT: 2}


def _getter(o: OutputInfo, k: int | None) -> Callable[[list, list, list], Any]:
    """How output `o` is obtained from the inputs, the graph's results and earlier outputs."""
    kind, src = o.kind, o.source
    if kind is OutputKind.PLAIN and o.detached_from is not None:
        return lambda inputs, raw, outs: detached_alias(inputs[o.detached_from], o.geometry)
    if kind is OutputKind.PLAIN and o.made_in_inference_mode:
        return lambda inputs, raw, outs: as_inference_tensor(raw[k])
    if kind is OutputKind.PLAIN:
        return lambda inputs, raw, outs: raw[k]
    if kind is OutputKind.CONSTANT:
        return lambda inputs, raw, outs: o.constant
    if kind is OutputKind.INPUT:
        return lambda inputs, raw, outs: inputs[src]
    if kind is OutputKind.VIEW_OF_INPUT:
        return lambda inputs, raw, outs: regenerate_view(o, _input_base(o, inputs[src]))
    if kind is OutputKind.VIEW_OF_INTERMEDIATE:
        return lambda inputs, raw, outs: regenerate_view(o, intermediate_base(o, raw[k]))
    if kind is OutputKind.VIEW_OF_OUTPUT:
        return lambda inputs, raw, outs: regenerate_view(o, outs[src])
    return lambda inputs, raw, outs: outs[src]  # SAME_AS_OUTPUT


def detached_alias(source: torch.Tensor, geometry: Geometry) -> torch.Tensor:
    """The output over `source`'s memory, as eager's `source.detach()` returns it: no view,
    sharing `source`'s version counter (a graph's alias of its input shares neither; where
    the graph wrote the input, or a backend copied, its value is not even over it)."""
    return source.detach().as_strided(*geometry).detach()


def _input_base(o: OutputInfo, x: torch.Tensor) -> torch.Tensor:
    return x.detach() if o.detached_base else x


def intermediate_base(o: OutputInfo, base: torch.Tensor) -> torch.Tensor:
    """The base of view `o` as the graph returned it, detached where eager's does not
    require grad (a view of it made with grad on would, or one made under no_grad would
    have no grad_fn): Inductor returns `x.detach()` as the input `x` itself."""
    if base.requires_grad and not (o.requires_grad or o.made_without_grad):
        return base.detach()
    return base


def as_inference_tensor(t: torch.Tensor) -> torch.Tensor:
    """`t` as an inference tensor over the same memory (eager's refuses autograd and,
    outside inference_mode, in-place changes). Dynamo's call under inference_mode made one."""
    if t.is_inference():
        return t
    with torch.inference_mode():
        alias = torch.empty(0, dtype=t.dtype, device=t.device)
        return alias.set_(t.untyped_storage(), t.storage_offset(), t.size(), t.stride())


def _symbolic_getter(o: OutputInfo, k: int | None, sizes: SizeBindings) -> Callable:
    """`_getter`, for a view or a constant (a `torch.Size`) that holds symbolic sizes: their
    values are those of each call."""
    if o.kind is OutputKind.CONSTANT and is_symbolic(o.constant):
        return lambda inputs, raw, outs: sizes.concrete(inputs, raw)(o.constant)
    if o.detached_from is not None and is_symbolic(o.geometry):
        return lambda inputs, raw, outs: detached_alias(
            inputs[o.detached_from], sizes.concrete(inputs, raw)(o.geometry))
    if o.kind not in _VIEWS:
        return _getter(o, k)
    src = o.source
    base = {OutputKind.VIEW_OF_INPUT: lambda inputs, raw, outs: _input_base(o, inputs[src]),
            OutputKind.VIEW_OF_INTERMEDIATE:
                lambda inputs, raw, outs: intermediate_base(o, raw[k]),
            OutputKind.VIEW_OF_OUTPUT: lambda inputs, raw, outs: outs[src]}[o.kind]
    return lambda inputs, raw, outs: regenerate_view(o, base(inputs, raw, outs),
                                                     sizes.concrete(inputs, raw))


_VIEWS = (OutputKind.VIEW_OF_INPUT, OutputKind.VIEW_OF_INTERMEDIATE, OutputKind.VIEW_OF_OUTPUT)
