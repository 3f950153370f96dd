"""`aotgrad.explain`: why a partition saves what it saves, and what that costs."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from . import check
from .backends.fxcache import fill_fake_values, lacks_fake_values
from .partition.budget import Curve, choose, plan_curve
from .schema import CURVE
from .schema import JOINT_FW_OUTPUTS
from .partition.memory import MemoryEstimate, estimate_peak
from .artifact import Artifact, SavedValue
from .partition.plans import Plan, node_cost
from .partition.split import joint_of
from .semantics.hops import hop_counts
from .artifact import format_bytes

BUDGET_STEPS = 11  # budgets 0, 0.1, ..., 1 in the report and the plot


@dataclass(frozen=True)
class Recomputed:
    name: str
    op: str
    cost_bytes: int  # bytes the recomputation reads and writes


@dataclass(frozen=True)
class Explanation:
    """What a compile saves for the backward, what it recomputes, and what that costs.

    `print(explanation)` or `explanation.show()` prints it; the graphs' code only when asked
    (`show(graphs=True)`). The memory/compute curve is computed at its first use
    (`.curve`, `.budget_points()`, `.plot()`): seconds to minutes on a large model. With a
    `memory_budget`, the compile computed it already and it is shown."""

    forward_code: str
    backward_code: str
    saved: list[SavedValue]
    recomputed: list[Recomputed]
    memory: MemoryEstimate
    memory_budget: float | None = None
    # Higher-order ops in the joint graph (name: calls): each partitioned as one unit.
    units: dict[str, int] = field(default_factory=dict)
    # Computes the curve (None: explain(..., curve=False)); or the curve itself, known.
    curve_source: Callable[[], Curve] | Curve | None = field(default=None, repr=False,
                                                            compare=False)

    @property
    def estimated_peak_bytes(self) -> int:
        return self.memory.peak_bytes

    @functools.cached_property
    def curve(self) -> Curve | None:
        """The memory/compute curve over budgets, computed at the first access."""
        source = self.curve_source
        return source() if callable(source) else source

    @property
    def chosen(self) -> Plan | None:
        """The curve's point for `memory_budget`."""
        if self.memory_budget is None or self.curve is None:
            return None
        return choose(self.curve, self.memory_budget)

    def budget_points(self, steps: int = BUDGET_STEPS) -> list[tuple[float, Plan]]:
        """(budget, the plan it picks) for budgets evenly spaced from 0 to 1."""
        if self.curve is None:
            return []
        budgets = [i / (steps - 1) for i in range(steps)]
        return [(b, choose(self.curve, b)) for b in budgets]

    def show(self, graphs: bool = False, curve: bool = False) -> None:
        """Print the report; `graphs`: with the forward's and backward's code; `curve`: with
        the memory/compute curve, computed if it was not (it is shown once known anyway)."""
        print(self.format(graphs, curve))

    def format(self, graphs: bool = False, curve: bool = False) -> str:
        return "\n".join(self._lines(graphs, curve))

    def __str__(self) -> str:
        return self.format()

    def _curve_known(self) -> bool:
        return "curve" in self.__dict__ or isinstance(self.curve_source, Curve)

    def _lines(self, graphs: bool, curve: bool):
        m = self.memory
        yield (f"estimated peak {format_bytes(m.peak_bytes)} (forward "
               f"{format_bytes(m.forward_peak_bytes)}, backward "
               f"{format_bytes(m.backward_peak_bytes)}; inputs {format_bytes(m.input_bytes)}, "
               f"saved {format_bytes(m.saved_bytes)})")
        yield f"saved for backward ({len(self.saved)}):"
        yield from (f"  {s.name:<24} {s.op:<36} {str(list(s.shape)):<18} {s.dtype}  "
                    f"{format_bytes(s.nbytes)}" for s in self.saved)
        total = sum(r.cost_bytes for r in self.recomputed)
        yield (f"recomputed in backward ({len(self.recomputed)}, "
               f"{format_bytes(total)} of traffic):")
        yield from (f"  {r.name:<24} {r.op:<36} {format_bytes(r.cost_bytes)}"
                    for r in self.recomputed)
        if self.units:
            yield ("higher-order ops, each partitioned as one unit (its outputs saved or the "
                   "whole op recomputed; what its subgraphs compute inside is neither saved "
                   "nor recomputed apart, their own partition decides): "
                   + ", ".join(f"{name} x{n}" for name, n in self.units.items()))
        if (curve or self._curve_known()) and self.curve is not None:
            yield from self._curve_lines()
        if graphs:
            yield "forward graph:" + self.forward_code
            yield "backward graph:" + self.backward_code

    def _curve_lines(self):
        c, chosen = self.curve, self.chosen
        yield (f"memory/compute curve ({c.solver}; peaks {format_bytes(c.low_bytes)} to "
               f"{format_bytes(c.high_bytes)}; budget b aims at the top less (1 - b) x "
               f"{format_bytes(c.saved_bytes)} saved), budget {self.memory_budget}:")
        yield from (f"  {'*' if p == chosen else ' '} peak {format_bytes(p.peak_bytes):>10}"
                    f"  recompute {format_bytes(p.recompute_cost):>10}" for p in c.plans)

    def plot(self, path: str) -> None:
        """Write the memory/compute curve as a PNG (needs matplotlib): the estimated peak
        and the recomputation each budget from 0 to 1 picks, and the Pareto front."""
        try:
            import matplotlib
        except ImportError as e:
            raise ImportError("Explanation.plot needs matplotlib: pip install matplotlib") from e
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        if self.curve is None:
            raise ValueError("explain(..., curve=False): there is no curve to plot")
        points = self.budget_points(51)
        unit, scale = _unit(max(p.peak_bytes for p in self.curve.plans))
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        left.step([b for b, _ in points], [p.peak_bytes / scale for _, p in points],
                  where="post", label="estimated peak")
        left.step([b for b, _ in points], [p.recompute_cost / scale for _, p in points],
                  where="post", label="recomputation traffic")
        left.set_xlabel("memory budget")
        left.set_ylabel(unit)
        left.legend()
        right.plot([p.recompute_cost / scale for p in self.curve.plans],
                   [p.peak_bytes / scale for p in self.curve.plans], "o-")
        if self.chosen is not None:
            right.plot([self.chosen.recompute_cost / scale], [self.chosen.peak_bytes / scale],
                       "r*", markersize=14)
        right.set_xlabel(f"recomputation ({unit} of traffic)")
        right.set_ylabel(f"estimated peak ({unit})")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def _unit(nbytes: int) -> tuple[str, int]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return unit, scale
    return "B", 1


