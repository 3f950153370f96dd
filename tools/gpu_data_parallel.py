"""Data-parallel training of GPT-2 small through aotgrad, on 2 GPUs over NCCL.

    PYTHONPATH=. torchrun --nproc-per-node 2 tools/gpu_data_parallel.py
    PYTHONPATH=. torchrun --nproc-per-node 2 tools/gpu_data_parallel.py --cpu --tiny  # gloo

GPT-2 small (transformers' GPT2LMHeadModel from its config: random weights, nothing
downloaded, dropout off so that every run draws the same numbers) trains a few SGD steps,
wrapped in DDP (bf16 autocast) and in FSDP2 (`fully_shard` per block and the root, bf16
parameters, fp32 reduction), each eagerly, through `torch.compile(backend="aotgrad")` and
through `torch.compile(backend="inductor")` (PyTorch's AOTAutograd). Every rank trains on its
own batches, the same ones in every run. Reported per run: the median step time after the
warm-up steps, the first step's time (compiles included), each GPU's peak memory, and the
largest difference of the losses from the eager run's. JSON goes to $OUT (or --out); a
Markdown table is printed last.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta

# NVLink multicast (NVLS) stays off: on shared hosts it can take the GPUs out of service.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import aotgrad  # noqa: E402,F401  (registers backend="aotgrad" with Dynamo)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU processes, no GPU")
    p.add_argument("--tiny", action="store_true", help="a 2-layer GPT-2 of width 64")
    p.add_argument("--wrappers", default="ddp,fsdp2")
    p.add_argument("--backends", default="eager,aotgrad,inductor")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps (compiles) first")
    p.add_argument("--steps", type=int, default=10, help="timed steps after the warm-up")
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the JSON")
    return p.parse_args()


def setup(args) -> torch.device:
    if args.cpu:
        dist.init_process_group("gloo", timeout=timedelta(minutes=10))
        return torch.device("cpu")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                            timeout=timedelta(minutes=10))
    return torch.device("cuda", local_rank)


def gpt2(args, device):
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config()  # GPT-2 small: 12 layers x 768
    if args.tiny:
        config = GPT2Config(vocab_size=512, n_positions=args.seq, n_embd=64, n_layer=2,
                            n_head=4)
    config.use_cache = False
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).to(device), config


def batches(args, config, device) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1 + dist.get_rank())
    shape = (args.batch, args.seq)
    return [torch.randint(0, config.vocab_size, shape, generator=g).to(device)
            for _ in range(args.warmup + args.steps)]


def wrap(wrapper: str, model, device):
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=None if device.type == "cpu" else [device.index])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.transformer.h:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(args, wrapper: str, backend: str, device) -> dict:
    """Warm-up and timed steps of one run: times, losses and this rank's peak memory."""
    model, config = gpt2(args, device)
    data = batches(args, config, device)
    model = wrap(wrapper, model, device)
    step_fn = model if backend == "eager" else torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    autocast = wrapper == "ddp" and device.type == "cuda"  # FSDP2 casts by its policy
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for ids in data:
        sync(device)
        start = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16) if autocast else nullcontext():
            loss = step_fn(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return {"times": times, "losses": losses, "peak_mb": peak}


def run(args, wrapper: str, backend: str, device) -> dict:
    """One run on every rank, gathered: None on a rank where it failed, with the error."""
    try:
        mine = train(args, wrapper, backend, device)
    except Exception as exc:
        mine = {"error": "".join(traceback.format_exception_only(exc)).strip()[-2000:]}
        traceback.print_exc()
    finally:
        torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ranks = [None] * dist.get_world_size()
    dist.all_gather_object(ranks, mine)
    errors = [r["error"] for r in ranks if "error" in r]
    if errors:
        return {"wrapper": wrapper, "backend": backend, "error": errors[0]}
    steps = range(args.warmup, len(ranks[0]["times"]))
    timed = [max(r["times"][i] for r in ranks) for i in steps]  # the slower rank's
    return {"wrapper": wrapper, "backend": backend,
            "step_ms_median": 1e3 * statistics.median(timed),
            "first_step_s": max(r["times"][0] for r in ranks),
            "peak_mb_per_rank": [r["peak_mb"] for r in ranks],
            "losses_per_rank": [r["losses"] for r in ranks]}


def add_loss_diffs(rows: list[dict]) -> None:
    """Each run's largest loss difference from the eager run of its wrapper, any rank, step."""
    eager = {r["wrapper"]: r for r in rows if r["backend"] == "eager" and "error" not in r}
    for r in rows:
        ref = eager.get(r["wrapper"])
        if ref is None or "error" in r:
            continue
        pairs = zip(sum(ref["losses_per_rank"], []), sum(r["losses_per_rank"], []))
        r["max_loss_diff_vs_eager"] = max(abs(a - b) for a, b in pairs)


def environment(args, device) -> dict:
    env = {"torch": torch.__version__, "world_size": dist.get_world_size(),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "model": "tiny GPT-2 (2x64)" if args.tiny else "GPT-2 small (12x768)",
           "batch_per_rank": args.batch, "seq": args.seq, "warmup": args.warmup,
           "steps": args.steps, "date": time.strftime("%Y-%m-%d")}
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError:
        pass
    return env


def markdown(rows: list[dict]) -> str:
    lines = ["| wrapper | backend | step (median) | first step | peak memory per GPU | "
             "max loss diff vs eager |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['wrapper']} | {r['backend']} | error: "
                         f"{r['error'].splitlines()[-1][:120]} | | | |")
            continue
        peaks = r["peak_mb_per_rank"]
        peak = "n/a (CPU)" if peaks[0] is None else " / ".join(f"{p:.0f} MB" for p in peaks)
        diff = r.get("max_loss_diff_vs_eager")
        lines.append(f"| {r['wrapper']} | {r['backend']} | {r['step_ms_median']:.1f} ms | "
                     f"{r['first_step_s']:.1f} s | {peak} | "
                     f"{'-' if diff is None else f'{diff:.2e}'} |")
    return "\n".join(lines)


def main():
    args = parse_args()
    device = setup(args)
    rows = []
    for wrapper in args.wrappers.split(","):
        for backend in args.backends.split(","):
            rows.append(run(args, wrapper, backend, device))
            if dist.get_rank() == 0:  # progress, in case the run is cut short
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "losses_per_rank"}),
                      flush=True)
    add_loss_diffs(rows)
    if dist.get_rank() == 0:
        result = {"environment": environment(args, device), "runs": rows}
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_data_parallel.json"), "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result["environment"]))
        print(markdown(rows), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
