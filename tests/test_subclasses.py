"""Tensor subclasses (TwoTensor, nested or not) as inputs, outputs, parameters, buffers and
gradients, against eager through the three front doors; what is refused, refused clearly."""

import pytest
import torch
from torch.testing._internal.two_tensor import TwoTensor

import aotgrad
from aotgrad.compat import aot_export_joint_simple, aot_function, aot_module, nop
from harness import grad_leaves


def compile_eager(target):
    return aotgrad.compile(target, backend="eager")


def compat(target):
    return aot_module(target, nop) if isinstance(target, torch.nn.Module) else aot_function(target, nop)


def dynamo(target):
    torch._dynamo.reset()
    return torch.compile(target, backend=aotgrad.backend(backend="eager"))


DOORS = pytest.mark.parametrize("door", [compile_eager, compat, dynamo],
                                ids=["compile", "compat", "dynamo"])


def two(*shape, requires_grad=False):
    return TwoTensor(torch.randn(shape), torch.randn(shape)).requires_grad_(requires_grad)


def parts(t):
    """The plain tensors inside a subclass, depth first."""
    if type(t) is torch.Tensor or not hasattr(t, "__tensor_flatten__"):
        return [t]
    attrs, _ = t.__tensor_flatten__()
    return [p for a in attrs for p in parts(getattr(t, a))]


def assert_same(e, c, what):
    """Same type (subclass included), same values in every part, same autograd facts."""
    assert type(e) is type(c), f"{what}: eager {type(e).__name__}, compiled {type(c).__name__}"
    if not isinstance(e, torch.Tensor):
        assert e == c, what
        return
    assert e.shape == c.shape, what
    for k, (pe, pc) in enumerate(zip(parts(e), parts(c), strict=True)):
        torch.testing.assert_close(pc.detach(), pe.detach(), msg=lambda m: f"{what} part {k}: {m}")
    facts = [(t.requires_grad, t.is_leaf, t._is_view()) for t in (e, c)]
    assert facts[0] == facts[1], f"{what}: (requires_grad, is_leaf, is_view) {facts}"


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _call(fn, inputs, seed, context):
    torch.manual_seed(seed)
    args = inputs()
    versions = [a._version for a in args]
    leaves = grad_leaves(list(args))
    with context():
        outs = _as_tuple(fn(*args))
    return args, versions, leaves, outs


def losses(outs):
    """One loss per output type, so that no gradient mixes a subclass with a plain tensor."""
    by_type = {}
    for k, o in enumerate(outs):
        if isinstance(o, torch.Tensor) and o.requires_grad:
            w = torch.randn(o.shape, generator=torch.Generator().manual_seed(k))
            by_type[type(o)] = by_type.get(type(o), 0) + (o * w).sum()
    return list(by_type.values())


def check(door, fn, inputs, *, context=torch.enable_grad, calls=2):
    """`door(fn)` against eager: outputs (type, parts, autograd facts, which input is their
    `_base`), inputs after the call, then gradients of every leaf behind the inputs."""
    compiled = door(fn)
    for call in range(calls):
        e_args, e_versions, e_leaves, e_outs = _call(fn, inputs, call, context)
        c_args, c_versions, c_leaves, c_outs = _call(compiled, inputs, call, context)
        assert len(e_outs) == len(c_outs)
        for k, (e, c) in enumerate(zip(e_outs, c_outs)):
            assert_same(e, c, f"output {k}")
            if isinstance(e, torch.Tensor):
                bases = [[i for i, a in enumerate(args) if out._base is a or out is a]
                         for out, args in ((e, e_args), (c, c_args))]
                assert bases[0] == bases[1], f"output {k} is (a view of) inputs {bases}"
        for k, (e, c) in enumerate(zip(e_args, c_args)):
            assert_same(e, c, f"input {k} after the call")
            bumped = [a._version != v for a, v in ((e, e_versions[k]), (c, c_versions[k]))]
            assert bumped[0] == bumped[1], f"input {k}: version bumped {bumped}"
        for outs in (e_outs, c_outs):
            if losses(outs):
                torch.autograd.backward(losses(outs))
        for k, (e, c) in enumerate(zip(e_leaves, c_leaves, strict=True)):
            assert (e.grad is None) == (c.grad is None), f"leaf {k}: grad {e.grad} vs {c.grad}"
            if e.grad is not None:
                assert_same(e.grad, c.grad, f"leaf {k}'s grad")


