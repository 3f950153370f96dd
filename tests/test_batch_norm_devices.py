"""Batch norm's side effects through every front door, on every device this machine has.

CUDA eager normalizes float inputs with cuDNN (`cudnn_batch_norm`), CPU with
`native_batch_norm`: both write the running statistics without their schemas saying so
(tables.UNMARKED_MUTATIONS). Loss and gradients come out right whether or not the update
is applied, so the buffers are compared after every step.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import aotgrad
from aotgrad import compat

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
DOORS = {
    "compile-eager": lambda m: aotgrad.compile(m, backend="eager"),
    "compile-inductor": lambda m: aotgrad.compile(m),
    "torch.compile": lambda m: torch.compile(m, backend="aotgrad"),
    "backend()": lambda m: torch.compile(m, backend=aotgrad.backend(backend="eager")),
    "aot_module": lambda m: compat.aot_module(m, compat.nop),
}


def net(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 16), nn.BatchNorm1d(16, momentum=0.3),
    ).to(device)


def step(model: nn.Module, x: torch.Tensor, autocast: bool) -> torch.Tensor:
    ctx = torch.autocast(x.device.type, torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        loss = model(x).float().square().mean()
    loss.backward()
    return loss.detach()


def compare_state(eager: nn.Module, compiled: nn.Module, tol: float) -> None:
    for (name, e), (_, c) in zip(eager.state_dict().items(), compiled.state_dict().items()):
        torch.testing.assert_close(c, e, atol=tol, rtol=tol, msg=f"buffer {name}")
    for (name, e), (_, c) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(c.grad, e.grad, atol=tol, rtol=tol, msg=f"{name}.grad")


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cudnn", [True, False], ids=["cudnn", "no-cudnn"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_running_statistics_match_eager(door, device, cudnn, autocast):
    if device == "cuda" and not cudnn and door in ("compile-inductor", "torch.compile"):
        pytest.xfail("CUDA with cuDNN off, Inductor: the compiled forward's convolution comes "
                     "out channels-last where its stride check expects contiguous (H100, torch "
                     "2.11, 2026-11-25; torch.compile's own Inductor passes): not yet found")
    eager, model = net(device), net(device)
    compiled = DOORS[door](model)
    tol = 3e-2 if autocast else 1e-4
    with torch.backends.cudnn.flags(enabled=cudnn):
        for k in range(2):
            x = torch.randn(4, 3, 8, 8, device=device) + k
            torch.testing.assert_close(step(compiled, x, autocast), step(eager, x, autocast),
                                       atol=tol, rtol=tol)
            compare_state(eager, model, tol)
        eager.eval(), model.eval()
        x = torch.randn(4, 3, 8, 8, device=device)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), eager(x), atol=tol, rtol=tol)
    compare_state(eager, model, tol)
    assert model[1].num_batches_tracked.item() == 2
    assert model[1].running_mean.abs().sum() > 0  # the statistics moved off their start


@pytest.mark.parametrize("door", ["compile-eager", "backend()", "aot_module"])
@pytest.mark.parametrize("device", DEVICES)
def test_cumulative_average_statistics_match_eager(door, device):
    """momentum=None: a cumulative average whose factor BatchNorm computes as
    `1.0 / float(num_batches_tracked)`, which the trace refused as data-dependent. SWA's
    `update_bn` sets it, then runs the (copied, compiled) model under no_grad."""
    eager, model = net(device), net(device)
    for bn in (eager[1], model[1], eager[5], model[5]):
        bn.momentum = None
    compiled = DOORS[door](model)
    for k in range(3):
        x = torch.randn(4, 3, 8, 8, device=device) + k
        torch.testing.assert_close(step(compiled, x, False), step(eager, x, False))
        compare_state(eager, model, 1e-6)
    assert model[5].num_batches_tracked.item() == 3
    swa_eager, swa = (torch.optim.swa_utils.AveragedModel(m) for m in (eager, compiled))
    loader = [torch.randn(4, 3, 8, 8, device=device) for _ in range(3)]
    torch.optim.swa_utils.update_bn(loader, swa_eager)
    torch.optim.swa_utils.update_bn(loader, swa)
    for e, c in zip(swa_eager.buffers(), swa.buffers()):
        torch.testing.assert_close(c, e, atol=1e-6, rtol=1e-6)
