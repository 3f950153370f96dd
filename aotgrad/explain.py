"""`aotgrad.explain`: why a partition saves what it saves, and what that costs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from .budget import Curve, choose, plan_curve
from .plans import Plan, node_cost
from .memory import MemoryEstimate, estimate_peak
from .pipeline import Artifact, SavedValue
from .report import format_bytes


@dataclass(frozen=True)
class Recomputed:
    name: str
    op: str
    cost_bytes: int  # bytes the recomputation reads and writes


@dataclass
class Explanation:
    forward_code: str
    backward_code: str
    saved: list[SavedValue]
    recomputed: list[Recomputed]
    memory: MemoryEstimate
    curve: list[Plan] = field(default_factory=list)
    chosen: Plan | None = None
    memory_budget: float | None = None

    @property
    def estimated_peak_bytes(self) -> int:
        return self.memory.peak_bytes

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self):
        yield f"estimated peak {format_bytes(self.memory.peak_bytes)} (forward "
        yield (f"  {format_bytes(self.memory.forward_peak_bytes)}, backward "
               f"{format_bytes(self.memory.backward_peak_bytes)}; inputs "
               f"{format_bytes(self.memory.input_bytes)}, saved "
               f"{format_bytes(self.memory.saved_bytes)})")
        yield f"saved for backward ({len(self.saved)}):"
        yield from (f"  {s.name:<24} {s.op:<36} {str(list(s.shape)):<18} {s.dtype}  "
                    f"{format_bytes(s.nbytes)}" for s in self.saved)
        yield f"recomputed in backward ({len(self.recomputed)}):"
        yield from (f"  {r.name:<24} {r.op:<36} {format_bytes(r.cost_bytes)} of traffic"
                    for r in self.recomputed)
        if self.curve:
            yield f"memory/compute curve ({len(self.curve)} points), budget {self.memory_budget}:"
            yield from (f"  {'*' if p is self.chosen else ' '} peak "
                        f"{format_bytes(p.peak_bytes):>10}  recompute "
                        f"{format_bytes(p.recompute_cost):>10}" for p in self.curve)
        yield "forward graph:" + self.forward_code
        yield "backward graph:" + self.backward_code

    def plot(self, path: str) -> None:
        """Write the memory/compute curve as a PNG (needs matplotlib)."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([p.recompute_cost / 2**20 for p in self.curve],
                [p.peak_bytes / 2**20 for p in self.curve], "o-")
        if self.chosen is not None:
            ax.plot([self.chosen.recompute_cost / 2**20], [self.chosen.peak_bytes / 2**20], "r*",
                    markersize=14)
        ax.set_xlabel("recomputation (MiB of traffic)")
        ax.set_ylabel("estimated peak (MiB)")
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def explain(fn_or_module: Callable, *example_inputs: Any, memory_budget: float | None = None,
            partitioner: Callable | None = None, print_report: bool = True, **kwargs) -> Explanation:
    """Compile for `example_inputs` (eager backend) and report the partition.

    >>> import torch, aotgrad
    >>> w = torch.randn(8, 8, requires_grad=True)
    >>> report = aotgrad.explain(lambda x: (x @ w).relu().sum(), torch.randn(4, 8),
    ...                          print_report=False)
    >>> report.estimated_peak_bytes > 0
    True
    """
    from .api import compile
    compiled = compile(fn_or_module, backend="eager", partitioner=partitioner,
                       memory_budget=memory_budget, **kwargs)
    compiled(*example_inputs)
    report = _explanation(compiled.artifacts[-1], memory_budget)
    if print_report:
        print(report)
    return report


def _explanation(artifact: Artifact, budget: float | None) -> Explanation:
    fw, bw = artifact.forward_graph, artifact.backward_graph
    if bw is None:
        raise ValueError("explain: nothing requires grad, so there is no backward to partition")
    n = artifact.info.num_graph_outputs
    fw_names = {node.name for node in fw.graph.nodes}
    recomputed = [Recomputed(node.name, str(node.target), node_cost(node))
                  for node in bw.graph.nodes
                  if node.op == "call_function" and node.name in fw_names]
    curve = plan_curve(artifact.joint_graph, n)
    chosen = choose(curve, 1.0 if budget is None else budget)
    return Explanation(fw.code, bw.code, artifact.saved, recomputed, estimate_peak(fw, bw, n),
                       curve, chosen, budget)
