"""The backward's schedule: recomputed forward values run just before their first use.

In joint order the values a backward recomputes would all run, and be alive, at its start;
moved down to their readers they live only across their span. The forward's narrowing copies
move the other way, up to just after what they read (`remat.hoist_narrow_copies`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from torch import fx

from ..tables import Recompute, recompute_class


def backward_schedule(nodes: Sequence[fx.Node], forward: set[fx.Node]) -> list[fx.Node]:
    """The backward's ops in the order they run: recomputed forward values, and views (which
    cost nothing), just before their first use. A view taken early (autograd's aliases of
    saved values come first in the joint graph) would pull its recomputed base to the start."""
    return just_in_time_order(nodes, lambda n: n in forward or is_view(n))


def is_view(node: fx.Node) -> bool:
    return node.op == "call_function" and recompute_class(node.target) == Recompute.FREE


def just_in_time_order(nodes: Sequence[fx.Node], recomputed: Callable[[fx.Node], bool]
                       ) -> list[fx.Node]:
    """`nodes` (topologically ordered) with every recomputed node moved down to just
    before the first node that needs it (or to the end, if only the outputs need it); the
    others keep their order."""
    members = set(nodes)
    late = {n for n in nodes if recomputed(n)}
    order: list[fx.Node] = []
    placed: set[fx.Node] = set()
    for node in nodes:
        if node not in late:
            _place(node, late, placed, order)
    for node in nodes:
        if node not in placed:
            _place(node, late, placed, order)
    assert len(order) == len(members)
    return order


def _place(node: fx.Node, late: set, placed: set, order: list) -> None:
    """Append `node` after the late nodes it still lacks (iterative post-order)."""
    stack = [(node, False)]
    while stack:
        current, ready = stack.pop()
        if current in placed:
            continue
        if ready:
            placed.add(current)
            order.append(current)
            continue
        stack.append((current, True))
        stack.extend((i, False) for i in reversed(current.all_input_nodes)
                     if i in late and i not in placed)


def as_early_as_possible(nodes: Sequence[fx.Node], early: set[fx.Node]) -> list[fx.Node]:
    """`nodes` (topologically ordered) with each of `early` moved up to just after the last
    of its inputs; the others keep their order."""
    missing = {node: len(set(node.all_input_nodes)) for node in early}
    readers: dict[fx.Node, list[fx.Node]] = {}
    for node in nodes:  # in graph order, not the set's: the order made is deterministic
        if node in early:
            for i in dict.fromkeys(node.all_input_nodes):
                readers.setdefault(i, []).append(node)
    order: list[fx.Node] = []
    for node in nodes:
        if node in early:
            continue
        stack = [node]
        while stack:
            current = stack.pop()
            order.append(current)
            for reader in readers.get(current, ()):
                missing[reader] -= 1
                if not missing[reader]:
                    stack.append(reader)
    assert len(order) == len(nodes), "as_early_as_possible: an early node reads no node"
    return order
