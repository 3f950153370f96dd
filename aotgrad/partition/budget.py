"""A memory budget: trade recomputation for a lower estimated peak, on a fixed curve.

`memory_budget` in [0, 1] sets a target peak: the min-cut plan's estimated peak, less the
share `1 - budget` of the activation memory that plan saves (`Curve.target`). At 1 that is the
min-cut plan's peak; at 0 nothing saved is left in it, which only saving just the inputs could
reach, so budgets below the lowest estimated peak found aim at that. The budget picks the
cheapest plan whose peak fits its target: at 1 the min-cut plan, unless a plan matches its
peak with less recomputation (and so beats it on both counts). Plans are scored by the
estimated peak of the whole step (`memory`, not the sum of saved bytes) and by the compute they
add (`plans.node_cost`: a matmul's or convolution's arithmetic counts, as the bytes that move
in its time). Below budget 1 plans may recompute matmuls and convolutions (`Rule.COSTLY`);
budget 1, like the min cut, does not. The plan that saves only what cannot be recomputed
(inputs, attention, random values) is always scored, but it need not have the lowest peak:
recomputing everything has transients of its own, and the greedy's plans go lower.

The curve is the Pareto front of the plans a solver found, computed once per graph. So by
construction a lower budget never raises the estimated peak, and every target is met (the
front's lowest point fits budget 0). Budget 1 needs no curve: its target is the min-cut
plan's peak (`plan_for_budget`).

Solvers, by problem size (`pick_solver`): every canonical plan scored one by one (up to
`MAX_EXHAUSTIVE` free choices); an integer program solved by SciPy's HiGHS (`ilp`), exact
up to `ilp.MAX_EXACT` choices; a greedy when SciPy is missing or the graph is too big.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from torch import fx

from . import ilp
from .plans import Plan, PlanSpace, node_cost
from .remat import CHOICES, split_recomputing_late
from .memory import tensor_bytes
from ..schema import CURVE

log = logging.getLogger(__name__)

MAX_EXHAUSTIVE = 10  # free choices: 2**10 plans scored one by one
GREEDY_ROUNDS = 16  # the greedy scores about this many plans


@dataclass(frozen=True)
class Curve:
    """The memory/compute trade-offs of one joint graph."""

    plans: tuple[Plan, ...]  # the Pareto front: increasing peak, decreasing cost
    low_bytes: int  # the lowest peak found: no budget aims below it
    high_bytes: int  # the target of budget 1: the min-cut plan's peak
    saved_bytes: int  # what the min-cut plan saves for the backward
    solver: str

    def target(self, budget: float) -> int:
        """The min-cut plan's peak, less the share `1 - budget` of what it saves: budget 0.5
        keeps half the min cut's activation memory in the peak (as PyTorch's
        `activation_memory_budget` keeps half its saved bytes), but counted at the peak.
        Budgets the curve cannot reach aim at its lowest point."""
        if not 0.0 <= budget <= 1.0:
            raise ValueError(f"memory_budget must be in [0, 1], got {budget}")
        return max(self.low_bytes,
                   self.high_bytes - math.floor((1.0 - budget) * self.saved_bytes))


def plan_curve(joint: fx.GraphModule, n: int, solver: str = "auto",
               space: PlanSpace | None = None) -> Curve:
    """The memory/compute curve of `joint`, from the least memory to the min-cut plan."""
    space = space or PlanSpace(joint, n)
    mincut, everything, nothing = _ends(space)
    high = mincut.peak_bytes
    name = pick_solver(space) if solver == "auto" else solver
    log.info("memory budget: computing the memory/compute curve with the %s solver "
             "(%d free choices among %d values)", name, len(space.candidates),
             len(space.reachable))
    # The integer program aims at targets down to the lowest peak known. The greedy's plans
    # (fast) reach lower than recomputing everything, and fill the gaps a grid leaves.
    seeds = greedy(space, 0, high) if name == "ilp" else []
    low = min(p.peak_bytes for p in [everything, mincut, *seeds])
    found = seeds + SOLVERS[name](space, low, high)
    plans = pareto(p for p in [mincut, everything, nothing, *found] if p.peak_bytes <= high)
    log.debug("memory/compute curve: %d plans on the front of %d found, peaks %d to %d bytes",
              len(plans), len(found) + 3, plans[0].peak_bytes, high)
    return Curve(tuple(plans), plans[0].peak_bytes, high, mincut.memory.saved_bytes, name)


def plan_for_budget(joint: fx.GraphModule, n: int, budget: float, solver: str = "auto") -> Plan:
    """The plan a budget chooses. Budget 1's target is the min-cut plan's peak, whatever the
    curve's other end: with the integer program a compile solves for it alone, instead of
    for the whole curve (about 20 s on GPT-2). Budget 1 recomputes no
    matmul or convolution, as the min cut does not."""
    space = PlanSpace(joint, n, kernels=budget < 1.0)
    name = pick_solver(space) if solver == "auto" else solver
    if budget == 1.0 and name == "ilp":
        ends = _ends(space)
        high = ends[0].peak_bytes
        fitting = [p for p in [*ends, *ilp.solve_point(space, high)] if p.peak_bytes <= high]
        return min(fitting, key=lambda p: (p.recompute_cost, p.peak_bytes))
    curve = plan_curve(joint, n, name, space)
    if solver == "auto" and budget < 1.0:  # explain's curve (kernels too): not computed twice
        joint.meta[CURVE] = curve
    return choose(curve, budget)


def _ends(space: PlanSpace) -> tuple[Plan, Plan, Plan]:
    """The min-cut plan, the plan recomputing every free choice, and the plan recomputing
    none of them (the least recomputation there is)."""
    return (space.evaluate(space.mincut), space.evaluate(space.saved_for(space.candidates)),
            space.evaluate(space.saved_for(())))


def pick_solver(space: PlanSpace) -> str:
    if len(space.candidates) <= MAX_EXHAUSTIVE:
        return "exhaustive"
    if ilp.available() and len(space.reachable) <= ilp.MAX_VALUES:
        return "ilp"
    return "greedy"


def choose(curve: Curve, budget: float) -> Plan:
    """The cheapest plan on the curve whose peak fits the budget's target."""
    target = curve.target(budget)
    return min((p for p in curve.plans if p.peak_bytes <= target),
               key=lambda p: (p.recompute_cost, p.peak_bytes))


