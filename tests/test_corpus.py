"""Every corpus case through every front door, compared against eager by the harness.

Front doors: `aotgrad.compat` with `nop`, `aotgrad.compile` (eager and Inductor backends),
and `torch.compile` with aotgrad as the Dynamo backend (eager and Inductor compilers).
Inductor compiles take seconds, so the Inductor doors run only the cases tagged "inductor".
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

import aotgrad
from aotgrad.compat import aot_function, aot_module, nop
from corpus import CASES, INDUCTOR
from harness import Case, check_case


def compat_nop(target: Callable) -> Callable:
    if isinstance(target, torch.nn.Module):
        return aot_module(target, nop)
    return aot_function(target, nop)


def aotgrad_compile(backend: str) -> Callable:
    return lambda target: aotgrad.compile(target, backend=backend)


def dynamo(backend_factory: Callable) -> Callable:
    def compile_with_dynamo(target: Callable) -> Callable:
        torch._dynamo.reset()  # no graph or guard left over from an earlier case
        return torch.compile(target, backend=backend_factory())
    return compile_with_dynamo


# name -> (compile function, whether it runs only the "inductor" subset)
FRONT_DOORS: dict[str, tuple[Callable, bool]] = {
    "compat-nop": (compat_nop, False),
    "compile-eager": (aotgrad_compile("eager"), False),
    "compile-inductor": (aotgrad_compile("inductor"), True),
    "dynamo-aotgrad-eager": (dynamo(lambda: aotgrad.backend(backend="eager")), False),
    "dynamo-aotgrad-inductor": (dynamo(lambda: "aotgrad"), True),
}

# (case name, front door) -> why it is expected to fail. Only gaps that are not aotgrad's
# to fix (Dynamo's own limitations) belong here; aotgrad bugs stay visible as failures.
# Empty while Dynamo alone passes every case (test_harness.py::test_dynamo_alone_matches_eager).
KNOWN_GAPS: dict[tuple[str, str], str] = {}


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
    check_case(case, compile_fn)
