"""Where does a compiled training step spend its GPU time? Kernel time by kind, side by side.

    python bench/profile_gap.py --models gpt2,resnet50 --modes torch_compile,aotgrad_dynamo

Each (model, mode) runs in its own subprocess (as in run.py), compiles, warms up, then records
a few steps with torch.profiler. Kernels are grouped by kind (matmul, convolution, attention,
Triton-generated, copies, other ATen kernels) so that two modes' steps can be compared kind
by kind, and the forward's kernel time apart from the backward's (what the partition
decides); the largest kernels of each mode are written to --out as JSON.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import run as bench  # noqa: E402  (bench/run.py: models, modes, the step)
from kernel_dump import Dump  # noqa: E402

# (kind, substrings of a kernel name), first match wins.
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas", "splitk")),
    ("convolution", ("conv", "cudnn", "implicit", "winograd", "dgrad", "wgrad", "fprop")),
    ("triton", ("triton",)),
    ("copy", ("copy", "memcpy", "memset", "cat")),
    ("reduction", ("reduce", "norm", "softmax")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((k for k, parts in KINDS if any(p in lowered for p in parts)), "other")


def profile_row(model_name: str, mode_name: str, steps: int, dump: Dump) -> dict:
    with dump:
        row = bench.warmed_up(bench.Job(model_name, mode_name, None, False, "cuda", 3, steps))
    step = row.step
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    before = torch.cuda.memory_stats()
    torch.cuda.reset_peak_memory_stats()
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    peak_mb = torch.cuda.max_memory_allocated() / 2**20
    allocator = {k: (after.get(k, 0) - before.get(k, 0)) / steps for k in ALLOCATOR_COUNTS}
    return {**summarize(prof.events(), steps), "gaps": idle_gaps(prof.events(), steps),
            "allocator_per_step": allocator, "peak_mb": peak_mb,
            "synced": synced_steps(step, steps),
            "forward_ms": forward_kernel_ms(row, steps),
            "host_profile": host_profile(step, steps)}


def forward_kernel_ms(row: bench.Warmed, steps: int) -> float:
    """Kernel time of the forward alone, per step (the backward's is the step's total less
    this: the partition decides what the backward reads and recomputes). Each forward is
    profiled on its own, synchronized, so no backward kernel falls in."""
    total = 0.0
    for _ in range(steps):
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.autocast("cuda", torch.bfloat16) if row.use_autocast \
                    else contextlib.nullcontext():
                loss = row.compiled(*row.batch)
            torch.cuda.synchronize()
        total += sum(e.device_time for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
        loss.backward()
        row.model.zero_grad(set_to_none=True)
    return total / 1e3 / steps


def synced_steps(step, steps: int) -> dict:
    """Steps timed as run.py times them (synchronized before each), and how long the GPU
    waits for the step's first kernel."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    latencies, times = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(3):
            torch.cuda.synchronize()
            with torch.profiler.record_function("bench_step"):
                step()
            torch.cuda.synchronize()
    events = prof.events()
    marks = sorted(e.time_range.start for e in events if e.name == "bench_step")
    kernels = sorted(e.time_range.start for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    for mark in marks:
        first = next((k for k in kernels if k >= mark), None)
        if first is not None:
            latencies.append((first - mark) / 1e3)
    return {"step_ms": sorted(times)[len(times) // 2], "first_kernel_ms": latencies}


def host_profile(step, steps: int, lines: int = 25) -> str:
    """Where the host's time goes in a step: cProfile's top functions by own time."""
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(lines)
    return text.getvalue()


# Allocator events that cost synchronizations or driver calls inside a step.
ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries",
                    "num_sync_all_streams")


def idle_gaps(events, steps: int, threshold_us: float = 20.0) -> dict:
    """Time the GPU sat idle between kernels, and the largest gaps with their neighbours."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    gaps = [(start - prev_end, prev_name, name)
            for (_, prev_end, prev_name), (start, _, name) in zip(kernels, kernels[1:])
            if start - prev_end > threshold_us]
    gaps.sort(key=lambda g: -g[0])
    return {"idle_ms_per_step": sum(g[0] for g in gaps) / 1e3 / steps,
            "largest": [{"us": g[0], "after": g[1][:100], "before": g[2][:100]}
                        for g in gaps[:15]]}


def summarize(events, steps: int) -> dict:
    by_kernel: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.device_type == torch.autograd.DeviceType.CUDA:
            row = by_kernel[e.name]
            row[0] += e.device_time / 1e3 / steps  # ms per step
            row[1] += 1 / steps
    kinds: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for name, (ms, count) in by_kernel.items():
        kinds[kind_of(name)][0] += ms
        kinds[kind_of(name)][1] += count
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:60]
    return {"total_ms": sum(ms for ms, _ in by_kernel.values()),
            "kernels": sum(c for _, c in by_kernel.values()),
            "kinds": {k: {"ms": ms, "count": c} for k, (ms, c) in kinds.items()},
            "top": [{"name": n[:160], "ms": ms, "count": c, "kind": kind_of(n)}
                    for n, (ms, c) in top]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--modes", default="torch_compile,aotgrad_dynamo")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="profile_gap")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per row")
    parser.add_argument("--dump", metavar="MARK", help="write the graphs Inductor compiles, and "
                        "the Triton kernels whose names hold MARK, to OUT/MODEL_MODE.tar.gz")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "MODE"))
    args = parser.parse_args()
    if args.worker:
        folder = Path(args.out) / "_".join(args.worker) if args.dump else None
        dump = Dump(folder, (args.dump,) if args.dump else ())
        print(json.dumps(profile_row(*args.worker, args.steps, dump)))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            try:
                done = subprocess.run([sys.executable, __file__, "--worker", model, mode,
                                       "--steps", str(args.steps), "--out", args.out,
                                       *(["--dump", args.dump] if args.dump else [])],
                                      capture_output=True,
                                      text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                print(f"{model}/{mode}: over {args.timeout:.0f} s")
                continue
            if done.returncode:
                print(f"{model}/{mode} failed:\n{done.stderr[-3000:]}")
                continue
            results[f"{model}/{mode}"] = json.loads(done.stdout.strip().splitlines()[-1])
            if args.dump:  # one file: a device call brings back only a few of $OUT's
                folder = out / f"{model}_{mode}"
                shutil.make_archive(str(folder), "gztar", folder)
                shutil.rmtree(folder)
            (out / "profile.json").write_text(json.dumps(results, indent=1))  # a cut run keeps it
            print(f"{model}/{mode}: done", flush=True)
    print_table(results)


def print_table(results: dict) -> None:
    kinds = sorted({k for r in results.values() for k in r["kinds"]})
    print("row".ljust(32) + "total".rjust(9) + "".join(k[:10].rjust(11) for k in kinds))
    for label, r in results.items():
        cells = "".join(f"{r['kinds'].get(k, {}).get('ms', 0):7.2f}/{r['kinds'].get(k, {}).get('count', 0):<3.0f}"
                        for k in kinds)
        print(label.ljust(32) + f"{r['total_ms']:9.2f}" + cells)
    for label, r in results.items():
        print(f"{label}: kernels forward {r['forward_ms']:.2f} ms, backward "
              f"{r['total_ms'] - r['forward_ms']:.2f} ms per step, peak {r['peak_mb']:.0f} MB")
    for label, r in results.items():
        print(f"{label}: idle {r['gaps']['idle_ms_per_step']:.2f} ms/step (gaps > 20 us), "
              f"synced step {r['synced']['step_ms']:.2f} ms, first kernel after "
              f"{[round(x, 2) for x in r['synced']['first_kernel_ms']]} ms")


if __name__ == "__main__":
    main()