def pareto(plans: Iterable[Plan]) -> list[Plan]:
    """Plans no other plan beats on both peak and cost, by increasing peak."""
    front: list[Plan] = []
    for plan in sorted(plans, key=lambda p: (p.peak_bytes, p.recompute_cost)):
        if not front or plan.recompute_cost < front[-1].recompute_cost:
            front.append(plan)
    return front


def budget_partition(memory_budget: float, solver: str = "auto") -> Callable:
    """A functorch-style partition_fn that honours `memory_budget`. A partial of a module's
    function, not a closure: a compiled module's options pickle (torch.save(model))."""
    if not 0.0 <= memory_budget <= 1.0:
        raise ValueError(f"memory_budget must be in [0, 1], got {memory_budget}")
    partition = functools.partial(_partition_for_budget, memory_budget=memory_budget,
                                  solver=solver)
    partition.memory_budget, partition.solver = memory_budget, solver  # for cache keys
    return partition


def budget_of(fn: Callable) -> tuple[float, str] | None:
    """(memory_budget, solver) of a `budget_partition`, as it runs with them (its partial's
    arguments, not attributes another object may carry or a caller may change); else None."""
    if isinstance(fn, functools.partial) and fn.func is _partition_for_budget:
        return fn.keywords["memory_budget"], fn.keywords["solver"]
    return None


def _partition_for_budget(joint_module, _joint_inputs=None, *, num_fwd_outputs,
                          memory_budget: float, solver: str, **_):
    plan = plan_for_budget(joint_module, num_fwd_outputs, memory_budget, solver)
    log.debug("memory budget %s: peak %d bytes, recomputation %d bytes of traffic, "
              "saves %s", memory_budget, plan.peak_bytes, plan.recompute_cost,
              ", ".join(plan.saved))
    by_name = {node.name: node for node in joint_module.graph.nodes}
    saved = [by_name[s] for s in plan.saved]
    return split_recomputing_late(joint_module, num_fwd_outputs, saved)


# ---- solvers: each returns plans for the curve --------------------------------------------

def exhaustive(space: PlanSpace, low: int, high: int) -> list[Plan]:
    """Every canonical plan: one per subset of the free choices."""
    cands = space.candidates
    return [space.evaluate(space.saved_for(c for i, c in enumerate(cands) if mask >> i & 1))
            for mask in range(1 << len(cands))]


def greedy(space: PlanSpace, low: int, high: int) -> list[Plan]:
    """From the min-cut plan, and from the plan recomputing nothing, recompute the saved
    values that free the most bytes per byte of recomputation, a batch at a time, until
    none frees anything."""
    recomputed = set(space.evaluate(space.mincut).recomputed)
    starts = [{c for c in space.candidates if c.name in recomputed}, set()]
    return [plan for chosen in starts for plan in _greedy_from(space, chosen)]


def _greedy_from(space: PlanSpace, chosen: set) -> list[Plan]:
    plans = []
    batch = max(1, math.ceil(len(space.candidates) / GREEDY_ROUNDS))
    for _ in range(4 * GREEDY_ROUNDS):
        saved = space.saved_for(chosen)
        plans.append(space.evaluate(saved))
        ranked = _ranked_candidates(space, saved, chosen)
        if not ranked:
            break
        chosen |= set(ranked[:batch])
    return plans


def _ranked_candidates(space: PlanSpace, saved: Sequence[fx.Node], chosen: set) -> list:
    """Saved free choices that free bytes if recomputed, best ratio first."""
    available = set(saved) | chosen
    scored = []
    for node in saved:
        if space.rules[node] not in CHOICES or node in chosen:
            continue
        newly_saved = {i for i in node.all_input_nodes if i not in available}
        freed = tensor_bytes(node.meta.get("val")) - sum(
            tensor_bytes(i.meta.get("val")) for i in newly_saved if i.op != "placeholder")
        if freed > 0:
            scored.append((-freed / max(1, node_cost(node)), space.position[node], node))
    return [node for *_, node in sorted(scored, key=lambda s: s[:2])]


def ilp_solver(space: PlanSpace, low: int, high: int) -> list[Plan]:
    return ilp.solve_curve(space, low, high)


SOLVERS = {"exhaustive": exhaustive, "greedy": greedy, "ilp": ilp_solver}
