"""Buffers a compiled function updates in place from their own value (a spectral norm's
power iteration): a double backward's replay (double_backward.py) runs after the call, on the
inputs as they are then, so the forward holds a copy of the old value of each buffer whose
old value its outputs read. Decided once, from the compiled forward graph."""

from __future__ import annotations

import operator

from torch import fx

from ..schema import FunctionInfo
from ..tables import RUNNING_STATS_REACH


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
        reached = _reached_from(placeholders[i])
        if reached & outputs:
            read.append(i)
        elif not reached & saved:
            unread.append(i)
    return tuple(read), tuple(unread)


def _reached_from(source: fx.Node) -> set[fx.Node]:
    """The nodes of a functional graph whose value depends on `source`'s (its users,
    transitively, through only the outputs of a batch norm its running statistics reach)."""
    reached: set[fx.Node] = set()
    stack = [source]
    while stack:
        node = stack.pop()
        if node in reached:
            continue
        reached.add(node)
        for user in node.users:
            stack.extend(_reached_users(user, node))
    return reached


def _reached_users(user: fx.Node, node: fx.Node) -> list[fx.Node]:
    entry = RUNNING_STATS_REACH.get(user.target)
    if entry is None:
        return [user]
    stats, training, outputs = entry
    if user.args[training] is not True or any(
            a is node for k, a in enumerate(user.args) if k not in stats):
        return [user]
    return [g for g in user.users if g.target is operator.getitem and g.args[1] in outputs]
