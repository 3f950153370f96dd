"""Session 34's GPU-machine probe (torch 2.11): MultiheadAttention's fast path through Dynamo on
CPU tensors (output strides per backend, and which branch Dynamo's graph took); eager
torch.cond with a branch that writes its operand."""
import torch
import torch.nn as nn

import aotgrad

torch.manual_seed(0)
m = nn.MultiheadAttention(8, 2, batch_first=True).eval()
x = torch.randn(2, 5, 8)
pad = torch.zeros(2, 5, dtype=torch.bool)
pad[1, -2:] = True


def show(gm, inputs):
    ops = sorted({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
    print("   dynamo graph ops:", [o for o in ops if "attention" in o or "transpose" in o
                                    or "linear" in o or "native" in o])
    return gm.forward


with torch.no_grad():
    print("eager:", m(x, x, x, key_padding_mask=pad)[0].stride())
    for name, backend in [("show", show), ("eager", "eager"), ("aot_eager", "aot_eager"),
                          ("aotgrad", aotgrad.backend(backend="eager"))]:
        torch._dynamo.reset()
        out = torch.compile(m, backend=backend)(x, x, x, key_padding_mask=pad)[0]
        print(f"{name}:", out.stride())
    print("aotgrad.compile:", aotgrad.compile(m, backend="eager")(x, x, x, key_padding_mask=pad)[0].stride())

try:
    with torch.no_grad():
        y = torch.randn(3, 4)
        r = torch.cond(y.sum() > 0, lambda y: y.sin_(), lambda y: y + 1, (y,))
    print("cond: returned its operand:", r is y)
except Exception as e:
    print("cond raised:", type(e).__name__, str(e).splitlines()[0])
