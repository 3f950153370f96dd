"""Where a host-bound step's host time goes, per mode: torch.profiler's CPU side, one process.

    python tools/host_probe.py deberta_v2 --modes torch_compile,aotgrad_dynamo --steps 3

Issue 20: DeBERTa-v2's GPU kernels take the same time in both doors (34.2 vs 34.4 ms a step,
session 31), yet our step is host-bound in most processes: host 43-46 ms against torch's
29-32, the GPU idle 21.6 ms a step against 8.3. cProfile sees Python only; this records the
C++ side too. Each mode compiles and warms up in this process, then `--steps` steps of each
are profiled (CPU and CUDA activities). Per mode it prints the host ops and CUDA runtime
calls by self CPU time (a `cudaStreamSynchronize` or a pageable `cudaMemcpy` would make the
host wait for the GPU), and the step's host time split at the backward's start. The
traces go to --out as Chrome traces.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.modules.setdefault("torchvision", None)
import torch  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import run as bench  # noqa: E402


def syncs(row: bench.Warmed) -> list[str]:
    """The synchronizing calls of one step, by CUDA's sync debug mode."""
    import warnings
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            row.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [str(w.message)[:120] for w in caught if "synchroniz" in str(w.message)]


def probe(row: bench.Warmed, steps: int, out: pathlib.Path | None, name: str) -> None:
    found = syncs(row)
    print(f"== {name}: {len(found)} synchronizing calls in a step", found[:3])
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    halves = []
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", torch.bfloat16):
                loss = row.compiled(*row.batch)
            t1 = time.perf_counter()
            loss.backward()
            row.model.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            torch.cuda.synchronize()
            halves.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3))
    print(f"== {name}: host ms (forward, backward) under the profiler: "
          + ", ".join(f"({a:.1f}, {b:.1f})" for a, b in halves))
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for e in events[:25]:
        print(f"  {e.self_cpu_time_total / steps / 1e3:8.2f} ms {e.count / steps:7.0f}x  "
              f"{e.key[:90]}")
    runtime = [e for e in events if e.key.startswith("cuda") or e.key.startswith("cu")]
    print("  CUDA runtime calls:", ", ".join(
        f"{e.key} {e.self_cpu_time_total / steps / 1e3:.2f} ms/{e.count / steps:.0f}x"
        for e in runtime[:8]))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"{name}.json"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--modes", default="torch_compile,aotgrad_dynamo")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", type=pathlib.Path)
    args = p.parse_args()
    rows = {m: bench.warmed_up(bench.Job(args.model, m, None, False, "cuda", 5, args.steps))
            for m in args.modes.split(",")}
    for mode, row in rows.items():
        probe(row, args.steps, args.out, f"{args.model}_{mode}")


if __name__ == "__main__":
    main()
