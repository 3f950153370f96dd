"""Common subexpressions: one node for each pure computation the graph repeats.

Traced code repeats itself: a model that builds the same attention mask in every layer, a
decomposition that compares the labels to `ignore_index` three times. Left alone, each copy
is a buffer of its own, and the partitioner may save twelve equal masks for the backward.

Only pure ops merge: no random draws, no mutation, no error checks, nothing aotgrad does
not know. Outputs, and views of them, never do, since two of eager's tensors must not become
one. Other views merge where nothing in the graph writes (a write through one of two equal
views is seen by the other only if they stay two): DeBERTa views its shared relative positions
again in each layer, and every op after those views repeated with them (12 copies of each
position clamp in its forward, GPU kernels and compile time for each). And
only within one side of a joint graph: the backward part holds the second run of
a checkpointed region, and merging it into the forward would undo the checkpoint. Nodes under
different checkpoint policies stay apart too. One kind crosses, where no policy holds it: a
normalized value, which the partitioner may then save rather than rebuild.
"""

from __future__ import annotations

import operator
from typing import Any, Hashable

import torch
from torch import fx

from ..tables import (ERROR_CHECKS, UNINITIALIZED, Recompute, broadcasts_statistics,
                      recompute_class)


def eliminate_common_subexpressions(gm: fx.GraphModule, forward: set[fx.Node] | None = None
                                    ) -> fx.GraphModule:
    """Merge repeated pure nodes in place. `forward` splits a joint graph into its sides."""
    seen: dict[Hashable, fx.Node] = {}
    views_merge = not any(_is_mutable(n.target) for n in gm.graph.nodes)
    for node in list(gm.graph.nodes):
        key = _key(node, forward, views_merge)
        if key is None:
            continue
        first = seen.setdefault(key, node)
        if first is not node:
            node.replace_all_uses_with(first)
            gm.graph.erase_node(node)
    gm.recompile()
    return gm


def _key(node: fx.Node, forward: set[fx.Node] | None, views_merge: bool) -> Hashable | None:
    if node.op != "call_function" or not _is_pure(node.target) or _written(node):
        return None
    if (recompute_class(node.target) == Recompute.FREE and not views_merge) \
            or _reaches_output(node):
        return None  # merging would make two of eager's tensors one (aliases, outputs)
    policy = node.meta.get("recompute")
    # A normalized value (`broadcasts_statistics`) crosses: the partitioner may then save it
    # for a norm's backward formula, which computes it again (partition/remat.py).
    normalized = not policy and broadcasts_statistics(node)
    side = None if normalized else (forward is None or node in forward)
    try:
        key = (node.target, _frozen(node.args), _frozen(node.kwargs), side, policy,
               node.meta.get("ac_graph_id"))
        hash(key)
    except TypeError:  # an argument with no value identity (a tensor constant, a list of them)
        return None
    return key


def _is_pure(target) -> bool:
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not (torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable
                or target in ERROR_CHECKS or target in UNINITIALIZED)


def _is_mutable(target) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _reaches_output(node: fx.Node) -> bool:
    """Is this value, or a view of it, a graph output (a result or a gradient the user
    holds as a tensor of its own)?"""
    stack = [node]
    while stack:
        for user in stack.pop().users:
            if user.op == "output":
                return True
            if user.op == "call_function" and recompute_class(user.target) == Recompute.FREE:
                stack.append(user)
    return False


def _written(node: fx.Node) -> bool:
    """Does an in-place op write into this value (a graph that keeps some mutations)?"""
    return any(_is_mutable(u.target) for u in node.users)


def _frozen(value: Any) -> Hashable:
    """Arguments as a hashable value; nodes compare by identity, which is what we want
    once their own duplicates have been replaced (nodes are visited in order)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, *map(_frozen, value))
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise TypeError("no value identity")
    if isinstance(value, float):  # -0.0 == 0.0 and nan != nan: compare the spelling
        return (float, repr(value))
    return (type(value), value)
