"""Where a model's first compile goes: aotgrad's stages and Inductor's phases, against torch's.

    python bench/compile_stages.py --model deberta_v2 --small            # CPU, 2-layer model
    python bench/compile_stages.py --model deberta_v2 --modes aotgrad,inductor  # GPU, < 3 min
    python bench/compile_stages.py --model deberta_v2 --fp32             # GPU, no autocast
    python bench/compile_stages.py --modes aotgrad_eager,aot_eager --batch 1  # CPU, full size
    python bench/compile_stages.py --model deberta_v2 --modes aotgrad,inductor --profile DIR

Each mode compiles the model's training step (bench/run.py's: forward with the loss, bf16
autocast on CUDA, backward) in a fresh process of its own, with aotgrad's and Inductor's caches
off, so every number is a first compile in a process, imports included. Modes:
`aotgrad` (`torch.compile(backend="aotgrad")`), `inductor` (`torch.compile()`), and the two
without Inductor, to tell our stages from Inductor's: `aotgrad_eager` (aotgrad's eager backend)
and `aot_eager` (torch's AOTAutograd, no-op compiler). Rounds interleave the modes, the order
rotating; each mode keeps its fastest round by process CPU time (a shared host's descheduled
time does not count; Inductor's compile workers are counted as children once they exit).

Printed per mode: the first step (its compile) by wall and CPU clock, Dynamo's graph and
break counts, what Inductor was handed (graphs, their call_function nodes, kernels it
generated), aotgrad's stages (the pipeline's timer, summed over graphs), and torch's own
`dynamo_timed` phases (Dynamo, AOTAutograd, Inductor's lowering, scheduling, code generation,
and the wait on kernel compiles), with the time outside them. `--profile DIR` writes a cProfile
of each mode's first step, the graphs Inductor got and the code it generated for them. `--json PATH` writes everything.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
MODES = {"aotgrad": "aotgrad_dynamo", "inductor": "torch_compile",
         "aotgrad_eager": "aotgrad_dynamo_eager", "aot_eager": "aot_eager",
         "aotgrad_spans": "aotgrad_dynamo_spans_saved"}  # issue 20's experiment (bench/run.py)
# torch's dynamo_timed keys worth a row each (others are summed into "other torch phases").
PHASES = [
    "_compile.compile_inner",                 # Dynamo: bytecode analysis to a graph
    "OutputGraph.call_user_compiler",         # the backend (AOT + Inductor), per graph
    "create_aot_dispatcher_function",         # torch's AOTAutograd (aotgrad does not run it)
    "min_cut_rematerialization_partition",    # torch's partitioner
    "compile_fx_inner",                       # Inductor, per forward/backward graph
    "GraphLowering.run",                      # lowering to Inductor IR
    "Scheduler.__init__",                     # fusion decisions
    "Scheduler.codegen",                      # kernels' source
    "GraphLowering.compile_to_module",        # the wrapper module and its kernels
    "async_compile.wait",                     # waiting on kernel compiles (Triton, C++)
    "async_compile.precompile",               # Triton kernels compiled in this process, one
                                              # by one: the worker pool was not ready yet
    "compile_file",                           # C++ compile (CPU)
]


# ---------------------------------------------------------------------------- one mode (worker)

def worker(spec: dict) -> dict:
    _block_broken_torchvision()
    sys.path.insert(0, str(BENCH_DIR))
    import torch
    import run as bench  # noqa: E402  (bench/run.py: the models and the modes)
    handed = _count_inductor_graphs(torch, spec.get("dump"))
    job = bench.Job(spec["model"], MODES[spec["mode"]], None, spec["small"], spec["device"], 0, 1)
    torch.manual_seed(0)
    model, batch, use_autocast = bench.prepare(job)
    if spec.get("batch"):  # fewer samples: a full-size model's step on a CPU takes a minute
        batch = tuple(b[:spec["batch"]] if isinstance(b, torch.Tensor) else b for b in batch)
    use_autocast = use_autocast and not spec["fp32"]
    sink: list = []
    compiled = bench.MODES[job.mode].compile(model, None, sink)
    step = bench.make_step(model, compiled, batch, use_autocast)
    first = _timed(step, torch, spec.get("profile"))
    steady = min((_timed(step, torch) for _ in range(2)), key=lambda t: t["wall"])
    return {"first": first, "steady": steady, "loss": first.pop("loss"),
            "compile_cpu_s": first["cpu"] - steady["cpu"],
            "compile_wall_s": first["wall"] - steady["wall"],
            **_counts(torch, bench, sink, handed), "phases": _phases(torch)}


def _block_broken_torchvision() -> None:
    """transformers imports torchvision where it is found; one built for another torch fails
    to import, and then transformers with it: hide such a one (timm needs a working one)."""
    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules["torchvision"] = None


def _timed(step, torch, profile_path: str | None = None) -> dict:
    """One step by three clocks: wall, this process's CPU, and its exited children's CPU."""
    cuda = torch.cuda.is_available()
    start = _clocks()
    profiler = cProfile.Profile() if profile_path else None
    if profiler:
        profiler.enable()
    loss = step()
    if cuda:
        torch.cuda.synchronize()
    if profiler:
        profiler.disable()
        profiler.dump_stats(profile_path)
    end = _clocks()
    return {**{k: end[k] - start[k] for k in start}, "loss": float(loss)}


def _clocks() -> dict[str, float]:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"wall": time.perf_counter(), "cpu": time.process_time(),
            "children_cpu": children.ru_utime + children.ru_stime}


def _count_inductor_graphs(torch, dump: str | None) -> list[dict[str, int]]:
    """The ops of each graph Inductor lowers (op -> call_function nodes), read by a post-grad
    pre-pass (called by `compile_fx_inner` on either side; caches are off: no key needs it).
    `dump`: a path prefix to write each graph to, numbered in the order Inductor got them."""
    from collections import Counter
    from torch._inductor import config
    graphs: list[dict[str, int]] = []

    def count(graph):
        if dump:
            Path(f"{dump}.{len(graphs)}.txt").write_text(str(graph))
        graphs.append(dict(Counter(str(n.target) for n in graph.nodes
                                   if n.op == "call_function")))
    config.post_grad_custom_pre_pass = count
    return graphs


def _counts(torch, bench, sink, handed: list[int]) -> dict:
    from torch._dynamo.utils import counters
    from torch._inductor import metrics
    artifacts = bench.artifacts_of(sink)
    return {"dynamo_graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(counters["graph_break"].values()),
            "recompiles": sum(counters["recompiles"].values()),
            "inductor_graphs": len(handed), "inductor_nodes": sum(sum(g.values()) for g in handed),
            "inductor_ops": handed,
            "kernels": metrics.generated_kernel_count,
            "aotgrad_graphs": len(artifacts),
            "aotgrad_stages": bench._sum_timings(a.timings for a in artifacts)}


def _phases(torch) -> dict[str, dict]:
    from torch._dynamo.utils import compilation_time_metrics
    return {key: {"s": sum(times), "n": len(times), "each": times}
            for key, times in compilation_time_metrics.items() if times}


# ---------------------------------------------------------------------------- the rounds (parent)

def run_mode(mode: str, args, profile_dir: Path | None) -> dict:
    spec = {"model": args.model, "mode": mode, "small": args.small, "device": args.device,
            "fp32": args.fp32, "batch": args.batch,
            "profile": str(profile_dir / f"{mode}.prof") if profile_dir else None,
            "dump": str(profile_dir / f"{mode}.graph") if profile_dir else None}
    with tempfile.TemporaryDirectory(prefix="compile-stages-") as scratch:
        out = Path(scratch, "result.json")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec),
               "--result", str(out)]
        try:
            proc = subprocess.run(cmd, env=_env(scratch), capture_output=True, text=True,
                                  timeout=args.timeout)
        except subprocess.TimeoutExpired:  # a row saying so; the other modes still run
            return {"error": f"timed out after {args.timeout:.0f} s (--timeout)"}
        if profile_dir:
            _keep_output_code(Path(scratch, "inductor"), profile_dir / f"{mode}.code")
        if not out.exists():
            return {"error": f"exit {proc.returncode}: {proc.stderr[-2000:]}"}
        return json.loads(out.read_text())


def _keep_output_code(cache: Path, into: Path) -> None:
    """The modules Inductor generated (each graph's wrapper, its kernels' source inline),
    kept from the scratch cache to compare one side's kernels with the other's."""
    into.mkdir(parents=True, exist_ok=True)
    for path in cache.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "def call(" in text:
            (into / path.name).write_text(text)


def _env(scratch: str) -> dict:
    env = dict(os.environ, AOTGRAD_CACHE="0", TORCHINDUCTOR_FORCE_DISABLE_CACHES="1",
               TORCHINDUCTOR_CACHE_DIR=os.path.join(scratch, "inductor"),
               AOTGRAD_CACHE_DIR=os.path.join(scratch, "aotgrad"))
    env.pop("TRITON_CACHE_DIR", None)  # Triton's cache then lies in the fresh Inductor one
    root = str(BENCH_DIR.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def run_rounds(args) -> dict[str, dict]:
    """Each mode's fastest round by CPU time; the order rotates every round."""
    best: dict[str, dict] = {}
    profile_dir = Path(args.profile) if args.profile else None
    if profile_dir:
        profile_dir.mkdir(parents=True, exist_ok=True)
    for r in range(args.rounds):
        order = args.modes[r % len(args.modes):] + args.modes[:r % len(args.modes)]
        for mode in order:
            row = run_mode(mode, args, profile_dir)
            print(f"round {r + 1} {mode}: {_brief(row)}", flush=True)
            if "error" in row or mode not in best or _cpu(row) < _cpu(best[mode]):
                best[mode] = row if mode not in best or "error" not in row else best[mode]
    return best


