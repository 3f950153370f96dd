"""A compiled graph is reused only where its assumptions hold: which inputs require grad and
which positions hold the same tensor. Doors that compile per signature compile again (and
match eager); `aot_module_simplified`, which compiles once for its caller to guard, raises
`InputsChanged`. Also the custom-Function cases through `aot_module_simplified`, which the
corpus doors do not cover."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import aotgrad
from aotgrad.compat import aot_function, aot_module_simplified, nop
from aotgrad.runtime.guards import InputsChanged, fixed_inputs_check
from corpus import HalfGradIdentity, ZeroSavedInBackward


def weighted(x, y):
    return (x * y * torch.arange(1.0, 4.0)).sum()


def mutates_first(x, y):
    x.mul_(2)
    return (x + y).sum()


def two(rx: bool, ry: bool) -> Callable[[], tuple]:
    def make():
        torch.manual_seed(0)
        return torch.randn(3, requires_grad=rx), torch.randn(3, requires_grad=ry)
    return make


def twice(requires_grad: bool) -> Callable[[], tuple]:
    def make():
        torch.manual_seed(0)
        x = torch.randn(3, requires_grad=requires_grad)
        return x, x
    return make


# (function, first call's inputs, second call's): the second must not reuse the first graph.
CHANGES = {
    "requires_grad flipped": (weighted, two(True, False), two(False, True)),
    "requires_grad gained": (weighted, two(False, False), two(True, True)),
    "requires_grad lost": (weighted, two(True, True), two(False, False)),
    "distinct then one tensor twice": (weighted, two(True, True), twice(True)),
    "one tensor twice then distinct": (weighted, twice(True), two(True, True)),
    "mutated: distinct then twice": (mutates_first, two(False, False), twice(False)),
    "mutated: twice then distinct": (mutates_first, twice(False), two(False, False)),
}


class Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def dynamo(fn):
    torch._dynamo.reset()
    return torch.compile(fn, backend=aotgrad.backend(backend="eager"))


RECOMPILING_DOORS = {
    "aot_function": lambda fn: aot_function(fn, nop),
    "compile-eager": lambda fn: aotgrad.compile(fn, backend="eager"),
    "compile-eager-dynamic": lambda fn: aotgrad.compile(fn, backend="eager", dynamic=True),
    "dynamo-aotgrad-eager": dynamo,
}


def outcome(fn: Callable, args: tuple) -> tuple:
    """The output, the inputs after the call and their gradients."""
    out = fn(*args)
    if out.requires_grad:
        out.backward()
    unique = list({id(a): a for a in args}.values())
    return out.detach(), [a.detach().clone() for a in args], [a.grad for a in unique]


def assert_same(expected: tuple, actual: tuple) -> None:
    torch.testing.assert_close(actual[0], expected[0])
    torch.testing.assert_close(actual[1], expected[1])
    for e, c in zip(expected[2], actual[2]):
        assert (e is None) == (c is None), f"gradient eager {e}, compiled {c}"
        if e is not None:
            torch.testing.assert_close(c, e)


@pytest.mark.parametrize("door", RECOMPILING_DOORS)
@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_a_door_that_compiles_per_signature_matches_eager(door, change):
    fn, first, second = change
    compiled = RECOMPILING_DOORS[door](fn)
    for make in (first, second, first):
        assert_same(outcome(fn, make()), outcome(compiled, make()))


def simplified(fn: Callable, example: tuple) -> Callable:
    return aot_module_simplified(Wrap(fn), list(example), nop)


@pytest.mark.parametrize("change", CHANGES.values(), ids=CHANGES.keys())
def test_aot_module_simplified_serves_its_inputs_or_raises(change):
    """Where the second call breaks an assumption of the graph: InputsChanged (or, for
    distinct tensors passed as one and mutated, the aliasing check's error), never a wrong
    result."""
    fn, first, second = change
    forward = simplified(fn, first())
    assert_same(outcome(fn, first()), outcome(forward, first()))
    expected = outcome(fn, second())
    try:
        actual = outcome(forward, second())
    except (InputsChanged, NotImplementedError) as error:
        assert str(error).startswith("aotgrad:")
        return
    assert_same(expected, actual)


def test_aot_module_simplified_names_what_changed():
    forward = simplified(weighted, two(True, False)())
    with pytest.raises(InputsChanged, match="input 1 has requires_grad=True"):
        forward(*two(True, True)())
    forward = simplified(mutates_first, twice(False)())
    with pytest.raises(InputsChanged, match="inputs 0 and 1 are distinct tensors"):
        forward(*two(False, False)())


def test_aot_module_simplified_sees_a_parameter_frozen_after_compiling():
    linear = torch.nn.Linear(3, 1)
    x = torch.randn(2, 3)
    forward = aot_module_simplified(linear, [x], nop)
    forward(x).sum().backward()
    assert linear.weight.grad is not None
    linear.weight.requires_grad_(False)
    with pytest.raises(InputsChanged, match="input 0 has requires_grad=False"):
        forward(x)


def test_aot_module_simplified_check_reads_requires_grad_when_compiling():
    """The example tensors may change after the compile: the check keeps what they were."""
    x = torch.randn(3)
    check = fixed_inputs_check([x, x, 2])
    x.requires_grad_(True)
    with pytest.raises(InputsChanged, match="input 0 has requires_grad=True"):
        check([x, x, 2])
    check([torch.randn(3)] * 2 + [2])


def half_identity(x):
    return HalfGradIdentity.apply(x)


def zero_saved(x, buf):
    return ZeroSavedInBackward.apply(x, buf).sum()


def test_aot_module_simplified_custom_function_returning_its_input():
    make = lambda: (torch.ones(3, requires_grad=True),)  # noqa: E731
    forward = simplified(half_identity, make())
    x = make()[0]
    out = forward(x)
    assert out._base is x
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 0.5))


def test_custom_function_backward_mutating_an_input_matches_eager():
    def make():
        torch.manual_seed(0)
        return torch.randn(3, requires_grad=True), torch.randn(3)
    expected = outcome(zero_saved, make())
    assert_same(expected, outcome(aotgrad.compile(zero_saved, backend="eager"), make()))
