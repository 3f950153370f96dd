"""A CUDA check of the three front doors: losses and gradients against eager, bf16 autocast."""

import torch
from torch import nn

import aotgrad
from aotgrad.compat import aot_module, nop


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 64),
                         nn.BatchNorm1d(64)).cuda()


def step(m, x, autocast: bool):
    with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
        loss = m(x).float().pow(2).mean()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in m.parameters()]


def main():
    x = torch.randn(32, 64, device="cuda")
    doors = {
        "aotgrad.compile(inductor)": lambda m: aotgrad.compile(m),
        "aotgrad.compile(eager)": lambda m: aotgrad.compile(m, backend="eager"),
        "torch.compile(aotgrad)": lambda m: torch.compile(m, backend="aotgrad"),
        "compat.aot_module(nop)": lambda m: aot_module(m, nop),
    }
    for autocast in (False, True):
        ref_loss, ref_grads = step(model(), x, autocast)
        for name, make in doors.items():
            m = model()
            loss, grads = step(make(m), x, autocast)
            err = max((a - b).abs().max().item() for a, b in zip(grads, ref_grads))
            tol = 5e-2 if autocast else 1e-4
            status = "ok" if abs(loss - ref_loss) < tol and err < tol else "MISMATCH"
            print(f"{status:8} autocast={autocast!s:5} {name:28} loss diff "
                  f"{abs(loss - ref_loss):.1e} grad diff {err:.1e}")


if __name__ == "__main__":
    main()
