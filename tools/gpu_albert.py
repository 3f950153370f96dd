"""Issue 20: ALBERT, bf16 autocast, backend="aotgrad" vs "inductor" (and eager), on CUDA.

    python tools/gpu_albert.py [--out DIR] [--layers 2] [--batch 4] [--seq 512]
                               [--modes aotgrad,inductor] [--no-dump]
    python tools/gpu_albert.py --device cpu --small --out /tmp/albert   # a CPU check of the script

The failure: Triton could not compile `triton_per_fused__to_copy_add_mul_native_layer_norm_
pow_tanh_view_*` (`PassManager::run failed` in make_ttgir) from aotgrad's forward graph. It is
the masked-LM head's gelu_new + layer norm. aotgrad's partition saved gelu_new's and the layer
norm's float32 intermediates there (five more tensors written by that kernel); it now saves
the bf16 layer-norm output as torch does, and that kernel's source equals torch's (on CPU,
Inductor's Triton code for both).

Per mode: the model (AlbertForMaskedLM, AlbertConfig() widths, `--layers` layers, random init,
seed 0) from the same initial weights, 2 training steps (bf16 autocast forward with labels,
backward, SGD), each step's loss compared with eager's. One line per mode: `PASS mode ...` or
`FAIL mode ...`; a failure's full traceback goes to DIR/<mode>_traceback.txt. With dumping on
(the default), DIR/<mode>/ gets each forward and backward graph Inductor received
(graph_<n>_<fw|bw>.txt) and the Triton source of every kernel fusing a layer norm with tanh.
"""

from __future__ import annotations

import argparse
import copy
import os
import pathlib
import sys
import tempfile
import time
import traceback

os.environ.setdefault("AOTGRAD_CACHE", "0")  # compile, not a cache hit: the dumps need it
sys.modules.setdefault("torchvision", None)  # transformers imports it if present; unused
import torch  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import aotgrad  # noqa: E402,F401  (registers backend="aotgrad")
from kernel_dump import Dump  # noqa: E402

KERNEL_MARKS = ("native_layer_norm", "tanh")  # the failing kernel fuses both
LOSS_RTOL = 2e-2  # bf16 autocast: compiled and eager round differently


def build(args):
    from transformers import AlbertConfig, AlbertForMaskedLM
    if args.small:
        config = AlbertConfig(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                              num_hidden_layers=args.layers)
    else:  # ALBERT's default config (xxlarge widths: 4096 hidden, embeddings 128)
        config = AlbertConfig(num_hidden_layers=args.layers)
    torch.manual_seed(0)
    model = AlbertForMaskedLM(config).to(args.device).train()
    ids = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)
    return model, ids


def train(model, compiled, ids, device, steps=2) -> list[float]:
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        with torch.autocast(device, torch.bfloat16):
            loss = compiled(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def run_mode(mode, args, initial, eager_losses) -> bool:
    model, ids = copy.deepcopy(initial[0]), initial[1]
    torch._dynamo.reset()
    folder = None if args.no_dump else args.out / mode
    start = time.time()
    try:
        with Dump(folder, KERNEL_MARKS):
            losses = train(model, torch.compile(model, backend=mode), ids, args.device)
    except Exception:
        path = args.out / f"{mode}_traceback.txt"
        path.write_text(traceback.format_exc())
        last = traceback.format_exc().strip().splitlines()[-1]
        print(f"FAIL {mode}: raised after {time.time() - start:.0f}s: {last[:300]} "
              f"(traceback: {path})", flush=True)
        return False
    ok = all(abs(a - b) <= LOSS_RTOL * abs(b) for a, b in zip(losses, eager_losses))
    print(f"{'PASS' if ok else 'FAIL'} {mode}: losses {fmt(losses)} vs eager {fmt(eager_losses)}"
          f" (rtol {LOSS_RTOL}), {time.time() - start:.0f}s", flush=True)
    return ok


def fmt(losses):
    return "[" + ", ".join(f"{x:.4f}" for x in losses) + "]"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=pathlib.Path,
                   default=pathlib.Path(os.environ.get("OUT") or tempfile.mkdtemp()) / "albert")
    p.add_argument("--device", default="cuda")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--modes", default="aotgrad,inductor")
    p.add_argument("--small", action="store_true", help="small widths (a CPU check)")
    p.add_argument("--no-dump", action="store_true")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_dump:  # Inductor's caches would skip the code generation recorded
        import torch._inductor.config
        torch._inductor.config.fx_graph_cache = False
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="albert-inductor-")
    print(f"torch {torch.__version__}, device {args.device}, out {args.out}", flush=True)
    initial = build(args)
    eager = copy.deepcopy(initial[0])
    eager_losses = train(eager, eager, initial[1], args.device)
    results = [run_mode(mode, args, initial, eager_losses) for mode in args.modes.split(",")]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
