"""A memory budget: trade recomputation for a lower estimated peak, on a fixed curve.

`memory_budget` in [0, 1] places a target between two plans: 1 is the min-cut plan, 0 the
plan that recomputes every recomputable value. Plans in between ban saving some of the
min-cut's values (forcing their recomputation) and are scored by the estimated peak
(`memory.estimate_peak`, the whole step, not the sum of saved bytes) and by the compute
they add. The curve is the Pareto front of these plans; a budget picks the cheapest plan
whose peak fits, so a lower budget never raises the estimated peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from torch import fx

from .memory import estimate_peak, tensor_bytes
from .partition import joint_parts, split_joint
from .remat import min_cut_saved_values
from .tables import Recompute, recompute_class

MAX_EXACT_CANDIDATES = 10  # exhaustive search up to 2**10 plans; a solver beyond


@dataclass(frozen=True)
class Plan:
    banned: frozenset  # forward values the plan may not save
    saved: tuple[str, ...]
    recomputed: tuple[str, ...]  # forward values the backward computes again
    peak_bytes: int
    recompute_cost: int  # bytes read and written by the recomputation (cheap ops are bound
                         # by memory traffic, not FLOPs)


def evaluate(joint: fx.GraphModule, n: int, banned: frozenset) -> Plan:
    saved = min_cut_saved_values(joint, n, must_recompute=banned)
    fw, bw = split_joint(joint, n, saved)
    forward_names = {node.name for node in fw.graph.nodes}
    recomputed = [node for node in bw.graph.nodes
                  if node.op == "call_function" and node.name in forward_names]
    return Plan(banned, tuple(s.name for s in saved), tuple(r.name for r in recomputed),
                estimate_peak(fw, bw, n).peak_bytes, sum(map(node_cost, recomputed)))


def node_cost(node: fx.Node) -> int:
    if recompute_class(node.target) == Recompute.FREE:
        return 0
    reads = sum(tensor_bytes(i.meta.get("val")) for i in node.all_input_nodes)
    return reads + tensor_bytes(node.meta.get("val"))


def candidates(joint: fx.GraphModule, n: int, plan: Plan) -> list[fx.Node]:
    """Saved values of `plan` that could be recomputed instead."""
    primals = set(joint_parts(joint, n)[0])
    by_name = {node.name: node for node in joint.graph.nodes}
    return [by_name[s] for s in plan.saved if by_name[s] not in primals
            and recompute_class(by_name[s].target) != Recompute.NEVER]


def pareto(plans: Sequence[Plan]) -> list[Plan]:
    """Plans no other plan beats on both peak and cost, by increasing peak."""
    front: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.peak_bytes, p.recompute_cost)):
        if not front or plan.recompute_cost < front[-1].recompute_cost:
            front.append(plan)
    return front


def plan_curve(joint: fx.GraphModule, n: int) -> list[Plan]:
    """The memory/compute curve, from the most recomputation to the min-cut plan."""
    mincut = evaluate(joint, n, frozenset())
    cands = candidates(joint, n, mincut)
    if len(cands) <= MAX_EXACT_CANDIDATES:
        return pareto(_exhaustive(joint, n, cands))
    return pareto(_greedy(joint, n, mincut))


def _exhaustive(joint, n, cands) -> list[Plan]:
    plans = []
    for mask in range(1 << len(cands)):
        banned = frozenset(c for i, c in enumerate(cands) if mask >> i & 1)
        plans.append(evaluate(joint, n, banned))
    return plans


def _greedy(joint, n, plan: Plan) -> list[Plan]:
    """Ban the saved value that frees the most bytes per byte of recomputation, again and
    again, until nothing recomputable is saved."""
    plans = [plan]
    while True:
        cands = candidates(joint, n, plan)
        if not cands:
            return plans
        best = min(cands, key=lambda c: node_cost(c) / max(1, tensor_bytes(c.meta.get("val"))))
        plan = evaluate(joint, n, plan.banned | {best})
        plans.append(plan)


def choose(curve: Sequence[Plan], budget: float) -> Plan:
    """The cheapest plan whose peak fits the budget's target on this curve."""
    if not 0.0 <= budget <= 1.0:
        raise ValueError(f"memory_budget must be in [0, 1], got {budget}")
    low, high = curve[0].peak_bytes, curve[-1].peak_bytes
    target = low + budget * (high - low)
    fitting = [p for p in curve if p.peak_bytes <= target]
    return fitting[-1]


def budget_partition(memory_budget: float) -> Callable:
    """A functorch-style partition_fn that honours `memory_budget`."""
    def partition(joint_module, _joint_inputs=None, *, num_fwd_outputs, **_):
        plan = choose(plan_curve(joint_module, num_fwd_outputs), memory_budget)
        by_name = {node.name: node for node in joint_module.graph.nodes}
        return split_joint(joint_module, num_fwd_outputs, [by_name[s] for s in plan.saved])
    return partition
