"""The order in which eager's engine runs the AccumulateGrad tasks that one node readies.

The engine's ready queue is a `std::priority_queue` (a binary heap, libstdc++'s) ordered by
sequence number, and every AccumulateGrad task has the top one: among those one node
pushes (in the order of its outputs), the heap, not the push order, decides which runs
first: 0, 2, 1, 3 for four (`pop_order`). `mark_pushes` notes, on the captured program,
what else the node pushed between them (other nodes' tasks, of lower priority: they change
the heap's shape), and `eager_order` replays those pushes. Assumed: nothing else was queued
(an aotgrad region's node, readying every parameter, is the last node of most backwards).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

from torch import fx

from . import hooks
from ..schema import ENGINE_NODE, READY, READY_QUEUE


@functools.lru_cache(maxsize=None)
def pop_order(k: int) -> tuple[int, ...]:
    """The pops of a libstdc++ heap of k equal items pushed as 0..k-1 (equal pushes never
    sift up)."""
    heap, popped = list(range(k)), []
    while heap:
        popped.append(heap[0])
        last = heap.pop()
        if heap:
            _fill_root(heap, last)
    return tuple(popped)


def _fill_root(heap: list, last: int) -> None:
    """std::__adjust_heap on equal items: the root's hole moves down, always to the right
    child (a left one only last, where the heap's size is even), and `last` fills it."""
    n, hole, child = len(heap), 0, 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child], child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child - 1], child - 1
    heap[hole] = last


def eager_order(group: list) -> list:
    """The accumulations one node readied (in its outputs' order), in eager's order."""
    pushes = {acc.meta.get(READY_QUEUE, (None,))[0] for acc in group}
    if len(pushes) != 1 or None in pushes:
        return [group[i] for i in pop_order(len(group))]
    kinds = pushes.pop()
    at = {acc.meta[READY_QUEUE][1]: acc for acc in group}
    # Another node's task ranks below any AccumulateGrad; among them (rarely compared),
    # a later output is taken as a later-made node (a higher sequence number).
    ranks = [math.inf if kind else k for k, kind in enumerate(kinds)]
    order = [k for k in heap_pops(ranks) if k in at]
    return [at[k] for k in order] if len(order) == len(group) else group


def heap_pops(ranks: list) -> list[int]:
    """The indices of `ranks`, pushed in order onto a libstdc++ max-heap, as it pops them."""
    heap: list[tuple[float, int]] = []
    for item in enumerate(ranks):
        heap.append(None)
        _sift_up(heap, len(heap) - 1, (item[1], item[0]))
    popped = []
    while heap:
        popped.append(heap[0][1])
        last = heap.pop()
        if heap:
            _sift_up(heap, _hole_down(heap), last)
    return popped


def _sift_up(heap: list, hole: int, item: tuple) -> None:
    parent = (hole - 1) // 2
    while hole > 0 and heap[parent][0] < item[0]:
        heap[hole], hole = heap[parent], parent
        parent = (hole - 1) // 2
    heap[hole] = item


def _hole_down(heap: list) -> int:
    """std::__adjust_heap's descent of the root's hole: to the larger child (the right one
    where they tie)."""
    n, hole, child = len(heap), 0, 0
    while child < (n - 1) // 2:
        child = 2 * (child + 1)
        if heap[child][0] < heap[child - 1][0]:
            child -= 1
        heap[hole], hole = heap[child], child
    if n % 2 == 0 and child == (n - 2) // 2:
        child = 2 * (child + 1)
        heap[hole], hole = heap[child - 1], child - 1
    return hole


def mark_pushes(program: fx.Graph) -> None:
    """READY_QUEUE on each accumulation whose gradient is one output of a node (not a sum)."""
    found = {acc: _output_of(acc.args[1]) for acc in
             program.find_nodes(op="call_function", target=hooks.accumulate_into)}
    taken = {where: acc for acc, where in found.items() if where is not None and
             acc.meta.get(READY) == where[0].meta.get(ENGINE_NODE)}
    for (validated, index), acc in taken.items():
        kinds = tuple(_pushed(validated, k, taken) for k in range(len(validated.args[1])))
        acc.meta[READY_QUEUE] = (tuple(k for k in kinds if k is not None),
                           sum(k is not None for k in kinds[:index]))


def _output_of(grad: Any) -> tuple[fx.Node, int] | None:
    """(the node's `validate_outputs` call, the output) a gradient is, through hooks."""
    found = made_by(grad)
    return found if found is not None and found[1] is not None else None


def made_by(grad: Any) -> tuple[fx.Node, int | None] | None:
    """What made a gradient whole, through the hooks on its way: (a node's
    `validate_outputs` call, its output), or (the sum of two contributions, None)."""
    while isinstance(grad, fx.Node):
        if grad.target is hooks.add_gradients:
            return grad, None
        if grad.target is operator.getitem:
            source = grad.args[0]
            if source.target is hooks.call_formula and source.args[0] == "validate_outputs":
                return source, grad.args[1]
            grad = source
        elif grad.target in GRADIENT_ARG:
            grad = GRADIENT_ARG[grad.target](grad.args)
        else:
            return None
    return None


def _pushed(validated: fx.Node, index: int, taken: dict) -> bool | None:
    """What the node pushed for output `index`: True an AccumulateGrad, False another node's
    task, None nothing (no gradient, or one that another node's contribution completes)."""
    if (validated, index) in taken:
        return True
    reads = [u for u in validated.users if u.target is operator.getitem and u.args[1] == index]
    users = [u for read in reads for u in read.users]
    if validated.args[1][index] is None or not users:
        return None
    node = validated.meta.get(ENGINE_NODE)
    if any(u.target is hooks.add_gradients and u.meta.get(ENGINE_NODE) != node for u in users):
        return None
    return False


# The gradient an AccumulateGrad node's hook passes on.
GRADIENT_ARG = {
    hooks.run_tensor_hook: lambda args: args[1],
    hooks.run_cpp_tensor_hooks: lambda args: args[1],
    hooks.run_node_pre_hook: lambda args: args[1][0],
}
