"""Partition time against trace time on a 12-layer transformer (GPT-2 small shapes).

    python bench/partition_time.py [--layers 12] [--curve]

Builds the model from plain torch modules, compiles it with the eager backend (the
min-cut partitioner, the default), and prints the per-stage compile times from the
artifact, then times min-cut and the memory-budget curve on the same joint graph.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aotgrad  # noqa: E402
from aotgrad.partition import budget, remat  # noqa: E402
from aotgrad.demo import TinyLM  # noqa: E402
from aotgrad.partition.memory import estimate_peak  # noqa: E402
from aotgrad.partition.split import default_partition  # noqa: E402


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--curve", action="store_true", help="also time the budget curve")
    parser.add_argument("--solvers", default="auto", help="comma-separated: auto, ilp, greedy")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--decompose", action="store_true",
                        help="trace with Inductor's decompositions (a larger graph)")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    # Fake tensors: shapes without data, so a GPT-2-sized step costs no compute here.
    with FakeTensorMode(allow_non_fake_inputs=True):
        # GPT-2 small's shape: 768 wide, 12 heads, a 1024-token context.
        model = TinyLM(vocab=args.vocab, width=768, heads=12, layers=args.layers, context=1024)
        ids = torch.randint(0, args.vocab, (args.batch, args.seq))
        targets = torch.roll(ids, -1, 1)
    decomps = None
    if args.decompose:
        from torch._inductor.decomposition import select_decomp_table
        decomps = select_decomp_table()
    compiled = aotgrad.compile(model, backend="eager", decompositions=decomps)
    compiled(ids, targets)
    art = compiled.artifacts[0]
    joint, n = art.joint_graph, art.info.num_graph_outputs
    print(f"joint graph: {len(joint.graph.nodes)} nodes")
    print("compile stages (s):", {k: round(v, 3) for k, v in art.timings.items()})
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    (fw, bw), t_mincut = timed(remat.min_cut_rematerialization_partition, joint,
                               num_fwd_outputs=n)
    (dfw, dbw), t_default = timed(default_partition, joint, num_fwd_outputs=n)
    print(f"min-cut partition {t_mincut:.3f} s, default partition {t_default:.3f} s")
    for name, (f, b) in [("min-cut", (fw, bw)), ("default", (dfw, dbw))]:
        m = estimate_peak(f, b, n)
        print(f"{name}: saved {m.saved_bytes / 2**20:.1f} MiB of new memory "
              f"({saved(f, n) / 2**20:.1f} MiB counting views as copies), estimated peak "
              f"{m.peak_bytes / 2**20:.1f} MiB")
    if args.curve:
        for solver in args.solvers.split(","):
            curve, t_curve = timed(budget.plan_curve, joint, n, solver)
            print(f"plan_curve ({curve.solver}) {t_curve:.3f} s, budget 0..1 = "
                  f"{curve.low_bytes / 2**20:.0f}..{curve.high_bytes / 2**20:.0f} MiB, "
                  f"{len(curve.plans)} points (peak MiB/recompute MiB): " + ", ".join(
                      f"{p.peak_bytes / 2**20:.0f}/{p.recompute_cost / 2**20:.0f}"
                      for p in curve.plans))
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)


def saved(fw, n):
    outs = list(fw.graph.output_node().args[0])[n:]
    return sum(o.meta["val"].numel() * o.meta["val"].element_size() for o in outs
               if o.op != "placeholder" and isinstance(o.meta.get("val"), torch.Tensor))


if __name__ == "__main__":
    main()
