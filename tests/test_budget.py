"""The memory budget: guarantees of the curve, checked on small random graphs.

(a) lowering the budget never raises the estimated peak;
(b) the budget's target is never exceeded when some plan fits it;
(c) the solver's choice matches exhaustive search (the ILP exactly; the greedy is only
    checked to fit, and never to beat the exhaustive optimum).

The random graphs are Python functions (chains and DAGs of pointwise ops, matmuls and a
reduction) compiled with the eager backend, so that they go through the real pipeline."""

import functools
import random
import time

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings

import aotgrad
from aotgrad.partition import budget, ilp
from aotgrad.partition.budget import Curve, choose, pareto, plan_curve, plan_for_budget
from aotgrad.partition.memory import MemoryEstimate, estimate_peak
from aotgrad.partition.plans import Plan, PlanSpace
from aotgrad.partition.remat import split_recomputing_late
from aotgrad.verify import verify_partition

BUDGETS = [i / 20 for i in range(21)]
needs_scipy = pytest.mark.xfail(not ilp.available(), reason="scipy not installed: no ILP",
                                strict=True)
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# ---- random graphs --------------------------------------------------------------------------

UNARY = [torch.sin, torch.cos, torch.exp, torch.tanh, torch.relu, torch.sigmoid]


def random_program(rng: random.Random, max_ops: int = 12) -> tuple:
    """A straight-line program over value 0 (the input): ops reading earlier values, mostly
    recent ones (chains, with some fan-out)."""
    ops = []
    for i in range(rng.randint(3, max_ops)):
        kind = rng.choice(["unary"] * 4 + ["binary"] * 3 + ["matmul", "reduce"])
        a = rng.randint(max(0, i - 3), i)
        if kind == "unary":
            ops.append(("unary", rng.randrange(len(UNARY)), a))
        elif kind == "binary":
            ops.append(("binary", rng.choice(["add", "mul"]), a, rng.randint(0, i)))
        else:
            ops.append((kind, a))
    return tuple(ops)


# One fixed corpus for every property: each program is compiled once per test worker.
CORPUS = [random_program(random.Random(seed)) for seed in range(60)]
programs = functools.partial(st.sampled_from, CORPUS)


def as_function(ops):
    def fn(x, *ws):
        values, weights = [x], iter(ws)
        for op in ops:
            if op[0] == "unary":
                values.append(UNARY[op[1]](values[op[2]]))
            elif op[0] == "binary":
                a, b = values[op[2]], values[op[3]]
                values.append(a + b if op[1] == "add" else a * b)
            elif op[0] == "matmul":
                values.append(values[op[1]] @ next(weights))
            else:  # a reduction whose result is broadcast back
                values.append(values[op[1]] - values[op[1]].mean(0, keepdim=True))
        return values[-1].sum()
    return fn


@functools.lru_cache(maxsize=None)
def joint_of(ops):
    """(joint graph, number of forward outputs) of a program. Activations (128x8) are
    large next to the weights (8x8), so that recomputation matters."""
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(8, 8, generator=gen, requires_grad=True)
               for op in ops if op[0] == "matmul"]
    compiled = aotgrad.compile(as_function(ops), backend="eager")
    compiled(torch.randn(128, 8, generator=gen, requires_grad=True), *weights)
    art = compiled.artifacts[0]
    return art.joint_graph, art.info.num_graph_outputs


@functools.lru_cache(maxsize=None)
def curve_of(ops, solver):
    joint, n = joint_of(ops)
    return plan_curve(joint, n, solver)


def small(ops) -> bool:
    joint, n = joint_of(ops)
    return len(PlanSpace(joint, n).candidates) <= budget.MAX_EXHAUSTIVE


def point(plan: Plan) -> tuple[int, int]:
    return plan.peak_bytes, plan.recompute_cost


# A program whose curve has three points (found by the strategy above).
THREE_POINTS = (("unary", 0, 0), ("matmul", 1), ("matmul", 2), ("binary", "add", 1, 3),
                ("unary", 3, 4))


# ---- the guarantees -------------------------------------------------------------------------

@pytest.mark.parametrize("solver", ["exhaustive", pytest.param("ilp", marks=needs_scipy),
                                    "greedy"])
