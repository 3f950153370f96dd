"""A CUDA check of the three front doors: losses, gradients and buffers against eager, bf16
autocast. Buffers too: a compiled step that drops BatchNorm's running-statistics update
still has eager's loss and gradients (cuDNN's batch norm did, before session 7)."""

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
    return loss.item(), [p.grad.clone() for p in m.parameters()], [b.clone() for b in m.buffers()]


def main():
    x = torch.randn(32, 64, device="cuda")
    doors = {
        "aotgrad.compile(inductor)": lambda m: aotgrad.compile(m),
        "aotgrad.compile(eager)": lambda m: aotgrad.compile(m, backend="eager"),
        "torch.compile(aotgrad)": lambda m: torch.compile(m, backend="aotgrad"),
        "compat.aot_module(nop)": lambda m: aot_module(m, nop),
    }
    for autocast in (False, True):
        ref_loss, ref_grads, ref_buffers = step(model(), x, autocast)
        for name, make in doors.items():
            m = model()
            loss, grads, buffers = step(make(m), x, autocast)
            err = max((a - b).abs().max().item() for a, b in zip(grads, ref_grads))
            buf_err = max((a.float() - b.float()).abs().max().item()
                          for a, b in zip(buffers, ref_buffers))
            tol = 5e-2 if autocast else 1e-4
            status = "ok" if abs(loss - ref_loss) < tol and max(err, buf_err) < tol else "MISMATCH"
            print(f"{status:8} autocast={autocast!s:5} {name:28} loss diff "
                  f"{abs(loss - ref_loss):.1e} grad diff {err:.1e} buffer diff {buf_err:.1e}")


if __name__ == "__main__":
    main()