def _cpu(row: dict) -> float:
    return row["first"]["cpu"] + row["first"]["children_cpu"] if "first" in row else 1e9


def _brief(row: dict) -> str:
    if "error" in row:
        return row["error"].strip().splitlines()[-1][:200]
    return (f"first step {row['first']['wall']:.1f} s wall, {_cpu(row):.1f} s CPU; "
            f"{row['dynamo_graphs']} Dynamo graphs, {row['inductor_graphs']} to Inductor")


# ---------------------------------------------------------------------------- the table

def table(best: dict[str, dict]) -> str:
    modes = [m for m in best if "error" not in best[m]]
    head = "| | " + " | ".join(modes) + " |\n|---|" + "---:|" * len(modes)
    rows = [_row("first step, wall s", best, lambda r: r["first"]["wall"]),
            _row("first step, CPU s (+children)", best, _cpu),
            _row("steady step, wall s", best, lambda r: r["steady"]["wall"])]
    for key in ("dynamo_graphs", "graph_breaks", "recompiles", "inductor_graphs",
                "inductor_nodes", "kernels", "aotgrad_graphs"):
        rows.append(_row(key, best, lambda r, k=key: r[k], "{:.0f}"))
    stages = sorted({s for m in modes for s in best[m]["aotgrad_stages"]})
    rows += [_row(f"aotgrad: {s}", best, lambda r, s=s: r["aotgrad_stages"].get(s))
             for s in stages]
    rows += [_phase_row(key, modes, best) for key in PHASES]
    rows.append(_row("first step outside Dynamo's frame compiles, wall s", best, _outside))
    errors = [f"- {m}: {best[m]['error'].strip().splitlines()[-1][:300]}"
              for m in best if "error" in best[m]]
    return "\n".join([head, *rows, *errors]) + "\n"


