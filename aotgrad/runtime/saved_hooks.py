"""The caller's saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`) around a call.

Eager packs what each op saves; the compiled node packs what the partition chose to save,
other tensors. A hook that gives back the value it was given (save_on_cpu, checkpoint's, a
logger) leaves the gradients eager's either way. One that changes the value (quantizing
activations) changes eager's gradients through the tensors eager saves, which the compiled
backward cannot repeat. So under a hook of the user's, a fingerprint of each saved value is
kept beside what the hook packed (not the value: an offloading hook still frees its
memory), and what unpack returns must have the same: a different value raises instead of
giving other gradients than eager's. Torch's own hooks and aotgrad's are exact and run
unwrapped.
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
    module = getattr(hooks[0], "__module__", None) if hooks is not None else None
    if hooks is None or (module or "").startswith(_EXACT_PREFIXES):
        return None
    return hooks


def checked(hooks: tuple[Callable, Callable]) -> contextlib.AbstractContextManager:
    """The user's `hooks`, each run once per saved value as before, with unpack's result
    compared to the value packed."""
    pack, unpack = hooks

    def pack_kept(t: torch.Tensor) -> tuple[tuple, Any]:
        return _fingerprint(t), pack(t)

    def unpack_checked(kept: tuple[tuple, Any]) -> torch.Tensor:
        fingerprint, packed = kept
        value = unpack(packed)
        if not isinstance(value, torch.Tensor) or _fingerprint(value) != fingerprint:
            raise RuntimeError(
                f"aotgrad: the saved-tensor unpack hook {_name(unpack)} returned another "
                f"value than its pack hook {_name(pack)} was given. A compiled function "
                "saves other tensors for its backward than eager does, so the gradients "
                "eager gets under a hook that changes values (quantizing, rounding) cannot "
                "be reproduced. Call the function uncompiled under this hook, or use hooks "
                "that give back the values they packed.")
        return value

    return torch.autograd.graph.saved_tensors_hooks(pack_kept, unpack_checked)


def _fingerprint(t: torch.Tensor) -> tuple:
    """Dtype, shape, device and two sums over the elements' bits. Integer sums are exact and
    independent of the order of the elements (a copy of another layout has the same); any
    change of values (a rounding) changes them but by a rare coincidence."""
    if type(t) not in (torch.Tensor, torch.nn.Parameter):  # a subclass: its sizes only
        return t.dtype, t.shape, t.device
    bits = _bits(t.detach())
    if bits.numel() == 0:
        return t.dtype, t.shape, t.device
    # Summed in int64 as read: no int64 copy of a large activation. (On a GPU, `tolist`
    # waits for the device, once per saved value: the price of a hook of the user's.)
    sums = torch.stack([bits.sum(dtype=torch.int64),
                        (bits ^ (bits >> 3)).sum(dtype=torch.int64)]).tolist()
    return t.dtype, t.shape, t.device, *sums


def _bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s elements as integers of their width (a view: no copy)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t.view(torch.uint8)
    if t.is_floating_point():
        return t.view(_INT_OF_SIZE[t.element_size()])
    return t


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _name(hook: Callable) -> str:
    return getattr(hook, "__qualname__", repr(hook))
