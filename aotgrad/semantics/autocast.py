"""Autocast's cast cache, as eager has it.

Inside an autocast region, eager casts a float32 leaf that requires grad (a parameter) once
and reuses that cast at its every use; the gradients of the uses add up in the lower
precision, then one cast back gives the leaf's. make_fx turns the cache off, so a plain trace
casts at each use and adds the gradients in float32: a layer called twice under autocast got
other gradients than eager's, silently. The joint trace and the double backward's replay run
with the cache as the caller has it (`with_autocast_cache`), where that matches eager
(`eager_cast_cache`). The analysis runs with it off: its entries, keyed by the fake inputs a
later trace takes again, would hand that trace a cast it never recorded (a constant). A
reentrant checkpoint's region casts on its own, as eager's rerun in the backward does.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch

from ..schema import FunctionInfo


@contextlib.contextmanager
def autocast_cache(enabled: bool):
    """Autocast's cast cache on or off for a while (`torch.autocast(cache_enabled=None)`
    regions inside read it)."""
    previous = torch.is_autocast_cache_enabled()
    torch.set_autocast_cache_enabled(enabled)
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(previous)


def with_autocast_cache(fn: Callable, enabled: bool) -> Callable:
    """`fn`, run with autocast's cast cache on or off."""
    @functools.wraps(fn)
    def cached(*args):
        with autocast_cache(enabled):
            return fn(*args)
    return cached


def eager_cast_cache(info: FunctionInfo) -> bool:
    """Whether a trace of the plain inputs casts as eager does with the cache on: where every
    input that requires grad is a leaf. The cache reuses the casts of the trace's inputs,
    leaves all, and eager's only of its leaves: its casts of a non-leaf input are one per
    use, whose gradients add up in float32. A functionalized joint wraps the inputs as leaves
    only where the caller's are (`joint.leaf_wrappers`): it keeps the cache whatever the
    inputs, and takes a call under autocast with a non-leaf input that requires grad
    (`capture.pure`). (The guards check the leafness these read: runtime/guards.py.)"""
    return all(x.is_leaf for x in info.inputs if x.requires_grad)


def autocast_on() -> bool:
    """Is a caller's autocast region open, on any device a compiled call runs on?"""
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")
