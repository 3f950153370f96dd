"""Training steps with the forward compiled by `torch.compile(backend="aotgrad")` and the
backward run by (a) the eager engine, (b) aotgrad's compiled autograd with "inductor",
(c) torch's compiled autograd (`torch._dynamo.compiled_autograd.enable(torch.compile(
backend="inductor"))`): step time (median of 10 after 3 warm-up steps), peak memory, the
first step's time (its compiles), the first loss and gradient norm (the variants should
agree). GPT-2 small (transformers, random init, 8x512 tokens) and ResNet-50 (timm, batch 32).

    python tools/gpu_compiled_autograd.py                 # CUDA; JSON to $OUT
    python tools/gpu_compiled_autograd.py --cpu --tiny    # a check of the script itself

Each model and variant runs in a process of its own, with a timeout: the engine binds its
C++ functions to one compiled-autograd instance per process, and one failure must not stop
the rest. `--tiny` shrinks the models (a small MLP and CNN of our own where transformers
or timm is missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

MODELS = ("gpt2", "resnet50")
VARIANTS = ("eager engine", "aotgrad inductor", "torch compiled autograd")
WARMUP, STEPS = 3, 10


# -- one model, one variant (a child process) ------------------------------------------------
def build(model: str, tiny: bool, device: str):
    """(module, batch, loss_fn) on `device`, seeded."""
    import torch
    torch.manual_seed(0)
    if model == "gpt2":
        return _gpt2(tiny, device)
    return _resnet(tiny, device)


def _gpt2(tiny: bool, device: str):
    import torch
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        if not tiny:
            raise
        return _tiny_mlp(device)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=512) if tiny else GPT2Config()
    module = GPT2LMHeadModel(config).to(device)
    batch, length = (2, 32) if tiny else (8, 512)
    tokens = torch.randint(0, config.vocab_size, (batch, length), device=device)
    return module, tokens, lambda m, t: m(input_ids=t, labels=t).loss


def _resnet(tiny: bool, device: str):
    import torch
    try:
        import timm
    except Exception:  # noqa: BLE001 - timm's import fails where torchvision mismatches
        if not tiny:
            raise
        return _tiny_cnn(device)
    module = timm.create_model("resnet18" if tiny else "resnet50").to(device)
    batch, side = (2, 32) if tiny else (32, 224)
    images = torch.randn(batch, 3, side, side, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)
    return module, (images, labels), _classify


def _classify(m, batch):
    import torch
    images, labels = batch
    return torch.nn.functional.cross_entropy(m(images), labels)


def _tiny_mlp(device: str):
    import torch
    from torch import nn
    module = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256),
                           nn.Linear(256, 64)).to(device)
    return module, torch.randn(16, 64, device=device), lambda m, x: m(x).pow(2).mean()


def _tiny_cnn(device: str):
    import torch
    from torch import nn
    module = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                           nn.Conv2d(16, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                           nn.Flatten(), nn.Linear(16, 10)).to(device)
    images = torch.randn(4, 3, 16, 16, device=device)
    return module, (images, torch.randint(0, 10, (4,), device=device)), _classify


def backward_context(variant: str):
    import torch
    import aotgrad
    if variant == "aotgrad inductor":
        return aotgrad.compiled_autograd.enable("inductor")
    if variant == "torch compiled autograd":
        from torch._dynamo import compiled_autograd as torch_ca  # compared against, not used
        enable = getattr(torch_ca, "enable", None) or torch_ca._enable  # 2.13: _enable
        return enable(torch.compile(backend="inductor"))
    return contextlib.nullcontext()


def measure(model: str, variant: str, tiny: bool, device: str) -> dict:
    import torch
    import aotgrad  # noqa: F401  (registers the "aotgrad" backend)
    module, batch, loss_fn = build(model, tiny, device)
    compiled = torch.compile(module, backend="aotgrad")
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times, first = [], {}
    with backward_context(variant), contextlib.ExitStack() as timing:
        for i in range(WARMUP + STEPS):
            if i == WARMUP:
                timing.enter_context(_timing_lock())
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
            sync()
            start = time.perf_counter()
            loss = loss_fn(compiled, batch)
            loss.backward()
            if i == 0:
                first = {"first_loss": loss.item(), "first_grad_norm": _grad_norm(module)}
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            sync()
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    timed = sorted(times[WARMUP:])
    return {"model": model, "variant": variant, "step_ms": timed[len(timed) // 2] * 1e3,
            "first_step_s": times[0], "peak_mib": peak, **first}


@contextlib.contextmanager
def _timing_lock():
    """Under --parallel the runs compile at once, but their timed steps take turns: a step
    timed while another process runs on the same GPU would be slower than it is."""
    path = os.environ.get("CA_BENCH_LOCK")
    if path is None:
        yield
        return
    import fcntl
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _grad_norm(module) -> float:
    import torch
    grads = [p.grad.float().norm() for p in module.parameters() if p.grad is not None]
    return torch.stack(grads).norm().item()


# -- the driver ------------------------------------------------------------------------------
def run_one(model: str, variant: str, args, timeout: float) -> dict:
    command = [sys.executable, __file__, "--one", model, variant] + \
        (["--cpu"] if args.cpu else []) + (["--tiny"] if args.tiny else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
         os.environ.get("PYTHONPATH", "")]))
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": model, "variant": variant, "error": f"timed out after {timeout:.0f} s"}
    last = done.stdout.strip().splitlines()[-1:] or [""]
    if done.returncode != 0 or not last[0].startswith("{"):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"model": model, "variant": variant, "error": tail,
                "wall_s": time.perf_counter() - start}
    return json.loads(last[0])


def _run_parallel(runs, args) -> list[dict]:
    """All runs at once, each in its own process: the compiles overlap (first-step times are
    then those of concurrent compiles), the timed steps take turns (`_timing_lock`)."""
    from concurrent.futures import ThreadPoolExecutor
    os.environ["CA_BENCH_LOCK"] = os.path.join(args.out, ".timing.lock")
    os.makedirs(args.out, exist_ok=True)
    timeout = min(args.timeout, args.budget)
    with ThreadPoolExecutor(len(runs)) as pool:
        return list(pool.map(lambda run: run_one(*run, args, timeout), runs))


def table(rows: list[dict]) -> str:
    lines = ["| model | backward | step (ms) | first step (s) | peak (MiB) | first loss | "
             "grad norm |", "| --- " * 7 + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['variant']} | failed: {r['error']} | | | | |")
            continue
        peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
        lines.append(f"| {r['model']} | {r['variant']} | {r['step_ms']:.1f} | "
                     f"{r['first_step_s']:.1f} | {peak} | {r['first_loss']:.4f} | "
                     f"{r['first_grad_norm']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--one", nargs=2, metavar=("MODEL", "VARIANT"))
    parser.add_argument("--timeout", type=float, default=110, help="seconds per run")
    parser.add_argument("--budget", type=float, default=285, help="seconds for all runs")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--parallel", action="store_true",
                        help="all runs at once; timed steps take turns")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if args.one:
        print(json.dumps(measure(*args.one, args.tiny, device)))
        return
    runs = [(model, variant) for variant in VARIANTS for model in args.models.split(",")]
    if args.parallel:
        rows = _run_parallel(runs, args)
    else:
        rows, deadline = [], time.perf_counter() + args.budget
        # The eager engine first: it compiles least, and is what the others are read against.
        for model, variant in runs:
            left = deadline - time.perf_counter()
            rows.append(run_one(model, variant, args, min(args.timeout, left)) if left > 5 else
                        {"model": model, "variant": variant, "error": "no time left"})
    rows.sort(key=lambda r: (MODELS.index(r["model"]), VARIANTS.index(r["variant"])))
    args.concurrent_compiles = len(runs) if args.parallel else 1
    _write(rows, args, device)


def _write(rows: list[dict], args, device: str) -> None:
    import torch
    meta = {"date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "device":
            torch.cuda.get_device_name() if device == "cuda" else "cpu", "tiny": args.tiny,
            "concurrent_compiles": args.concurrent_compiles, "warmup": WARMUP, "steps": STEPS}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gpu_compiled_autograd.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    print(json.dumps(meta))
    print(table(rows))


if __name__ == "__main__":
    main()
