"""A channels-last conv net split by a graph break: the gradient crossing the break is
channels-last, and the backward graph before it takes it in some layout. Step time (forward
and backward) of `torch.compile(backend=...)`, CPU or GPU, a few rounds, medians.

    python bench/tangent_layout.py [--backend aotgrad] [--device cpu] [--rounds 5]

Run from two checkouts to compare a change (the printed line names the code's version).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import code_version  # noqa: E402


class Half(torch.nn.Sequential):
    def __init__(self, width: int):
        super().__init__(*[m for _ in range(3) for m in (
            torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.BatchNorm2d(width),
            torch.nn.ReLU())])


class Split(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.first, self.second = Half(width), Half(width)

    def forward(self, x):
        y = self.first(x)
        torch._dynamo.graph_break()
        return self.second(y).mean()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="aotgrad")
    p.add_argument("--device", default="cpu")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--size", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    torch.manual_seed(0)
    model = Split(args.width).to(args.device, memory_format=torch.channels_last)
    x = torch.randn(args.batch, args.width, args.size, args.size, device=args.device)
    x = x.to(memory_format=torch.channels_last)
    step = torch.compile(model, backend=args.backend)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    for _ in range(3):
        step(x).backward()
    times = []
    for _ in range(args.rounds):
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step(x).backward()
        sync()
        times.append((time.perf_counter() - start) / args.steps * 1e3)
    print(f"{args.backend} {code_version()}: step {statistics.median(times):.3f} ms "
          f"(min {min(times):.3f}) on {args.device}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
