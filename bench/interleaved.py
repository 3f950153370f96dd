"""Two modes' training steps in one process, taking turns: step time without process noise.

    python bench/interleaved.py --models gpt2,resnet50 --out bench/results/DIR
    python bench/interleaved.py --small --device cpu --models mlp \
        --modes eager,aotgrad_compile_eager

`run.py` gives each row a process of its own. A host-bound step (ResNet-50 at batch 64
launches ~560 kernels for 11 ms of GPU work) then varies by several percent from one
process to the next: the same row measured 13.3 to 16.6 ms in three runs. Here both modes
compile in one process and alternate, `--rounds` rounds of `--steps` synced steps each (the
order flips every round), so that what differs between them is the compiled code. The
medians of the host time and of the CUDA-event step time are written as JSON + Markdown.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench  # noqa: E402  (bench/run.py: models, modes, the step and its timing)

def compiled_step(job: bench.Job):
    """A training step of `model_name` compiled by `mode`, warmed up. PyTorch reads its
    budget while it partitions, at the first call: every call holds the mode's config."""
    torch.manual_seed(0)
    model, batch, use_autocast = bench.prepare(job)
    mode = bench.MODES[job.mode]
    step = bench.make_step(model, mode.compile(model, job.budget, []), batch, use_autocast)

    def configured_step():
        with mode.config(job.budget):
            return step()
    for _ in range(job.warmup):
        configured_step()
    return configured_step


def measure(model: str, modes: list[str], budget: float | None, small: bool, device: str,
            rounds: int, turns: list[int]) -> list[dict]:
    """A row per turn length, all timed on the same compiled steps: whether a ratio moves
    with how many steps a mode runs before the other takes over (issue 20: DeBERTa-v2's
    ratio differed between harnesses of 3 and of 30-48 steps a turn)."""
    stepping = {m: compiled_step(bench.Job(model, m, budget, small, device, 5, turns[0]))
                for m in modes}
    rows = []
    for steps in turns:
        times = take_turns(stepping, rounds, steps, device.startswith("cuda"))
        rows.append({"steps": steps, **{
            m: {key: statistics.median(t[key] for t in ts) * 1e3 for key in ("host", "step")}
            for m, ts in times.items()}})
    return rows


def take_turns(stepping: dict, rounds: int, steps: int, cuda: bool) -> dict[str, list[dict]]:
    """Each mode's timed steps (bench.time_step): `rounds` turns of `steps` steps each, the
    order flipping every round."""
    times = {m: [] for m in stepping}
    for r in range(rounds):
        for m in (list(stepping) if r % 2 else list(stepping)[::-1]):
            times[m] += _turn(stepping[m], steps, cuda)
    return times


def _turn(step, steps: int, cuda: bool) -> list[dict]:
    """On CUDA each step also carries `peak_above_mb`: the turn's peak allocated memory above
    what was allocated when the turn began (the other modes' models stay resident), and the
    turn's allocator calls per step (`bench.allocator_calls`)."""
    if not cuda:
        return [bench.time_step(step, cuda) for _ in range(steps)]
    torch.cuda.reset_peak_memory_stats()
    resident = torch.cuda.memory_allocated()
    before = torch.cuda.memory_stats()
    timed = [bench.time_step(step, cuda) for _ in range(steps)]
    calls = bench.allocator_calls(before, steps)
    above = (torch.cuda.max_memory_allocated() - resident) / 2**20
    return [{**t, "peak_above_mb": above, **calls} for t in timed]


def table(rows: list[dict], modes: list[str]) -> str:
    """The second mode against the first."""
    first, second = modes
    lines = [f"| model | budget | steps a turn | {first} step ms | {second} step ms | ratio "
             f"| {first} host ms | {second} host ms |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        a, b = row[first], row[second]
        lines.append(f"| {row['model']} | {row['budget']} | {row['steps']} | {a['step']:.2f} "
                     f"| {b['step']:.2f} | {b['step'] / a['step']:.3f} | {a['host']:.2f} "
                     f"| {b['host']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,resnet50")
    parser.add_argument("--modes", default="torch_compile,aotgrad_dynamo",
                        help="two modes: the reference, then the one compared with it")
    parser.add_argument("--budget", type=float, default=None)
    parser.add_argument("--small", action="store_true", help="the CPU-sized models")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", default="3",
                        help="steps a turn; a comma list times each on the same compiles")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    modes = args.modes.split(",")
    assert len(modes) == 2, "--modes takes two modes"
    turns = [int(s) for s in args.steps.split(",")]
    rows = [{"model": name, "budget": 1.0 if args.budget is None else args.budget, **row}
            for name in args.models.split(",")
            for row in measure(name, modes, args.budget, args.small, args.device, args.rounds,
                               turns)]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    text = (f"# Interleaved step time ({datetime.date.today()}, torch {torch.__version__}, "
            f"{device})\n\nMedians of {args.rounds} turns of synced steps per mode, both "
            f"modes in one process, taking turns.\n\n{table(rows, modes)}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "interleaved.json").write_text(json.dumps(rows, indent=1))
        (out / "interleaved.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