@SETTINGS
@given(ops=programs())
def test_a_lower_budget_never_raises_the_peak(solver, ops):
    assume(solver != "exhaustive" or small(ops))
    curve = curve_of(ops, solver)
    peaks = [choose(curve, b).peak_bytes for b in BUDGETS]
    assert peaks == sorted(peaks)


@pytest.mark.parametrize("solver", ["exhaustive", pytest.param("ilp", marks=needs_scipy),
                                    "greedy"])
@SETTINGS
@given(ops=programs())
def test_b_the_budget_is_met_whenever_a_plan_fits(solver, ops):
    """Every budget's target is met. For the exact solvers the targets are those of
    exhaustive search (same ends: the min-cut's peak and the lowest there is); the greedy
    may not find the lowest peak, so its budget 0 may aim higher, never lower."""
    assume(small(ops))
    curve, every = curve_of(ops, solver), curve_of(ops, "exhaustive")
    assert curve.high_bytes == every.high_bytes
    assert curve.low_bytes == every.low_bytes or solver == "greedy" and \
        curve.low_bytes > every.low_bytes
    for b in BUDGETS:
        target = curve.target(b)
        if any(p.peak_bytes <= target for p in every.plans):
            assert choose(curve, b).peak_bytes <= target


@needs_scipy
@SETTINGS
@given(ops=programs())
def test_c_ilp_matches_exhaustive_search(ops):
    assume(small(ops))
    exact, solved = curve_of(ops, "exhaustive"), curve_of(ops, "ilp")
    assert [point(p) for p in solved.plans] == [point(p) for p in exact.plans]
    for b in BUDGETS:
        assert point(choose(solved, b)) == point(choose(exact, b))


@needs_scipy
def test_c_ilp_matches_exhaustive_search_on_a_three_point_curve():
    exact, solved = curve_of(THREE_POINTS, "exhaustive"), curve_of(THREE_POINTS, "ilp")
    assert len(exact.plans) == 3
    assert [point(p) for p in solved.plans] == [point(p) for p in exact.plans]
    for b in BUDGETS:
        assert point(choose(solved, b)) == point(choose(exact, b))
    assert point(choose(exact, 1.0)) == point(exact.plans[-1])  # the min-cut plan
    assert len({point(choose(exact, b)) for b in BUDGETS}) >= 2  # and a leaner one


@needs_scipy
@SETTINGS
@given(ops=programs())
def test_d_budget_one_solved_alone_is_the_curves_choice(ops):
    """A compile at budget 1 solves for the min-cut plan's peak alone, not the curve."""
    assume(small(ops))
    joint, n = joint_of(ops)
    alone, chosen = plan_for_budget(joint, n, 1.0, "ilp"), choose(curve_of(ops, "exhaustive"), 1.0)
    # As cheap, and fitting the same target; of plans equally cheap, the solver may return
    # any (the integer program's objective is the cost alone).
    assert alone.recompute_cost == chosen.recompute_cost
    assert alone.peak_bytes <= curve_of(ops, "exhaustive").target(1.0)


@SETTINGS
@given(ops=programs())
def test_c_greedy_fits_and_never_beats_exhaustive_search(ops):
    """The greedy's choice fits its target, and exhaustive search finds a plan as cheap
    under the same target (the greedy may aim higher at budget 0: see test_b)."""
    assume(small(ops))
    exact, greedy = curve_of(ops, "exhaustive"), curve_of(ops, "greedy")
    for b in BUDGETS:
        target, chosen = greedy.target(b), choose(greedy, b)
        assert chosen.peak_bytes <= target
        best = min(p.recompute_cost for p in exact.plans if p.peak_bytes <= target)
        assert chosen.recompute_cost >= best


