"""What `aotgrad.compile(module)`'s graphs took as given beyond the parameters and buffers,
compared at each call: a change compiles the module again (api.CompiledModule), instead of
running graphs that baked the old state. torch.compile guards the same things (Dynamo's
guards); the argument guards are runtime/guards.py.

- which submodule sits where, and its class (`parametrize` swaps it);
- the attributes forward may read as constants: numbers (a `scale`, a dropout's `p`),
  strings, None, and plain (unregistered) tensor attributes, by identity;
- the module hooks, and the global ones: a hook registered anywhere bumps one counter of
  torch's (`RemovableHandle.next_id`), checked first; the hook dicts that held hooks at the
  compile are compared whole, so that a removal is seen too.

`hooks_checked` refuses, during a trace, the hooks whose effects a graph cannot keep.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable

import torch
from torch.nn.modules import module as module_hooks
from torch.utils.hooks import RemovableHandle

_CONSTANTS = (bool, int, float, str, type(None), torch.Tensor)
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GONE = object()


class ModuleAttributes:
    def __init__(self, module: torch.nn.Module):
        modules = list(module.modules())
        self.edges = [(m._modules, n, c, type(c)) for m in modules
                      for n, c in m._modules.items()]
        self.values = [(vars(m), n, v) for m in modules for n, v in vars(m).items()
                       if isinstance(v, _CONSTANTS) and not n.startswith("_")
                       and n != "training"]
        self.hook_dicts = [getattr(m, h) for m in modules for h in _HOOK_DICTS] + [
            module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks,
            module_hooks._global_backward_pre_hooks, module_hooks._global_backward_hooks]
        self.hooked = _hooked(self.hook_dicts)
        self.next_hook = RemovableHandle.next_id

    def changed(self) -> str | None:
        """What changed, in words; None if nothing did."""
        for parent, name, child, cls in self.edges:
            if parent.get(name) is not child or type(child) is not cls:
                return f"submodule {name!r}"
        for owner, name, value in self.values:
            now = owner.get(name, _GONE)
            if now is not value and not (type(now) is type(value) and
                                         not isinstance(value, torch.Tensor) and now == value):
                return f"attribute {name!r}"
        return self._hooks_changed()

    def _hooks_changed(self) -> str | None:
        for hooks, keys in self.hooked:
            if tuple(hooks) != keys:
                return "a module hook"
        if RemovableHandle.next_id != self.next_hook:  # a hook registered somewhere
            if _hooked(self.hook_dicts) != self.hooked:
                return "a module hook"
            self.next_hook = RemovableHandle.next_id  # a tensor's, or another module's
        return None


def _hooked(dicts: list) -> list:
    return [(d, tuple(d)) for d in dicts if d]


@contextlib.contextmanager
def hooks_checked(hook_dicts: list):
    """Around a trace of a compiled module: each hook of the user's that returns nothing is
    refused. What such a hook does, it does to something else than the module's tensors (a
    list of features, a log of gradients), once, on the trace's fake tensors, and never at
    run time: the user would get fake tensors where eager gives values. A hook that returns
    a value transforms it, which the graph keeps (torch's own hooks are trusted)."""
    originals = [(hooks, dict(hooks)) for hooks in hook_dicts if hooks]
    for hooks, before in originals:
        for key, hook in before.items():
            if not _is_torchs(hook):
                hooks[key] = _returning(hook)
    try:
        yield
    finally:
        for hooks, before in originals:
            hooks.update(before)


def _returning(hook: Callable) -> Callable:
    @functools.wraps(hook)
    def checked(*args, **kwargs):
        out = hook(*args, **kwargs)
        if out is None:
            name = getattr(hook, "__qualname__", type(hook).__qualname__)
            raise NotImplementedError(
                f"aotgrad: the module hook {name} returns nothing: what it does instead (a "
                "list it appends to, a log) would happen once, while aotgrad.compile traces "
                "the module on fake tensors, and never when the compiled module runs. Use "
                "torch.compile(backend='aotgrad'), which runs it; or, if it only transforms "
                "the value it is given, return the value.")
        return out
    return checked


def _is_torchs(hook: Callable) -> bool:
    """A hook torch registers (spectral_norm's, parametrizations'): its effects are traced."""
    hook = getattr(hook, "func", hook)  # functools.partial
    module = getattr(hook, "__module__", None) or type(hook).__module__
    return module == "torch" or module.startswith("torch.")
