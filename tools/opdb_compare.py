"""How the op-database sweep compares a compiled call with eager: outputs, aliasing, strides,
gradients (`tools/opdb_sweep.py`). A difference raises `Mismatch`, named by what differs; a
sample that cannot be compared raises `Skip`; a bug in the comparison itself, `SweepError`."""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch.multiprocessing.reductions import StorageWeakRef


class Skip(Exception):
    """The sample cannot be compared; the message says why."""


class Mismatch(AssertionError):
    """Compiled and eager disagree; `group` names what differs."""

    def __init__(self, group: str, detail: str):
        super().__init__(f"{group}: {detail}")
        self.group = group


class SweepError(Exception):
    """The sweep's own comparison code broke: a bug here, not in aotgrad."""


def comparison(compare: Callable) -> Callable:
    """Keep the sweep's own bugs out of aotgrad's failure groups."""
    @functools.wraps(compare)
    def checked(*args, **kwargs):
        try:
            return compare(*args, **kwargs)
        except Mismatch:
            raise
        except Exception as exc:
            raise SweepError(f"{compare.__name__}: {type(exc).__name__}: {exc}") from exc
    return checked


# Non-tensor output leaves compared with ==.
_PLAIN_LEAVES = (bool, int, float, complex, str, type(None), torch.Size, torch.dtype,
                 torch.device)


def require_comparable(out: Any) -> None:
    for leaf in pytree.tree_leaves(out):
        if isinstance(leaf, torch.Tensor):
            if leaf.layout != torch.strided:
                raise Skip(f"output not comparable: {leaf.layout}")
        elif not isinstance(leaf, _PLAIN_LEAVES):
            raise Skip(f"output not comparable: {type(leaf).__name__}")


@comparison
def compare_outputs(actual: Any, expected: Any, tolerance) -> None:
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    if a_spec != e_spec:
        raise Mismatch("mismatch: output structure", f"{a_spec} != {e_spec}")
    compare_values(a_leaves, e_leaves, tolerance, "mismatch: forward")
    for i, (a, e) in enumerate(zip(a_leaves, e_leaves)):
        if isinstance(e, torch.Tensor) and a.requires_grad != e.requires_grad:
            raise Mismatch("mismatch: requires_grad",
                           f"output {i}: {a.requires_grad}, eager {e.requires_grad}")


@comparison
def compare_values(actual: Sequence, expected: Sequence, tolerance, group: str) -> None:
    rtol, atol = tolerance
    for i, (a, e) in enumerate(zip(actual, expected)):
        try:
            if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
                torch.testing.assert_close(_plain(a), _plain(e), rtol=rtol, atol=atol,
                                           equal_nan=True)
            elif a != e and not (isinstance(e, float) and e != e and a != a):  # NaN == NaN
                raise AssertionError(f"{a!r} != {e!r}")
        except (AssertionError, TypeError, ValueError) as err:
            raise Mismatch(group, f"leaf {i}: {err}") from None


def _plain(t: Any) -> Any:
    return t.detach() if isinstance(t, torch.Tensor) else t


@comparison
def compare_aliasing(compiled: tuple, eager: tuple) -> None:
    """Each output shares memory with the same inputs and earlier outputs as in eager: views
    stay views, fresh tensors stay fresh."""
    actual, expected = alias_pattern(*compiled), alias_pattern(*eager)
    if actual != expected:
        raise Mismatch("mismatch: aliasing", f"{actual}, eager {expected}")


def alias_pattern(out: Any, inputs: Sequence[torch.Tensor]) -> list[tuple]:
    """Per tensor output, (inputs it shares storage with, earlier outputs it does)."""
    input_storages = [_storage(t) for t in inputs]
    seen: list = []
    pattern = []
    for t in pytree.tree_leaves(out):
        if isinstance(t, torch.Tensor):
            s = _storage(t)
            pattern.append((tuple(i for i, x in enumerate(input_storages) if _same(x, s)),
                            tuple(j for j, x in enumerate(seen) if _same(x, s))))
            seen.append(s)
    return pattern


def _storage(t: torch.Tensor):
    """The storage's identity; None for empty or storage-less tensors, which alias nothing."""
    if t.layout != torch.strided or t.untyped_storage().nbytes() == 0:
        return None
    return StorageWeakRef(t.untyped_storage())


def _same(a, b) -> bool:
    return a is not None and b is not None and a == b


@comparison
def compare_strides(actual: Any, expected: Any) -> None:
    """Last: a stride difference matters only once the values agree."""
    for i, (a, e) in enumerate(zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected))):
        if isinstance(e, torch.Tensor) and e.numel() > 1 and a.stride() != e.stride():
            raise Mismatch("mismatch: strides", f"output {i}: {a.stride()}, eager {e.stride()}")


def compare_grads(sample, compiled: tuple, eager: tuple, tolerance) -> None:
    """Gradients of sum(out * w) over the differentiable outputs, w fixed and random.
    Nothing to compare when no output is differentiable or eager's backward raises."""
    outs = differentiable_outputs(sample, eager[0])
    wrt = [t for t in eager[1] if t.requires_grad]
    if not outs or not wrt:
        return
    weights = fixed_weights(outs)
    try:
        expected = input_grads(outs, weights, wrt)
    except Exception:
        return
    actual = input_grads(differentiable_outputs(sample, compiled[0]), weights,
                         [t for t in compiled[1] if t.requires_grad])
    compare_grad_lists(actual, expected, tolerance, "grad")


def compare_grad_lists(actual: Sequence, expected: Sequence, tolerance, what: str) -> None:
    for i, (a, e) in enumerate(zip(actual, expected)):
        if (a is None) != (e is None):
            raise Mismatch(f"mismatch: {what} is None in one only",
                           f"input {i}: {'None' if a is None else 'tensor'}, eager "
                           f"{'None' if e is None else 'tensor'}")
    compare_values(actual, expected, tolerance, f"mismatch: {what}")


def differentiable_outputs(sample, out: Any) -> list[torch.Tensor]:
    """Floating outputs that require grad, after the sample's own output post-processing
    (which drops gauge-dependent parts, such as the phases of eigenvectors)."""
    return [t for t in pytree.tree_leaves(sample.output_process_fn_grad(out))
            if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def fixed_weights(outs: Sequence[torch.Tensor], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=o.real.dtype if o.is_complex() else o.dtype)
            for o in outs]


def input_grads(outs, weights, wrt, create_graph: bool = False) -> tuple:
    loss = sum(((o * w).real if o.is_complex() else o * w).sum() for o, w in zip(outs, weights))
    return torch.autograd.grad(loss, wrt, allow_unused=True, create_graph=create_graph)
