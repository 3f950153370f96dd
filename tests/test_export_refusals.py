"""Every export door refuses what an exported graph cannot hold through one path
(compat/export.py: refuse_non_functional), with one exception type: ExportUnsupported, a
NotImplementedError and so a RuntimeError, as torch's own export refusals are."""

import contextlib

import pytest
import torch

from aotgrad import compat
from aotgrad.compat.export import ExportUnsupported


class ReturnsAView(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x):
        return (x.view(-1),)  # an alias of the input: no exported graph returns one


def _joint_simple(mod, x):
    return compat.aot_export_joint_simple(lambda a: mod(a), [x], trace_joint=False)


def _module(mod, x):
    return compat.aot_export_module(mod, [x], trace_joint=False)


def _descriptors(mod, x):
    with contextlib.ExitStack() as stack:
        return compat.aot_export_joint_with_descriptors(stack, mod, (x,))


@pytest.mark.parametrize("door", [_joint_simple, _module, _descriptors],
                         ids=["aot_export_joint_simple", "aot_export_module", "descriptors"])
def test_each_door_refuses_an_aliased_output_the_same_way(door):
    x = torch.randn(4)
    with pytest.raises(ExportUnsupported, match=r"^aotgrad: .*aliases an input"):
        door(ReturnsAView(), x)
    # the eager function itself runs: the refusal is about export, not the function
    assert ReturnsAView()(x)[0].shape == (4,)


def test_the_refusal_is_the_runtime_error_torch_raises():
    assert issubclass(ExportUnsupported, RuntimeError)
    assert issubclass(ExportUnsupported, NotImplementedError)


def test_only_the_simple_door_refuses_a_data_mutation():
    def bump(x):
        x.add_(1)
        return (x * 2,)

    class Bump(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", torch.zeros(4))

        def forward(self, x):
            self.count.add_(1)
            return (x * 2,)
    with pytest.raises(ExportUnsupported, match="mutates an input"):
        compat.aot_export_joint_simple(bump, [torch.randn(4)], trace_joint=False)
    gm, signature = compat.aot_export_module(Bump(), [torch.randn(4)], trace_joint=False)
    assert list(signature.buffers_to_mutate.values()) == ["count"]
