"""`x.set_(y)` on an input inside the function: the input ends on another storage.

Functionalization replaces the input's storage by the source's (`_functionalize_was_storage_
changed`), so the graph computes every later use of the input from the source's values. What
it cannot do is make the caller's tensor use that storage: the runtime does, with `set_()`
after the graph ran. Where the storage comes from decides how (`StorageSwap`):

- another input's storage (`x.set_(y)`, `x.set_(y[2:])`): the runtime calls `x.set_` on that
  input's storage, with the geometry `x` ended with, so that `x` shares memory with `y` as in
  eager;
- a tensor made inside (`x.set_(y * 2)`, `x.set_(torch.zeros(4))`): the graph returns it,
  after its other outputs, and the runtime sets `x` to it.

Refused, naming the construct: a swap that autograd would have to follow (eager has no
derivative for `set_`), a write into the input's old memory before the swap (whoever else
holds that memory would see it in eager), a source that itself swaps its storage, tensor
subclass inputs, and an input sharing memory with another input that the function mutates
(aliasing.py would merge the two). With dynamic shapes, the function is compiled for static
shapes. Dynamo runs `set_()` itself, between two graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils._mode_utils import no_dispatch

from .dynamic import DynamicShapesUnsupported, geometry, is_symbolic
from ..schema import Geometry, StorageSwap

SET_FROM_TENSOR = torch.ops.aten.set_.source_Tensor


def mirror_set_on_wrapper(args: Sequence[Any]) -> None:
    """After functionalization ran `x.set_(y)`, give the Python wrapper of `x` the size,
    strides and storage of the wrapper of `y` as well: PyTorch updates only the tensor
    inside, and code after the `set_` would read `x.shape` as it was before."""
    if is_symbolic(args[0]) or is_symbolic(args[1]):  # the kernel wants concrete sizes
        raise DynamicShapesUnsupported("aotgrad: set_() of an input is compiled for static "
                                       "shapes only.")
    with no_dispatch():
        torch.Tensor.set_(args[0], args[1])


class SetCalls:
    """What functionalization saw of `set_()`: per tensor (by id), whether its memory had
    been written (through it, a view or `.data`) at its first `set_`. Such a write stays in
    its old memory, where the runtime cannot replay it. Also the tensors whose `set_` autograd
    saw (grad mode on, a tensor requiring grad): eager's backward through them has no
    derivative."""

    def __init__(self):
        self.written_before: dict[int, bool] = {}
        self.seen_by_autograd: set[int] = set()

    def record(self, args: Sequence[Any]) -> None:
        written = torch._functionalize_mutation_counter(args[0].elem) > 0
        self.written_before.setdefault(id(args[0]), written)
        # Read below autograd, where grad mode is still the caller's.
        if torch.is_grad_enabled() and (args[0].requires_grad or args[1].requires_grad):
            self.seen_by_autograd.add(id(args[0]))


@dataclass(frozen=True)
class Original:
    """An input's storage and geometry before the call."""

    storage: int
    geometry: Geometry


def originals(tensors: Sequence[Any]) -> list[Original | None]:
    return [Original(t.untyped_storage()._cdata, geometry(t))
            if isinstance(t, torch.Tensor) else None for t in tensors]


def was_swapped(inner: Sequence[torch.Tensor]) -> bool:
    return any(torch._functionalize_was_storage_changed(t.elem) for t in inner)


def find_swap(i: int, f_args: Sequence[Any], before: Sequence[Original | None],
              set_calls: SetCalls, requires_grad: bool) -> StorageSwap:
    """How input `i`, whose storage the function swapped, ends; refuses what the runtime
    cannot replay."""
    a = f_args[i]
    _refuse(i, a, set_calls, requires_grad, before[i].geometry)
    source = _source(i, a.untyped_storage()._cdata, before)
    if source is None:
        return StorageSwap(None)
    if source != i and torch._functionalize_was_storage_changed(f_args[source].elem):
        raise _refusal(i, f"to input {source}, which the function also calls set_() on")
    return StorageSwap(source, _relative_geometry(geometry(a), before[source].geometry))


def _source(i: int, storage: int, before: Sequence[Original | None]) -> int | None:
    """The input whose storage `storage` was before the call: `i` itself, if it was its own
    (`x.set_(x[1:])`)."""
    owners = [j for j, o in enumerate(before) if o is not None and o.storage == storage]
    return i if i in owners else next(iter(owners), None)


def _refuse(i: int, a: Any, set_calls: SetCalls, requires_grad: bool,
            old: Geometry) -> None:
    if not hasattr(a, "elem"):
        raise _refusal(i, "on a tensor subclass input")
    if id(a) in set_calls.seen_by_autograd:
        raise _refusal(i, "with grad mode on, where the input or the new tensor requires grad "
                       "(eager has no derivative for set_; under torch.no_grad() it is "
                       "supported)")
    # Under no_grad autograd keeps the input as it was: its gradient flows to the caller's
    # tensor, which must keep the shape the compiled graph's autograd node was given.
    if requires_grad and geometry(a)[0] != old[0]:
        raise _refusal(i, f"changing the shape of an input that requires grad (from "
                       f"{tuple(old[0])} to {tuple(a.shape)}): its gradient would not have "
                       "the shape the call's autograd node expects")
    if set_calls.written_before.get(id(a), True):  # True also when the set_ call went unseen
        raise _refusal(i, "after writing into the input's memory (eager leaves that write "
                       "in the old memory)")


def _relative_geometry(geometry: Geometry, source: Geometry) -> Geometry | None:
    """The geometry, its offset from the source's; None when it is the source's own."""
    if geometry == source:
        return None
    size, stride, offset = geometry
    return size, stride, offset - source[2]


def _refusal(i: int, what: str) -> NotImplementedError:
    return NotImplementedError(
        f"aotgrad: the function calls set_() on input {i} {what}; that is not supported. "
        "Call set_ outside the compiled function (return the new tensor and set_ the input "
        "to it after the call), or copy_ the new values in.")


def set_storage(t: torch.Tensor, swap: StorageSwap, source: torch.Tensor) -> None:
    """`t.set_()` to `source` as the function did (outside autograd: nothing to follow)."""
    with torch.no_grad():
        if swap.geometry is None:
            t.set_(source)
        else:
            size, stride, offset = swap.geometry
            t.set_(source.untyped_storage(), source.storage_offset() + offset, size, stride)
