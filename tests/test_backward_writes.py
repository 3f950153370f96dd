"""Inputs written in place by the backward (a custom Function's backward zeroing a tensor
saved on ctx): eager changes the caller's tensor when that backward runs, not before. The
backward graph returns the new values after the gradients and the runtime copies them in
(aotgrad/capture/joint.py `backward_writes`, aotgrad/runtime/mutations.py `BackwardWrites`).
A backward with `create_graph=True` is refused with torch's AOTAutograd's exception type."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from functorch.compile import aot_function as torch_aot_function
from functorch.compile import nop as torch_nop

import aotgrad
from aotgrad.compat import aot_export_joint_simple, aot_function, aot_module_simplified, nop
from corpus import ZeroSavedInBackward


class ScaleSavedInBackward(torch.autograd.Function):
    """Two in-place ops in backward: eager's version counter moves twice."""

    @staticmethod
    def forward(ctx, x, buf):
        ctx.save_for_backward(buf)
        return x * buf

    @staticmethod
    def backward(ctx, grad):
        buf, = ctx.saved_tensors
        grad_x = grad * buf
        buf.mul_(2)
        buf.add_(1)
        return grad_x, None


class ZeroOutputInBackward(torch.autograd.Function):
    """Saves its own output and zeroes it in backward: eager changes the returned tensor."""

    @staticmethod
    def forward(ctx, x):
        out = x * 2
        ctx.save_for_backward(out)
        ctx.mark_non_differentiable(out)
        return x * 3, out

    @staticmethod
    def backward(ctx, grad, _):
        out, = ctx.saved_tensors
        out.zero_()
        return grad * 3


def zero_saved(x, buf):
    return ZeroSavedInBackward.apply(x, buf).sum()


def scale_saved(x, buf):
    return ScaleSavedInBackward.apply(x, buf).sum()


def mutated_in_both(x, buf):
    # The forward's write lands at the call, the backward's at the backward.
    buf.add_(1)
    return ScaleSavedInBackward.apply(x, buf).sum(), buf * 2


def grad_input_written(x, w):
    # The written input requires grad itself (a leaf: eager writes it under no_grad).
    return ZeroSavedInBackward.apply(x, w).sum() + (w * x).sum()


def _dynamo(backend: Callable) -> Callable:
    def compile_fn(fn):
        torch._dynamo.reset()
        return torch.compile(fn, backend=backend(), fullgraph=True)
    return compile_fn


DOORS = {
    "compile-eager": lambda fn: aotgrad.compile(fn, backend="eager"),
    "compile-inductor": lambda fn: aotgrad.compile(fn, backend="inductor"),
    "compile-eager-dynamic": lambda fn: aotgrad.compile(fn, backend="eager", dynamic=True),
    "aot_function": lambda fn: aot_function(fn, nop),
    "dynamo-aotgrad-eager": _dynamo(lambda: aotgrad.backend(backend="eager")),
    "dynamo-aotgrad-inductor": _dynamo(lambda: "aotgrad"),
}


def inputs(buf_requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=buf_requires_grad)


def observe(fn: Callable, args: tuple) -> dict:
    """The inputs' values and versions after the forward and after the backward, and the
    gradients."""
    out = fn(*args)
    loss = out if isinstance(out, torch.Tensor) else out[0]
    seen = {"after forward": [(a.detach().clone(), a._version) for a in args]}
    loss.backward()
    seen["after backward"] = [(a.detach().clone(), a._version) for a in args]
    seen["grads"] = [a.grad for a in args]
    return seen


def assert_same(expected: dict, actual: dict) -> None:
    for when in ("after forward", "after backward"):
        for (e, ev), (a, av) in zip(expected[when], actual[when]):
            torch.testing.assert_close(a, e, msg=lambda m: f"{when}: {m}")
            assert av == ev, f"{when}: version {av}, eager {ev}"
    for e, a in zip(expected["grads"], actual["grads"]):
        assert (e is None) == (a is None)
        if e is not None:
            torch.testing.assert_close(a, e)


FUNCTIONS = {"zero": (zero_saved, False), "two writes": (scale_saved, False),
             "forward and backward": (mutated_in_both, False),
             "requires grad": (grad_input_written, True)}


@pytest.mark.parametrize("door", DOORS)
@pytest.mark.parametrize("fn, buf_requires_grad", FUNCTIONS.values(), ids=FUNCTIONS.keys())
def test_backward_write_lands_when_the_backward_runs(door, fn, buf_requires_grad):
    compiled = DOORS[door](fn)
    for _ in range(2):  # the second call reuses the compiled graphs
        expected = observe(fn, inputs(buf_requires_grad))
        assert_same(expected, observe(compiled, inputs(buf_requires_grad)))


def test_aot_module_simplified_applies_the_backward_write():
    class Wrap(torch.nn.Module):
        def forward(self, x, buf):
            return zero_saved(x, buf)
    compiled = aot_module_simplified(Wrap(), list(inputs()), nop)
    assert_same(observe(zero_saved, inputs()), observe(compiled, inputs()))


def test_backward_graph_returns_the_new_value_after_the_gradients():
    compiled = aotgrad.compile(zero_saved, backend="eager")
    compiled(*inputs()).backward()
    bw = compiled.artifacts[0].backward_graph
    outputs = bw.graph.output_node().args[0]
    assert len(outputs) == 3  # a gradient per input, then buf's new value
    assert outputs[1] is None and outputs[2] is not None


def test_second_backward_with_retained_graph_raises_like_eager():
    """The write changes a saved tensor: a second backward reads it modified."""
    for fn in (zero_saved, aotgrad.compile(zero_saved, backend="eager")):
        loss = fn(*inputs())
        loss.backward(retain_graph=True)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_create_graph_is_refused_as_torch_refuses():
    x, buf = inputs()
    with pytest.raises(RuntimeError) as torch_error:
        torch.autograd.grad(torch_aot_function(zero_saved, torch_nop)(x, buf), x,
                            create_graph=True)
    assert "create_graph=True" in str(torch_error.value)
    for door in ("compile-eager", "compile-inductor", "aot_function"):
        x, buf = inputs()
        before = buf.clone()
        loss = DOORS[door](zero_saved)(x, buf)
        with pytest.raises(type(torch_error.value), match="^aotgrad: .*create_graph=True"):
            torch.autograd.grad(loss, x, create_graph=True)
        torch.testing.assert_close(buf, before)  # refused before anything was written
        loss.backward()  # a first-order backward still works
        torch.testing.assert_close(buf, torch.zeros(4))


def test_write_into_a_returned_tensor_is_refused():
    def fn(x):
        return ZeroOutputInBackward.apply(x)
    with pytest.raises(NotImplementedError, match="^aotgrad: the backward writes in place "
                                                  "into a tensor the function returns"):
        aotgrad.compile(fn, backend="eager")(torch.randn(3, requires_grad=True))


def test_export_of_a_joint_graph_with_a_backward_write_is_refused():
    with pytest.raises(NotImplementedError, match="^aotgrad: the backward mutates input 1"):
        aot_export_joint_simple(lambda x, buf: [zero_saved(x, buf)], list(inputs()),
                                trace_joint=True)


def test_write_into_a_subclass_input_is_refused():
    from torch.testing._internal.two_tensor import TwoTensor
    x = TwoTensor(torch.randn(3), torch.randn(3)).requires_grad_()
    buf = TwoTensor(torch.randn(3), torch.randn(3))
    with pytest.raises(NotImplementedError, match="^aotgrad: the backward mutates input 1 .*"
                                                  "tensor subclass input"):
        aotgrad.compile(zero_saved, backend="eager")(x, buf)
