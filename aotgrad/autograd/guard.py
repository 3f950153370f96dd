"""The guard of a specialization: what its trace assumed about the lifted tensors, sizes
and scalars, checked before each run.

The clauses (torch's `produce_guards`, read as the engine's lists: `inputs[3].stride()[0]
== inputs[3].size()[1]`) are the definition. They read nothing but the sizes, strides and
storage offsets of some lifted tensors and some lifted sizes and scalars, so values that
equal those of a run where they held hold as well: the check compares those values with
the runs it passed before (`ExactMatch`: the tensors' sizes and strides through one C++
call, `TensorGuards`), and evaluates the clauses only where none matches. A 12-layer MLP's
guard has over 400 clauses; evaluated one by one they cost more than its backward's ops.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

MAX_REMEMBERED = 4  # exact matches kept per guard (say, a few batch sizes in turn)
_READ = re.compile(r"\b(inputs|sizes|scalars)\[(\d+)\](\.(size|stride|storage_offset)\(\))?")
_WHOLE = re.compile(r"\b(inputs|sizes|scalars)\b(?!\[)")  # a list read whole


@dataclass(frozen=True)
class Guard:
    """`check(inputs, sizes, scalars)`: an exact match with a passed run, else the clauses
    (joined into one generated lambda)."""
    clauses: tuple[str, ...]
    check_clauses: Callable[[list, list, list], bool]
    reads: "Reads | None"  # None: a clause reads something else; no shortcut
    remembered: list["ExactMatch"] = field(default_factory=list)

    @staticmethod
    def of(clauses: Sequence[str]) -> "Guard":
        return Guard(tuple(clauses), _compile_check(" and ".join(clauses) or "True"),
                     Reads.of(clauses))

    def check(self, inputs: list, sizes: list, scalars: list) -> bool:
        for match in self.remembered:
            if match(inputs, sizes, scalars):
                return True
        if not self.check_clauses(inputs, sizes, scalars):
            return False
        if self.reads is not None and len(self.remembered) < MAX_REMEMBERED:
            self.remembered.append(ExactMatch.of(self.reads, inputs, sizes, scalars))
        return True

    def first_failure(self, inputs: list, sizes: list, scalars: list) -> str:
        """Which clause failed (a miss's reason: evaluated only then, one by one)."""
        for clause in self.clauses:
            if not _compile_check(clause)(inputs, sizes, scalars):
                return clause
        return "none (all clauses hold)"


def _compile_check(code: str) -> Callable[[list, list, list], bool]:
    from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP
    return eval(compile(f"lambda inputs, sizes, scalars: {code}", "<aotgrad backward guard>",
                        "eval"), dict(SYMPY_INTERP))


@dataclass(frozen=True)
class Reads:
    """Which lifted tensors, sizes and scalars the clauses read (a tensor: only its sizes,
    strides and storage offset)."""
    inputs: tuple[int, ...]
    sizes: tuple[int, ...]
    scalars: tuple[int, ...]

    @staticmethod
    def of(clauses: Sequence[str]) -> "Reads | None":
        read: dict[str, set[int]] = {"inputs": set(), "sizes": set(), "scalars": set()}
        for clause in clauses:
            if "L[" in clause or _WHOLE.search(clause):
                return None  # a source other than the engine's lists, or a whole list
            for found in _READ.finditer(clause):
                kind, index, method = found.group(1), int(found.group(2)), found.group(3)
                if kind == "inputs" and method is None:
                    return None  # a tensor read otherwise: exact sizes may not be enough
                read[kind].add(index)
        return Reads(*(tuple(sorted(read[k])) for k in ("inputs", "sizes", "scalars")))


def _picker(indices: tuple[int, ...]) -> Callable[[Sequence], tuple]:
    """A tuple of the items at `indices` (itemgetter: one C call)."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        index = indices[0]
        return lambda values: (values[index],)
    return operator.itemgetter(*indices)


_offset = torch.Tensor.storage_offset


@dataclass(frozen=True)
class ExactMatch:
    """True where the read values equal those of one run the clauses passed for."""
    pick_tensors: Callable[[Sequence], tuple]
    pick_sizes: Callable[[Sequence], tuple]
    pick_scalars: Callable[[Sequence], tuple]
    layouts: Any  # TensorGuards (sizes, strides; dtype, device... as well: stricter)
    offsets: tuple[int, ...]
    numbers: tuple

    @staticmethod
    def of(reads: Reads, inputs: list, sizes: list, scalars: list) -> "ExactMatch":
        picks = [_picker(i) for i in (reads.inputs, reads.sizes, reads.scalars)]
        tensors = picks[0](inputs)
        return ExactMatch(*picks, _layouts(tensors), tuple(map(_offset, tensors)),
                          (picks[1](sizes), picks[2](scalars)))

    def __call__(self, inputs: list, sizes: list, scalars: list) -> bool:
        tensors = self.pick_tensors(inputs)
        return self.layouts.check(*tensors) and tuple(map(_offset, tensors)) == self.offsets \
            and (self.pick_sizes(sizes), self.pick_scalars(scalars)) == self.numbers


def _layouts(tensors: tuple) -> Any:
    try:
        from torch._C._dynamo.guards import TensorGuards
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)
    except (ImportError, TypeError, RuntimeError):  # its signature is torch's to change
        return _PythonLayouts(tuple((t.shape, t.stride()) for t in tensors))


@dataclass(frozen=True)
class _PythonLayouts:
    layouts: tuple

    def check(self, *tensors: torch.Tensor) -> bool:
        return tuple((t.shape, t.stride()) for t in tensors) == self.layouts


def exact_guard(args: Sequence) -> Guard:
    """A guard that holds for exactly these values: every lifted tensor's geometry, every
    size and scalar (stronger than the traced one, whose every clause read only these)."""
    inputs, sizes, scalars = args[:3]
    # One clause per fact: a failure (a miss's reason) names the one that changed.
    clauses = [clause for i, t in enumerate(inputs) for clause in (
        f"inputs[{i}].size() == {tuple(t.shape)!r}",
        f"inputs[{i}].stride() == {tuple(t.stride())!r}",
        f"inputs[{i}].storage_offset() == {t.storage_offset()}")]
    # (The lists' lengths are the program's: the same at every run of it.)
    clauses += [f"sizes[{i}] == {v!r}" for i, v in enumerate(sizes)]
    clauses += [_equals(f"scalars[{i}]", v) for i, v in enumerate(scalars)]
    return Guard.of(clauses)


def _equals(read: str, value: Any) -> str:
    """`read == value` as guard code (nan equals nothing; inf has no literal)."""
    if isinstance(value, float) and math.isnan(value):
        return f"{read} != {read}"
    if isinstance(value, float) and math.isinf(value):
        return f"{read} == float({str(value)!r})"
    return f"{read} == {value!r}"
