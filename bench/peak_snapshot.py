"""What is alive at the peak of a training step, for two compilers side by side.

    python bench/peak_snapshot.py resnet50 [--modes torch_compile,aotgrad_dynamo]
        [--budget 0.2] [--out DIR] [--keep-code DIR]

Each mode runs in its own process (as in run.py): it compiles, warms up, then records the
caching allocator's trace over one step. Replaying the trace finds the moment most memory
was allocated and the blocks alive then, each with the line of generated code that made it.
The blocks whose sizes differ between the modes are printed last: where two peaks differ,
and by what.
"""

from __future__ import annotations

import argparse
import collections
import json
import linecache
import shutil
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: models, modes, the step)


def origin(event: dict) -> tuple[str, str | None]:
    """The first frame in generated code (Inductor's or aotgrad's), with its source line, and
    that code's file."""
    frames = event.get("frames", [])
    for frame in frames:
        name = frame["filename"]
        if "torchinductor" in name or "aotgrad" in name:
            line = linecache.getline(name, frame["line"]).strip()
            return f"{Path(name).name}:{frame['line']} {line[:90]}", name
    return (frames[0]["name"] if frames else "?"), None


def alive_at_peak(events: list[dict]) -> list[tuple[int, str, str | None]]:
    """(bytes, origin, its file) of the blocks alive when the traced allocations peaked."""
    alive: dict[int, tuple[int, str, str | None]] = {}
    current, best, at_best = 0, -1, {}
    for event in events:
        if event["action"] == "alloc":
            alive[event["addr"]] = (event["size"], *origin(event))
            current += event["size"]
            if current > best:
                best, at_best = current, dict(alive)
        elif event["action"] == "free_completed" and event["addr"] in alive:
            current -= alive.pop(event["addr"])[0]
    return sorted(at_best.values(), key=lambda block: -block[0])


def snapshot_row(model_name: str, mode_name: str, budget: float | None,
                 keep_code: str | None = None) -> dict:
    job = bench.Job(model_name, mode_name, budget, False, "cuda", 3, 1)
    torch.manual_seed(0)
    model, batch, use_autocast = bench.prepare(job)
    mode = bench.MODES[mode_name]
    compiled_step = bench.make_step(model, mode.compile(model, budget, []), batch, use_autocast)

    def step():  # PyTorch reads its budget when it partitions, at the first call
        with mode.config(budget):
            return compiled_step()
    for _ in range(job.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=500_000)
    step()
    torch.cuda.synchronize()
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    torch.cuda.memory._record_memory_history(enabled=None)
    peak = alive_at_peak(trace)
    if keep_code:  # the generated code that allocated during the step (forward, backward)
        kept = Path(keep_code)
        kept.mkdir(parents=True, exist_ok=True)
        for path in {origin(event)[1] for event in trace} - {None}:
            shutil.copy(path, kept / f"{mode_name}-{Path(path).name}")
    blocks = [(size, where) for size, where, _ in peak]
    return {"mode": mode_name, "max_allocated": torch.cuda.max_memory_allocated(),
            "traced_peak": sum(size for size, _ in blocks), "blocks": blocks}


def differing_sizes(rows: list[dict]) -> list[str]:
    first, second = (collections.Counter(size for size, _ in r["blocks"]) for r in rows)
    lines = []
    for size in sorted(set(first) | set(second), reverse=True):
        if first[size] != second[size]:
            lines.append(f"{size / 2**20:9.3f} MB blocks: {rows[0]['mode']} {first[size]}, "
                         f"{rows[1]['mode']} {second[size]} "
                         f"({(second[size] - first[size]) * size / 2**20:+.3f} MB)")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="resnet50")
    parser.add_argument("--modes", default="torch_compile,aotgrad_dynamo")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--keep-code", default=None,
                        help="copy the generated code that allocated during the step here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # one mode, in a process of its own
        print(json.dumps(snapshot_row(args.model, args.modes, args.budget, args.keep_code)))
        return
    rows = []
    for mode in args.modes.split(","):
        budget = [] if args.budget is None else ["--budget", str(args.budget)]
        keep = [] if args.keep_code is None else ["--keep-code", args.keep_code]
        proc = subprocess.run([sys.executable, __file__, args.model, "--modes", mode, "--worker",
                               *budget, *keep], capture_output=True, text=True, check=True)
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / f"peak_snapshot_{args.model}.json").write_text(json.dumps(rows))
    for row in rows:
        print(f"{row['mode']}: max allocated {row['max_allocated'] / 2**20:.1f} MB, traced "
              f"blocks alive at the peak {row['traced_peak'] / 2**20:.1f} MB; largest:")
        for size, where in row["blocks"][:8]:
            print(f"  {size / 2**20:8.2f} MB  {where}")
    print("\n".join(differing_sizes(rows)) if len(rows) == 2 else "")


if __name__ == "__main__":
    main()