# ---- inputs and outputs --------------------------------------------------------------------

@DOORS
def test_twotensor_in_plain_out(door):
    # Reading the parts is not differentiable in eager either: only y gets a gradient.
    check(door, lambda x, y: (x.a * x.b).sin() + y,
          lambda: (two(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)))


@DOORS
def test_plain_in_twotensor_out(door):
    check(door, lambda x: TwoTensor(x.sin(), x * 2), lambda: (torch.randn(3, 4),))


@DOORS
def test_twotensor_in_and_out_with_gradients(door):
    # y.grad is a TwoTensor too: the product with x is one.
    check(door, lambda x, y: ((x * y).sin() * 2, x.sum(0), y.cos()),
          lambda: (two(3, 4, requires_grad=True), torch.randn(3, 4, requires_grad=True)))


@DOORS
def test_nested_twotensor(door):
    check(door, lambda x, y: (x * 2).cos() @ y,
          lambda: (TwoTensor(two(3, 4), two(3, 4)).requires_grad_(), torch.randn(4, 2)))


@DOORS
def test_unused_subclass_output_gets_no_gradient(door):
    # Autograd materializes a plain zero gradient for an unused output; aotgrad must not
    # mistake it for a gradient of the wrong type.
    def f(x):
        return (x.sin(), x.cos())
    for fn in (f, door(f)):
        x = two(3, requires_grad=True)
        fn(x)[0].sum().backward()
        assert type(x.grad) is TwoTensor
        torch.testing.assert_close(parts(x.grad), [p.cos() for p in parts(x.detach())])


@DOORS
def test_inference_under_no_grad(door):
    check(door, lambda x: (x * 2, x.view(-1)), lambda: (two(3, 4, requires_grad=True),),
          context=torch.no_grad)


def test_inductor_backend():
    def f(x, y):
        return (x * y).sin(), (x + 1).view(-1), y.exp()
    check(lambda fn: aotgrad.compile(fn, backend="inductor"), f,
          lambda: (two(3, 4, requires_grad=True), torch.randn(3, 4)), calls=1)


# ---- aliasing and mutation -----------------------------------------------------------------

@DOORS
def test_views_of_subclass_inputs_and_intermediates(door):
    check(door, lambda x: (x.view(-1), x.t(), (x * 2)[0], x),
          lambda: (two(3, 4, requires_grad=True),))


@DOORS
def test_mutation_of_twotensor_input(door):
    def f(x, y):
        x.mul_(2)
        return x + y
    check(door, f, lambda: (two(3, 4), torch.randn(3, 4, requires_grad=True)))


@DOORS
def test_mutation_of_non_leaf_twotensor_reaches_gradients(door):
    def f(x, y):
        x.mul_(y)
        return x.sin()
    check(door, f, lambda: (two(3, 4, requires_grad=True) * 1, torch.randn(3, 4, requires_grad=True)))


@DOORS
def test_metadata_mutation_of_twotensor_input(door):
    check(door, lambda x: x.t_() * 2, lambda: (two(3, 4),))


def test_mutating_a_twotensor_whose_parts_alias_is_refused():
    a = torch.randn(3)
    compiled = compile_eager(lambda x: x.add_(1))
    compiled(two(3))
    for x in (TwoTensor(a, a), TwoTensor(a[:], a[:])):  # a new signature, then a cached one
        with pytest.raises(NotImplementedError, match="inner tensors of input 0"):
            compiled(x)


def test_new_part_aliasing_compiles_again():
    a = torch.randn(3)
    compiled = compile_eager(lambda x: x * 2)
    compiled(two(3))
    out = compiled(TwoTensor(a, a))
    assert len(compiled.entries) == 2
    torch.testing.assert_close(parts(out), [a * 2, a * 2])


# ---- modules -------------------------------------------------------------------------------

class WithTwoParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.w = torch.nn.Parameter(TwoTensor(torch.randn(4, 5), torch.randn(4, 5)))
        self.register_buffer("stat", TwoTensor(torch.zeros(4), torch.ones(4)))

    def forward(self, x):
        y = self.lin(x)
        with torch.no_grad():  # a running statistic, updated like BatchNorm's
            self.stat.mul_(0.9).add_(y.mean(0) * 0.1)
        return (y @ self.w).relu()


