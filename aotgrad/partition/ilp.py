"""The memory-budget integer program: the cheapest recomputation whose peak fits a target.

Per forward value `v` a backward could read there are two 0/1 variables: `need[v]` (the
backward has `v`) and `redo[v]` (it computes `v` again; a needed value not recomputed is
saved). The rows say what a partition is: a value the backward's own ops read is needed;
the inputs of a recomputed value are needed; the rules of `remat.Rule` fix some choices
(views are recomputed, tuples cannot be saved, a tuple element is recomputed with its
tuple). The objective is the recomputation's cost, `plans.node_cost` summed.

The estimated peak is a maximum over the steps of both graphs, which the program bounds
from below with one linear row per step: in the forward, a saved value stays alive until
the end (exact); in the backward, a saved value is alive from the start to its last
reader, a recomputed one from its first to its last reader (a lower bound: recomputation
transients are left out). Each solution is then scored by the real estimate. One that does
not fit is cut off (a no-good cut) and the program solved again, so the first solution
that fits is the cheapest plan that fits: the curve is exact, point by point (up to
`MAX_EXACT` free choices). Larger problems get a grid of targets, each lowered by the
overshoot when its solution does not fit: good plans, not proven ones.
"""

from __future__ import annotations

import logging
import operator
import time

from torch import fx

from ..log import Progress
from .memory import base_of, is_tuple, read_only_in_kernels, simulate, tensor_bytes
from .plans import Plan, PlanSpace, node_cost
from .remat import Rule
from ..tables import fuses_into_readers

# SciPy's solver and the names it needs, imported at the first `available()`: scipy.optimize
# takes about half a second to import, which a compile without a memory budget never needs.
np = Bounds = LinearConstraint = milp = csr_matrix = None
_scipy_tried = False

log = logging.getLogger(__name__)

MAX_EXACT = 16  # free choices: beyond, a grid of targets instead of a proven front
MAX_EXACT_SOLVES = 120  # then the rest of the front on the grid (each solve is ~10-100 ms)
MAX_VALUES = 20_000  # forward values: beyond, the greedy
MAX_ROW_ENTRIES = 400_000  # backward rows kept: the most loaded steps first
GRID = 12  # targets between the curve's ends, for large problems
# Aimed solves stop within 1% of the cheapest plan: on ResNet-50 the same plans as 0.1%,
# found 4-15x faster (0.5-0.7 s a solve instead of 2.4-10 s).
GRID_GAP = 0.01
# Solves are bounded by branch-and-bound nodes, not by the clock, so that a compile chooses
# the same plan however busy the machine is (most solves end at the root node; the slowest
# seen on GPT-2 took 160 nodes, 2.7 s). The clock only guards against a pathological graph:
# past GUARD_S for one curve, solves stop, and the plan may then differ from run to run.
NODE_LIMIT = 500  # per solve
GUARD_S = 120.0  # all solves of one curve


def available() -> bool:
    """Whether SciPy's MILP solver is there (imported the first time)."""
    global _scipy_tried
    if not _scipy_tried:
        _scipy_tried = True
        _import_scipy()
    return milp is not None


def _import_scipy() -> None:
    global np, Bounds, LinearConstraint, milp, csr_matrix
    try:
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import csr_matrix
    except ImportError:  # the greedy takes over
        milp = None


def solve_curve(space: PlanSpace, low: int, high: int) -> list[Plan]:
    if not space.reachable:
        return []
    program = PeakProgram(space)
    if len(space.candidates) <= MAX_EXACT:
        return exact_front(program, low, high)
    return grid_front(program, low, high)


def exact_front(program: "PeakProgram", low: int, high: int) -> list[Plan]:
    """The Pareto front, from the top: the cheapest plan that fits, then the cheapest that
    fits strictly below its peak, and so on, down to the lowest peak there is."""
    plans, cuts, target = [], [], high
    while program.solves < MAX_EXACT_SOLVES:
        plan = program.cheapest_fitting(target, cuts)
        if plan is None:
            if program.solves < MAX_EXACT_SOLVES:
                return plans  # nothing fits below the last peak: the front is complete
            break
        plans.append(plan)
        target = plan.peak_bytes - 1
    return plans + grid_front(program, low, target)  # too many cuts: settle for good plans


