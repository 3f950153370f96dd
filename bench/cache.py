"""First-step time in a fresh process, with cold caches and with warm ones (issue 18).

    python bench/cache.py                      # CPU: a 4-layer TinyLM
    python bench/cache.py --gpu                # CUDA: GPT-2 small and ResNet-50 (bench/run.py's)
    python bench/cache.py --sides aotgrad,torch --warm-runs 2

Each side runs in a fresh process twice or more against one set of cache directories of its
own (aotgrad's, Inductor's, Triton's, all under a new temporary directory): the first run
finds them empty (cold), the next ones find what it left (warm). A run times the compile
and first training step (forward, backward; synchronized on CUDA), not the imports. Sides:

- `aotgrad`: `aotgrad.compile(model)` (Inductor), aotgrad's cache on;
- `aotgrad_nocache`: the same with `AOTGRAD_CACHE=0` (Inductor's own caches only);
- `aotgrad_dynamo`: `torch.compile(model, backend="aotgrad")`;
- `torch`: `torch.compile(model)` (Inductor, AOTAutogradCache and FxGraphCache);
- `compiled_autograd`: the model run eagerly, its backward under
  `aotgrad.compiled_autograd.enable("inductor")` ("eager" where that is not built yet).

`--profile DIR` adds a profiled warm run per side (DIR/<model>-<side>.txt), not timed.
`--out DIR` merges into DIR/cache.json (one model or side per run, as a device's time
limit allows) and writes DIR/cache.md from all of it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SIDES = ("aotgrad", "aotgrad_nocache", "aotgrad_dynamo", "torch", "compiled_autograd")


def build(model: str, device: str):
    """(loss module, batch, autocast) on `device`, seeded."""
    import torch
    torch.manual_seed(0)
    if model == "tinylm":
        sys.path.insert(0, str(REPO_ROOT))
        from aotgrad.demo import TinyLM
        lm = TinyLM(layers=4).to(device)
        tokens = torch.randint(0, 256, (8, 64), device=device)
        return lm, (tokens, torch.roll(tokens, -1, dims=1)), False
    sys.path.insert(0, str(BENCH_DIR))
    import run  # bench/run.py: the suite's GPT-2 and ResNet-50, as it runs them
    job = run.Job(model, "cache", None, False, device, 0, 1)
    return run.prepare(job)


def compile_side(side: str, model):
    import torch
    import aotgrad
    if side in ("aotgrad", "aotgrad_nocache"):
        return aotgrad.compile(model, backend="inductor")
    if side == "aotgrad_dynamo":
        return torch.compile(model, backend="aotgrad")
    if side == "compiled_autograd":
        return model
    return torch.compile(model)


def enter_backward_context(side: str, stack) -> str | None:
    """Enters the backward's context on `stack`; the compiled autograd compiler's name."""
    if side != "compiled_autograd":
        return None
    from aotgrad import compiled_autograd
    try:
        stack.enter_context(compiled_autograd.enable("inductor"))
        return "inductor"
    except NotImplementedError:  # not built on this branch
        stack.enter_context(compiled_autograd.enable("eager"))
        return "eager"


def child(side: str, model_name: str, device: str) -> dict:
    """One fresh process's first step."""
    import contextlib
    import torch
    model, batch, use_autocast = build(model_name, device)
    autocast = torch.autocast("cuda", torch.bfloat16) if use_autocast \
        else contextlib.nullcontext()
    cuda = device.startswith("cuda")
    if os.environ.get("BENCH_CACHE_KEYS"):
        _record_inductor_keys(os.environ["BENCH_CACHE_KEYS"])
    said = _keep_cache_log()
    profile = _profiler(os.environ.get("BENCH_CACHE_PROFILE"))
    start, cpu_start = time.perf_counter(), time.process_time()
    compiled = compile_side(side, model)
    with autocast:
        out = compiled(*batch)
    loss = out[0] if isinstance(out, tuple) else out
    with contextlib.ExitStack() as stack:
        ca_compiler = enter_backward_context(side, stack)
        loss.backward()
    if cuda:
        torch.cuda.synchronize()
    first_step = time.perf_counter() - start
    if profile is not None:
        profile()
    # This process's CPU time too: on a shared machine, wall time follows the others' load.
    result = {"first_step_s": first_step, "first_step_cpu_s": time.process_time() - cpu_start,
              "loss": float(loss.detach())}
    if ca_compiler is not None:
        result["compiled_autograd"] = ca_compiler
    if side.startswith("aotgrad") or ca_compiler is not None:
        from aotgrad import cache
        result["aotgrad_cache"] = {k: v for k, v in cache.stats().items() if v}
        # "hit before the trace": keyed before the analysis and trace (cache/program.py)
        result["aotgrad_events"] = [e + " before the trace" * why.startswith("before the trace")
                                    for e, why in cache.events()]
    if said:  # why a stored Inductor key was not entered
        result["aotgrad_log"] = said
    from torch._dynamo.utils import counters
    result["inductor_counters"] = {k: v for k, v in counters["inductor"].items()
                                   if "cache" in k}
    return result


def _profiler(path: str | None):
    """Profiles this process's first step into `path` (cProfile's top functions by
    cumulative and by own time); returns the function that stops it and writes them."""
    if not path:
        return None
    import cProfile
    import io
    import pstats
    profiler = cProfile.Profile()
    profiler.enable()

    def stop_and_write() -> None:
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(60)
        stats.sort_stats("tottime").print_stats(30)
        Path(path).write_text(text.getvalue())
    return stop_and_write


def _keep_cache_log() -> list[str]:
    """aotgrad's cache messages of this process (its explained misses), as they come."""
    import logging
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage()[:2000])
    log = logging.getLogger("aotgrad.cache")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return said


