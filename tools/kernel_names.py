"""Whether the graphs aotgrad hands Inductor carry each node's ATen op (`original_aten`, which
Inductor names its kernels after), per door; on the GPU machine's torch the profiles showed
anonymous kernels (`triton_per_fused_18`)."""
import os
import sys

os.environ.setdefault("AOTGRAD_CACHE", "0")  # a hit would skip Inductor
os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"

import torch
import torch._inductor.compile_fx as compile_fx

import aotgrad
import aotgrad.backends.compilers  # noqa: F401  (imports compile_fx_inner lazily, at each call)

graphs = []
_inner = compile_fx.compile_fx_inner


def _spy(gm, *args, **kwargs):
    graphs.append(gm)
    return _inner(gm, *args, **kwargs)


compile_fx.compile_fx_inner = _spy


def f(x, w):
    return torch.nn.functional.gelu(x @ w).sum(-1).softmax(-1)


device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
for door, compiled in [("dynamo", torch.compile(f, backend="aotgrad")),
                       ("native", aotgrad.compile(f, backend="inductor"))]:
    graphs.clear()
    x = torch.randn(8, 16, device=device, requires_grad=True)
    w = torch.randn(16, 16, device=device, requires_grad=True)
    compiled(x, w).sum().backward()
    for gm in graphs:
        ops = [n for n in gm.graph.nodes if n.op == "call_function"]
        named = sum(n.meta.get("original_aten") is not None for n in ops)
        print(f"{door}: {named}/{len(ops)} nodes carry original_aten; meta keys of the first: "
              f"{sorted(ops[0].meta) if ops else None}")
