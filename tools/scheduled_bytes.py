"""Issue 20: the bytes Inductor's kernels would read and write, aotgrad's partition vs torch's.

    PYTHONPATH=.:/tmp/timmpkgs:/tmp/tfpkgs:/tmp/tvstub python tools/scheduled_bytes.py vit_s16

`tools/saved_compare.py`'s two partitions of a bench model's joint (CPU, fake tensors,
CUDA-like bf16 autocast), each graph lowered and scheduled by Inductor (fusion decided) and
stopped before code generation. Per graph: its scheduled nodes (kernels and extern calls)
and the bytes they read and write (`GraphLowering.count_bytes`); then the backward's kernels
grouped by the ATen ops fused into them, where the two sides' bytes differ. A partition
whose backward kernels move fewer bytes runs faster where they are memory-bound, but the
CPU's scheduler fuses otherwise than the GPU's, and these totals did not rank session 27's
GPU kernel times (`bench/profile_gap.py`, the measure): our backward moved 1.6% more bytes
than torch's on ViT-S/16 (GPU kernel time 1.050x), 3.9% more on Swin-T (0.970x) and 2.0%
more on ConvNeXt-T (0.974x). What it shows is where two partitions differ, kernel by kernel.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch
import torch._inductor.graph as inductor_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lowered_buffers  # noqa: E402  (its buffers_of stops a compile by an exception)

MiB = 2**20


def _stop_after_scheduling():
    def codegen(self):
        self.init_wrapper_code()
        self._update_scheduler()
        _, per_node, _ = self.count_bytes()  # (node, bytes // 4) each
        raise lowered_buffers._Lowered([(_fused_ops(n), 4 * b) for n, b in per_node])
    inductor_graph.GraphLowering.codegen = codegen


def _fused_ops(node) -> str:
    """A scheduled node named by the ATen ops fused into it, with their counts."""
    ops = collections.Counter(getattr(origin.target, "_opname", str(origin.target))
                              for part in node.get_nodes() if part.node is not None
                              for origin in part.node.origins)
    return " ".join(f"{op}x{k}" if k > 1 else op for op, k in sorted(ops.items()))


def main(argv=None):
    graphs = lowered_buffers.both_partitions((argv or sys.argv[1:] or ["vit_s16"])[0])
    _stop_after_scheduling()
    backward = {}
    for side, role, gm in graphs:
        nodes = lowered_buffers.buffers_of(gm, backward=role == "backward")
        total = sum(b for _, b in nodes)
        print(f"{side:8} {role:9} scheduled nodes {len(nodes):4}  bytes {total / MiB:9.1f} MiB")
        if role == "backward":
            backward[side] = by_ops = collections.defaultdict(lambda: [0, 0])
            for ops, b in nodes:
                by_ops[ops][0] += 1
                by_ops[ops][1] += b
    ours, theirs = backward["aotgrad"], backward["torch"]
    print("\n== backward kernels by the ops fused into them: count, MiB, aotgrad | torch")
    for ops in sorted(set(ours) | set(theirs), key=lambda k: -abs(ours[k][1] - theirs[k][1])):
        if ours[ops][1] != theirs[ops][1]:
            print(f"  {ours[ops][0]:4} {ours[ops][1] / MiB:8.1f} | {theirs[ops][0]:4} "
                  f"{theirs[ops][1] / MiB:8.1f}  {ops[:120]}")


if __name__ == "__main__":
    main()