def _record_inductor_keys(path: str) -> None:
    """Append the details of every FX graph cache key this process computes to `path`: a
    warm run's Inductor miss is then a diff against the cold run's file."""
    from torch._inductor import codecache
    original = codecache.compiled_fx_graph_hash

    def recording(*args, **kwargs):
        key, lines = original(*args, **kwargs)
        with open(path, "a") as f:
            f.write(f"== {key}\n" + "\n".join(lines) + "\n")
        return key, lines
    codecache.compiled_fx_graph_hash = recording


def run_side(side: str, model: str, device: str, warm_runs: int, timeout: float,
             keys_dir: str | None = None, profile_dir: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"aotgrad-bench-cache-{side}-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT),
               "AOTGRAD_CACHE_DIR": f"{tmp}/aotgrad", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "TRITON_CACHE_DIR": f"{tmp}/triton",
               "AOTGRAD_CACHE": "0" if side == "aotgrad_nocache" else "1"}
        runs = []
        for run in range(1 + warm_runs):
            if keys_dir:
                env["BENCH_CACHE_KEYS"] = f"{keys_dir}/{model}-{side}-{run}.txt"
            cmd = [sys.executable, __file__, "--child", side, "--models", model, "--device", device]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                return {"error": proc.stderr[-2000:]}
            runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        if profile_dir:  # one more warm run, profiled (not among the timed ones)
            env["BENCH_CACHE_PROFILE"] = f"{profile_dir}/{model}-{side}.txt"
            env.pop("BENCH_CACHE_KEYS", None)
            subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    warm = min(runs[1:], key=lambda r: r["first_step_s"])
    return {"cold": runs[0], "warm": warm, "warm_runs": [r["first_step_s"] for r in runs[1:]],
            "ratio": warm["first_step_s"] / runs[0]["first_step_s"]}


def markdown(results: dict, meta: dict) -> str:
    lines = ["# Compile cache: first step in a fresh process, cold vs warm caches",
             "",
             f"{meta['date']}, torch {meta['torch']}, {meta['machine']}, commit {meta['commit']}.",
             "Time from compiling to the end of the first forward+backward (imports excluded); "
             "warm: the best of the warm runs.",
             "",
             "| model | side | cold (s) | warm (s) | warm / cold | CPU s cold / warm "
             "| aotgrad cache (warm) | run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for model, sides in results.items():
        for side, r in sides.items():
            if "error" in r:
                lines.append(f"| {model} | {side} | error | | | {r['error'][-80:]!r} |")
                continue
            events = ", ".join(r["warm"].get("aotgrad_events", [])) or "-"
            cpu = [x.get("first_step_cpu_s") for x in (r["cold"], r["warm"])]
            cpu_text = " / ".join(f"{c:.1f}" for c in cpu) if None not in cpu else "-"
            lines.append(f"| {model} | {side} | {r['cold']['first_step_s']:.1f} | "
                         f"{r['warm']['first_step_s']:.1f} | {r['ratio']:.2f}x | {cpu_text} | "
                         f"{events} | {r.get('run', '')} |")
    return "\n".join(lines) + "\n"


def write_merged(out: Path, results: dict, meta: dict) -> None:
    """Merge into out/cache.json (a run per model or side), then cache.md from all of it."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cache.json"
    merged = json.loads(path.read_text())["results"] if path.exists() else {}
    for model, sides in results.items():
        for r in sides.values():  # rows of several runs: each says which
            r["run"] = f"{meta['commit']} {meta['date']}"
        merged.setdefault(model, {}).update(sides)
    path.write_text(json.dumps({"meta": meta, "results": merged}, indent=1))
    (out / "cache.md").write_text(markdown(merged, meta))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="GPT-2 small and ResNet-50 on CUDA")
    parser.add_argument("--models", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--sides", default=",".join(SIDES))
    parser.add_argument("--warm-runs", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--out", default=None, help="directory for cache.json and cache.md")
    parser.add_argument("--keys", default=None,
                        help="directory for the FX graph cache keys' details of every run")
    parser.add_argument("--profile", default=None,
                        help="directory for a profile of one more warm run per side")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = args.device or ("cuda" if args.gpu else "cpu")
    models = (args.models or ("gpt2,resnet50" if args.gpu else "tinylm")).split(",")
    if args.child:
        print(json.dumps(child(args.child, models[0], device)))
        return 0
    import torch
    from run import code_version  # bench/run.py; after the child's return: it imports aotgrad
    commit = code_version()
    machine = torch.cuda.get_device_name() if device.startswith("cuda") else \
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "machine": machine, "commit": commit, "device": device}
    for folder in (args.keys, args.profile):
        if folder:
            os.makedirs(folder, exist_ok=True)
    results = {}
    for model in models:
        results[model] = {}
        for side in args.sides.split(","):
            r = results[model][side] = run_side(side, model, device, args.warm_runs,
                                                args.timeout, args.keys, args.profile)
            print(model, side, _summary(r), flush=True)
            if args.out:  # after every side: a run cut short keeps what it measured
                write_merged(Path(args.out), {model: {side: r}}, meta)
    print(markdown(results, meta))
    return 0


def _summary(r: dict) -> str:
    if "error" in r:
        return "error: " + r["error"][-300:]
    events = ", ".join(r["warm"].get("aotgrad_events", [])) or "-"
    not_entered = [line[:300] for line in r["warm"].get("aotgrad_log", [])
                   if "not entered" in line]  # a stored Inductor key the warm run missed
    return (f"cold {r['cold']['first_step_s']:.1f} s, warm {r['warm']['first_step_s']:.1f} s "
            f"({r['ratio']:.2f}x), warm events: {events}" +
            "".join(f"\n  {line}" for line in not_entered))


if __name__ == "__main__":
    sys.exit(main())
