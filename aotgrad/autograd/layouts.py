"""The layout of what a Python call hands the traced ops of a specialized graph.

A hook, an opaque custom backward, a replayed region's backward return tensors of any
strides, but the ATen ops after them were traced on stand-ins of one layout, dense: a
`view` traced for a contiguous gradient fails on a transposed one, and Inductor's code
reads memory by the traced strides. `restride_effect_results` copies such a result into
the traced layout where it differs (a check of its strides where it does not).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

from . import hooks


def restride_effect_results(graph: fx.Graph) -> None:
    """Each tensor a Python call returns, as its ATen readers read it: in its stand-in's
    layout. Python readers (another hook, `.grad` accumulation) and the graph's outputs
    (`autograd.grad`'s results) take it as it is, as in eager."""
    for node in list(graph.nodes):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not from_effect(node):
            continue
        traced = hooks.traced_users(node)
        order = dims_outer_to_inner(value)
        if not traced or order is None:
            continue
        with graph.inserting_after(node):
            restrided = graph.call_function(hooks.in_layout, (node, order))
        restrided.meta = dict(node.meta)
        for user in traced:
            user.replace_input_with(node, restrided)


def from_effect(node: fx.Node) -> bool:
    """Is this a Python call's result (or an item of one), not yet restrided?"""
    if node.target is hooks.in_layout:
        return False
    if node.target in hooks.EFFECTS:
        return True
    return node.target is operator.getitem and from_effect(node.args[0])


def dims_outer_to_inner(value: torch.Tensor) -> tuple[int, ...] | None:
    """The order of a stand-in's dims in memory; None where it is not dense (overlapping or
    with gaps: no order says how to copy into it). Read from its sizes' hints: the order
    only decides how a result is copied (its values are kept)."""
    sizes, strides = _hints(value.shape), _hints(value.stride())
    order = tuple(sorted(range(value.dim()), key=lambda d: -strides[d]))
    dense = hooks.dense_strides(sizes, order)
    if [s for s, n in zip(strides, sizes) if n > 1] != [s for s, n in zip(dense, sizes) if n > 1]:
        return None
    return order


def _hints(values: Any) -> list[int]:
    return [v.node.hint if isinstance(v, torch.SymInt) else v for v in values]
