"""Benchmark aotgrad against eager and PyTorch's own compilers: compile time, step time, memory.

    python bench/run.py --quick --budgets 1.0,0.5,0.2        # GPU: every model and mode
    python bench/run.py --small --models mlp,tiny --modes eager,aotgrad_compile_eager

A step is forward (loss inside the compiled region), `loss.backward()`, zero grads; no
optimizer. Each (model, mode, budget) runs in its own subprocess so that compile caches,
memory statistics and Dynamo state do not leak between rows; a failure or timeout is
recorded and the run goes on. Results land in --out as results.json, results.md and plots;
a short summary table is printed last on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT))  # `python bench/run.py` from anywhere finds aotgrad

import aotgrad  # noqa: E402


# ---------------------------------------------------------------------------- the tables

@dataclass(frozen=True)
class ModelSpec:
    build: Callable[[bool], tuple[nn.Module, tuple]]  # small -> (loss module, CPU batch)
    needs: tuple[str, ...]        # modules the full-size model imports
    needs_small: tuple[str, ...]  # ... and the --small variant
    autocast: bool                # bf16 autocast around forward on CUDA
    channels_last: bool = False


@dataclass(frozen=True)
class Mode:
    compile: Callable  # (model, budget, sink) -> callable; `sink` collects what has timings
    budgeted: bool = False  # runs once per --budgets value
    config: Callable[[float | None], contextlib.AbstractContextManager] = \
        lambda budget: contextlib.nullcontext()


def _build_gpt2(small):
    from transformers import GPT2Config, GPT2LMHeadModel
    if small:
        config = GPT2Config(vocab_size=1024, n_positions=64, n_embd=128, n_layer=2, n_head=4)
    else:
        config = GPT2Config()  # GPT-2 small: 12 layers x 768, random init, nothing downloaded
    config.use_cache = False  # training: no key/value cache among the outputs
    batch, tokens = (2, 64) if small else (8, 1024)
    ids = torch.randint(0, config.vocab_size, (batch, tokens))
    return LanguageModelLoss(GPT2LMHeadModel(config)), (ids,)


def _build_resnet50(small):
    if not small:
        import timm
        return _classifier(timm.create_model("resnet50", pretrained=False), 64, 224, 1000)
    if importlib.util.find_spec("timm"):
        import timm
        return _classifier(timm.create_model("resnet18", pretrained=False, num_classes=10),
                           4, 64, 10)
    return _classifier(SmallConvNet(), 8, 32, 10)  # timm missing: a stand-in with BatchNorm


def _build_mlp(small):
    width, layers, batch = (256, 4, 64) if small else (4096, 8, 8192)
    return SquaredOutput(_mlp(width, layers)), (torch.randn(batch, width),)


def _build_tiny(small):
    # Kernels take microseconds here: the step time is the host overhead of each path.
    return SquaredOutput(_mlp(16, 2)), (torch.randn(8, 16),)


MODELS = {
    "gpt2": ModelSpec(_build_gpt2, ("transformers",), ("transformers",), autocast=True),
    "resnet50": ModelSpec(_build_resnet50, ("timm",), (), autocast=True, channels_last=True),
    "mlp": ModelSpec(_build_mlp, (), (), autocast=False),
    "tiny": ModelSpec(_build_tiny, (), (), autocast=False),
}


def _torch_budget(budget):
    # Read when AOTAutograd partitions, i.e. during the first call: the worker holds the patch
    # around every call of the row.
    if budget is None:
        return contextlib.nullcontext()
    return torch._functorch.config.patch(activation_memory_budget=budget)


def _aotgrad_dynamo(backend):
    def compile_(model, budget, sink):
        if backend == "inductor" and budget is None:
            chosen = torch._dynamo.lookup_backend("aotgrad")  # the registered name itself
        else:
            chosen = aotgrad.backend(backend=backend, memory_budget=budget)
        return torch.compile(model, backend=_recording(chosen, sink))
    return compile_


def _aotgrad_compile(backend):
    def compile_(model, budget, sink):
        compiled = aotgrad.compile(model, backend=backend, memory_budget=budget)
        sink.append(compiled)
        return compiled
    return compile_


MODES = {
    "eager": Mode(lambda model, budget, sink: model),
    "torch_compile": Mode(lambda model, budget, sink: torch.compile(model), budgeted=True,
                          config=_torch_budget),
    "aot_eager": Mode(lambda model, budget, sink: torch.compile(model, backend="aot_eager")),
    "aotgrad_dynamo": Mode(_aotgrad_dynamo("inductor"), budgeted=True),
    "aotgrad_dynamo_eager": Mode(_aotgrad_dynamo("eager")),
    "aotgrad_compile": Mode(_aotgrad_compile("inductor")),
    "aotgrad_compile_eager": Mode(_aotgrad_compile("eager")),
}
DEFAULT_MODES = [m for m in MODES if m != "aotgrad_compile_eager"]  # that one is for CPU tests

# (warm-up steps, timed steps, seconds per row, seconds for the whole run)
SETTINGS = {"full": (5, 30, 900, None), "quick": (3, 10, 150, 570)}
MIN_ROW_SECONDS = 20  # a row with less time left than this is skipped, not started


# ---------------------------------------------------------------------------- the models

class LanguageModelLoss(nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(ids, labels=ids).loss


class ClassifierLoss(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, images, labels):
        return nn.functional.cross_entropy(self.net(images), labels)


class SquaredOutput(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x).square().mean()


class SmallConvNet(nn.Sequential):
    def __init__(self, classes=10):
        super().__init__(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(32, classes))


def _classifier(net, batch, size, classes):
    images = torch.randn(batch, 3, size, size)
    return ClassifierLoss(net), (images, torch.randint(0, classes, (batch,)))


def _mlp(width, layers):
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.GELU())])


def _recording(backend, sink):
    """Keep what the backend returns: aotgrad's compiled callables carry `.artifact`."""
    def recorded(gm, example_inputs):
        compiled = backend(gm, example_inputs)
        sink.append(compiled)
        return compiled
    return recorded


