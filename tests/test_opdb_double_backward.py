"""A CI sample of the OpInfo sweep's double_backward pass: every CI_EVERY-th op of PyTorch's
op_db that supports gradgrad, one sample each in float64, eager against
`aotgrad.compile(backend="eager")`: the create_graph gradients (values and history), then
the gradients of a random projection of them. The full pass is
`python -m tools.opdb_sweep --pass double_backward`.
"""

import sys
from pathlib import Path

import pytest

# `tools` sits beside `aotgrad` in the repository and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# op_db imports expecttest at module level; without it there is nothing to sample.
pytest.importorskip("expecttest", reason="op_db needs expecttest: pip install expecttest")

from test_opdb import check_op, op_param  # noqa: E402
from tools import opdb_sweep  # noqa: E402

# A quarter of the ~510 ops with gradgrad: about 15 s on a 2-core machine.
CI_EVERY = 4
PASS = "double_backward"

# Ops that fail today, by cause group exactly as the sweep files it, for every op of the
# full one-sample pass (torch 2.13), so a change of CI_EVERY needs no edit.
KNOWN_FAILURES = {
    # The same refusals as the static pass: the forward itself cannot be compiled.
    "refused: data-dependent value": (
        "combinations", "corrcoef", "cov", "masked_select", "nn.functional.gaussian_nll_loss",
        "linalg.lstsq", "linalg.lstsq.grad_oriented"),
    "data-dependent: a kernel reads tensor data at trace time": ("tensor_split",),
    # rrelu's output depends on the slopes it draws, which no table says how to recompute.
    "refused: double backward of a random op": ("nn.functional.rrelu",),
    # prod's differentiable backward branches on whether the input holds zeros.
    "refused: double backward, data-dependent": ("index_reduce.prod", "scatter_reduce.prod"),
    # The second-order gradient reaching eig splits between the compiled forward's eig node
    # (through the first-order gradients' own history) and the replay's; their sum is
    # phase-invariant, each part is not, and eig's backward checks each part.
    "eig's phase check: the replay's and the forward's gradients arrive apart": ("linalg.eig",),
}
XFAIL = {op: cause for cause, ops in KNOWN_FAILURES.items() for op in ops}


def _with_gradgrad():
    ops = opdb_sweep.select_ops(comparable_only=True)
    return [op for op in ops if opdb_sweep.double_backward_skip_reason(op) is None]


SAMPLE = [op_param(op, XFAIL) for op in _with_gradgrad()[::CI_EVERY]]
# Every random op with gradgrad (about 5 s): eager and compiled draw from one seed, and the
# double backward takes the compiled forward's values instead of drawing.
RANDOM = [op_param(op, XFAIL) for op in opdb_sweep.all_ops()
          if opdb_sweep.is_random(opdb_sweep.op_id(op))
          and opdb_sweep.double_backward_skip_reason(op) is None]


@pytest.mark.parametrize("op", SAMPLE)
def test_second_order_grads_match_eager(op):
    check_op(op, XFAIL, PASS)


@pytest.mark.parametrize("op", RANDOM)
def test_random_ops_second_order_grads_match_eager_from_one_seed(op):
    check_op(op, XFAIL, PASS)


def test_ops_without_gradgrad_are_skipped():
    (op,) = [op for op in opdb_sweep.all_ops() if not op.supports_gradgrad][:1]
    result = opdb_sweep.run_op(op, samples=1, pass_name=PASS)
    assert (result.status, result.reason) == (opdb_sweep.SKIPPED, "no gradgrad")


def test_main_prints_the_pass_rates_side_by_side(capsys):
    opdb_sweep.main(["--ops", "sin", "--samples", "1", "--pass", "static,double_backward"])
    out = capsys.readouterr().out
    assert "pass=static" in out and "pass=double_backward" in out
    assert "pass rates: static 1 / 1 (100.0%); double_backward 1 / 1 (100.0%)" in out
