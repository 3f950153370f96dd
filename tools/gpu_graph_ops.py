"""What each door hands Inductor for one bench model: op counts and saved bytes, side by side.

    python tools/gpu_graph_ops.py bert [--marks attention,dropout] [--out DIR]

Two compiles of `bench/run.py`'s model (its device and autocast settings), one training step
each: torch.compile(backend="aotgrad") and backend="inductor", both recording the forward and backward graphs before Inductor compiles
them. Prints, per door, the forward's and backward's count of each op whose name contains a
mark, the bytes the forward saves for the backward (its outputs after the user's), and the
largest saved values; with --out, each graph's code. For a peak or a step that differs between
the doors (issue 20: BERT's peak 1.35x torch's in session 29's table), this says whether the
graphs differ in what they compute, not only in what they save.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("AOTGRAD_CACHE", "0")  # a compile, not a cache hit: the graphs are needed
sys.modules.setdefault("torchvision", None)  # transformers imports it if present; unused
import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import aotgrad  # noqa: E402
from aotgrad.backends.compilers import resolve_backend  # noqa: E402
import run as bench_run  # noqa: E402


def recording(compile_, graphs: list, role: str):
    def compiler(gm, example_inputs):
        graphs.append((role, gm))
        return compile_(gm, example_inputs)
    return compiler


def aotgrad_door(graphs, memory_budget=None):
    inductor = resolve_backend("inductor")
    return aotgrad.backend(memory_budget=memory_budget, backend=dataclasses.replace(
        inductor, fw_compiler=recording(inductor.fw_compiler, graphs, "fw"),
        bw_compiler=recording(inductor.bw_compiler, graphs, "bw")))


def torch_door(graphs):
    """backend="inductor" itself, its inner compile recording each graph."""
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    def inner(gm, example_inputs, **kwargs):
        graphs.append(("bw" if kwargs.get("is_backward") else "fw", gm))
        return compile_fx_inner(gm, example_inputs, **kwargs)
    return lambda gm, example_inputs: compile_fx(gm, example_inputs, inner_compile=inner)


def tensor_bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes() if not value.is_sparse else 0
    return 0


def saved_values(fw: torch.fx.GraphModule, n_user: int):
    output = next(iter(fw.graph.find_nodes(op="output")))
    args = output.args[0]
    # Inputs (parameters) the backward reads are alive anyway: not counted.
    return [a for a in args[n_user:] if isinstance(a, torch.fx.Node) and a.op != "placeholder"]


def report(door, graphs, marks, top, out):
    print(f"== {door}")
    for index, (role, gm) in enumerate(graphs):
        counts = collections.Counter(str(n.target) for n in gm.graph.nodes
                                     if n.op == "call_function")
        shown = {k: v for k, v in sorted(counts.items()) if any(m in k for m in marks)}
        print(f"  {role}{index}: {sum(counts.values())} ops; {shown}")
        if out:
            (out / f"{door}_{index}_{role}.txt").write_text(gm.print_readable(False))
    fw = next((gm for role, gm in graphs if role == "fw"), None)
    if fw is None:
        return
    saved = saved_values(fw, n_user=1)  # the loss
    sized = sorted(((tensor_bytes(n.meta.get("val")), n) for n in saved), key=lambda p: -p[0])
    total = sum(b for b, _ in sized)
    print(f"  saved: {len(saved)} values, {total / 2**20:.1f} MiB")
    for size, node in sized[:top]:
        value = node.meta.get("val")
        print(f"    {size / 2**20:8.1f} MiB  {node.name:28s} {node.target}  "
              f"{getattr(value, 'dtype', '')} {list(getattr(value, 'shape', []))}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--marks", default="attention,dropout,bernoulli,softmax,bmm,philox,rand")
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--memory-budget", type=float, help="aotgrad's memory_budget")
    parser.add_argument("--doors", default="aotgrad,torch")
    parser.add_argument("--out")
    args = parser.parse_args()
    out = pathlib.Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    spec = bench_run.MODELS[args.model]
    marks = args.marks.split(",")
    doors = {"aotgrad": lambda graphs: aotgrad_door(graphs, args.memory_budget),
             "torch": torch_door}
    for door in args.doors.split(","):
        make = doors[door]
        torch.manual_seed(0)
        model, batch = spec.build(args.small)
        model = model.to(args.device).train()
        batch = tuple(b.to(args.device) for b in batch)
        graphs: list = []
        compiled = torch.compile(model, backend=make(graphs))
        with torch.autocast(args.device, torch.bfloat16, enabled=spec.autocast):
            loss = compiled(*batch)
        loss.backward()
        report(door, graphs, marks, args.top, out)
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