@DOORS
def test_module_with_twotensor_parameter_and_buffer(door):
    torch.manual_seed(0)
    eager = WithTwoParameter()
    torch.manual_seed(0)
    target = WithTwoParameter()
    compiled = door(target)
    for step in range(2):
        x = torch.randn(3, 4)
        assert_same(eager(x), compiled(x), f"step {step}: output")
        assert_same(eager.stat, target.stat, f"step {step}: buffer")
    eager(x).sum().backward()
    compiled(x).sum().backward()
    for (name, e), (_, c) in zip(eager.named_parameters(), target.named_parameters()):
        assert_same(e.grad, c.grad, f"{name}.grad")
    assert type(target.w.grad) is TwoTensor


# ---- refused -------------------------------------------------------------------------------

class OnlyTorchFunction(torch.Tensor):
    """A subclass with __torch_function__ only: it cannot be split into plain tensors."""


@DOORS
def test_non_traceable_subclass_is_refused(door):
    x = torch.randn(3).as_subclass(OnlyTorchFunction)
    with pytest.raises(Exception, match="not a traceable wrapper subclass"):
        door(lambda x: x * 2)(x)


def test_non_traceable_subclass_made_inside_is_refused():
    with pytest.raises(NotImplementedError, match="not a traceable wrapper subclass"):
        compile_eager(lambda x: (x * 2).as_subclass(OnlyTorchFunction))(torch.randn(3))


@DOORS
def test_plain_gradient_for_a_twotensor_output_is_refused(door):
    out = door(lambda x: x * 2)(two(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="traced for a TwoTensor"):
        out.backward(torch.ones(3))


@DOORS
def test_loss_mixing_twotensor_and_plain_outputs_is_refused(door):
    # Eager sends a TwoTensor gradient into the plain output; the backward was traced for
    # a plain one, and cannot run on the parts of another layout.
    a, b = door(lambda x, y: (x * 2, y.sin()))(two(3, requires_grad=True),
                                               torch.randn(3, requires_grad=True))
    with pytest.raises(RuntimeError, match="traced for a plain tensor"):
        (a.sum() + b.sum()).backward()


def test_leaf_twotensor_made_inside_is_refused():
    # TwoTensor(x, ...) of an x that requires grad is a new leaf in eager, cut from x.
    with pytest.raises(NotImplementedError, match="leaf tensor that requires grad"):
        compile_eager(lambda x: TwoTensor(x, x * 2))(torch.randn(3, requires_grad=True))


def test_export_refuses_subclasses():
    with pytest.raises(NotImplementedError, match="tensor subclass"):
        aot_export_joint_simple(lambda x: (x * 2,), [two(3)], trace_joint=False)


class ShiftedTwo(torch.nn.Module):
    """A float attribute: under dynamic=True Dynamo passes it as a tensor whose `.item()`
    its graph reads."""

    def __init__(self):
        super().__init__()
        self.shift, self.w = 0.5, torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        y = x * self.w + self.shift
        return y, y.sin()


def test_subclass_outputs_and_gradients_of_dynamic_shape():
    """TwoTensor in and out under Dynamo's symbolic sizes, one output unused by the loss.
    Outputs and input gradients were rebuilt with the trace's symbolic sizes (`y.shape` a
    SymInt); refusing them sent the graph to a compile per shape, which cannot read the
    dynamic float (aten._local_scalar_dense). They are rebuilt with each call's sizes."""
    torch._dynamo.reset()
    eager = ShiftedTwo()
    compiled = torch.compile(ShiftedTwo(), backend=aotgrad.backend(backend="eager"),
                             dynamic=True)
    for n in (3, 5, 7):
        x = two(n, 4, requires_grad=True)
        x_eager = x.detach().clone().requires_grad_()
        got, want = compiled(x)[0], eager(x_eager)[0]
        assert all(type(d) is int for d in (*got.shape, *got.stride())), got.shape
        assert_same(want, got, f"output, {n} rows")
        got.sum().backward()
        want.sum().backward()
        assert all(type(d) is int for d in x.grad.shape), x.grad.shape
        assert_same(x_eager.grad, x.grad, f"input gradient, {n} rows")
    assert_same(eager.w.grad, compiled.w.grad, "w's gradient")
