"""Decompositions that keep eager's memory layout.

Some of Inductor's decompositions compute the right values in another layout than the op
they replace: `cat([x, x], 1)` of a channels-last `x` becomes `unsqueeze/expand/flatten/clone`,
contiguous; `channel_shuffle` and `max_unpool2d` of channels-last inputs, too. The traced
graph then says so, and the compiled function returned a contiguous tensor where eager
returns a channels-last one. Worse, a view the runtime rebuilds from such a value (an
`as_strided` of it, as eager made it) read other elements: silently wrong values.

Each decomposition is wrapped: where an argument is not contiguous (the only case seen to
diverge, which keeps a contiguous model's trace at one run per op), the op's own meta kernel
says what layout eager gives, and a dense result of another layout is copied into it.
Symbolic sizes and strides are compared by their values in the example inputs (`hint`, no
guard): a layout is an order of dimensions, the same at every size the graph serves, bar
dimensions of size one, whose strides do not matter.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import _disable_current_modes

from ..semantics.dynamic import hint
from ..semantics.inplace_layouts import contiguous_strides, memory_order, significant_strides


def keeping_layout(op: torch._ops.OpOverload, decomposition: Callable) -> Callable:
    """`decomposition`, its tensor results in the layout `op` itself gives them."""
    if not _returns_new_tensors(op):
        return decomposition

    @functools.wraps(decomposition)
    def decompose(*args, **kwargs):
        out = decomposition(*args, **kwargs)
        if out is NotImplemented or not _has_strided_arguments(args, kwargs):
            return out
        return _in_layouts(out, _eager_layouts(op, args, kwargs))
    return decompose


def _returns_new_tensors(op: Any) -> bool:
    """A functional op: a view's layout is its base's, and a write keeps its target's."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    schema = op._schema
    return not schema.is_mutable and not any(r.alias_info for r in schema.returns)


def _has_strided_arguments(args, kwargs) -> bool:
    tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    return any(t.layout is torch.strided and
               significant_strides(t) != contiguous_strides(t.shape) for t in tensors)


def _eager_layouts(op: torch._ops.OpOverload, args, kwargs) -> list | None:
    """Per tensor `op` itself returns on these fake arguments: its sizes, significant
    strides and (dense) dimension order, as plain ints; None where the meta kernel cannot
    say. Run outside the trace, and read there too: its symbolic sizes are no node of the
    trace, and arithmetic on them inside it fails ('not tracked with proxy')."""
    try:
        with _disable_current_modes():
            return [_layout(t) for t in pytree.tree_leaves(op(*args, **kwargs))]
    except Exception:  # no meta kernel, or one that needs the trace's modes: keep the result
        return None


def _layout(t: Any) -> tuple | None:
    if not isinstance(t, torch.Tensor) or t.layout is not torch.strided or \
            not torch._prims_common.is_non_overlapping_and_dense_or_false(t):
        return None
    return _hints(t.shape), significant_strides(t), memory_order(t)


def _in_layouts(out: Any, layouts: list | None) -> Any:
    flat, spec = pytree.tree_flatten(out)
    if layouts is None or len(layouts) != len(flat):
        return out
    return pytree.tree_unflatten([_restrided(o, w) for o, w in zip(flat, layouts)], spec)


def _restrided(t: Any, layout: tuple | None) -> Any:
    """`t` copied into `layout`, a dense layout of its shape whose strides differ from `t`'s
    along some dimension longer than one."""
    if layout is None or not isinstance(t, torch.Tensor):
        return t
    sizes, significant, order = layout
    if _hints(t.shape) != sizes or significant_strides(t) == significant:
        return t
    inverse = sorted(range(t.dim()), key=order.__getitem__)
    # clone, not contiguous(): asking whether a symbolic tensor is contiguous adds guards
    dense = t.permute(order).clone(memory_format=torch.contiguous_format)
    return dense.permute(inverse)


def _hints(sizes) -> tuple:
    return tuple(hint(n) for n in sizes)
