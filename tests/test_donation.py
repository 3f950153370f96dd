"""Donated saved values: the backward may write into the memory of a saved value that only it
holds (Inductor reuses it for a gradient), and nothing else may ever see that write."""

import pytest
import torch

import aotgrad
from aotgrad.schema import DONATED

# Inductor writes into donated buffers on either device; on a GPU machine both run.
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


def donated_names(compiled) -> set[str]:
    bw = compiled.artifacts[0].backward_graph
    return {n.name for n in bw.graph.find_nodes(op="placeholder") if n.meta.get(DONATED)}


def two_products(x, w):
    out = x @ w  # a user output, which the square's backward reads
    h = x @ w.t()  # read by sin's backward alone
    return out, (out * out + h.sin()).sum()


def test_only_values_nothing_else_holds_are_donated():
    x, w = torch.randn(4, 4, requires_grad=True), torch.randn(4, 4, requires_grad=True)
    compiled = aotgrad.compile(two_products, backend="eager")
    compiled(x, w)
    art = compiled.artifacts[0]
    fw_outputs = art.forward_graph.graph.output_node().args[0]
    saved = {s.name: s.op for s in art.saved}
    out = fw_outputs[0].name
    assert out in saved and "placeholder" in saved.values()  # the cases to refuse are there
    donated = donated_names(compiled)
    assert len(donated) == 1 and saved[donated.pop()] == "aten.mm.default"


def grads_of_two_backwards(fn, *args, **backward_kwargs):
    for a in args:
        a.grad = None
    out = fn(*args)
    out.backward(retain_graph=True, **backward_kwargs)
    first = [a.grad.clone() for a in args]
    for a in args:
        a.grad = None
    out.backward()
    return first, [a.grad for a in args]


def exp_of_product(x, w):
    # The backward multiplies the gradient (3) by the saved exp(x @ w), and Inductor writes
    # the product into exp's donated buffer.
    return (x @ w).exp().sum() * 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_retained_graph_keeps_its_saved_values(device):
    """`retain_graph=True` keeps the saved values for a second backward, so that backward
    runs a compile that writes into none of them."""
    args = (torch.randn(8, 8, device=device, requires_grad=True),
            torch.randn(8, 8, device=device, requires_grad=True))
    compiled = aotgrad.compile(exp_of_product)
    got = grads_of_two_backwards(compiled, *args)
    assert donated_names(compiled), "nothing was donated: the test tests nothing"
    expected = grads_of_two_backwards(exp_of_product, *args)
    for g, e in zip(got, expected):  # Inductor's fused exp rounds apart (H100 host: 7e-6)
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def exp_of_product_returned(x, w):
    e = (x @ w).exp()
    return e.detach(), e.sum() * 3  # the same backward, but `e` is the caller's


@pytest.mark.parametrize("device", DEVICES)
def test_a_donating_backward_is_never_served_from_the_cache_to_one_that_may_not(device):
    """Inductor's FX graph cache keys a graph by its code: the two functions' backwards are
    the same code, and only the first may write into `e`."""
    fresh_cache = getattr(torch._inductor.utils, "fresh_cache", None) or \
        torch._inductor.utils.fresh_inductor_cache
    x = torch.randn(8, 8, device=device, requires_grad=True)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    with fresh_cache(), torch._inductor.config.patch(fx_graph_cache=True):
        torch.compile(exp_of_product, backend="aotgrad")(x, w).backward()
        e, loss = torch.compile(exp_of_product_returned, backend="aotgrad")(x, w)
        before = e.clone()
        loss.backward()
    assert torch.equal(e, before)


@pytest.mark.parametrize("device", DEVICES)
def test_a_saved_tensor_hook_never_sees_a_donated_value_change(device):
    """A pack hook may keep the tensor it is given (to inspect it later): the backward must
    not reuse its memory."""
    x = torch.randn(8, 8, device=device, requires_grad=True)
    w = torch.randn(8, 8, device=device, requires_grad=True)
    compiled = aotgrad.compile(exp_of_product)
    kept = []

    def pack(t):
        kept.append((t, t.clone()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = compiled(x, w)
    loss.backward()
    assert donated_names(compiled) and kept
    assert all(torch.equal(t, before) for t, before in kept)
    expected = torch.autograd.grad(exp_of_product(x, w), x)[0]
    torch.testing.assert_close(x.grad, expected)


@torch.library.custom_op("aotgrad_donation::add_into", mutates_args=("out",))
def add_into(out: torch.Tensor, x: torch.Tensor) -> None:
    out.add_(x)


add_into.register_fake(lambda out, x: None)


def add_into_then_scale(buf, x):
    add_into(buf, x.detach() * 2)
    return buf * x


@pytest.mark.parametrize("door", ["compile", "dynamo"])
def test_an_input_a_custom_op_writes_is_never_donated(door):
    """Inductor computes the op's functionalized result in the input's own memory (it is
    copied back there): that saved value is the input. The backward raised a version error
    (the counter was set after the forward saved it), then wrote the gradient into it."""
    if door == "compile":
        compiled = aotgrad.compile(add_into_then_scale)
    else:
        torch._dynamo.reset()
        compiled = torch.compile(add_into_then_scale, backend="aotgrad")
    seen = []
    for fn in (add_into_then_scale, compiled):
        torch.manual_seed(0)
        buf, x, weight = torch.randn(3), torch.randn(3, requires_grad=True), torch.randn(3)
        out = fn(buf, x)
        after_call = buf.clone()
        (out * weight).sum().backward()
        seen.append((out, after_call, buf, x.grad))
    torch.testing.assert_close(seen[1], seen[0])


def times_kept_scale(x, scale):
    return (x * scale.clone()).exp().sum()  # the backward reads the scale, a graph constant


class KeptScale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = torch.tensor([1.0, 2.0, 3.0])  # neither a parameter nor a buffer

    def forward(self, x):
        return times_kept_scale(x, self.scale)


@pytest.mark.parametrize("holder", ["closure", "module"])
def test_a_tensor_the_graph_holds_as_a_constant_is_never_donated(holder):
    """A tensor the traced code closes over becomes a constant of the graph module, saved for
    the backward as it is: it outlives the call, so the backward wrote its gradient into it and
    every later call read the gradient as the constant."""
    if holder == "module":
        module = KeptScale()
        compiled, scale = aotgrad.compile(module), module.scale
    else:
        scale = torch.tensor([1.0, 2.0, 3.0])
        compiled = aotgrad.compile(lambda x: times_kept_scale(x, scale))
    for _ in range(2):
        x = torch.linspace(0, 1, 3, requires_grad=True)
        compiled(x).backward()
        expected = torch.autograd.grad(times_kept_scale(x, torch.tensor([1.0, 2.0, 3.0])), x)[0]
        torch.testing.assert_close(x.grad, expected)
    assert torch.equal(scale, torch.tensor([1.0, 2.0, 3.0]))
