"""Rematerialization: save the fewest bytes for the backward, recomputing cheap values.

The saved set is a minimum cut of the joint graph. Every forward value `v` becomes an edge
`v.in -> v.out` whose capacity is what saving `v` costs (its bytes); data flows along
infinite edges. The source feeds what must come from the forward (inputs, and ops too
expensive or unsafe to recompute, per `tables.recompute_class`); the sink is the backward.
Any cut separating them is a valid choice of saved values, and the backward recomputes the
forward values that lie past it.
"""

from __future__ import annotations

from typing import Sequence

from torch import fx

from .flow import FlowNetwork
from .joint import OVERWRITTEN
from .memory import tensor_bytes
from .partition import ancestors, joint_parts, split_joint, with_tuple_elements
from .tables import Recompute, recompute_class

SOURCE, SINK = "source", "sink"


def min_cut_rematerialization_partition(joint_module: fx.GraphModule, _joint_inputs=None,
                                        compiler: str = "inductor", *, num_fwd_outputs: int,
                                        static_lifetime_input_indices=None,
                                        static_lifetime_input_nodes=None):
    """Forward and backward graphs that save a minimum-byte set of values."""
    saved = min_cut_saved_values(joint_module, num_fwd_outputs)
    return split_joint(joint_module, num_fwd_outputs, saved)


def min_cut_saved_values(joint: fx.GraphModule, num_fwd_outputs: int,
                         must_recompute: frozenset = frozenset()) -> list[fx.Node]:
    primals, tangents, fw_outs, grads = joint_parts(joint, num_fwd_outputs)
    forward = with_tuple_elements(ancestors(fw_outs) | set(primals))
    network, infinity = _network(joint, forward, set(primals), set(grads), must_recompute)
    reachable = network.min_cut(SOURCE, SINK)
    cut = {n for n in forward if (n, "in") in reachable and (n, "out") not in reachable}
    # Zero-cost edges may be cut without being needed; keep what the backward reads.
    needed = ancestors(grads, stop=cut | set(tangents))
    return [n for n in joint.graph.nodes if n in cut and n in needed]


def _network(joint, forward, primals, grads, must_recompute) -> tuple[FlowNetwork, int]:
    infinity = 1 + 4 * sum(tensor_bytes(n.meta.get("val")) for n in forward)
    net = FlowNetwork()
    for node in joint.graph.nodes:
        if node not in forward:
            continue
        net.add_edge((node, "in"), (node, "out"), _save_cost(node, primals, infinity,
                                                             must_recompute))
        if node in primals or _must_come_from_forward(node):
            net.add_edge(SOURCE, (node, "in"), infinity)
        for user in node.users:
            if user in forward:
                net.add_edge((node, "out"), (user, "in"), infinity)
            elif user.op == "call_function":
                net.add_edge((node, "out"), SINK, infinity)
        if node in grads:
            net.add_edge((node, "out"), SINK, infinity)
    return net, infinity


def _must_come_from_forward(node: fx.Node) -> bool:
    return node.op == "call_function" and recompute_class(node.target) == Recompute.NEVER


def _save_cost(node: fx.Node, primals, infinity: int, must_recompute) -> int:
    """Twice the bytes, plus a tie-breaker: among equal sizes save the value that spares the
    most recomputation (a cheap op's result over its expensive input), and a base over a
    view of it."""
    if node in primals:
        # Inputs are alive anyway, unless the call overwrites them.
        return infinity if node.meta.get(OVERWRITTEN) else 0
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)) or node in must_recompute:
        return infinity
    kind = recompute_class(node.target)
    tie = {Recompute.CHEAP: 0, Recompute.NEVER: 1, Recompute.FREE: 2}[kind]
    return 2 * tensor_bytes(val) + tie


def saved_bytes(saved: Sequence[fx.Node], primals: Sequence[fx.Node] = ()) -> int:
    return sum(tensor_bytes(n.meta.get("val")) for n in saved if n not in set(primals))
