"""Higher-order ops on CUDA, against eager: flex attention forward and backward (score_mod,
block_mask), user Triton kernels inside a custom autograd.Function, cond / scan / a compiled
region with Inductor. One line per case and front door: the largest output and gradient
difference, or the error. cond, scan, the region and flex attention run before the user
Triton kernels, and the JSON is rewritten after each line. Results go to `--out` as JSON (the
CPU tests: tests/test_hops.py).

The user Triton cases print `PASS` or `FAIL` per door, and each failure's full traceback goes
into the JSON (`traceback`). A raw @triton.jit launch passes at aotgrad.compile and
compat.aot_function when it is refused by name (it reads data_ptr() of a traced tensor);
through Dynamo, and wrapped with `torch.library.wrap_triton` everywhere, it must match eager.

    python tools/gpu_hops.py [--out bench/results/gpu_hops.json]
    python tools/gpu_hops.py --cases user_triton_kernel,user_triton_wrap_triton
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


def triton_scale(wrapped: bool = False):
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

    def scale(x, factor, out=None):
        out = torch.empty_like(x) if out is None else out
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
    return scale, Scale


def triton_case(wrapped: bool = False):
    _, Scale = triton_scale(wrapped)

    def fn(x):
        return Scale.apply(x.sin()).cos()
    return fn, [torch.randn(1000, device="cuda", requires_grad=True)]


def triton_input_case():
    """The kernel writes into an input of the compiled function (functionalized: the
    compiled function copies the result back), and its output is differentiated too."""
    scale, Scale = triton_scale(wrapped=True)

    def fn(x, buf):
        scale(x.detach(), 3.0, out=buf)
        return Scale.apply(x).sin() + buf
    return fn, [torch.randn(1000, device="cuda", requires_grad=True),
                torch.zeros(1000, device="cuda")]


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


def closed_over_region(device: str = "cuda"):
    """A compiled region called four times, its body reading a block's parameters through
    its closure (Dynamo lifts them into the call's operands): (block, fn). The CPU tests
    (tests/test_hops.py) build the same."""
    block = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 64)).to(device)

    @torch.compiler.nested_compile_region
    def region(x):
        return x + block(x).relu()

    def fn(x):
        for _ in range(4):
            x = region(x)
        return x
    return block, fn


def region_case():
    _, fn = closed_over_region()
    return fn, [torch.randn(8, 64, device="cuda", requires_grad=True)]


# The user Triton case last: a crash there broke the CUDA context for every case after it.
CASES = {"cond": cond_case, "scan": scan_case, "compiled_region": region_case,
         "flex_attention": flex_case, "user_triton_kernel": triton_case,
         "user_triton_wrap_triton": lambda: triton_case(wrapped=True),
         "user_triton_input_mutation": triton_input_case}
TRITON_CASES = {name for name in CASES if name.startswith("user_triton")}
# The user Triton cases also run with Dynamo's symbolic sizes (the grid is computed from them).
# torch's own backend is the reference: a failure it shares is Dynamo's, not ours.
TRITON_DOORS = {**DOORS, "torch.compile(aotgrad eager, dynamic)": lambda fn: torch.compile(
    fn, backend=aotgrad.backend(backend="eager"), fullgraph=True, dynamic=True),
    "torch.compile(inductor) [reference]": lambda fn: torch.compile(
        fn, backend="inductor", fullgraph=True)}
# Doors where a raw @triton.jit launch is refused, not traced: nothing outside Dynamo makes it
# traceable, and it reads the traced tensors' data_ptr().
REFUSING_DOORS = {"aotgrad.compile(inductor)", "compat.aot_function(nop)"}
TOLERANCE = 1e-4


def run(fn, inputs):
    args = [a.detach().clone().requires_grad_(a.requires_grad) for a in inputs]
    out = fn(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    loss = sum(o.float().sum() for o in outs if o.requires_grad)
    grads = torch.autograd.grad(loss, [a for a in args if a.requires_grad], allow_unused=True)
    return [o.detach() for o in outs], grads, [a.detach() for a in args]


def difference(expected, actual) -> float:
    return max(((a.float() - e.float()).abs().max().item() for e, a in zip(expected, actual)
                if e is not None and a is not None), default=0.0)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="bench/results/gpu_hops.json")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--try-triton", action="store_true",
                        help="no effect: Triton kernel wrappers are no longer refused")
    args = parser.parse_args(argv)
    meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name()}
    rows = []
    for name in args.cases.split(","):
        make = CASES[name]
        for row in case_rows(name, make):
            rows.append(row)
            print(verdict_line(row) if name in TRITON_CASES else json.dumps(row), flush=True)
            with open(args.out, "w") as f:  # after each row: a later crash keeps the earlier
                json.dump({**meta, "rows": rows}, f, indent=1)


def case_rows(name: str, make):
    """One row per front door, each with its differences or its error; one row in all when
    the case cannot even run eagerly."""
    try:
        fn, inputs = make()
        ref_outs, ref_grads, ref_inputs = run(fn, inputs)
    except Exception as e:  # noqa: BLE001 - reported per case, not fatal
        yield {"case": name, "door": "eager", "passed": False, **failure(e)}
        return
    for door, compile_fn in (TRITON_DOORS if name in TRITON_CASES else DOORS).items():
        torch._dynamo.reset()
        row = {"case": name, "door": door}
        try:
            compiled = compile_fn(fn)
            outs, grads, after = run(compiled, inputs)
            row.update(output_diff=difference(ref_outs, outs),
                       grad_diff=difference(ref_grads, grads),
                       input_diff=difference(ref_inputs, after), hops=graph_hops(compiled))
            row["passed"] = max(row["output_diff"], row["grad_diff"],
                                row["input_diff"]) <= TOLERANCE
        except Exception as e:  # noqa: BLE001 - reported per case, not fatal
            row.update(failure(e))
            row["passed"] = name == "user_triton_kernel" and door in REFUSING_DOORS and \
                "data_ptr()" in row["error"] and row["error"].startswith("NotImplementedError")
        yield row


def graph_hops(compiled) -> dict:
    """aotgrad.compile's and aot_function's graphs: the higher-order ops each calls."""
    artifacts = getattr(compiled, "artifacts", None)
    if not artifacts:
        return {}
    from aotgrad.semantics.hops import hop_counts
    last = artifacts[-1]
    graphs = {"forward": last.forward_graph, "backward": last.backward_graph}
    return {k: hop_counts(g.graph) for k, g in graphs.items() if g is not None}


def verdict_line(row: dict) -> str:
    verdict = "PASS" if row.get("passed") else "FAIL"
    detail = row.get("error") or (f"out {row['output_diff']:.2e} grad {row['grad_diff']:.2e} "
                                  f"inputs {row['input_diff']:.2e} {row.get('hops', '')}")
    return f"{verdict} {row['case']} | {row['door']} | {detail[:300]}"


def failure(e: Exception) -> dict:
    return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
            "where": traceback.format_exc(limit=-3).splitlines()[-4:],
            "traceback": traceback.format_exc()}


if __name__ == "__main__":
    main()
