"""The harness itself: it must pass eager against eager (and against Dynamo alone), and catch
each kind of divergence.

Each "broken compiler" below reproduces one mistake a compiled wrapper can make (detached
outputs, lost mutations, lost aliasing, swallowed errors, wrong gradients); the harness must
reject it on a case that exercises that behaviour. Without these, a lenient harness would
let the corpus pass vacuously.
"""

from __future__ import annotations

import copy
import functools
from typing import Callable

import pytest
import torch
import torch.utils._pytree as pytree

from corpus import CASES, CASES_BY_NAME
from harness import check_case


def _tensor_map(fn: Callable, tree):
    return pytree.tree_map(lambda t: fn(t) if isinstance(t, torch.Tensor) else t, tree)


def _wrap_outputs(transform: Callable) -> Callable:
    """A compiler that calls the target unchanged and transforms every tensor output."""
    def compile_fn(target):
        @functools.wraps(target)
        def call(*args, **kwargs):
            return _tensor_map(transform, target(*args, **kwargs))
        return call
    return compile_fn


def _on_cloned_inputs(target):
    """Runs on copies of the inputs: mutations never reach the caller's tensors."""
    def call(*args, **kwargs):
        args, kwargs = _tensor_map(lambda t: t.detach().clone().requires_grad_(t.requires_grad),
                                   (args, kwargs))
        return target(*args, **kwargs)
    return call


def _on_module_copy(target):
    """Runs a deep copy of the module: buffer updates and parameter gradients are lost."""
    return copy.deepcopy(target)


def _swallow_errors(target):
    def call(*args, **kwargs):
        try:
            return target(*args, **kwargs)
        except Exception:
            return None
    return call


class _DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


# (what goes wrong, the broken compiler, a case that shows it, what the harness must say)
BROKEN = [
    ("detached outputs", _wrap_outputs(torch.Tensor.detach), "sin_sum_backward_twice",
     r"compiled: \{'requires_grad': False"),
    ("cloned outputs lose aliasing", _wrap_outputs(torch.Tensor.clone), "view_of_input",
     r"compiled: \{.*'is_view': False"),
    ("cloned outputs lose identity", _wrap_outputs(torch.Tensor.clone), "returns_input_no_grad",
     r"output 0 aliasing"),
    ("lost input mutation", _on_cloned_inputs, "mutate_input_no_grad",
     r"input 0 after the call: Tensor-likes are not close"),
    ("lost metadata mutation", _on_cloned_inputs, "t_on_input",
     r"input 0 after the call: eager torch.float32\[4, 3\]"),
    ("lost buffer update", _on_module_copy, "batchnorm1d_train", r"module state 'running_mean'"),
    ("swallowed error", _swallow_errors, "shape_mismatch_raises", r"compiled did not"),
    ("wrong gradient", _wrap_outputs(lambda t: _DoubleGrad.apply(t) if t.requires_grad else t),
     "matmul_relu", r"\.grad of input leaf 0"),
    ("integer output cast", _wrap_outputs(lambda t: t.float()), "argmax_and_sum",
     r"eager torch.int64\[\], compiled torch.float32"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_eager_matches_itself(case):
    check_case(case, lambda target: target)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_dynamo_alone_matches_eager(case):
    """The control for the Dynamo front doors: with Dynamo's pass-through backend every
    case matches eager, so a Dynamo-door failure is aotgrad's, not Dynamo's. A case that
    fails here belongs in test_corpus.KNOWN_GAPS for the Dynamo doors."""
    def compile_fn(target):
        torch._dynamo.reset()
        return torch.compile(target, backend="eager")
    check_case(case, compile_fn)


@pytest.mark.parametrize("what, compile_fn, name, says", BROKEN, ids=[b[0] for b in BROKEN])
def test_harness_catches(what, compile_fn, name, says):
    with pytest.raises(AssertionError, match=says):
        check_case(CASES_BY_NAME[name], compile_fn)