# ---------------------------------------------------------------------------- one row (worker)

@dataclass(frozen=True)
class Job:
    model: str
    mode: str
    budget: float | None
    small: bool
    device: str
    warmup: int
    steps: int

    @property
    def label(self) -> str:
        suffix = "" if self.budget is None else f"@{self.budget:g}"
        return f"{self.model}/{self.mode}{suffix}"


def prepare(job: Job):
    """The loss module and batch on the device; a step function that runs one training step."""
    spec = MODELS[job.model]
    model, batch = spec.build(job.small)
    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    model = model.to(job.device, memory_format=fmt).train()
    batch = tuple(t.to(job.device, memory_format=fmt) if t.dim() == 4 else t.to(job.device)
                  for t in batch)
    use_autocast = spec.autocast and job.device.startswith("cuda")
    return model, batch, use_autocast


def make_step(model, compiled, batch, use_autocast):
    autocast = (lambda: torch.autocast("cuda", torch.bfloat16)) if use_autocast \
        else contextlib.nullcontext

    def step():
        with autocast():
            loss = compiled(*batch)
        loss.backward()
        model.zero_grad(set_to_none=True)
        return loss
    return step


def time_step(step, cuda: bool) -> dict:
    """One step: host time (until the Python call returns), wall time and device time."""
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    loss = step()
    t1 = time.perf_counter()
    if cuda:
        end.record()
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    device_s = start.elapsed_time(end) / 1e3 if cuda else t2 - t0
    return {"host": t1 - t0, "wall": t2 - t0, "step": device_s, "loss": loss.item()}


def measure(step, job: Job) -> dict:
    cuda = job.device.startswith("cuda")
    first = time_step(step, cuda)  # compiles
    for _ in range(job.warmup):
        time_step(step, cuda)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else None
    timed = [time_step(step, cuda) for _ in range(job.steps)]
    median = {k: statistics.median(t[k] for t in timed) for k in ("host", "wall", "step")}
    return {
        "compile_s": first["wall"] - median["wall"], "first_step_s": first["wall"],
        "step_ms": median["step"] * 1e3, "wall_ms": median["wall"] * 1e3,
        "host_ms": median["host"] * 1e3, "loss": first["loss"],
        "peak_mb": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "base_mb": base / 2**20 if cuda else None,
    }


