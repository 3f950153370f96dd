"""Every corpus case through every front door, compared against eager by the harness.

Front doors: `aotgrad.compat` with `nop`, `aotgrad.compile` (eager and Inductor backends),
and `torch.compile` with aotgrad as the Dynamo backend (eager and Inductor compilers) or with
a backend calling `compat.aot_module_simplified`; and
with dynamic shapes, `aotgrad.compile(dynamic=True)` and `torch.compile(dynamic=True)`.
Inductor compiles take seconds, so the Inductor doors (and Dynamo with dynamic shapes, whose
symbolic trace is slower) run only the cases tagged "inductor".
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from functorch import compile as functorch_compile

import aotgrad
from aotgrad.compat import aot_function, aot_module, nop
from corpus import CASES, INDUCTOR
from harness import Case, check_case


def compat_nop(target: Callable, **options) -> Callable:
    if isinstance(target, torch.nn.Module):
        return aot_module(target, nop, **options)
    return aot_function(target, nop, **options)


def aotgrad_compile(backend: str, dynamic: bool = False, **options) -> Callable:
    return lambda target: aotgrad.compile(target, backend=backend, dynamic=dynamic, **options)


def compat_simplified_backend():
    """A Dynamo backend written for functorch's compile module, on compat's door."""
    from aotgrad.compat import aot_module_simplified
    return lambda gm, example_inputs: aot_module_simplified(gm, example_inputs, nop)


def dynamo(backend_factory: Callable, dynamic: bool | None = None) -> Callable:
    def compile_with_dynamo(target: Callable) -> Callable:
        torch._dynamo.reset()  # no graph or guard left over from an earlier case
        return torch.compile(target, backend=backend_factory(), dynamic=dynamic)
    return compile_with_dynamo


# name -> (compile function, whether it runs only the "inductor" subset)
FRONT_DOORS: dict[str, tuple[Callable, bool]] = {
    "compat-nop": (compat_nop, False),
    # Inference graphs that write their inputs' new values themselves (functorch's option).
    "compat-nop-keep": (lambda target: compat_nop(target, keep_inference_input_mutations=True),
                        False),
    # A partition_fn written for torch's joint graphs: torch's own min-cut.
    "compat-nop-torch-min-cut": (lambda target: compat_nop(
        target, partition_fn=functorch_compile.min_cut_rematerialization_partition), False),
    "compile-inductor-keep": (aotgrad_compile("inductor", keep_inference_input_mutations=True),
                              True),
    "compile-eager": (aotgrad_compile("eager"), False),
    "compile-inductor": (aotgrad_compile("inductor"), True),
    "dynamo-aotgrad-eager": (dynamo(lambda: aotgrad.backend(backend="eager")), False),
    "dynamo-aotgrad-inductor": (dynamo(lambda: "aotgrad"), True),
    "dynamo-compat-nop": (dynamo(compat_simplified_backend), False),
    # Dynamic shapes: every case through aotgrad's own door, Dynamo's on the smaller subset.
    "compile-eager-dynamic": (aotgrad_compile("eager", dynamic=True), False),
    "dynamo-aotgrad-eager-dynamic": (dynamo(lambda: aotgrad.backend(backend="eager"), True), True),
}

# (case name, front door) -> why it is expected to fail. Only gaps that are not aotgrad's
# to fix (Dynamo's own limitations) belong here; aotgrad bugs stay visible as failures.
# Empty while Dynamo alone passes every case (test_harness.py::test_dynamo_alone_matches_eager).
KNOWN_GAPS: dict[tuple[str, str], str] = {}

# Cases aotgrad does not support yet, where it must refuse with a clear error instead of
# diverging: case -> (doors where the refusal shows, pattern the error must match).
# Dynamo splits the function around some of these and then matches eager by itself.
PLAIN_DOORS = ("compat-nop", "compat-nop-keep", "compat-nop-torch-min-cut", "compile-eager",
               "compile-inductor",
               "compile-inductor-keep", "compile-eager-dynamic")
WITH_DYNAMO = PLAIN_DOORS + ("dynamo-aotgrad-eager", "dynamo-aotgrad-inductor",
                             "dynamo-aotgrad-eager-dynamic", "dynamo-compat-nop")
DYNAMO_DOORS = tuple(door for door in WITH_DYNAMO if door not in PLAIN_DOORS)
REFUSED: dict[str, tuple[tuple[str, ...], str]] = {
    # Dynamo traces a Function's backward under no_grad: whether eager records it is lost.
    "double_backward_custom_function": (DYNAMO_DOORS, "captured by torch.compile"),
    "requires_grad_false_on_input": (PLAIN_DOORS, r"calls requires_grad_\(False\)"),
    "fresh_leaf_created_inside": (PLAIN_DOORS, "computes a value from a tensor that it made"),
    "value_of_view_made_leaf_inside": (PLAIN_DOORS, "computes a value from a tensor that it made"),
    "closure_over_grad_tensor": (PLAIN_DOORS, "not an input of the compiled function"),
    "item_float_output": (PLAIN_DOORS, "depends on tensor data"),
    "data_dependent_shape": (PLAIN_DOORS, "depends on tensor data"),
    "resize_grows_input_then_view_written": (PLAIN_DOORS, "resize_"),
}


def _params():
    for door, (_, inductor_only) in FRONT_DOORS.items():
        for case in CASES:
            if inductor_only and INDUCTOR not in case.tags:
                continue
            marks = []
            reason = KNOWN_GAPS.get((case.name, door))
            if reason is not None:
                marks.append(pytest.mark.xfail(reason=reason, strict=True))
            yield pytest.param(case, door, id=f"{door}-{case.name}", marks=marks)


@pytest.mark.parametrize("case, door", list(_params()))
def test_matches_eager(case: Case, door: str):
    compile_fn, _ = FRONT_DOORS[door]
    doors, error = REFUSED.get(case.name, ((), ""))
    if door in doors:
        with pytest.raises(Exception, match=error):
            check_case(case, compile_fn)
    else:
        check_case(case, compile_fn)