def explain(fn_or_module: Callable, *example_inputs: Any, memory_budget: float | None = None,
            partitioner: Callable | None = None, curve: bool = True, plot: str | None = None,
            print_report: bool = False, **options) -> Explanation:
    """Compile for `example_inputs` (eager backend) and return the report of its partition;
    nothing is printed unless `print_report` (or `print(report)`, `report.show()`). The
    compiled function is called once on them: what it changes in place (an input, a
    module's buffers) is changed, as a call would.

    `memory_budget` and `partitioner` are passed to `aotgrad.compile`, as are `options`;
    `curve=False`: no memory/compute curve (else computed when first used); `plot` writes
    the curve as a PNG.

    >>> import torch, aotgrad
    >>> w = torch.randn(8, 8, requires_grad=True)
    >>> report = aotgrad.explain(lambda x, w: (x @ w).relu().sum(), torch.randn(4, 8), w)
    >>> report.estimated_peak_bytes > 0
    True
    """
    from .api import compile
    check.flag("explain", "curve", curve)
    check.flag("explain", "print_report", print_report)
    check.optional_type("explain", "plot", plot, str, "a file path")
    compiled = compile(fn_or_module, backend="eager", partitioner=partitioner,
                       memory_budget=memory_budget, **options)
    compiled(*example_inputs)
    report = explain_artifact(compiled.artifacts[-1], memory_budget, curve)
    if print_report:
        print(report)
    if plot is not None:
        report.plot(plot)
    return report


def explain_artifact(artifact: Artifact, memory_budget: float | None = None,
                     curve: bool = True) -> Explanation:
    """The report for one compile's artifact (the curve computed when first used)."""
    fw, bw = artifact.forward_graph, artifact.backward_graph
    if bw is None:
        raise ValueError("explain: nothing requires grad, so there is no backward to partition")
    joint = artifact.joint_graph
    if joint is None:  # a persistent cache hit keyed before the trace: nothing was traced
        raise ValueError("aotgrad: explain: this compile came from the persistent cache "
                         "before its trace, so it has no joint graph; compile again with "
                         "AOTGRAD_CACHE=0 to explain it")
    for gm in (fw, bw):  # a cache hit Inductor loaded by key: its ops have no fake values
        if lacks_fake_values(gm):
            fill_fake_values(gm)
    n = joint.meta[JOINT_FW_OUTPUTS]  # plain outputs (subclasses split)
    forward = {v.name for v in joint_of(joint, n).forward}
    recomputed = [Recomputed(node.name, str(node.target), node_cost(node))
                  for node in bw.graph.nodes
                  if node.op == "call_function" and node.name in forward]
    # The curve a memory budget was chosen on, if the compile computed it.
    source = (joint.meta.get(CURVE) or functools.partial(plan_curve, joint, n)) if curve else None
    return Explanation(fw.code, bw.code, artifact.saved, recomputed, estimate_peak(fw, bw, n),
                       memory_budget, hop_counts(joint.graph), source)