@needs_scipy
@SETTINGS
@given(ops=programs())
def test_ilp_rows_bound_every_plans_peak_from_below(ops):
    """Each canonical plan satisfies the program's rows, and the rows' estimate of its peak
    never exceeds the real estimate: what makes the ILP's answers exact."""
    import numpy as np
    joint, n = joint_of(ops)
    space = PlanSpace(joint, n)
    assume(space.reachable and len(space.candidates) <= 6)
    program = ilp.PeakProgram(space)
    for mask in range(1 << len(space.candidates)):
        chosen = {c for i, c in enumerate(space.candidates) if mask >> i & 1}
        saved = space.saved_for(chosen)
        plan = space.evaluate(saved)
        x = np.zeros(2 * program.m)
        for v in program.values:
            x[program.need(v)] = v in saved or v.name in plan.recomputed
            x[program.redo(v)] = v.name in plan.recomputed
        assert (program.lb <= x).all() and (x <= program.ub).all()
        for coeffs, lo, hi in program.rows:
            assert lo <= sum(c * x[j] for j, c in coeffs.items()) <= hi
        bound = max(const + sum(c * x[j] for j, c in coeffs.items())
                    for coeffs, const in program.memory)
        assert bound <= plan.peak_bytes


@SETTINGS
@given(ops=programs())
def test_plan_scores_are_those_of_the_graphs_it_builds(ops):
    """Scoring a plan on the joint graph gives what `estimate_peak` gives on the forward
    and backward graphs the partitioner builds for it."""
    joint, n = joint_of(ops)
    space = PlanSpace(joint, n)
    everything_read = [v for v in space.nodes if v in space.read_by_fixed]  # no recomputation
    plans = [space.mincut, everything_read, space.saved_for(()), space.saved_for(space.candidates),
             space.saved_for(space.candidates[::2])]
    for saved in plans:
        fw, bw = split_recomputing_late(joint, n, saved)
        verify_partition(fw, bw, n)
        plan = space.evaluate(saved)
        assert estimate_peak(fw, bw, n) == plan.memory
        recomputed = {node.name for node in bw.graph.nodes if node.op == "call_function"
                      and node.name in {f.name for f in space.forward}}
        assert recomputed == set(plan.recomputed)


# ---- the curve and the choice ---------------------------------------------------------------

def fake_plan(peak, cost):
    return Plan((), (), MemoryEstimate(0, 0, peak, 0), cost)


def test_pareto_keeps_what_nothing_beats():
    plans = [fake_plan(10, 5), fake_plan(12, 5), fake_plan(8, 9), fake_plan(11, 1),
             fake_plan(8, 7)]
    assert [point(p) for p in pareto(plans)] == [(8, 7), (10, 5), (11, 1)]


def test_choose_takes_the_cheapest_plan_under_the_target():
    curve = Curve(tuple(pareto([fake_plan(8, 7), fake_plan(10, 5), fake_plan(11, 1)])),
                  8, 11, 4, "test")
    assert point(choose(curve, 1.0)) == (11, 1)
    assert point(choose(curve, 0.7)) == (10, 5)  # target 11 - floor(0.3 * 4) = 10
    assert point(choose(curve, 0.0)) == (8, 7)  # 11 - 4 = 7 is out of reach: the lowest, 8
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="memory_budget"):
            choose(curve, bad)


def test_budget_ends_are_the_min_cut_and_the_lowest_peak():
    joint, n = joint_of(THREE_POINTS)
    space = PlanSpace(joint, n)
    curve = curve_of(THREE_POINTS, "exhaustive")
    mincut = space.evaluate(space.mincut)
    everything = space.evaluate(space.saved_for(space.candidates))
    assert curve.high_bytes == mincut.peak_bytes
    lowest = min(p.peak_bytes for p in budget.exhaustive(space, 0, 0))
    assert curve.low_bytes == lowest <= everything.peak_bytes
    # budget 1: the min-cut plan, or one that matches its peak with less recomputation
    top = choose(curve, 1.0)
    assert top.peak_bytes <= mincut.peak_bytes and top.recompute_cost <= mincut.recompute_cost


def wide(inp, w0, w):
    """Twelve small sums the min-cut saves (recomputing one needs the large `x`): twelve
    reductions, and the pointwise ops under them, are free choices."""
    x = inp @ w0
    total = 0
    for i in range(12):
        total = total + ((x * (i + 1)).exp().sum(0) * w).sum()
    return total


@functools.lru_cache(maxsize=None)
def wide_joint():
    compiled = aotgrad.compile(wide, backend="eager")
    compiled(torch.randn(128, 8), torch.randn(8, 8), torch.randn(8, requires_grad=True))
    art = compiled.artifacts[0]
    return art.joint_graph, art.info.num_graph_outputs


