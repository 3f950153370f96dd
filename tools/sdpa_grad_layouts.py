"""SDPA's gradients per kernel, mask and layout of the output's gradient, against float64.

    python tools/sdpa_grad_layouts.py            # the table (one process)
    python tools/sdpa_grad_layouts.py --order contig,like-out   # cuDNN alone, in this order

Session 32 (torch 2.11, cuDNN 9.19, H200): cuDNN's attention backward returned wrong
gradients (errors of about 2 on values of about 1) for whichever gradient layout came second
for a shape, contiguous after laid-out-like-the-output or the reverse; the same layout twice
stayed right, and so did the memory-efficient and math kernels. Its cached kernel is keyed
without the gradient's strides (backends/passes.py lays ours out like the output).
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def qkv(b=2, h=4, t=64, d=32):
    # [b, t, h, d] transposed to [b, h, t, d], as a model's projections give them
    return [torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            .requires_grad_() for _ in range(3)]


def error(q, k, v, mask, backend, layout, base) -> float:
    """The largest error of the three input gradients against float64's math path."""
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    go = base.contiguous() if layout == "contig" else torch.empty_like(out).copy_(base)
    got = torch.autograd.grad(out, (q, k, v), go)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.MATH]):
        ref = F.scaled_dot_product_attention(*exact, attn_mask=None if mask is None else (
            mask if mask.dtype == torch.bool else mask.double()))
    want = torch.autograd.grad(ref, exact, go.double())
    return max((g.double() - w).abs().max().item() for g, w in zip(got, want))


def table():
    torch.manual_seed(0)
    q, k, v = qkv()
    b, h, t = q.shape[0], q.shape[1], q.shape[2]
    masks = {"none": None,
             "bool [b,1,t,t]": torch.ones(b, 1, t, t, dtype=torch.bool, device="cuda"),
             "bool [b,h,t,t]": torch.ones(b, h, t, t, dtype=torch.bool, device="cuda"),
             "bf16 [b,1,t,t]": torch.zeros(b, 1, t, t, dtype=torch.bfloat16, device="cuda")}
    for name, mask in masks.items():
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                        SDPBackend.MATH):
            base = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
            errors = [f"{layout} {error(q, k, v, mask, backend, layout, base):.3f}"
                      for layout in ("contig", "like-out")]
            print(f"{name:15s} {backend.name:20s}", " | ".join(errors))


def order(layouts):
    """cuDNN alone, the layouts in this order, then reversed at another shape."""
    torch.manual_seed(0)
    for shape in (dict(t=64), dict(t=128)):
        q, k, v = qkv(**shape)
        base = torch.randn(q.shape, device="cuda").to(torch.bfloat16)
        cudnn = SDPBackend.CUDNN_ATTENTION
        print(shape, [f"{layout} {error(q, k, v, None, cudnn, layout, base):.3f}"
                      for layout in layouts])
        layouts = layouts[::-1]


if __name__ == "__main__":
    print(torch.__version__, "cuDNN", torch.backends.cudnn.version())
    if sys.argv[1:2] == ["--order"]:
        order(sys.argv[2].split(","))
    else:
        table()
