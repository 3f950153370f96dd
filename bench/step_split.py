"""A training step split in two: the forward's and the backward's host time and GPU time.

    python bench/step_split.py --models deberta_v2 --modes aotgrad_dynamo,torch_compile

run.py's step time is the GPU's, from the step's first kernel to its last; where the host
issues kernels more slowly than the GPU runs them, the GPU waits and the step grows. This
times each half apart (CUDA events recorded between them, host clocks around each call), so
that a longer step shows which half the GPU waited in. Each step is synchronized before it,
as in run.py. It also counts the synchronizing calls of one step (CUDA's sync debug mode)
and times the steps again with Python's garbage collector off. One process per row.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: models, modes, the step)


def split_step(row: bench.Warmed) -> dict:
    autocast = torch.autocast("cuda", torch.bfloat16) if row.use_autocast \
        else contextlib.nullcontext()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    torch.cuda.synchronize()
    events[0].record()
    t0 = time.perf_counter()
    with autocast:
        loss = row.compiled(*row.batch)
    t1 = time.perf_counter()
    events[1].record()
    loss.backward()
    t2 = time.perf_counter()
    events[2].record()
    row.model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return {"host_fw": (t1 - t0) * 1e3, "host_bw": (t2 - t1) * 1e3,
            "gpu_fw": events[0].elapsed_time(events[1]),
            "gpu_bw": events[1].elapsed_time(events[2])}


def medians(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def syncs_in_a_step(step) -> int:
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def measure_row(model_name: str, mode_name: str, steps: int) -> dict:
    row = bench.warmed_up(bench.Job(model_name, mode_name, None, False, "cuda", 5, steps))
    timed = medians([split_step(row) for _ in range(steps)])
    gc.disable()
    no_gc = medians([split_step(row) for _ in range(steps)])
    gc.enable()
    return {"steps": timed, "gc_off": no_gc, "syncs": syncs_in_a_step(row.step)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deberta_v2")
    parser.add_argument("--modes", default="aotgrad_dynamo,torch_compile")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--row", nargs=2, help=argparse.SUPPRESS)  # the worker's own row
    args = parser.parse_args()
    if args.row:
        print(json.dumps(measure_row(*args.row, args.steps)))
        return
    results = {}
    for model_name in args.models.split(","):
        for mode_name in args.modes.split(","):
            done = subprocess.run(
                [sys.executable, __file__, "--row", model_name, mode_name,
                 "--steps", str(args.steps)], capture_output=True, text=True,
                timeout=args.timeout)
            label = f"{model_name}/{mode_name}"
            if done.returncode:
                print(label, "failed:", done.stderr[-2000:])
                continue
            results[label] = json.loads(done.stdout.strip().splitlines()[-1])
            r = results[label]
            print(label, "syncs", r["syncs"], *(
                f"{part}: " + " ".join(f"{k} {v:.2f}" for k, v in r[part].items())
                for part in ("steps", "gc_off")), sep="\n  ", flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "step_split.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
