"""The model list: eager, Inductor and aotgrad, each compiler also with CUDA graphs.

    python bench/models.py --budget 300 --timeout 170 --out bench/results/DIR   # the GPU
    python bench/models.py --small --out /tmp/models          # CPU check, tiny models
    python bench/models.py --report bench/results/DIR         # results.md + plot.svg again

Modes: eager; torch.compile with backend="inductor" and with backend="aotgrad", each also
with mode="reduce-overhead" (`_ro`: CUDA graphs); on request (`--modes`), each with
options={"cpp_wrapper": True} (`_cpp`: Inductor's kernels launched from C++) and with
options={"combo_kernels": True} (`_combo`: independent kernels fused side by side;
`_combo_pw`: pointwise ones only, aotgrad's default on CUDA since session 36;
`aotgrad_no_combo`: aotgrad without them). A step is bench/run.py's: forward with the loss
(bf16 autocast on CUDA), backward, grads set to None; random init, seed 0. Per model:
1. cold: each mode in a process of its own with empty Inductor and aotgrad caches
   (bench/run.py's worker, `--jobs` at a time): first-step (compile) seconds, the first
   loss, and the peak memory of the mode alone over a few steps after warm-up.
2. interleaved: every mode in one process (compiled again from the caches the cold
   processes filled), then `--rounds` turns of `--steps` synced steps per mode, the order
   flipping every round, so that drift of clocks or host hits every mode alike: step time
   median and min, and the host's speed before and after (`host_launch_us`). `--processes
   N` runs N such processes (the later ones from warm caches): each mode's figures are then
   the medians of the processes'.
<out>/<model>.json is rewritten after every cold process and after the interleaved one, so
a killed run keeps what it measured. --budget stops starting models; --timeout bounds one
model's processes together (a run lasts at most about budget + timeout). The report (written
at the end, or alone with --report) holds the ratios vs inductor and vs inductor + CUDA
graphs, their geomeans, and an SVG plot.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from types import SimpleNamespace

import torch

import aotgrad.cache
from aotgrad.cache import fxkeys, store

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import interleaved  # noqa: E402  (bench/interleaved.py: one compiled step, turns)
import models_report  # noqa: E402
import run as bench  # noqa: E402  (bench/run.py: the models, the modes, the worker)

# This benchmark's names of bench/run.py's modes.
MODES = {"eager": "eager", "inductor": "torch_compile", "inductor_ro": "torch_compile_ro",
         "aotgrad": "aotgrad_dynamo", "aotgrad_ro": "aotgrad_dynamo_ro",
         "inductor_cpp": "torch_compile_cpp", "aotgrad_cpp": "aotgrad_dynamo_cpp",
         "inductor_combo": "torch_compile_combo", "aotgrad_combo": "aotgrad_dynamo_combo",
         "inductor_combo_pw": "torch_compile_combo_pw", "aotgrad_combo_pw":
         "aotgrad_dynamo_combo_pw", "aotgrad_no_combo": "aotgrad_dynamo_no_combo",
         "aotgrad_combo_all": "aotgrad_dynamo_combo_all"}
MODELS = ["gpt2", "llama", "bert", "resnet50", "efficientnet_b0", "vit_s16", "swin_t",
          "convnext_t", "deberta_v2"]
SMALL_MODELS = ["tiny"]  # needs neither transformers nor timm; fits 3 min on 2 cores
# --small: few steps (the check is that everything runs and is written, not the numbers)
SETTINGS = {"full": dict(rounds=10, steps=3, warmup=5, cold_warmup=3, cold_steps=3),
            "small": dict(rounds=3, steps=2, warmup=1, cold_warmup=1, cold_steps=2)}


# ---------------------------------------------------------------------------- the parent

def run_all(args) -> None:
    start = time.time()
    meta = environment(args)
    for name in args.models:
        if time.time() - start > args.budget:
            skip(args.out, {"model": name, "meta": meta}, f"--budget {args.budget:.0f}s spent")
            continue
        run_model(name, args, meta)
    print(f"all models: {time.time() - start:.0f}s", flush=True)


def run_model(name: str, args, meta: dict) -> None:
    start = time.time()
    result = {"model": name, "meta": meta, "cold": {}, "interleaved": {}}
    missing = bench.missing_modules(cold_job(name, "eager", args))
    if missing:
        return skip(args.out, result, f"{', '.join(missing)} not importable")
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as scratch:
        for mode, row in cold_phase(name, args, scratch, start + args.timeout):
            result["cold"][mode] = row
            save(args.out, result)
        warm = merge_caches(scratch)
        # A mode that failed or ran out of time cold would only do so again, taking the
        # others' time; its cold row says why.
        modes = [m for m in args.modes if result["cold"][m].get("status") == "ok"]
        result["interleaved"] = interleaved_phase(name, modes, args, warm,
                                                  start + args.timeout)
    result["elapsed_s"] = time.time() - start
    save(args.out, result)


def skip(out: Path, result: dict, reason: str) -> None:
    """Noted for the report, unless an earlier run in --out measured the model."""
    print(f"{result['model']}: not run ({reason})", flush=True)
    if not (out / f"{result['model']}.json").exists():
        save(out, {"cold": {}, "interleaved": {}, **result, "skipped": reason})


def save(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{result['model']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)  # a run killed mid-write keeps the previous file


def cold_phase(name: str, args, scratch: str, deadline: float):
    """(mode, bench/run.py's row) as each cold process ends; each gets fresh caches."""
    spawn_args = SimpleNamespace(lock=None, cache_dir=scratch, threads=args.threads,
                                 jobs=args.jobs, cold=True, timeout=args.timeout)
    with ThreadPoolExecutor(args.jobs) as pool:  # threads only wait on the subprocesses
        futures = {pool.submit(bench.run_job, cold_job(name, mode, args), spawn_args,
                               deadline): mode for mode in args.modes}
        for future in as_completed(futures):
            mode, row = futures[future], future.result()
            print(f"{name}/{mode} cold: {bench._progress(row)}", flush=True)
            yield mode, row


def cold_job(name: str, mode: str, args) -> bench.Job:
    return bench.Job(name, MODES[mode], None, args.small, args.device, args.cold_warmup,
                     args.cold_steps)


_TUNED = shutil.ignore_patterns("*.best_config")  # Triton's autotuning choices


def merge_caches(scratch: str) -> str:
    """One cache directory holding what every cold process compiled. Inductor's, Triton's and
    aotgrad's entries are named by the hash of what they hold, so that merging them is safe;
    it only spares the interleaved process compiling everything again. A graph's Inductor
    keys are one `.fxkey` file with a record per context: those are merged record by record
    (copied over, only the last cold process's context was found, and its code served every
    mode that shares the graph: session 37). Triton's autotuning choices (`.best_config`)
    are left out: the cold processes tune side by side on one GPU, each timing its kernels'
    configurations while the others run theirs, and a choice made that way is kept by
    every later process; the interleaved process tunes its modes alone (a choice timed
    under contention is a draw none of the modes should carry. Session 38: DeBERTa-v2's
    no-combo aotgrad step took 37.4 ms, median, in a process whose caches one lone process
    had filled, and never under 42.9 ms in the bench's, same graphs and settings)."""
    warm = tempfile.mkdtemp(prefix="warm-", dir=scratch)
    for cold in sorted(Path(scratch).glob("bench-inductor-*")):
        try:
            shutil.copytree(cold, warm, symlinks=True, dirs_exist_ok=True,
                            copy_function=_merge_copy, ignore=_TUNED)
        except shutil.Error as e:  # a lock file gone meanwhile: that entry compiles again
            print(f"merging {cold.name}: {str(e)[:200]}", flush=True)
    return warm


def _merge_copy(src: str, dst: str) -> None:
    if not (dst.endswith(fxkeys.SUFFIX) and os.path.exists(dst)):
        shutil.copy2(src, dst)
        return
    records = {}
    for path in (dst, src):
        try:
            records.update(store.unseal(Path(path).read_bytes()))
        except (OSError, ValueError):  # damaged: the other file's records stand
            pass
    Path(dst).write_bytes(store.seal(records))


def interleaved_phase(name: str, modes: list[str], args, warm: str, deadline: float) -> dict:
    timeout = deadline - time.time()
    if timeout < bench.MIN_ROW_SECONDS or not modes or not args.rounds:
        reason = ("--rounds 0 (cold compiles only)" if not args.rounds else
                  "out of time (--timeout)" if modes else "no mode compiled cold")
        return {"status": "skipped", "error": reason}
    spec = {"model": name, "modes": modes, "small": args.small, "device": args.device,
            "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup}
    env = bench._worker_env(SimpleNamespace(cache_dir=None, threads=args.threads, jobs=1,
                                            cold=False))
    env.update(TORCHINDUCTOR_CACHE_DIR=warm, AOTGRAD_CACHE_DIR=os.path.join(warm, "aotgrad"))
    runs = []
    for _ in range(args.processes):
        runs.append(spawn_worker(spec, env, deadline - time.time()))
        print(f"{name} interleaved: {runs[-1].get('status')} "
              f"{runs[-1].get('error', '')[:150]}", flush=True)
        if runs[-1].get("status") != "ok" or deadline - time.time() < bench.MIN_ROW_SECONDS:
            break
    return merge_processes(runs)


def merge_processes(runs: list[dict]) -> dict:
    """One interleaved row from several processes: each mode's step and host medians are
    the medians of the processes' own. A host-bound step's speed is drawn per process
    (session 31: DeBERTa-v2's ratio 0.81x to 1.29x in nine processes, its kernels 1.006x),
    so one process's ratio can mislead; `processes` keeps each one's figures."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if len(ok) < 2:
        return runs[0] if len(runs) == 1 or not ok else ok[0]
    merged = {**ok[0], "modes": {mode: dict(row) for mode, row in ok[0]["modes"].items()}}
    for mode, row in merged["modes"].items():
        rows = [r["modes"][mode] for r in ok if "step_ms" in r["modes"].get(mode, {})]
        for key in ("step_ms", "host_ms"):
            if len(rows) == len(ok):
                row[key] = statistics.median(r[key] for r in rows)
        row["min_ms"] = min((r["min_ms"] for r in rows), default=row.get("min_ms"))
        row.pop("samples_ms", None)
    merged["processes"] = [{mode: {k: row.get(k) for k in ("step_ms", "host_ms", "min_ms",
                                                           "allocator_calls_per_step",
                                                           "device_events_per_step")}
                            for mode, row in r["modes"].items()} for r in ok]
    merged["host_launch_us"] = [pair for r in ok for pair in r.get("host_launch_us") or []]
    merged["elapsed_s"] = sum(r.get("elapsed_s", 0) for r in runs)
    return merged


def spawn_worker(spec: dict, env: dict, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_path, log_path = Path(tmp, "result.json"), Path(tmp, "log.txt")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec),
               "--result", str(result_path)]
        with open(log_path, "w") as log_file:
            # A session of its own: on timeout the group goes, Inductor's workers included.
            proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
            timed_out = bench._wait(proc, timeout)
        if result_path.exists():
            return json.loads(result_path.read_text())
        log = log_path.read_text(errors="replace")
        return bench._no_result(log, proc.returncode, timeout if timed_out else None)


def environment(args) -> dict:
    cuda = args.device.startswith("cuda")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__, "commit": bench.code_version(),
        "device": torch.cuda.get_device_name(args.device) if cuda else bench._cpu_name(),
        "versions": {m: bench._version(m) for m in ("transformers", "timm", "triton")},
        "argv": sys.argv[1:],
        "settings": {k: getattr(args, k) for k in ("small", "rounds", "steps", "warmup",
                                                    "cold_warmup", "cold_steps", "jobs",
                                                    "budget", "timeout", "threads",
                                                    "processes")},
    }


# ---------------------------------------------------------------------------- the worker

def interleaved_worker(spec: dict) -> dict:
    """Every mode of one model compiled and warmed up in this process, then timed in turns."""
    cuda = spec["device"].startswith("cuda")
    _allow_recompiles(len(spec["modes"]))
    stepping, rows = {}, {}
    for mode in spec["modes"]:
        job = bench.Job(spec["model"], MODES[mode], None, spec["small"], spec["device"], 0,
                        spec["steps"])
        try:
            stepping[mode], rows[mode] = warmed_step(job, spec["warmup"], cuda)
        except Exception as e:  # recorded; the other modes go on
            rows[mode] = {"status": "error", "error": bench.describe(e)[:2000],
                          "where": bench.where(e)}
    print(bench.COMPILED_MARK, flush=True)
    launch_before = host_launch_us(spec["device"])
    times = interleaved.take_turns(stepping, spec["rounds"], spec["steps"], cuda)
    launch_after = host_launch_us(spec["device"])
    for mode, timed in times.items():
        rows[mode].update(summarize(timed))
        if cuda:
            rows[mode].update(profiled_step(stepping[mode]))
    return {"status": "ok", "modes": rows,  # a pair per process, as merged rows list them
            "host_launch_us": [[launch_before, launch_after]]}


def host_launch_us(device: str, calls: int = 500, rounds: int = 5) -> float:
    """This process's host speed: microseconds a call of a one-element `add` takes to
    dispatch and launch (its fastest round), before and after the turns. A host-bound
    step's time moves with it from process to process and call to call (session 35:
    ResNet-50's Inductor step 16.6 ms, 26.5 in session 34): the covariate to read such a
    row's ratio beside."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    a = torch.zeros(1, device=device)
    out = torch.empty_like(a)
    best = float("inf")
    for _ in range(rounds):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            torch.add(a, 1, out=out)
        best = min(best, time.perf_counter() - start)  # the host's time: the GPU's queue
    sync()                                            # takes 500 without waiting
    return round(best / calls * 1e6, 3)


# The profiler's names of a step's copies (on the GPU) and of the host's calls that wait on
# the GPU: a host that waits mid-step loses its lead, and a host-bound step's time moves
# with that (DeBERTa-v2's aotgrad rows, 1.06-1.32x in some processes only).
COPIES_AND_WAITS = ("Memcpy", "Memset", "Synchronize")


def profiled_step(step) -> dict:
    """One step under the profiler: the kernels and copies it put on the GPU
    (`device_events_per_step`: which compiled code a mode ran; in session 37 two modes
    sharing graphs ran one code, which their timings could not tell), and its copies and
    waits by name (`copies_and_waits`)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        events = prof.events()
    except Exception as e:  # a count is a clue, not a measure the row needs
        print(f"profiled_step: {bench.describe(e)[:200]}", flush=True)
        return {}
    waits: dict[str, int] = {}
    for event in events:
        if any(word in event.name for word in COPIES_AND_WAITS):
            waits[event.name] = waits.get(event.name, 0) + 1
    if waits.get("cudaDeviceSynchronize"):  # one is this function's own, after the step
        waits["cudaDeviceSynchronize"] -= 1
    waits = {name: n for name, n in waits.items() if n}
    return {"device_events_per_step": sum(e.device_type == DeviceType.CUDA for e in events),
            "copies_and_waits": waits}


def _allow_recompiles(modes: int) -> None:
    # Every mode compiles the same forward code (other module, other backend): one Dynamo
    # cache entry each, graph breaks' resume functions included.
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 8 * modes))


def warmed_step(job: bench.Job, warmup: int, cuda: bool):
    aotgrad.cache.reset_stats()  # the events of this mode's compile alone
    step = interleaved.compiled_step(job)  # job.warmup is 0: compiles on the first call
    first = bench.time_step(step, cuda)
    for _ in range(warmup):
        step()
    row = {"status": "ok", "first_step_s": first["wall"], "first_loss": first["loss"]}
    if "aotgrad" in job.mode:  # a slow warm first step: did our cache miss, and why?
        row["aotgrad_cache"] = {"stats": {k: v for k, v in aotgrad.cache.stats().items() if v},
                                "events": [f"{e}: {why[:300]}" for e, why in
                                           aotgrad.cache.events()[:20]]}
    return step, row


def summarize(timed: list[dict]) -> dict:
    step_ms = [t["step"] * 1e3 for t in timed]
    summary = {"step_ms": statistics.median(step_ms), "min_ms": min(step_ms),
               "host_ms": statistics.median(t["host"] for t in timed) * 1e3,
               "timed_steps": len(timed),
               # in the order timed, turn after turn: is a turn's first step the slow one?
               "samples_ms": [[round(t["step"] * 1e3, 3), round(t["host"] * 1e3, 3)]
                              for t in timed]}
    if "peak_above_mb" in timed[0]:
        summary["peak_above_mb"] = max(t["peak_above_mb"] for t in timed)
        summary["allocator_calls_per_step"] = {
            k: statistics.mean(t[k] for t in timed) for k in bench.ALLOCATOR_CALLS}
    return summary


def worker_main(spec_json: str, result_path: str) -> None:
    start = time.perf_counter()
    try:
        result = interleaved_worker(json.loads(spec_json))
    except Exception as e:  # recorded in the model's JSON
        result = {"status": "error", "error": bench.describe(e)[:2000]}
    result["elapsed_s"] = time.perf_counter() - start
    Path(result_path).write_text(json.dumps(result))


# ---------------------------------------------------------------------------- command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=bench._names(bench.MODELS))
    p.add_argument("--modes", type=bench._names(MODES),
                   default=[m for m in MODES if not m.endswith(("_cpp", "_combo", "_pw", "_fw"))])
    p.add_argument("--small", action="store_true", help="tiny models (CPU check)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--budget", type=float, default=480, help="seconds; no model starts later")
    p.add_argument("--timeout", type=float, default=300, help="seconds per model, all phases")
    p.add_argument("--jobs", type=int,
                   help="cold processes at once (default: every mode on GPU, so that all "
                        "compile under the same load; 2 on CPU)")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the workers")
    p.add_argument("--processes", type=int, default=1,
                   help="interleaved processes per model; each mode's step is the median of "
                        "theirs (a host-bound step's speed varies by process)")
    for name in SETTINGS["full"]:
        p.add_argument(f"--{name.replace('_', '-')}", type=int)
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "models")
    p.add_argument("--report", type=Path, help="only write the report of this directory")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name, value in SETTINGS["small" if args.small else "full"].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.models = args.models or (SMALL_MODELS if args.small else MODELS)
    args.jobs = args.jobs or (len(args.modes) if args.device.startswith("cuda") else 2)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.result)
    if not args.report:
        run_all(args)
    print(models_report.write_report(args.report or args.out), flush=True)


if __name__ == "__main__":
    main()