def artifacts_of(sink) -> list:
    found = []
    for item in sink:
        if hasattr(item, "artifacts"):
            found += item.artifacts
        elif getattr(item, "artifact", None) is not None:
            found.append(item.artifact)
    return found


def compile_facts(sink, mode: str) -> dict:
    """aotgrad's per-stage compile time and saved bytes; Dynamo's graph and break counts."""
    facts = {}
    if mode != "eager" and not mode.startswith("aotgrad_compile"):
        counters = torch._dynamo.utils.counters
        facts["graphs"] = counters["stats"]["unique_graphs"]
        facts["graph_breaks"] = sum(counters["graph_break"].values())
    artifacts = artifacts_of(sink)
    if mode.startswith("aotgrad"):
        facts["aotgrad_graphs"] = len(artifacts)
        facts["stages"] = _sum_timings(a.timings for a in artifacts) if artifacts else None
        facts["saved_mb"] = sum(s.nbytes for a in artifacts for s in a.saved) / 2**20
    return facts


def _sum_timings(timings) -> dict:
    total: dict[str, float] = {}
    for t in timings:
        for stage, seconds in t.items():
            total[stage] = total.get(stage, 0.0) + seconds
    return total


def run_row(job: Job) -> dict:
    torch.manual_seed(0)
    model, batch, use_autocast = prepare(job)
    mode = MODES[job.mode]
    sink: list = []
    with mode.config(job.budget):
        compiled = mode.compile(model, job.budget, sink)
        metrics = measure(make_step(model, compiled, batch, use_autocast), job)
    return {**metrics, **compile_facts(sink, job.mode), "autocast": use_autocast}


def worker_main(job_json: str, result_path: str) -> None:
    job = Job(**json.loads(job_json))
    start = time.perf_counter()
    try:
        result = {"status": "ok", **run_row(job)}
    except Exception as e:  # recorded in the table; the parent goes on with the next row
        result = {"status": "error", "error": f"{type(e).__name__}: {e}"[:2000],
                  "traceback": traceback.format_exc()[-4000:]}
    result["elapsed_s"] = time.perf_counter() - start
    Path(result_path).write_text(json.dumps(result))


# ---------------------------------------------------------------------------- the run (parent)

def plan_jobs(args) -> list[Job]:
    """Rows in priority order: every default-budget row before the lower budgets, so that a
    run cut short by --time-limit loses the budget sweep first."""
    budgets = args.budgets or [None]
    jobs = []
    for model in args.models:
        for mode in args.modes:
            for budget in (budgets if MODES[mode].budgeted else [None]):
                jobs.append(Job(model, mode, budget, args.small, args.device,
                                args.warmup, args.steps))
    return sorted(jobs, key=lambda j: j.budget is not None and j.budget < 1.0)


def missing_modules(job: Job) -> list[str]:
    spec = MODELS[job.model]
    needs = spec.needs_small if job.small else spec.needs
    return [m for m in needs if importlib.util.find_spec(m) is None]


def run_job(job: Job, args, deadline: float | None) -> dict:
    row = {"model": job.model, "mode": job.mode, "budget": job.budget}
    missing = missing_modules(job)
    if missing:
        return {**row, "status": "skipped", "error": f"{', '.join(missing)} not importable"}
    timeout = args.timeout if deadline is None else min(args.timeout, deadline - time.time())
    if timeout < MIN_ROW_SECONDS:
        return {**row, "status": "skipped", "error": "out of time (--time-limit)"}
    return {**row, **_spawn(job, timeout, args)}


