"""What analysis learns about inputs and outputs, checked fact by fact."""

import pytest
import torch

import aotgrad
from aotgrad.schema import OutputKind, StorageSwap


def info_of(fn, *args):
    compiled = aotgrad.compile(fn, backend="eager")
    compiled(*args)
    return compiled.artifacts[0].info


def leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def nonleaf(*shape):
    return leaf(*shape) * 1


def test_plain_function_mutates_nothing():
    info = info_of(lambda x: x.sin(), leaf(3))
    assert not any(x.mutated for x in info.inputs)
    assert [o.kind for o in info.outputs] == [OutputKind.PLAIN]
    assert info.differentiable == (True,)


def test_data_mutation_visible_to_autograd():
    def f(x):
        x.mul_(2)
        return x.sum()
    x = info_of(f, nonleaf(3)).inputs[0]
    assert x.mutates_data and not x.mutates_metadata and not x.mutation_hidden_from_autograd


@pytest.mark.parametrize("how", ["no_grad", "detach", "data"])
def test_mutation_hidden_from_autograd(how):
    def f(x):
        if how == "no_grad":
            with torch.no_grad():
                x.add_(1)
        elif how == "detach":
            x.detach().add_(1)
        else:
            x.data.add_(1)
        return x * 2
    x = info_of(f, leaf(3)).inputs[0]
    assert x.mutates_data and x.mutation_hidden_from_autograd


def test_mutation_through_a_view_of_an_input():
    def f(x):
        x[0].add_(1)
        return x.sum()
    assert info_of(f, torch.randn(2, 3)).inputs[0].mutates_data


def test_metadata_mutation_records_final_geometry():
    def f(x):
        x.t_()
        return x + 1
    x = info_of(f, torch.randn(2, 3)).inputs[0]
    assert x.mutates_metadata and not x.mutates_data
    assert x.final_geometry == ((3, 2), (1, 3), 0)


def test_output_kinds():
    def f(x, y):
        z = x * 2
        return x, x.view(-1), z, z[0], (y + 1)[0], 3, z
    info = info_of(f, leaf(2, 2), torch.randn(2))
    assert [(o.kind, o.source) for o in info.outputs] == [
        (OutputKind.INPUT, 0), (OutputKind.VIEW_OF_INPUT, 0), (OutputKind.PLAIN, None),
        (OutputKind.VIEW_OF_OUTPUT, 2), (OutputKind.VIEW_OF_INTERMEDIATE, 0),
        (OutputKind.CONSTANT, None), (OutputKind.SAME_AS_OUTPUT, 2)]
    assert info.num_intermediate_bases == 1


def test_integer_and_detached_outputs_are_not_differentiable():
    info = info_of(lambda x: (x.argmax(), x.detach() * 2, x * 2), leaf(4))
    assert info.differentiable == (False, False, True)


def test_no_grad_call_needs_no_autograd():
    with torch.no_grad():
        info = info_of(lambda x: x * 2, leaf(3))
    assert not info.needs_autograd


def test_leaf_mutation_raises_like_eager():
    def f(x):
        x.add_(1)
        return x
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        f(leaf(2))
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        aotgrad.compile(f, backend="eager")(leaf(2))


def test_set_on_an_input_is_recorded_as_a_storage_swap():
    def f(x, y, z):
        x.set_(y)
        z.set_(y * 2)
        return x + 1
    f = aotgrad.compile(f, backend="eager")
    f(torch.randn(2), torch.randn(2), torch.randn(3))
    info = f.artifacts[0].info
    swaps = [x.storage_swap for x in info.inputs]
    assert swaps == [StorageSwap(1), None, StorageSwap(None)]
    assert not any(x.mutates_data or x.mutates_metadata for x in info.inputs)
    assert info.storages_from_graph == (2,)


def test_closed_over_constant_is_baked_in():
    c = torch.randn(3)
    f = aotgrad.compile(lambda x: x * c, backend="eager")
    x = torch.randn(3, requires_grad=True)
    torch.testing.assert_close(f(x), x * c)


def test_closed_over_tensor_requiring_grad_is_refused():
    w = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="not an input of the compiled function"):
        aotgrad.compile(lambda x: x * w, backend="eager")(torch.randn(3))


def test_mutating_closed_over_tensor_is_refused():
    counter = torch.zeros(())

    def f(x):
        counter.add_(1)
        return x * 2
    with pytest.raises(RuntimeError, match="mutation would be lost"):
        aotgrad.compile(f, backend="eager")(torch.randn(3))
