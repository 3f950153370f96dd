"""Llama-like (bench/run.py's `llama`), bf16 autocast training steps through
`torch.compile(backend="aotgrad")` in variants, each in a process of its own, side by side:
which of aotgrad's choices a CUDA fault follows. Prints one line per variant.

    python tools/gpu_llama.py --variants plain,no_donate,no_flat --out DIR
"""

import argparse
import json
import os
import subprocess
import sys
import time

VARIANTS = {
    "plain": "nothing changed",
    "no_donate": "the backward may not write into saved values (partition.donate off)",
    "no_flat": "saved values kept whole (remat.saved_as_read off)",
    "nocudnn": "cuDNN attention off (torch.backends.cuda.enable_cudnn_sdp(False))",
    "inductor": "torch's own backend=\"inductor\", for comparison",
    "eager_backend": "aotgrad's graphs run op by op (no Inductor)",
}
# Each variant also runs on the small config as small_<variant> ("small" alone: nothing changed).


def patch(variant: str) -> None:
    import torch
    import aotgrad.pipeline
    if variant == "nocudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    import aotgrad.partition.remat as remat
    if variant == "no_donate":
        aotgrad.pipeline.mark_donated = lambda p: None
    if variant == "no_flat":
        remat.saved_as_read = lambda saved, *a: list(saved)


ATTENTION = []  # (graph, op, argument strides) of each attention op Inductor is handed


def record_attention(graph) -> None:
    for n in graph.nodes:
        if "attention" in str(n.target):
            strides = [tuple(a.meta["val"].stride()) if hasattr(a, "meta") and hasattr(
                a.meta.get("val"), "stride") else None for a in n.args[:4]]
            ATTENTION.append((len(graph.nodes), str(n.target), strides))


def child(variant: str) -> dict:
    import torch
    import copy
    from bench.run import _build_llama
    from torch._inductor import config
    small = variant.startswith("small")
    variant = variant.removeprefix("small").lstrip("_") or "plain"
    patch(variant)
    config.post_grad_custom_post_pass = record_attention
    torch.manual_seed(0)
    model, (ids,) = _build_llama(small)
    model, ids = model.cuda(), ids.cuda()
    reference = copy.deepcopy(model)
    with torch.autocast("cuda", torch.bfloat16):
        want = reference(ids)
    want.backward()
    if variant == "inductor":
        compiled = torch.compile(model)
    elif variant == "eager_backend":
        import aotgrad.dynamo
        compiled = torch.compile(model, backend=aotgrad.dynamo.make_backend(backend="eager"))
    else:
        compiled = torch.compile(model, backend="aotgrad")
    losses = []
    for _ in range(3):
        for p in model.parameters():
            p.grad = None
        with torch.autocast("cuda", torch.bfloat16):
            loss = compiled(ids)
        loss.backward()
        torch.cuda.synchronize()
        losses.append(loss.item())
    rel = sorted((((a.grad - b.grad).abs().max() / (b.grad.abs().max() + 1e-9)).item(), name)
                 for (name, a), b in zip(model.named_parameters(), reference.parameters())
                 if b.grad is not None)
    for graph_size, op, strides in ATTENTION[:2] + ATTENTION[-2:]:
        print("ATTENTION", graph_size, op, strides)
    return {"loss": losses, "eager_loss": want.item(), "worst_rel_grad": rel[-3:],
            "attention_ops": sorted({op for _, op, _ in ATTENTION})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="plain,no_donate,no_flat")
    ap.add_argument("--child")
    ap.add_argument("--out", default="/tmp/gpu_llama")
    ap.add_argument("--timeout", type=float, default=240)
    a = ap.parse_args()
    if a.child:
        try:
            print("RESULT " + json.dumps({"status": "ok", **child(a.child)}))
        except BaseException as e:
            import traceback
            traceback.print_exc()
            print("RESULT " + json.dumps({"status": "error", "error": repr(e)[:300]}))
        return
    os.makedirs(a.out, exist_ok=True)
    procs = {}
    for v in a.variants.split(","):
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", TORCHINDUCTOR_CACHE_DIR=f"{a.out}/inductor-{v}",
                   AOTGRAD_CACHE="0")
        log = open(f"{a.out}/{v}.log", "w")
        procs[v] = subprocess.Popen([sys.executable, __file__, "--child", v], env=env,
                                    stdout=log, stderr=subprocess.STDOUT), log
    t0 = time.time()
    for v, (p, log) in procs.items():
        try:
            p.wait(timeout=max(1, a.timeout - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()
        lines = [l for l in open(f"{a.out}/{v}.log") if l.startswith("RESULT ")]
        print(f"{v:14s} {lines[-1][7:].strip() if lines else 'no result (timeout)'}")


if __name__ == "__main__":
    main()
