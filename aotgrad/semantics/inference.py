"""Views under `torch.inference_mode()` of tensors that are not inference tensors.

Eager makes them views (autograd's view tracking, `ADInplaceOrView`, still runs for a
normal tensor in inference mode) that keep the base's `requires_grad` and refuse a later
in-place change outside inference mode. A trace on fake tensors loses that two ways:

- inference mode skips the autograd keys, where composite view ops (`view_as`, `reshape`,
  `flatten`, `.T`, `movedim`, `unflatten`, `expand_as`...) decompose, so such an op reaches
  a Python mode whole, below view tracking: the mode's result is no view (eager's CPU kernel
  decomposes it and dispatches the parts from the top). `decompose_tracking_views` does so
  with view tracking turned back on for the parts.
- functionalization wraps each result in a new `FunctionalTensor`, made in inference mode:
  an inference tensor, which view tracking cannot tie to its base's version counter
  ("Cannot set version_counter for inference tensor"). `normal_views` wraps a view of a
  normal tensor again outside inference mode, as eager's view shares its base's kind.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.functional_tensor import FunctionalTensor

_VIEW_TRACKING = torch._C.DispatchKey.ADInplaceOrView


def _decomposes_below_view_tracking(func: Any) -> bool:
    """A composite op that eager decomposes, without view tracking of its own."""
    if not isinstance(func, torch._ops.OpOverload):
        return False
    name = func.name()
    return (torch._C._dispatch_has_kernel(name) and func._can_decompose() and
            not torch._C._dispatch_has_kernel_for_dispatch_key(name, "ADInplaceOrView"))


def decompose_tracking_views(mode: Any, func: Any, args: tuple, kwargs: dict | None) -> Any:
    """Inside `mode.__torch_dispatch__`: a composite op decomposed with view tracking on (as
    eager's kernel does under inference mode), or NotImplemented where that is not needed.
    (A mode runs with the keys above it excluded: view tracking among them.)"""
    if not torch.is_inference_mode_enabled() or not _decomposes_below_view_tracking(func):
        return NotImplemented
    included = torch._C._dispatch_tls_local_include_set()
    excluded = torch._C._dispatch_tls_local_exclude_set().remove(_VIEW_TRACKING)
    with torch._C._ForceDispatchKeyGuard(included, excluded), mode:
        return func.decompose(*args, **(kwargs or {}))


def normal_views(func: Any, args: tuple, out: Any, mode: Any) -> Any:
    """A functionalized view op's result, wrapped as a normal tensor where its base is one."""
    if not (torch.is_inference_mode_enabled() and getattr(func, "is_view", False)):
        return out
    base = args[0] if args else None
    if not isinstance(base, FunctionalTensor) or base.is_inference():
        return out
    return pytree.tree_map_only(FunctionalTensor, lambda t: _normal_wrapper(t, mode), out)


def _normal_wrapper(t: FunctionalTensor, mode: Any) -> FunctionalTensor:
    if not t.is_inference():
        return t
    with torch.inference_mode(False):
        return FunctionalTensor(t.elem, mode)
