"""Ops that write their arguments without their schemas saying so (batch norm's kernels).

CUDA eager runs `cudnn_batch_norm`, which updates the running statistics unmarked; a trace
that trusts the schema drops the update and nothing warns (the loss and gradients are right).
On CPU the mechanism is tested with an op of the same shape: `lying_ema` updates a running
average in place and its schema says it does not; like cuDNN's, its decomposition under the
python dispatcher (which the trace runs, and the analysis does not) is its declared form
(`_ema`, in-place ATen ops that mark the write). `tests/test_batch_norm_devices.py` runs
cuDNN itself where there is a GPU, and `tools/gpu_batch_norm.py` five timm models.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._C import DispatchKey

import aotgrad
from aotgrad import compat, tables

MOMENTUM = 0.25
_lib = torch.library.Library("aotgrad_test", "FRAGMENT")
_lib.define("lying_ema(Tensor x, Tensor running) -> Tensor")  # writes `running` unmarked


def _ema(x, running):
    running.mul_(1 - MOMENTUM).add_(x.detach().mean(0), alpha=MOMENTUM)
    return x * 2


def _fake(x, running):
    return torch.empty_like(x)


_lib.impl("lying_ema", _ema, "CPU")
_lib.impl("lying_ema", _fake, "Meta")
torch.library.register_autograd("aotgrad_test::lying_ema", lambda ctx, grad: (grad * 2, None))

ops = torch.ops.aotgrad_test
# Like cudnn_batch_norm: only the python dispatcher's decomposition shows the write.
ops.lying_ema.default.py_impl(DispatchKey.Autograd)(_ema)


def fn(x, running):
    return ops.lying_ema(x.sin(), running).cos().sum()


def inputs():
    torch.manual_seed(0)
    return torch.randn(8, 4, requires_grad=True), torch.zeros(4)


DOORS = {
    "compile-eager": lambda fn: aotgrad.compile(fn, backend="eager"),
    "compile-inductor": lambda fn: aotgrad.compile(fn),
    "torch.compile": lambda fn: torch.compile(fn, backend="aotgrad", fullgraph=True),
    "aot_function": lambda fn: compat.aot_function(fn, compat.nop),
}


@pytest.fixture
def lying_ema_declared(monkeypatch):
    monkeypatch.setitem(tables.UNMARKED_MUTATIONS, ops.lying_ema.default, _ema)


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_unmarked_write_is_applied(lying_ema_declared, door, grad):
    compiled = DOORS[door](fn)
    x, expected = inputs()
    with torch.set_grad_enabled(grad):
        eager_out = fn(x, expected)
    x, running = inputs()
    for call in range(2):  # the second call runs the cached graph
        with torch.set_grad_enabled(grad):
            out = compiled(x, running)
        if call == 0:
            torch.testing.assert_close(out, eager_out)
            torch.testing.assert_close(running, expected)
    assert not torch.equal(running, expected)  # the second call updated it again
    if grad:
        (g,) = torch.autograd.grad(out, x)
        torch.testing.assert_close(g, torch.autograd.grad(fn(x, torch.zeros(4)), x)[0])


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_write_seen_only_by_the_trace_raises(grad):
    """Outside the table, only the trace's decompositions reach the declared form: a clear
    error, not a graph that drops the write."""
    compiled = aotgrad.compile(fn, backend="eager")
    x, running = inputs()
    with pytest.raises(NotImplementedError, match="aotgrad: an op writes into input 1"):
        with torch.set_grad_enabled(grad):
            compiled(x, running)


@pytest.mark.parametrize("op", ["cudnn_batch_norm", "native_batch_norm", "miopen_batch_norm"])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_declared_forms_match_eager(op, training):
    """Each declared form computes eager's batch norm and writes the running statistics
    through an op whose schema marks it (on CPU tensors: the forms are device independent)."""
    x, weight, bias = torch.randn(8, 3, 5, 5), torch.rand(3), torch.randn(3)
    mean, var = torch.zeros(3), torch.ones(3)
    expected_mean, expected_var = mean.clone(), var.clone()
    expected = F.batch_norm(x, expected_mean, expected_var, weight, bias, training, 0.1, 1e-5)
    declared = tables.UNMARKED_MUTATIONS[getattr(torch.ops.aten, op).default]
    outs = declared(x, weight, bias, mean, var, training, 0.1, 1e-5)
    torch.testing.assert_close(outs[0], expected)
    torch.testing.assert_close((mean, var), (expected_mean, expected_var))
    assert len(outs) == len(getattr(torch.ops.aten, op).default._schema.returns)
    writer = torch.ops.aten._native_batch_norm_legit.default
    assert writer._schema.arguments[3].alias_info.is_write  # running_mean: marked


# ---- kernels that resize their arguments where their fake kernels do not -------------------

def observe(x, observer_on, running_min, running_max, scale, zero_point):
    """A per-channel QAT weight observer (`FusedMovingAvgObsFakeQuantize.forward`)."""
    on = torch.ones(1, dtype=torch.long)
    return torch.fused_moving_avg_obs_fake_quant(
        x, observer_on, on, running_min, running_max, scale, zero_point, 0.01, -128, 127, 0,
        True, True).square().sum()


def observer_inputs(observer_on=1):
    torch.manual_seed(0)
    return (torch.randn(16, 8, requires_grad=True), torch.tensor([observer_on]), torch.empty(0),
            torch.empty(0), torch.ones(1), torch.zeros(1, dtype=torch.int))


@pytest.mark.parametrize("door", ["compile-eager", "torch.compile", "aot_function"])
@pytest.mark.parametrize("observer_on", [1, 0])
def test_observer_resizing_empty_statistics_matches_eager(door, observer_on):
    """The kernel sizes empty running statistics and the scale and zero point to the channel
    count; the fake kernel does not. The trace kept shape (0,) and the compiled step failed
    to write its (16,)-shaped values back ("output with shape [1] doesn't match the broadcast
    shape [16]"): prepare_qat's models failed at their first compiled step."""
    expected = observer_inputs(observer_on)
    eager_loss = observe(*expected)
    eager_loss.backward()
    got = observer_inputs(observer_on)
    loss = DOORS[door](observe)(*got)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    torch.testing.assert_close(got[0].grad, expected[0].grad)
    for i in (2, 3) if observer_on else (2, 3, 5):  # the scale's new elements are unset memory
        torch.testing.assert_close(got[i], expected[i])
    assert [t.shape for t in got[2:]] == [(16,)] * 4


@pytest.mark.parametrize("door", ["compile-eager", "aot_module"])
def test_qat_training_matches_eager(door):
    """prepare_qat's per-channel weight observers start with empty statistics."""
    import torch.ao.quantization as quant

    def trained(compile_):
        torch.manual_seed(0)
        model = torch.nn.Sequential(quant.QuantStub(), torch.nn.Linear(8, 16),
                                    torch.nn.ReLU(), torch.nn.Linear(16, 4), quant.DeQuantStub())
        model.qconfig = quant.get_default_qat_qconfig("x86")
        quant.prepare_qat(model, inplace=True)
        step, opt = compile_(model), torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            F.mse_loss(step(torch.randn(6, 8)), torch.randn(6, 4)).backward()
            opt.step()
            opt.zero_grad()
        return model.state_dict()

    compile_ = {"compile-eager": lambda m: aotgrad.compile(m, backend="eager"),
                "aot_module": lambda m: compat.aot_module(m, compat.nop)}[door]
    torch.testing.assert_close(trained(compile_), trained(lambda m: m))