def grid_front(program: "PeakProgram", low: int, high: int) -> list[Plan]:
    """Plans aimed at a grid of targets, taken coarse to fine (the middle, the quarters, ...):
    should the guard stop the solves, the gaps left in the curve are narrow ones."""
    targets = spread(sorted({low + (high - low) * j // GRID for j in range(GRID + 1)}))
    return [plan for target in targets for plan in _aimed(program, target)]


def spread(items: list) -> list:
    """`items` reordered coarse to fine: each next item is the one farthest (by index) from
    those already taken."""
    order, taken = [], []
    for _ in items:
        best = max((i for i in range(len(items)) if i not in taken),
                   key=lambda i: (min((abs(i - t) for t in taken), default=len(items)),
                                  -abs(2 * i - len(items) + 1)))
        taken.append(best)
        order.append(items[best])
    return order


def solve_point(space: PlanSpace, target: int) -> list[Plan]:
    """Plans for one target: the cheapest that fits, exactly when the problem is small."""
    if not space.reachable:
        return []
    program = PeakProgram(space)
    if len(space.candidates) <= MAX_EXACT:
        plan = program.cheapest_fitting(target, [])
        return [] if plan is None else [plan]
    return _aimed(program, target)


def _aimed(program: "PeakProgram", target: int) -> list[Plan]:
    """Solve for `target`, lowering the aim by the overshoot when the solution's real peak
    (the rows bound it from below) does not fit; three tries."""
    plans, aim = [], target
    for _ in range(3):
        plan = program.solve(aim, [], gap=GRID_GAP)
        if plan is None:
            break
        plans.append(plan)
        if plan.peak_bytes <= target:
            break
        aim -= plan.peak_bytes - target
    return plans


class PeakProgram:
    """The integer program of one joint graph; only the target changes between solves."""

    def __init__(self, space: PlanSpace):
        if not available():
            raise ImportError("aotgrad: the memory budget's integer program needs SciPy "
                              "(pip install scipy); without it the greedy solver runs")
        self.space = space
        self.values = [n for n in space.nodes if n in space.reachable]
        self.index = {v: i for i, v in enumerate(self.values)}
        m = self.m = len(self.values)
        self.lb, self.ub = np.zeros(2 * m), np.ones(2 * m)
        self.rows: list[tuple[dict[int, float], float, float]] = []
        self.memory: list[tuple[dict[int, float], int]] = []  # (coefficients, constant)
        self.cost = np.array([0.0] * m + [float(node_cost(v)) for v in self.values])
        self.evaluated: dict[frozenset, Plan] = {}
        self.solves = 0
        self.deadline = time.monotonic() + GUARD_S
        self.progress = Progress(log, f"memory budget: integer program of {m} values")
        self._structure()
        self._forward_rows()
        self._backward_rows()
        self._structure_matrix = _matrix(self.rows, 2 * m)
        self._memory_matrix = _matrix([(c, 0, 0) for c, _ in self.memory], 2 * m)

    def need(self, v: fx.Node) -> int:
        return self.index[v]

    def redo(self, v: fx.Node) -> int:
        return self.m + self.index[v]

    # ---- rows --------------------------------------------------------------------------

    def _structure(self) -> None:
        inf = np.inf
        for v in self.values:
            n, r = self.need(v), self.redo(v)
            self.rows.append(({r: 1, n: -1}, -inf, 0))  # only a needed value is recomputed
            for u in set(v.all_input_nodes):
                self.rows.append(({r: 1, self.need(u): -1}, -inf, 0))
            if v in self.space.read_by_fixed:
                self.lb[n] = 1
            self._rule(v, self.space.rules[v])

    def _rule(self, v: fx.Node, rule: str) -> None:
        n, r = self.need(v), self.redo(v)
        if rule in (Rule.INPUT, Rule.OVERWRITTEN, Rule.SAVE):
            self.ub[r] = 0
            if is_tuple(v) and rule == Rule.SAVE:
                self.ub[n] = 0  # its elements are saved instead
        elif rule == Rule.FREE and v.target is operator.getitem:
            t = self.redo(v.args[0])  # recomputed exactly when needed and its tuple is
            self.rows.append(({r: 1, t: -1}, -np.inf, 0))
            self.rows.append(({t: 1, n: 1, r: -1}, -np.inf, 1))
        elif rule in (Rule.FREE, Rule.RECOMPUTE) or is_tuple(v):
            self.rows.append(({n: 1, r: -1}, -np.inf, 0))  # never saved

    def _own_buffers(self) -> dict[fx.Node, int]:
        """Values whose saving or recomputation changes memory, and their bytes."""
        space = self.space
        excluded = {base_of(o) for o in space.fw_outs if isinstance(o, fx.Node)}
        return {v: tensor_bytes(v.meta.get("val")) for v in self.values
                if v.op == "call_function" and base_of(v) is v and not is_tuple(v)
                and v not in excluded}

    def _forward_rows(self) -> None:
        """At each step of the forward that keeps nothing for the backward, the values
        saved (born before it, dead by then otherwise, or fused away) are alive as well. A
        lower bound: saving a fused value may let what it reads die sooner."""
        space, own = self.space, self._own_buffers()
        nodes, steps, buffers, inputs, outputs = space.forward_base()
        trace: list[int] = []
        simulate(steps, buffers.size, set(inputs), inputs | outputs, trace)
        death = {}  # buffer -> the step after which it is freed
        for i, (made, reads) in enumerate(steps):
            if made >= 0:
                death.setdefault(made, i)
            for b in reads:
                death[b] = i
        step_of = {node: i for i, node in enumerate(nodes)}
        best = -1
        for i in reversed(range(len(nodes))):
            if steps[i][0] < 0 or trace[i] <= best:
                continue  # allocates nothing, or a later step is as loaded
            best = trace[i]
            coeffs = {}
            for v, nbytes in own.items():
                if v in step_of:
                    b = buffers.owner[v]
                    extra = step_of[v] <= i and (b < 0 or death[b] < i)
                else:
                    extra = space.position[v] < space.position[nodes[i]]
                if extra and nbytes:
                    coeffs[self.need(v)] = nbytes
                    coeffs[self.redo(v)] = -nbytes
            self.memory.append((coeffs, trace[i]))

    def _backward_rows(self) -> None:
        """At the start of the backward every saved value is alive; at each backward op, a
        saved value with a reader at or after it, and a recomputed value with readers on
        both sides of it, unless it may be fused into its readers (then it owns no
        buffer: `memory.fused_in_kernels`). A lower bound."""
        space, own = self.space, self._own_buffers()
        start, steps, readers = space.backward_floor()
        first, last = _fixed_readers(space, own, readers)
        _read_through_recomputation(space, own, first, last)
        fused = _may_fuse(space, own)
        self.memory.append(({**{self.need(v): b for v, b in own.items()},
                             **{self.redo(v): -b for v, b in own.items()}}, start))
        width = max(1, len(first))
        keep = sorted(steps, key=lambda s: -s[1])[:max(1, MAX_ROW_ENTRIES // width)]
        for k, live in sorted(keep):
            coeffs = {}
            for v, lo in first.items():
                if last[v] >= k and own[v]:
                    coeffs[self.need(v)] = own[v]
                    kept = lo <= k and v not in fused
                    coeffs[self.redo(v)] = 0 if kept else -own[v]
            self.memory.append((coeffs, live))

    # ---- solving -----------------------------------------------------------------------

    def cheapest_fitting(self, target: int, cuts: list[frozenset]) -> Plan | None:
        """The cheapest plan whose estimated peak fits `target` (None: none fits, or the
        solves ran out)."""
        while self.solves < MAX_EXACT_SOLVES:
            chosen = self._solve(target, cuts, gap=0.0)
            if chosen is None:
                return None
            plan = self.plan(chosen)
            if plan.peak_bytes <= target:
                return plan
            cuts.append(chosen)
        return None

    def solve(self, target: int, cuts: list[frozenset], gap: float) -> Plan | None:
        chosen = self._solve(target, cuts, gap)
        return None if chosen is None else self.plan(chosen)

    def plan(self, chosen: frozenset) -> Plan:
        if chosen not in self.evaluated:
            space = self.space
            self.evaluated[chosen] = space.evaluate(space.saved_for(chosen))
        return self.evaluated[chosen]

    def _solve(self, target: int, cuts: list[frozenset], gap: float) -> frozenset | None:
        self.solves += 1
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        constants = np.array([c for _, c in self.memory], dtype=float)
        if any(not coeffs and constant > target for coeffs, constant in self.memory):
            return None
        scale = max(1.0, float(target))  # rows in units of the target: better conditioned
        constraints = [
            LinearConstraint(self._structure_matrix, [lo for _, lo, _ in self.rows],
                             [hi for _, _, hi in self.rows]),
            LinearConstraint(self._memory_matrix / scale, -np.inf,
                             (target - constants) / scale)]
        if cuts:
            constraints.append(self._cut_rows(cuts))
        result = milp(self.cost, integrality=np.ones(2 * self.m), bounds=Bounds(self.lb, self.ub),
                      constraints=constraints,
                      options={"node_limit": NODE_LIMIT, "time_limit": remaining,
                               "mip_rel_gap": gap})
        log.debug("solve %d: target %d bytes, %s", self.solves, target, result.message)
        self.progress.report(f"{self.solves} solves, {len(self.evaluated)} plans scored")
        if result.x is None:
            return None
        return frozenset(c for c in self.space.candidates if result.x[self.redo(c)] > 0.5)

    def _cut_rows(self, cuts: list[frozenset]) -> LinearConstraint:
        """No-good cuts: at least one free choice differs from each cut-off solution."""
        rows = []
        for chosen in cuts:
            coeffs = {self.redo(c): (-1 if c in chosen else 1) for c in self.space.candidates}
            rows.append((coeffs, 1 - len(chosen), np.inf))
        return LinearConstraint(_matrix(rows, 2 * self.m), [lo for _, lo, _ in rows],
                                [hi for _, _, hi in rows])


def _fixed_readers(space: PlanSpace, own: dict, readers: list[frozenset]
                   ) -> tuple[dict, dict]:
    """Per value with its own buffer: the first and last backward op (by index among the
    backward's own ops) reading its buffer, directly, through a view, or through a value
    fused into the op (`readers`, from `PlanSpace.backward_floor`)."""
    first, last = {}, {}
    end = len(space.fixed)
    for k, values in enumerate(readers):
        for i in values:
            v = base_of(i)
            if v in own:
                first.setdefault(v, k)
                last[v] = k
    for g in space.grads:
        if isinstance(g, fx.Node) and base_of(g) in own:
            first.setdefault(base_of(g), end)
            last[base_of(g)] = end
    return first, last


def _read_through_recomputation(space: PlanSpace, own: dict, first: dict, last: dict) -> None:
    """A value no backward op reads is needed only to recompute others: saved, it is alive
    at least until the first backward op that reads one of the values made from it. Its
    `first` lies past that `last`, so recomputed it counts nothing in the rows."""
    earliest: dict[fx.Node, int] = {}
    for v in reversed(space.nodes):
        if v in space.forward:
            made_from = [earliest[u] for u in v.users if u in earliest]
            here = [first[v]] if v in first else []
            if made_from or here:
                earliest[v] = min(here + made_from)
    for v in own:
        if v not in first and v in earliest:
            last[v] = earliest[v]
            first[v] = earliest[v] + 1


def _may_fuse(space: PlanSpace, own: dict) -> set[fx.Node]:
    """Values that, recomputed, may be fused into their readers (`memory.fused_in_kernels`):
    made by a fusible op, and no op every backward runs reads them unfused. A superset (a
    recomputed reader may still need them in a buffer), so the rows stay lower bounds."""
    fixed = set(space.fixed)
    return {v for v in own if fuses_into_readers(v.target) and read_only_in_kernels(v, fixed)}


def _matrix(rows, width: int):
    data, row_ids, col_ids = [], [], []
    for i, (coeffs, _, _) in enumerate(rows):
        for j, c in coeffs.items():
            if c:
                data.append(c)
                row_ids.append(i)
                col_ids.append(j)
    return csr_matrix((data, (row_ids, col_ids)), shape=(max(1, len(rows)), width))