def test_without_scipy_the_greedy_takes_over(monkeypatch):
    joint, n = wide_joint()
    space = PlanSpace(joint, n)
    assert len(space.candidates) > budget.MAX_EXHAUSTIVE
    monkeypatch.setattr(ilp, "milp", None)
    assert budget.pick_solver(space) == "greedy"
    for b in (0.0, 1.0):
        fw, bw = budget.budget_partition(b)(joint, num_fwd_outputs=n)
        verify_partition(fw, bw, n)


@needs_scipy
def test_larger_problems_use_the_ilp_on_a_grid_of_targets():
    joint, n = wide_joint()
    assert len(PlanSpace(joint, n).candidates) > ilp.MAX_EXACT
    curve = plan_curve(joint, n)
    greedy = plan_curve(joint, n, "greedy")
    assert curve.solver == "ilp" and len(curve.plans) > 1
    peaks = [choose(curve, b).peak_bytes for b in BUDGETS]
    assert peaks == sorted(peaks)
    assert all(choose(curve, b).peak_bytes <= curve.target(b) for b in BUDGETS)
    assert curve.low_bytes <= greedy.low_bytes  # the ILP reaches at least as low


@needs_scipy
def test_a_slow_machine_finds_the_same_curve(monkeypatch):
    """Solves are bounded by nodes, not by the clock: a compile on a busy machine chooses
    the plans an idle one does."""
    joint, n = wide_joint()
    idle = plan_curve(joint, n)
    solve = ilp.milp

    def slow(*args, **kwargs):
        time.sleep(0.05)
        return solve(*args, **kwargs)
    monkeypatch.setattr(ilp, "milp", slow)
    busy = plan_curve(joint, n)
    assert [p.saved for p in busy.plans] == [p.saved for p in idle.plans]


def test_memory_budget_is_validated_up_front():
    with pytest.raises(ValueError, match="memory_budget"):
        aotgrad.compile(lambda x: x.sin().sum(), backend="eager", memory_budget=2.0)


# ---- matmuls and convolutions: recomputed under a budget, never by the min cut ---------------

def wide_mlp(x, *ws):
    """Four blocks, each widening 8 to 512 and back: their hidden layers dwarf the narrow
    values between blocks, and only recomputing the widening matmul frees one."""
    for up, down in zip(ws[::2], ws[1::2]):
        x = (x @ up).relu() @ down
    return x.sum()


def wide_mlp_args():
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(*shape, generator=gen, requires_grad=True)
               for _ in range(4) for shape in ((8, 512), (512, 8))]
    return (torch.randn(128, 8, generator=gen), *weights)


def recomputed_kernels(plan: Plan) -> list[str]:
    return [name for name in plan.recomputed if name.startswith(("mm", "convolution"))]


@pytest.mark.parametrize("solver", ["exhaustive", pytest.param("ilp", marks=needs_scipy),
                                    "greedy"])
def test_a_low_budget_recomputes_a_matmul_and_budget_one_does_not(solver):
    compiled = aotgrad.compile(wide_mlp, backend="eager")
    compiled(*wide_mlp_args())
    art = compiled.artifacts[0]
    joint, n = art.joint_graph, art.info.num_graph_outputs
    low, top = (plan_for_budget(joint, n, b, solver) for b in (0.0, 1.0))
    assert recomputed_kernels(low) and not recomputed_kernels(top)
    assert low.peak_bytes < top.peak_bytes


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_recomputed_matmuls_give_eager_gradients(backend):
    args = wide_mlp_args()
    expected = torch.autograd.grad(wide_mlp(*args), args[1:])
    mms = []
    for b in (0.0, 1.0):
        compiled = aotgrad.compile(wide_mlp, backend=backend, memory_budget=b)
        actual = torch.autograd.grad(compiled(*args), args[1:])
        for e, a in zip(expected, actual):
            torch.testing.assert_close(a, e)
        bw = compiled.artifacts[0].backward_graph
        mms.append(sum(n.target == torch.ops.aten.mm.default for n in bw.graph.nodes))
    assert mms[0] > mms[1]  # budget 0 runs widening matmuls again


def test_grid_targets_go_coarse_to_fine():
    order = ilp.spread(list(range(13)))
    assert sorted(order) == list(range(13)) and order[0] == 6
    assert set(order[:5]) == {0, 3, 6, 9, 12}  # the halves and quarters before the rest
