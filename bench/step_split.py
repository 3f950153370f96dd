"""A training step split in two: the forward's and the backward's host time and GPU time.

    python bench/step_split.py --models deberta_v2 --modes aotgrad_dynamo,torch_compile
    python bench/step_split.py --models deberta_v2 --together --out DIR   # one process
    python bench/step_split.py --models deberta_v2 --together --small --device cpu  # a check

run.py's step time is the GPU's, from the step's first kernel to its last; where the host
issues kernels more slowly than the GPU runs them, the GPU waits and the step grows. This
times each half apart (CUDA events recorded between them, host clocks around each call), so
that a longer step shows which half the GPU waited in. Each step is synchronized before it,
as in run.py. It also counts the synchronizing calls of one step (CUDA's sync debug mode)
and times the steps again with Python's garbage collector off. One process per row; with
`--together`, one process per model instead, the modes taking turns (rounds of a few steps,
the order flipping every round, so that the host's speed hits every mode alike), and a
cProfile of a few steps of each mode: the host calls that differ between the modes. A mode
named twice with a suffix (`aotgrad_dynamo,aotgrad_dynamo#2`) is the control: two rows of the
same code, whose difference is what the host's speed alone makes of a row in this process.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

import aotgrad.cache

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: models, modes, the step)


# STEP_SPLIT_MID_EVENT=0: no CUDA event between the halves (models.py's step has none); does
# that event change the step's time? (session 30: this tool and models.py disagreed)
MID_EVENT = os.environ.get("STEP_SPLIT_MID_EVENT", "1") != "0"
# STEP_SPLIT_ZERO_GRAD_TIMED=1: `zero_grad` inside the timed step, before the last event, as
# in models.py's step
ZERO_GRAD_TIMED = os.environ.get("STEP_SPLIT_ZERO_GRAD_TIMED", "0") == "1"


def split_step(row: bench.Warmed) -> dict:
    cuda = next(row.model.parameters()).is_cuda
    autocast = torch.autocast("cuda", torch.bfloat16) if row.use_autocast and cuda \
        else contextlib.nullcontext()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(3)] if cuda else []
    _sync(cuda)
    t0 = _mark(events, 0)
    with autocast:
        loss = row.compiled(*row.batch)
    t1 = _mark(events if MID_EVENT else [], 1)
    loss.backward()
    if ZERO_GRAD_TIMED:
        row.model.zero_grad(set_to_none=True)
    t2 = _mark(events, 2)
    if not ZERO_GRAD_TIMED:
        row.model.zero_grad(set_to_none=True)
    _sync(cuda)
    times = {"host_fw": (t1 - t0) * 1e3, "host_bw": (t2 - t1) * 1e3}
    if cuda and MID_EVENT:
        times.update(gpu_fw=events[0].elapsed_time(events[1]),
                     gpu_bw=events[1].elapsed_time(events[2]))
    if cuda:
        times.update(gpu=events[0].elapsed_time(events[2]))
    return times


def _mark(events: list, i: int) -> float:
    if events:
        events[i].record()
    return time.perf_counter()


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


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
    return {"steps": timed, "gc_off": no_gc, "syncs": syncs_in_a_step(row.step),
            "host_profile": host_profile(row, 5)}


def measure_together(model_name: str, modes: list[str], args) -> dict:
    """Every mode in this process, taking turns; then each mode's host profile."""
    config = torch._dynamo.config  # each mode compiles the same code once more
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 8 * len(modes)))
    rows, caches = {}, {}
    for mode in modes:  # and how aotgrad's cache served each (loaded by Inductor's key?)
        aotgrad.cache.reset_stats()
        rows[mode] = bench.warmed_up(bench.Job(model_name, mode.split("#")[0], None, args.small,
                                               args.device, 5, args.steps))
        caches[mode] = {k: v for k, v in aotgrad.cache.stats().items() if v}
    timed = {mode: [] for mode in modes}
    for turn in range(args.rounds):
        for mode in (modes if turn % 2 == 0 else modes[::-1]):
            timed[mode] += [split_step(rows[mode]) for _ in range(args.steps)]
    return {mode: {"steps": medians(timed[mode]), "rounds": args.rounds,
                   "aotgrad_cache": caches[mode],
                   "host_profile": host_profile(rows[mode], args.profile_steps)}
            for mode in modes}


def host_profile(row: bench.Warmed, steps: int, top: int = 40) -> list[dict]:
    """The calls that take the host's time in `steps` steps, by own time, per step."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        split_step(row)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"call": f"{Path(f).name}:{line}:{name}", "calls": nc / steps,
             "own_us": tt / steps * 1e6, "total_us": ct / steps * 1e6}
            for (f, line, name), (_, nc, tt, ct, _) in ranked]


def print_together(model_name: str, result: dict) -> None:
    for mode, r in result.items():
        print(f"{model_name}/{mode}: " + " ".join(f"{k} {v:.2f}" for k, v in r["steps"].items())
              + f" (aotgrad cache: {r['aotgrad_cache']})")
    for mode, r in result.items():
        print(f"  {mode}: host calls by own time, us a step (calls)")
        for c in r["host_profile"][:12]:
            print(f"    {c['own_us']:9.1f} ({c['calls']:6.0f})  {c['call'][:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="deberta_v2")
    parser.add_argument("--modes", default="aotgrad_dynamo,torch_compile")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--together", action="store_true",
                        help="all modes of a model in one process, taking turns")
    parser.add_argument("--rounds", type=int, default=8, help="--together: turns per mode")
    parser.add_argument("--profile-steps", type=int, default=5, help="--together: cProfiled")
    parser.add_argument("--small", action="store_true", help="--together: the small models")
    parser.add_argument("--device", default="cuda", help="--together: cpu for a check")
    parser.add_argument("--row", nargs=2, help=argparse.SUPPRESS)  # the worker's own row
    args = parser.parse_args()
    if args.row:
        print(json.dumps(measure_row(*args.row, args.steps)))
        return
    if args.together:
        args.steps = max(1, args.steps // args.rounds)
    results = {}
    for model_name in args.models.split(","):
        if args.together:
            results[model_name] = measure_together(model_name, args.modes.split(","), args)
            print_together(model_name, results[model_name])
            continue
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
