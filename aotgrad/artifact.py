"""What one compile produced (`Artifact`, the values it saves), and readable summaries of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from .partition.memory import tensor_bytes
from .schema import GRAPH_INFO, FunctionInfo


@dataclass
class Artifact:
    """Everything one compile produced, for inspection after the fact."""

    info: FunctionInfo
    forward_graph: fx.GraphModule  # the inference graph when there is no backward
    backward_graph: fx.GraphModule | None = None
    joint_graph: fx.GraphModule | None = None
    timings: dict[str, float] = field(default_factory=dict)
    # The user's name of each graph input the forward's placeholders stand for (where known).
    input_names: dict[str, str] = field(default_factory=dict)

    @property
    def saved(self) -> list["SavedValue"]:
        """The values the forward saves for the backward."""
        if self.backward_graph is None:
            return []
        outs = list(self.forward_graph.graph.output_node().args[0])
        num_outputs = self.forward_graph.meta[GRAPH_INFO].user_outputs.stop  # plain outputs
        return [SavedValue.of(n, self.input_names) for n in outs[num_outputs:]]

    def summary(self) -> str:
        return summarize(self)


@dataclass(frozen=True)
class SavedValue:
    name: str  # the user's name of an input (`blocks.0.attn.weight`), else the node's
    op: str
    shape: tuple
    dtype: Any
    nbytes: int
    graph_name: str = ""  # the node's name in the graphs (`primals_3`, `mm_2`)

    @staticmethod
    def of(node: fx.Node, input_names: dict[str, str] | None = None) -> "SavedValue":
        val = node.meta.get("val")
        op = node.op if node.op == "placeholder" else str(node.target)
        name = (input_names or {}).get(node.name, node.name)
        if isinstance(val, torch.Tensor):
            return SavedValue(name, op, tuple(val.shape), val.dtype, tensor_bytes(val),
                              node.name)
        return SavedValue(name, op, (), type(val).__name__, 8, node.name)


def count_ops(gm: fx.GraphModule | None) -> int:
    return 0 if gm is None else sum(n.op == "call_function" for n in gm.graph.nodes)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def summarize(artifact: Artifact, largest: int = 10) -> str:
    """Graph sizes, the largest values saved for backward, and compile time per stage."""
    lines = [_graph_line(artifact)]
    saved = sorted(artifact.saved, key=lambda s: -s.nbytes)
    if saved:
        total = sum(s.nbytes for s in saved)
        lines.append(f"saved for backward: {len(saved)} values, {format_bytes(total)} "
                     f"(inputs among them cost nothing extra)")
        lines += [f"  {s.name:<24} {s.op:<36} {str(list(s.shape)):<20} "
                  f"{str(s.dtype).replace('torch.', ''):<9} {format_bytes(s.nbytes):>10}"
                  for s in saved[:largest]]
        if len(saved) > largest:
            lines.append(f"  ... and {len(saved) - largest} smaller ones")
    timings = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in artifact.timings.items())
    lines.append(f"compile time: {timings}")
    return "\n".join(lines)


def _graph_line(artifact: Artifact) -> str:
    if artifact.backward_graph is None:
        return f"inference graph: {count_ops(artifact.forward_graph)} ops"
    joint = "(from the cache)" if artifact.joint_graph is None else \
        f"{count_ops(artifact.joint_graph)} ops"
    return (f"joint graph: {joint} -> forward "
            f"{count_ops(artifact.forward_graph)} ops, backward "
            f"{count_ops(artifact.backward_graph)} ops")
