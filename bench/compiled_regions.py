"""Compile time against depth, with and without compiled regions (`nested_compile_region`).

    python bench/compiled_regions.py [--layers 4,16] [--backends eager,torch-aot_eager,inductor,torch-inductor] [--out bench/results]

A transformer LM (aotgrad.demo.TinyLM) whose block's forward is, or is not, marked
`torch.compiler.nested_compile_region`, compiled by `torch.compile(backend=aotgrad.backend(
backend="eager"))` ("eager": Dynamo, aotgrad's capture, trace, partition; the eager backend
compiles nothing) or `torch.compile(backend="aotgrad")` ("inductor": the same, then Inductor).
The time is the first training step's minus a steady step's, by process CPU time and wall
time, with aotgrad's and Inductor's on-disk caches off (every compile is cold). With regions, Dynamo hands aotgrad one `invoke_subgraph`
per block, all calling one subgraph: aotgrad traces and partitions it once, and every call
reuses that without running the body again (semantics/regions.py); a backend sees it once. PyTorch's own AOTAutograd (`aot_eager`, `inductor`) is measured
alongside as the reference. Also counted, for aotgrad's eager backend: the nodes and the
distinct subgraphs of the forward and backward graphs aotgrad hands the backend.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import time

os.environ["AOTGRAD_CACHE"] = "0"  # cold compiles: no hit from an earlier run or row

import torch

import aotgrad
from aotgrad.demo import Block, TinyLM

CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}
# How each backend name compiles; "eager" counts the graphs aotgrad hands its backend.
DYNAMO_BACKENDS = {"torch-aot_eager": "aot_eager", "inductor": "aotgrad",
                   "torch-inductor": "inductor"}


class RegionBlock(Block):
    @torch.compiler.nested_compile_region
    def forward(self, x):
        return super().forward(x)


def model(layers: int, regions: bool) -> TinyLM:
    torch.manual_seed(0)
    lm = TinyLM(vocab=512, width=64, heads=4, layers=layers, context=128)
    if regions:
        for block in lm.blocks:
            block.__class__ = RegionBlock
    return lm


def step_seconds(compiled, tokens, targets) -> dict[str, float]:
    start = {clock: read() for clock, read in CLOCKS.items()}
    compiled(tokens, targets).backward()
    return {clock: read() - start[clock] for clock, read in CLOCKS.items()}


def cold_caches() -> None:
    """Inductor's caches off, as aotgrad's: a row must not reuse an earlier row's kernels."""
    import torch._functorch.config
    import torch._inductor.config
    torch._inductor.config.fx_graph_cache = False
    torch._inductor.config.autotune_local_cache = False
    torch._functorch.config.enable_autograd_cache = False


def measure(layers: int, regions: bool, backend: str) -> dict:
    """`backend`: "eager" (aotgrad, running the FX graphs it hands the backend), "inductor"
    (aotgrad, then Inductor), or "torch-aot_eager" / "torch-inductor" (PyTorch's
    AOTAutograd, the reference). Graphs are counted for "eager" only."""
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm

    lm = model(layers, regions)
    dynamo_backend = DYNAMO_BACKENDS.get(backend) or aotgrad.backend(backend=counting)
    compiled = torch.compile(lm, backend=dynamo_backend)
    tokens = torch.randint(0, 512, (2, 128))
    targets = torch.roll(tokens, -1, 1)
    first = step_seconds(compiled, tokens, targets)
    steady = [step_seconds(compiled, tokens, targets) for _ in range(3)]
    loss, eager = compiled(tokens, targets), model(layers, regions)(tokens, targets)
    return {"layers": layers, "regions": regions, "backend": backend,
            **{f"compile_{c}_s": round(first[c] - min(s[c] for s in steady), 3) for c in CLOCKS},
            "graph_nodes": [len(g.graph.nodes) for g in graphs],
            "subgraphs": [len(list(g.named_children())) for g in graphs],
            "loss_matches_eager": bool(torch.allclose(loss, eager, rtol=1e-4, atol=1e-5))}


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Compile time against depth, compiled regions ({meta['date']}, torch "
             f"{meta['torch']}, {meta['machine']})", "",
             "First training step minus a steady one, cold caches, TinyLM width 64, batch "
             "2x128 (`bench/compiled_regions.py`). eager: `torch.compile(backend=aotgrad."
             "backend(backend=\"eager\"))`; inductor: `torch.compile(backend=\"aotgrad\")`; "
             "torch-*: `torch.compile(backend=\"aot_eager\" or \"inductor\")`.", "",
             "| backend | regions | layers | compile CPU s | wall s | graph nodes (fw, bw) "
             "| subgraphs | loss = eager |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['backend']} | {'yes' if r['regions'] else 'no'} | {r['layers']} | "
                     f"{r['compile_cpu_s']} | {r['compile_wall_s']} | {r['graph_nodes']} | "
                     f"{r['subgraphs']} | {r['loss_matches_eager']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", default="4,16")
    parser.add_argument("--backends", default="eager,torch-aot_eager,inductor,torch-inductor")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    cold_caches()
    rows = []
    for backend in args.backends.split(","):
        measure(2, True, backend)  # warm-up: a backend's first compile pays for its imports
        rows += [measure(int(n), regions, backend) for regions in (False, True)
                 for n in args.layers.split(",")]
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores"}
    out = pathlib.Path(args.out)
    (out / "compiled_regions_cpu.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (out / "compiled_regions_cpu.md").write_text(markdown(meta, rows))
    print(markdown(meta, rows))


if __name__ == "__main__":
    main()