def _row(name: str, best: dict, get, fmt: str = "{:.2f}") -> str:
    values = [get(row) for row in best.values() if "error" not in row]
    cells = ["" if value is None else fmt.format(value) for value in values]
    return f"| {name} | " + " | ".join(cells) + " |"


def _phase_row(key: str, modes: list[str], best: dict) -> str:
    def cell(m):
        p = best[m]["phases"].get(key)
        if not p:
            return ""
        if 1 < p["n"] <= 3:  # a forward and a backward, say: each
            return " + ".join(f"{s:.2f}" for s in p["each"])
        return f"{p['s']:.2f} ({p['n']})"
    return f"| {key}: s (calls) | " + " | ".join(cell(m) for m in modes) + " |"


def _outside(row: dict) -> float:
    """The first step's wall time not inside Dynamo's compile of a frame: the step's run and
    the lazy backward compile where it is outside Dynamo's timer."""
    inner = row["phases"].get("_compile.compile_inner", {"s": 0.0})["s"]
    return row["first"]["wall"] - inner


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="deberta_v2")
    p.add_argument("--modes", default="aotgrad,inductor,aotgrad_eager,aot_eager",
                   type=lambda s: [m for m in s.split(",") if m])
    p.add_argument("--small", action="store_true", help="the CPU-sized variant of the model")
    p.add_argument("--device", default=None)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast on CUDA")
    p.add_argument("--batch", type=int, help="the batch's first N samples (the graphs are the "
                   "model's; a full-size model's step on a CPU is shorter)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900, help="seconds per process")
    p.add_argument("--profile", help="a directory for each mode's cProfile of its first step "
                   "and the graphs Inductor was handed")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        Path(args.result).write_text(json.dumps(worker(json.loads(args.worker))))
        return
    if args.device is None:
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    start = time.time()
    best = run_rounds(args)
    print(f"\n{args.model}{' (small)' if args.small else ''} on {_device_name(args.device)}, "
          f"{'fp32' if args.fp32 or args.device == 'cpu' else 'bf16 autocast'}, "
          f"{args.rounds} round(s), {time.time() - start:.0f} s\n")
    print(table(best))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": best}, indent=1))


def _device_name(device: str) -> str:
    import torch
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
    return f"CPU ({os.cpu_count()} cores), torch {torch.__version__}"


if __name__ == "__main__":
    main()
