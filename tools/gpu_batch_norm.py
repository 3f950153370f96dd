"""Batch norm's running statistics after compiled training steps on CUDA, against eager.

    python -m tools.gpu_batch_norm [--out DIR] [--models resnet50,...] [--inductor resnet50]

CUDA eager takes cuDNN's batch norm, which writes the running statistics without its
schema saying so; the loss and gradients are right whether or not a compiled step applies
the update, so this compares every buffer. timm models, random weights, batch 8 at 96x96.
Prints one row per model and door; `--out` writes results.json and results.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import time

import torch

import aotgrad

MODELS = ["resnet50", "efficientnet_b0", "mobilenetv3_large_100", "regnety_008", "densenet121"]
DOORS = {
    "aotgrad.compile(eager)": lambda m: aotgrad.compile(m, backend="eager"),
    "backend(eager) via Dynamo":
        lambda m: torch.compile(m, backend=aotgrad.backend(backend="eager")),
    "torch.compile(aotgrad)": lambda m: torch.compile(m, backend="aotgrad"),
}
INDUCTOR_DOORS = {"torch.compile(aotgrad)"}


def model(name: str) -> torch.nn.Module:
    import timm
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False).cuda().train()


def train_steps(m: torch.nn.Module, steps: int = 2) -> None:
    for k in range(steps):
        torch.manual_seed(100 + k)
        x = torch.randn(8, 3, 96, 96, device="cuda")
        m(x).float().square().mean().backward()


def compare_buffers(initial: dict, eager: torch.nn.Module, compiled: torch.nn.Module) -> dict:
    """Stale buffers (eager moved them, the compiled steps left them at their start: the
    bug) and the largest difference beyond cuDNN-vs-native rounding."""
    stale, worst, where = [], 0.0, ""
    for (name, e), (_, c) in zip(eager.named_buffers(), compiled.named_buffers()):
        if not torch.equal(e, initial[name]) and torch.equal(c, initial[name]):
            stale.append(name)
        excess = ((e.double() - c.double()).abs() - 1e-3 - 1e-2 * e.double().abs()).max().item()
        if excess > worst:
            worst, where = excess, name
    return {"stale_buffers": len(stale), "first_stale": stale[:1], "excess_over_tolerance": worst,
            "worst_buffer": where, "ok": not stale and worst <= 0}


def check(name: str, door: str) -> dict:
    eager, target = model(name), model(name)
    initial = {n: b.clone() for n, b in target.named_buffers()}
    train_steps(eager)
    start = time.perf_counter()
    train_steps(DOORS[door](target))
    return {"model": name, "door": door, **compare_buffers(initial, eager, target),
            "seconds": round(time.perf_counter() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--inductor", default="resnet50", help="models also run with Inductor")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = False
    rows = []
    for name in args.models.split(","):
        for door in DOORS:
            if door in INDUCTOR_DOORS and name not in args.inductor.split(","):
                continue
            rows.append(check(name, door))
            r = rows[-1]
            print(f"{'ok' if r['ok'] else 'WRONG':5} {name:22} {door:26} stale buffers "
                  f"{r['stale_buffers']:3} {r['first_stale']} "
                  f"excess {r['excess_over_tolerance']:.1e} "
                  f"({r['worst_buffer']}) {r['seconds']} s", flush=True)
    if args.out:
        write(args.out, rows)


def write(out: pathlib.Path, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "device": torch.cuda.get_device_name(), "cudnn": torch.backends.cudnn.version()}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# Batch norm buffers after 2 training steps vs eager ({meta['date']}, torch "
             f"{meta['torch']}, {meta['device']}, cuDNN {meta['cudnn']})", "",
             "Stale: buffers eager updated that the compiled steps left at their initial value. "
             "Excess: the largest difference beyond 1e-3 + 1e-2 x |eager| (cuDNN's batch norm "
             "rounds differently from the native kernel a compiled graph calls).", "",
             "| model | door | stale buffers | excess | ok |", "|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['door']} | {r['stale_buffers']} | "
              f"{r['excess_over_tolerance']:.1e} | {'yes' if r['ok'] else 'NO'} |" for r in rows]
    (out / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
