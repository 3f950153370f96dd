"""Higher-order ops on CUDA, against eager: flex attention forward and backward (score_mod,
block_mask), user Triton kernels inside a custom autograd.Function, cond / scan / a compiled
region with Inductor. One line per case and front door: the largest output and gradient
difference, or the error. cond, scan, the region and flex attention run before the user
Triton kernel, and the JSON is rewritten after each line. Results go to `--out` as JSON (the CPU tests: tests/test_hops.py).

    python tools/gpu_hops.py [--out bench/results/gpu_hops.json]
"""

from __future__ import annotations

import argparse
import json
import traceback

import torch

import aotgrad
from aotgrad.compat import aot_function, nop

DOORS = {
    "torch.compile(aotgrad)": lambda fn: torch.compile(fn, backend="aotgrad", fullgraph=True),
    "torch.compile(aotgrad eager)": lambda fn: torch.compile(
        fn, backend=aotgrad.backend(backend="eager"), fullgraph=True),
    "aotgrad.compile(inductor)": lambda fn: aotgrad.compile(fn),
    "compat.aot_function(nop)": lambda fn: aot_function(fn, nop),
}


def flex_case():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256, device="cuda")

    def attend(q, k, v):
        return flex_attention(q, k, v, score_mod=lambda s, b, h, q, kv: s + (q - kv) * 0.01,
                              block_mask=mask)
    inputs = [torch.randn(2, 4, 256, 64, device="cuda", requires_grad=True) for _ in range(3)]
    return attend, inputs


def triton_case(wrapped: bool = False):
    """A user Triton kernel in a custom Function's forward and backward (y = 2x), launched
    directly or through `torch.library.wrap_triton` (which make_fx traces, outside Dynamo
    too, into the kernel wrapper HOP)."""
    import triton
    import triton.language as tl

    @triton.jit
    def scale_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)

    kernel = torch.library.wrap_triton(scale_kernel) if wrapped else scale_kernel

    def scale(x, factor):
        out = torch.empty_like(x)
        n = x.numel()
        kernel[(triton.cdiv(n, 256),)](x, out, n, factor, BLOCK=256)
        return out

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return scale(x, 2.0)

        @staticmethod
        def backward(ctx, grad):
            return scale(grad, 2.0)

    def fn(x):
        return Scale.apply(x.sin()).cos()
    return fn, [torch.randn(1000, device="cuda", requires_grad=True)]


def cond_case():
    w = torch.randn(64, 64, device="cuda", requires_grad=True)

    def fn(x, w):
        return torch.cond(x.sum() > 0, lambda x: (x @ w).sin(), lambda x: (x @ w).cos(), (x,))
    return fn, [torch.rand(8, 64, device="cuda", requires_grad=True), w]


def scan_case():
    from torch._higher_order_ops import scan

    def fn(init, xs):
        def combine(carry, x):
            carry = carry * x.sin() + x
            return carry.clone(), carry.cos()
        return scan(combine, init, xs)
    return fn, [torch.randn(64, device="cuda", requires_grad=True),
                torch.randn(16, 64, device="cuda", requires_grad=True)]


def region_case():
    block = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64)).cuda()

    @torch.compiler.nested_compile_region
    def region(x):
        return x + block(x).relu()

    def fn(x):
        for _ in range(4):
            x = region(x)
        return x
    return fn, [torch.randn(8, 64, device="cuda", requires_grad=True)]


# The user Triton case last: a crash there broke the CUDA context for every case after it.
CASES = {"cond": cond_case, "scan": scan_case, "compiled_region": region_case,
         "flex_attention": flex_case, "user_triton_kernel": triton_case,
         "user_triton_wrap_triton": lambda: triton_case(wrapped=True)}


def run(fn, inputs):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in inputs]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(o.float().sum() for o in outs if o.requires_grad)
    grads = torch.autograd.grad(loss, [a for a in args if a.requires_grad], allow_unused=True)
    return [o.detach() for o in outs], grads


def difference(expected, actual) -> float:
    return max(((a.float() - e.float()).abs().max().item() for e, a in zip(expected, actual)
                if e is not None and a is not None), default=0.0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/gpu_hops.json")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--try-triton", action="store_true",
                        help="lift the refusal of Triton kernel wrappers (what would happen)")
    args = parser.parse_args(argv)
    if args.try_triton:
        from aotgrad.semantics import hops
        hops.REFUSED_HOPS.clear()
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    rows = []
    for name in args.cases.split(","):
        make = CASES[name]
        for row in case_rows(name, make):
            rows.append(row)
            print(json.dumps(row), flush=True)
            with open(args.out, "w") as f:  # after each row: a later crash keeps the earlier
                json.dump({**meta, "rows": rows}, f, indent=1)


def case_rows(name: str, make):
    """One row per front door, each with its differences or its error; one row in all when
    the case cannot even run eagerly."""
    try:
        fn, inputs = make()
        ref_outs, ref_grads = run(fn, inputs)
    except Exception as e:  # noqa: BLE001 - reported per case, not fatal
        yield {"case": name, "door": "eager", **failure(e)}
        return
    for door, compile_fn in DOORS.items():
        torch._dynamo.reset()
        row = {"case": name, "door": door}
        try:
            outs, grads = run(compile_fn(fn), inputs)
            row.update(output_diff=difference(ref_outs, outs),
                       grad_diff=difference(ref_grads, grads))
        except Exception as e:  # noqa: BLE001 - reported per case, not fatal
            row.update(failure(e))
        yield row


def failure(e: Exception) -> dict:
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
            "where": traceback.format_exc(limit=-3).splitlines()[-4:]}


if __name__ == "__main__":
    main()
