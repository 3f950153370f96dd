"""Inputs a compiled function updates in place, and a double backward's replay
(double_backward.py), which runs after the call, on the inputs as they are then.

- A buffer updated from its own value (a spectral norm's power iteration): the forward holds
  a copy of its old value where its outputs read it (`old_values_read`, decided once, from
  the compiled forward graph).
- Any other mutated input whose old value the gradients read: the replay is refused
  (`refuse_old_values_of_mutated_inputs`, from the replay's graph).

Both ask what a node's value reaches in a graph (`reached_from`): the functional forward
graph, or the replay's, whose in-place ops write memory other nodes read.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from ..schema import FunctionInfo
from ..tables import STATS_UPDATED_AS_OUTPUTS, UNREAD_WHEN_TRAINING, VIEWS_IN_PRACTICE, written_arguments


def with_old_values(inputs: tuple, old_values: tuple[int, ...]) -> tuple:
    inputs = list(inputs)
    for i in old_values:
        inputs[i] = inputs[i].detach().clone()
    return tuple(inputs)


def old_values_read(forward: fx.GraphModule, num_fw_outputs: int,
                    info: FunctionInfo) -> tuple[tuple, tuple]:
    """The data-mutated inputs without history: those whose old value reaches the user's
    outputs in the (functional) forward graph, and those whose old value reaches nothing it
    returns or saves but their own new value. A replay runs on the inputs after the call:
    it needs the old value of the first (the forward holds a copy: a spectral norm's
    vector), and may ignore that of the second, which only a write in the replay's
    unfunctionalized ops seems to read (BatchNorm's running statistics, a buffer
    overwritten by `out=`). Others (read by saved values only) are left to the replay's
    own check."""
    placeholders = list(forward.graph.find_nodes(op="placeholder"))
    results = forward.graph.output_node().args[0]
    first = len(info.data_mutated_inputs)
    outputs = {r for r in results[first:num_fw_outputs] if isinstance(r, fx.Node)}
    saved = {r for r in results[num_fw_outputs:] if isinstance(r, fx.Node)}
    read, unread = [], []
    for i in info.data_mutated_inputs:
        x = info.inputs[i]
        if i >= len(placeholders) or x.requires_grad or x.mutates_metadata:
            continue
        reached = reached_from(placeholders[i])
        if reached & outputs:
            read.append(i)
        elif not reached & saved:
            unread.append(i)
    return tuple(read), tuple(unread)


def refuse_old_values_of_mutated_inputs(graph: fx.Graph, info: FunctionInfo,
                                        exempt: tuple[int, ...] = ()) -> None:
    """The inputs a replay gets hold their values after the call, but for those `exempt`
    (old_values_read); refuse where the gradients depend on the value before a mutation by
    the function."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, (node, x) in enumerate(zip(placeholders, info.inputs)):
        if x.mutated and i not in exempt and graph.output_node() in reached_from(node):
            raise NotImplementedError(
                f"aotgrad: double backward (create_graph=True) through a compiled function "
                f"that mutates input {i} (shape {list(node.meta['val'].shape)}) in place is "
                "not supported when the gradients depend on its old value (e.g. BatchNorm's "
                "running statistics in training mode): the input now holds the new value. "
                "Move the mutation out of the compiled function.")


def reached_from(source: fx.Node) -> set[fx.Node]:
    """Every node whose value may depend on `source`'s: its users, transitively, and every
    reader of memory that a reached in-place op writes (views of one storage alias). A
    batch norm in training mode that `source` enters only as running statistics reaches
    only its updated statistics (in a functional graph, the outputs that return them)."""
    reached: set[fx.Node] = set()
    aliases = _Aliases(source.graph)
    stack = [source]
    while stack:
        node = stack.pop()
        if node in reached:
            continue
        reached.add(node)
        for user in node.users:
            stack.extend(_reached_through(user, node))
        for written in _written_args(node):
            stack.extend(aliases.members_of(written))
    return reached


def _reached_through(user: fx.Node, node: fx.Node) -> list[fx.Node]:
    if not _unread_by(user, node):
        return [user]
    outputs = STATS_UPDATED_AS_OUTPUTS.get(user.target, ())
    return [g for g in user.users if g.target is operator.getitem and g.args[1] in outputs]


def _unread_by(user: fx.Node, node: fx.Node) -> bool:
    """`user` takes `node` only as arguments whose values it does not read (tables.py)."""
    entry = UNREAD_WHEN_TRAINING.get(user.target)
    if entry is None or node in user.kwargs.values():
        return False
    names, training = entry
    if training is not None and user.args[training] is not True:
        return False
    schema = user.target._schema.arguments
    return all(schema[k].name in names for k, a in enumerate(user.args) if a is node)


class _Aliases:
    """The nodes sharing each storage: found on first use, since a functional graph (the
    forward's) writes nothing and never asks."""

    def __init__(self, graph: fx.Graph):
        self._graph = graph
        self._roots: dict[fx.Node, fx.Node] | None = None
        self._members: dict[fx.Node, list[fx.Node]] = {}

    def members_of(self, node: fx.Node) -> list[fx.Node]:
        if self._roots is None:
            self._roots = _alias_roots(self._graph)
            for member, root in self._roots.items():
                self._members.setdefault(root, []).append(member)
        return self._members.get(self._roots.get(node, node), [])


def _alias_roots(graph: fx.Graph) -> dict[fx.Node, fx.Node]:
    """Each node's storage root: the first node of its chain of views and in-place results."""
    roots: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        base = node.args[0] if _aliases_first_arg(node) else None
        roots[node] = roots.get(base, base) if isinstance(base, fx.Node) else node
    return roots


def _aliases_first_arg(node: fx.Node) -> bool:
    target = node.target
    if node.op != "call_function" or not node.args:
        return False
    if target is operator.getitem:
        return isinstance(node.args[0], fx.Node) and _aliases_first_arg(node.args[0])
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return (target.is_view or target in VIEWS_IN_PRACTICE
            or bool(returns) and returns[0].alias_info is not None)


def _written_args(node: fx.Node) -> list[fx.Node]:
    return [v for v in written_arguments(node.target, node.args, node.kwargs)
            if isinstance(v, fx.Node)]
