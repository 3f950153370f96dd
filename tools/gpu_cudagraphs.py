"""CUDA graphs on the GPU: host-bound training steps with and without `reduce-overhead`.

    python tools/gpu_cudagraphs.py [--steps 30] [--models resnet50_b16,resnet50_b64,gpt2_2x256]
                                   [--modes eager,inductor,inductor_ro,aotgrad,aotgrad_ro]

Each model (random init, bf16 autocast, forward + backward + SGD step, grads set to None)
runs in each mode from a fresh copy: the first step's time is the compile time, then warm-up
steps, then `--steps` timed steps (median and min, CUDA-synchronized) and the peak memory of
the timed steps. Modes: eager; torch.compile with backend="inductor" and "aotgrad", each
also with mode="reduce-overhead" (`_ro`, CUDA graphs). Writes cudagraphs.json to $OUT (or
--out) and prints a Markdown table last. ResNet-50 needs timm, GPT-2 transformers.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import aotgrad  # noqa: E402,F401  (registers backend="aotgrad")


def resnet50(batch: int):
    def make():
        import timm
        model = timm.create_model("resnet50", pretrained=False).cuda()
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    return make


def gpt2(batch: int, seq: int):
    def make():
        from transformers import GPT2Config, GPT2LMHeadModel
        model = GPT2LMHeadModel(GPT2Config()).cuda()
        ids = torch.randint(0, 50257, (batch, seq), device="cuda")
        return model, lambda m: m(input_ids=ids, labels=ids).loss
    return make


MODELS = {"resnet50_b16": resnet50(16), "resnet50_b64": resnet50(64),
          "gpt2_2x256": gpt2(2, 256)}
MODES = {
    "eager": lambda m: m,
    "inductor": lambda m: torch.compile(m, backend="inductor"),
    "inductor_ro": lambda m: torch.compile(m, backend="inductor", mode="reduce-overhead"),
    "aotgrad": lambda m: torch.compile(m, backend="aotgrad"),
    "aotgrad_ro": lambda m: torch.compile(m, backend="aotgrad", mode="reduce-overhead"),
}


def run_mode(make, mode: str, steps: int, warmup: int) -> dict:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model, loss_of = make()
    compiled = MODES[mode](model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = loss_of(compiled)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times),
            "peak_mb": torch.cuda.max_memory_allocated() / 2**20, "compile_s": compile_s}


def markdown(meta: dict, rows: dict) -> str:
    modes = [m for m in MODES if any(m in r for r in rows.values())]
    lines = [f"# CUDA graphs ({meta['date']}, torch {meta['torch']}, {meta['gpu']})", "",
             "Training step median ms / peak MB / first-step (compile) s; `_ro`: "
             "mode=\"reduce-overhead\".", "",
             "| model | " + " | ".join(modes) + " |", "|---|" + "---:|" * len(modes)]
    for model, r in rows.items():
        cells = [f"{r[m]['median_ms']:.1f} / {r[m]['peak_mb']:.0f} / {r[m]['compile_s']:.0f}"
                 if "median_ms" in r.get(m, {}) else r.get(m, {}).get("error", "-")[:40]
                 for m in modes]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    rows: dict[str, dict] = {}
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            try:
                rows.setdefault(model, {})[mode] = run_mode(MODELS[model], mode, args.steps,
                                                            args.warmup)
            except Exception as exc:  # one failure must not lose the other rows
                rows[model][mode] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
            print(model, mode, rows[model][mode], flush=True)
    meta = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name(), "steps": args.steps}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cudagraphs.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    text = markdown(meta, rows)
    (out / "cudagraphs.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
