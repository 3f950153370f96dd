"""What the compiled module wrapper (api.CompiledModule) must not add to an eager call of
the module it wraps, and what a trace of that module must not share with the caller.

- The global module hooks (`torch.nn.modules.module.register_module_forward_hook` and its
  kin) run at every nn.Module call, the wrapper's too: a forward hook scaling outputs would
  scale them twice (inside the graph, at the user's module, and again on the wrapper's
  output), a pre-hook would shift the input twice, a backward hook would fire once more.
  Eager has no wrapper, so its call runs none of them (`call_as_the_module`).
- `parametrize.cached()` keeps parametrized tensors in one process-wide dict: a trace runs
  with a dict of its own (`parametrizations_cached_apart`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
from torch.nn.modules import module as _module
from torch.nn.utils import parametrize

_GLOBAL_HOOKS = (_module._global_forward_pre_hooks, _module._global_forward_hooks,
                 _module._global_backward_pre_hooks, _module._global_backward_hooks)
_OWN_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")


def call_as_the_module(wrapper: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
    """`wrapper(*args, **kwargs)` running the wrapper's own hooks, not the global ones
    (which its forward runs for the user's modules, as eager does)."""
    if not any(_GLOBAL_HOOKS) or getattr(wrapper, "_compiled_call_impl", None) is not None:
        return torch.nn.Module.__call__(wrapper, *args, **kwargs)
    if not any(getattr(wrapper, name) for name in _OWN_HOOKS):
        return wrapper.forward(*args, **kwargs)  # what Module.__call__ would do, hooks aside
    # Hooks of the wrapper's own: torch runs them with the global ones, so those are hidden
    # around the wrapper's call and shown again around its forward. (Another thread's
    # module call meanwhile misses them: only where both kinds of hooks are set.)
    forward = type(wrapper).forward.__get__(wrapper)
    vars(wrapper)["forward"] = _with_global_hooks(forward)
    try:
        with _global_hooks_hidden():
            return torch.nn.Module.__call__(wrapper, *args, **kwargs)
    finally:
        del vars(wrapper)["forward"]


def _with_global_hooks(forward: Callable) -> Callable:
    def shown(*args, **kwargs):
        with _global_hooks_shown():
            return forward(*args, **kwargs)
    return shown


_HIDDEN: list = []  # the hooks hidden (None while shown), innermost wrapper call last


@contextlib.contextmanager
def _global_hooks_hidden():
    _HIDDEN.append(_take())
    try:
        yield
    finally:
        _put(_HIDDEN.pop())


@contextlib.contextmanager
def _global_hooks_shown():
    if _HIDDEN[-1] is None:  # shown already: forward calls itself (compiling again)
        yield
        return
    _put(_HIDDEN[-1])
    _HIDDEN[-1] = None
    try:
        yield
    finally:
        _HIDDEN[-1] = _take()


def _take() -> list[dict]:
    taken = [dict(hooks) for hooks in _GLOBAL_HOOKS]
    for hooks in _GLOBAL_HOOKS:
        hooks.clear()
    return taken


def _put(taken: list[dict]) -> None:
    """Back in their order, before any registered while they were away."""
    for hooks, before in zip(_GLOBAL_HOOKS, taken):
        added = dict(hooks)
        hooks.clear()
        hooks.update(before)
        hooks.update(added)


@contextlib.contextmanager
def parametrizations_cached_apart(caching: bool):
    """Trace parametrized tensors with a cache of the trace's own, on where the caller's
    `parametrize.cached()` is. The caller's dict is process-wide: a trace would store its
    fake tensors there (the caller's parametrized weight, read later, would be a FakeTensor)
    or read a real tensor cached before the call (a constant the graph would keep). With a
    dict of its own, a forward reading a weight twice computes it once, as eager does under
    `cached()`: a stateful parametrization (spectral_norm's power iteration) steps once.
    Whether caching is on (`caching`) is a part of the call's signature (api.CompiledModule).
    Eager keeps a value cached across calls in one `cached()` block, computed before an
    in-place change of its original; each compiled call computes it from the original."""
    enabled, cache = parametrize._cache_enabled, parametrize._cache
    parametrize._cache_enabled, parametrize._cache = int(caching), {}
    try:
        yield
    finally:
        parametrize._cache_enabled, parametrize._cache = enabled, cache


@contextlib.contextmanager
def parametrizations_uncached():
    """Around a compile of a function (which traces it more than once, each trace needing a
    cache of its own): the modules it reads compute parametrized tensors at each read."""
    with parametrizations_cached_apart(False):
        yield


def parametrize_caching() -> bool:
    return parametrize._cache_enabled > 0