def _spawn(job: Job, timeout: float, args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result_path, log_path = Path(tmp, "result.json"), Path(tmp, "log.txt")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker",
               json.dumps(asdict(job)), "--result", str(result_path)]
        with open(log_path, "w") as log:
            # A session of its own: on timeout the whole group goes, Inductor's compile
            # workers included.
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=_worker_env(args))
            timed_out = _wait(proc, timeout)
        log_tail = log_path.read_text(errors="replace")[-3000:]
        if result_path.exists():
            return json.loads(result_path.read_text())
        status = "timeout" if timed_out else "crash"
        reason = f"no result after {timeout:.0f}s" if timed_out else f"exit code {proc.returncode}"
        return {"status": status, "error": reason, "log_tail": log_tail}


def _wait(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this run started, leftovers included
    proc.wait()
    return timed_out


def _worker_env(args) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", args.cache_dir)
    if args.cold:
        env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-inductor-",
                                                          dir=args.cache_dir)
    return env


def environment(args) -> dict:
    cuda = args.device.startswith("cuda")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(args.device) if cuda else _cpu_name(),
        "python": platform.python_version(),
        "versions": {m: _version(m) for m in ("transformers", "timm", "triton")},
        "argv": sys.argv[1:],
        "settings": {"small": args.small, "warmup": args.warmup, "steps": args.steps,
                     "timeout_s": args.timeout, "time_limit_s": args.time_limit,
                     "cold_cache": args.cold},
    }


def _cpu_name() -> str:
    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} threads)"


def _version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


def run_all(args) -> list[dict]:
    deadline = None if args.time_limit is None else time.time() + args.time_limit
    rows = []
    jobs = plan_jobs(args)
    for i, job in enumerate(jobs, 1):
        row = run_job(job, args, deadline)
        rows.append(row)
        print(f"[{i}/{len(jobs)}] {job.label}: {_progress(row)}", flush=True)
    return rows


def _progress(row: dict) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('error', '')[:100]}"
    return (f"compile {row['compile_s']:.1f}s, step {row['step_ms']:.2f} ms "
            f"({row['elapsed_s']:.0f}s)")


# ---------------------------------------------------------------------------- the command line

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=_names(MODELS), default=list(MODELS))
    p.add_argument("--modes", type=_names(MODES), default=DEFAULT_MODES)
    p.add_argument("--budgets", type=_floats, default=None,
                   help="e.g. 1.0,0.5,0.2: torch_compile and aotgrad_dynamo once per budget")
    p.add_argument("--small", action="store_true", help="the small CPU-sized variants")
    p.add_argument("--quick", action="store_true",
                   help="few steps and a whole-run time limit: fits one 10-minute command")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--warmup", type=int, help="steps after the first (compiling) one")
    p.add_argument("--steps", type=int, help="timed steps (median reported)")
    p.add_argument("--timeout", type=float, help="seconds per row")
    p.add_argument("--time-limit", type=float, help="seconds for the whole run")
    p.add_argument("--cold", action="store_true",
                   help="a fresh Inductor cache per row (default: one per run, shared)")
    p.add_argument("--out", type=Path, default=BENCH_DIR / "results")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    return _fill_defaults(p.parse_args(argv))


def _fill_defaults(args):
    warmup, steps, timeout, time_limit = SETTINGS["quick" if args.quick else "full"]
    args.warmup = warmup if args.warmup is None else args.warmup
    args.steps = steps if args.steps is None else args.steps
    args.timeout = timeout if args.timeout is None else args.timeout
    args.time_limit = time_limit if args.time_limit is None else args.time_limit
    return args


def _names(table):
    def parse(text):
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in table]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(table)}")
        return names
    return parse


def _floats(text):
    return [float(b) for b in text.split(",") if b.strip()]


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args.worker, args.result)
    from run_report import summary_table, write_outputs  # beside this file
    start = time.time()
    meta = environment(args)
    with tempfile.TemporaryDirectory(prefix="bench-inductor-") as cache_dir:
        args.cache_dir = cache_dir  # Inductor's cache: cold at the start of every run
        rows = run_all(args)
    meta["total_s"] = time.time() - start
    notes = write_outputs(args.out, meta, rows)
    print(summary_table(meta, rows, notes), flush=True)


if __name__ == "__main__":
    main()
