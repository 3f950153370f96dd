"""Per-backward host cost on CPU: the eager engine vs aotgrad's compiled autograd vs
torch's compiled autograd (its "eager"-ish compiler: the captured graph run as is), on a
small MLP and a 12-layer MLP, side by side in one run.

    PYTHONPATH=. python bench/compiled_autograd.py [--out bench/results/compiled_autograd_cpu]

Not yet: `--gpu` (GPT-2 small, ResNet-50 training steps with Inductor): see the report.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import subprocess
import sys
import time

import torch

import aotgrad


def mlp(layers: int, width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods = [m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    return torch.nn.Sequential(*mods)


def torch_compiled_autograd():
    from torch._dynamo import compiled_autograd as torch_ca  # the bench compares, aotgrad doesn't
    return torch_ca._enable(lambda gm: gm)


ENGINES = {"eager engine": contextlib.nullcontext,
           "aotgrad compiled autograd": lambda: aotgrad.compiled_autograd.enable("eager"),
           "torch compiled autograd": torch_compiled_autograd}


def time_backward(model: torch.nn.Module, x: torch.Tensor, context, steps: int) -> float:
    """Median seconds of one backward (forward untimed), after warm-up captures."""
    times = []
    with context():
        for i in range(steps + 3):
            loss = model(x).sum()
            start = time.perf_counter()
            loss.backward()
            if i >= 3:
                times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


MODELS = (("small MLP (2x64)", 2, 64), ("12-layer MLP (12x64)", 12, 64))


def measure(engine: str, steps: int) -> dict:
    torch.set_num_threads(1)
    return {name: time_backward(mlp(layers, width), torch.randn(8, width), ENGINES[engine],
                                steps) * 1e6 for name, layers, width in MODELS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/compiled_autograd_cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--engine", help="measure this engine alone; print JSON")
    args = parser.parse_args()
    if args.engine:
        print(json.dumps(measure(args.engine, args.steps)))
        return
    # One process per engine: the engine binds its C++ formulas to the first compiled
    # autograd instance that sees them, so two instances cannot share a process.
    results = {e: json.loads(subprocess.run(
        [sys.executable, __file__, "--engine", e, "--steps", str(args.steps)],
        check=True, capture_output=True, text=True).stdout.splitlines()[-1]) for e in ENGINES}
    write([{"model": name, **{e: results[e][name] for e in ENGINES}} for name, *_ in MODELS],
          args.out)


def write(rows: list[dict], out: str) -> None:
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "threads": 1,
            "unit": "microseconds per backward (median)"}
    with open(out + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    names = list(ENGINES)
    lines = [f"# Compiled autograd: per-backward host cost, CPU\n",
             f"{meta['date']}, torch {meta['torch']}, {meta['machine']}, 1 thread; "
             "median of 200 backwards after 3 warm-up steps.\n",
             "| model | " + " | ".join(names) + " | ours / eager | torch's / eager |",
             "| --- " * (len(names) + 3) + "|"]
    for r in rows:
        e = r["eager engine"]
        lines.append(f"| {r['model']} | " + " | ".join(f"{r[n]:.0f} us" for n in names) +
                     f" | {r[names[1]] / e:.2f}x | {r[names[2]] / e:.2f}x |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
