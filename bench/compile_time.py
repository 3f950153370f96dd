"""Compile time of aotgrad's stages against PyTorch's AOTAutograd, by transformer depth.

    python bench/compile_time.py [--layers 12,24,48] [--rounds 3] [--baseline main] [--out bench/results]

Both sides compile the same flat function (a GPT-2-style transformer LM, parameters as
inputs) with a no-op compiler and a min-cut partitioner, so the time measured is the
ahead-of-time part alone: capture, analysis, joint trace, partition. Each is the first
call's time minus a steady call's. Widths are small: tracing cost depends on the graph, not
on tensor sizes. The sides take turns (interleaved, the order rotating) for `--rounds`
rounds after a warm-up compile of each, and each keeps its fastest round by two clocks:
process CPU time (what the ratios use: time descheduled on a shared machine does not count)
and wall time. `--baseline REV` adds aotgrad as of a git revision to the same rounds.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import pathlib
import platform
import tempfile
import time
from typing import Callable

import torch

import aotgrad.compat as ours
from aotgrad.demo import TinyLM
from overhead import baseline_package  # noqa: E402 - bench/ is on the path when run


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


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def compile_seconds(compiled, args) -> dict[str, float]:
    """The first call's time minus the fastest of three steady calls, by each clock."""
    first = _call_seconds(compiled, args)
    steady = [_call_seconds(compiled, args) for _ in range(3)]
    return {clock: first[clock] - min(s[clock] for s in steady) for clock in CLOCKS}


def _call_seconds(compiled, args) -> dict[str, float]:
    start = {clock: read() for clock, read in CLOCKS.items()}
    compiled(*args).backward()
    return {clock: read() - start[clock] for clock, read in CLOCKS.items()}


def candidates(baseline=None) -> dict[str, Callable]:
    """side -> a function compiling a flat function with a no-op compiler and min-cut."""
    from functorch.compile import aot_function, min_cut_rematerialization_partition, nop
    sides = {"torch_aot": lambda fn: aot_function(
                 fn, nop, partition_fn=min_cut_rematerialization_partition),
             "aotgrad": lambda fn: ours.aot_function(
                 fn, ours.nop, partition_fn=ours.min_cut_rematerialization_partition)}
    if baseline is not None:
        sides["baseline"] = lambda fn: baseline.compat.aot_function(
            fn, baseline.compat.nop, partition_fn=baseline.compat.min_cut_rematerialization_partition)
    return sides


def measure(layers: int, sides: dict[str, Callable], rounds: int) -> dict:
    """Each side's fastest round by each clock, the sides interleaved, their order rotating."""
    fn, args = flat_model(layers)
    best = {side: {clock: float("inf") for clock in CLOCKS} for side in sides}
    stages, joint_ops = {}, 0
    for r in range(rounds):
        order = list(sides)[r % len(sides):] + list(sides)[:r % len(sides)]
        for side in order:
            compiled = sides[side](fn)
            seconds = compile_seconds(compiled, args)
            if side == "aotgrad" and seconds["cpu"] < best[side]["cpu"]:
                stages = compiled.artifacts[0].timings
                joint_ops = sum(n.op == "call_function"
                                for n in compiled.artifacts[0].joint_graph.graph.nodes)
            for clock, value in seconds.items():
                best[side][clock] = min(best[side][clock], value)
    row = {"layers": layers, "joint_ops": joint_ops, "seconds": best,
           "aotgrad_s": best["aotgrad"]["cpu"], "aotgrad_stages_s": stages,
           "torch_aot_s": best["torch_aot"]["cpu"],
           "ratio": best["aotgrad"]["cpu"] / best["torch_aot"]["cpu"],
           "wall_ratio": best["aotgrad"]["wall"] / best["torch_aot"]["wall"]}
    if "baseline" in best:
        row["baseline_ratio"] = best["baseline"]["cpu"] / best["torch_aot"]["cpu"]
    return row


def warm_up(sides: dict[str, Callable]) -> None:
    """A first compile pays imports and lazy initialization: not part of any row."""
    fn, args = flat_model(1)
    for compile_fn in sides.values():
        compile_seconds(compile_fn(fn), args)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="12,24,48")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--baseline", help="also time aotgrad as of this git revision")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        baseline = baseline_package(args.baseline, scratch) if args.baseline else None
        if baseline is not None:
            importlib.import_module(baseline.__name__ + ".compat")
        sides = candidates(baseline)
        warm_up(sides)
        rows = [measure(int(n), sides, args.rounds) for n in args.layers.split(",")]
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "device": f"CPU ({platform.processor() or platform.machine()}, "
                      f"{torch.get_num_threads()} thread(s))",
            "rounds": args.rounds, "baseline": args.baseline}
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
             "first call minus a steady call, process CPU time, fastest of "
             f"{meta['rounds']} interleaved rounds. Where aotgrad's time goes: each stage's "
             "share of its fastest round (wall clock, timed by the pipeline).", "",
             "| layers | joint ops | aotgrad (s) | capture+analysis | trace | partition | "
             "PyTorch AOT (s) | aotgrad / PyTorch | by wall time |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        share = _shares(r["aotgrad_stages_s"])
        lines.append(f"| {r['layers']} | {r['joint_ops']} | {r['aotgrad_s']:.2f} | "
                     f"{share['capture+analysis']:.0%} | {share['trace']:.0%} | "
                     f"{share['partition']:.0%} | {r['torch_aot_s']:.2f} | {r['ratio']:.2f} | "
                     f"{r['wall_ratio']:.2f} |")
    if meta.get("baseline"):
        lines += ["", f"aotgrad as of `{meta['baseline']}`, in the same rounds:", ""]
        lines += [f"- {r['layers']} layers: {r['seconds']['baseline']['cpu']:.2f} s, "
                  f"{r['baseline_ratio']:.2f}x PyTorch" for r in rows]
    return "\n".join(lines) + "\n"


def _shares(stages: dict[str, float]) -> dict[str, float]:
    parts = {"capture+analysis": stages["capture"] + stages["analysis"],
             "trace": stages["trace"] + stages.get("passes", 0.0),  # passes: the joint's
             "partition": stages["partition"]}
    total = sum(stages.values())
    return {name: value / total for name, value in parts.items()}


if __name__ == "__main__":
    main()
