"""Compile time of aotgrad's stages against PyTorch's AOTAutograd, by transformer depth.

    python bench/compile_time.py [--layers 12,24,48] [--out bench/results]

Both sides compile the same flat function (a GPT-2-style transformer LM, parameters as
inputs) with a no-op compiler and a min-cut partitioner, so the time measured is the
ahead-of-time part alone: capture, analysis, joint trace, partition. Each is the first
call's time minus a steady call's. Widths are small: tracing cost depends on the graph, not
on tensor sizes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import statistics
import time

import torch

import aotgrad.compat as ours
from aotgrad.demo import TinyLM


def flat_model(layers: int):
    torch.manual_seed(0)
    model = TinyLM(vocab=512, width=64, heads=4, layers=layers, context=128)
    names = [n for n, _ in model.named_parameters()]
    params = [p for _, p in model.named_parameters()]

    def step(*args):
        state = dict(zip(names, args[:len(params)]))
        tokens, targets = args[len(params):]
        return torch.func.functional_call(model, state, (tokens, targets))

    tokens = torch.randint(0, 512, (2, 128))
    return step, [*params, tokens, torch.roll(tokens, -1, 1)]


def first_call_seconds(compiled, args) -> float:
    start = time.perf_counter()
    compiled(*args).backward()
    first = time.perf_counter() - start
    steady = []
    for _ in range(3):
        start = time.perf_counter()
        compiled(*args).backward()
        steady.append(time.perf_counter() - start)
    return first - statistics.median(steady)


def measure(layers: int) -> dict:
    from functorch.compile import aot_function, min_cut_rematerialization_partition, nop
    fn, args = flat_model(layers)
    theirs = first_call_seconds(
        aot_function(fn, nop, partition_fn=min_cut_rematerialization_partition), args)
    compiled = ours.aot_function(fn, ours.nop, partition_fn=ours.min_cut_rematerialization_partition)
    total = first_call_seconds(compiled, args)
    stages = compiled.artifacts[0].timings
    graph = compiled.artifacts[0].joint_graph
    return {"layers": layers, "joint_ops": sum(n.op == "call_function" for n in graph.graph.nodes),
            "aotgrad_s": total, "aotgrad_stages_s": stages, "torch_aot_s": theirs,
            "ratio": total / theirs}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="12,24,48")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    rows = [measure(int(n)) for n in args.layers.split(",")]
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "device": f"CPU ({platform.processor() or platform.machine()}, "
                      f"{torch.get_num_threads()} threads)"}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_time_cpu.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    table = markdown(meta, rows)
    (out / "compile_time_cpu.md").write_text(table)
    print(table)


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Compile time: aotgrad vs PyTorch AOTAutograd ({meta['date']}, torch "
             f"{meta['torch']}, {meta['device']})", "",
             "Ahead-of-time part only (no-op compiler, min-cut partitioner on both sides); "
             "first call minus a steady call.", "",
             "| layers | joint ops | aotgrad (s) | capture+analysis | trace | partition | "
             "PyTorch AOT (s) | aotgrad / PyTorch |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s = r["aotgrad_stages_s"]
        lines.append(f"| {r['layers']} | {r['joint_ops']} | {r['aotgrad_s']:.2f} | "
                     f"{s['capture'] + s['analysis']:.2f} | {s['trace']:.2f} | "
                     f"{s['partition']:.2f} | {r['torch_aot_s']:.2f} | {r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
