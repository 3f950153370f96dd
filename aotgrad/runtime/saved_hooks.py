"""The caller's saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`) around a call.

Eager packs what each op saves; the compiled node packs what the partition chose to save,
other tensors. A hook that gives back the value it was given (save_on_cpu, checkpoint's, a
logger) leaves the gradients eager's either way. One that changes the value (quantizing
activations) changes eager's gradients through the tensors eager saves, which the compiled
backward cannot repeat. So under a hook of the user's, each saved value is kept beside what
the hook packed, and what unpack returns is compared with it: a different value raises
instead of giving other gradients than eager's. Torch's own hooks and aotgrad's are exact
and run unwrapped (keeping the values would undo the memory they free).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_EXACT_PREFIXES = ("torch.", "aotgrad.")  # modules whose hooks return the value they packed


def users_hooks() -> tuple[Callable, Callable] | None:
    """The innermost (pack, unpack) hooks if they are the user's own, else None."""
    hooks = _top_hooks(False)
    if hooks is None or getattr(hooks[0], "__module__", "").startswith(_EXACT_PREFIXES):
        return None
    return hooks


def checked(hooks: tuple[Callable, Callable]) -> contextlib.AbstractContextManager:
    """The user's `hooks`, each run once per saved value as before, with unpack's result
    compared to the value packed."""
    pack, unpack = hooks

    def pack_kept(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
        return t.detach(), pack(t)

    def unpack_checked(kept: tuple[torch.Tensor, Any]) -> torch.Tensor:
        saved, packed = kept
        value = unpack(packed)
        if not _same(value, saved):
            raise RuntimeError(
                f"aotgrad: the saved-tensor unpack hook {_name(unpack)} returned another "
                f"value than its pack hook {_name(pack)} was given. A compiled function "
                "saves other tensors for its backward than eager does, so the gradients "
                "eager gets under a hook that changes values (quantizing, rounding) cannot "
                "be reproduced. Call the function uncompiled under this hook, or use hooks "
                "that give back the values they packed.")
        return value

    return torch.autograd.graph.saved_tensors_hooks(pack_kept, unpack_checked)


def _same(value: Any, saved: torch.Tensor) -> bool:
    """Same dtype, shape, device and values (NaN where NaN)."""
    if not isinstance(value, torch.Tensor) or value.dtype != saved.dtype or \
            value.shape != saved.shape or value.device != saved.device:
        return False
    if value.data_ptr() == saved.data_ptr() and value.stride() == saved.stride():
        return True  # the tensor itself, or a view of it over the same elements
    return bool(torch.eq(value, saved).logical_or_(value.isnan() & saved.isnan()).all()) \
        if value.is_floating_point() or value.is_complex() else torch.equal(value, saved)


def _name(hook: Callable) -> str:
    return getattr(hook, "__qualname__", repr(hook))
