"""The plain attributes a module's forward (or a hook of it) sets: `self.calls += 1`,
`self.last_batch = x.shape[0]`, an item appended to a list attribute.

`aotgrad.compile(module)` runs forward's Python only while it traces, and more than once
per compile (the analysis, then the joint trace). So each run after the first starts from
the attributes as they were before the first (`ForwardWrites.start`): the call leaves them
as one eager call does. A graph traced from a forward that changed an attribute baked the
old value and would not change it again, so the compiled module compiles again at its next
call (api.CompiledModule), as for any attribute changed between calls; a forward that sets
the value it already holds (`self.ready = True`) changes nothing and keeps its graphs.
Tensors are left to module_guard (a traced tensor stored is refused, or returned where
torch's hooks store it).
"""

from __future__ import annotations

from typing import Any

import torch

from .module_guard import contents_of, unchanged

_GONE = object()
_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


# nn.Module's own bookkeeping (parameters, hooks...): swapped for each trace, guarded by
# module_guard; forward's writes are to the user's attributes.
_INTERNAL = frozenset(vars(torch.nn.Module()))


class ForwardWrites:
    """What the traced runs of forward changed in the attributes of `modules`: (attribute
    dict, name, value before the run, its items before). Each run compares with the
    attributes as it found them: the tensors swapped in for a trace differ between runs."""

    def __init__(self, modules: list[torch.nn.Module]):
        self.modules = modules
        self.written: list[tuple[dict, str, Any, tuple | None]] = []

    def start(self) -> None:
        """Before a run: the attributes as the first run found them, then noted."""
        self._undo()
        self.before = [(vars(m), {n: v for n, v in vars(m).items() if n not in _INTERNAL})
                       for m in self.modules]
        self.items = {(id(d), n): contents_of(v) for d, snap in self.before
                      for n, v in snap.items() if not isinstance(v, torch.Tensor)}

    def record(self) -> None:
        """After a run: what it changed; a symbolic size it stored becomes this call's."""
        self.written = [w for d, snap in self.before for w in self._changed(d, snap)]
        for attributes, name, _, _ in self.written:
            if name in attributes:
                attributes[name] = _concrete(attributes[name], name)

    def _changed(self, attributes: dict, snap: dict) -> list:
        names = [*snap, *(n for n in attributes if n not in snap and n not in _INTERNAL)]
        return [(attributes, n, snap.get(n, _GONE), self.items.get((id(attributes), n)))
                for n in names if not self._same(attributes, n, snap.get(n, _GONE))]

    def _same(self, attributes: dict, name: str, before: Any) -> bool:
        now = attributes.get(name, _GONE)
        if isinstance(now, torch.Tensor) and isinstance(before, (torch.Tensor, type(None))):
            return True  # module_guard's: a tensor stored (or a hook's weight)
        return unchanged(now, before, self.items.get((id(attributes), name)))

    def _undo(self) -> None:
        for attributes, name, before, items in self.written:
            if before is _GONE:
                attributes.pop(name, None)
                continue
            attributes[name] = before
            if items is None:  # not a short plain list or dict: rebound, not changed inside
                continue
            if type(before) is list:
                before[:] = items
            elif type(before) is dict:
                half = len(items) // 2
                before.clear()
                before.update(zip(items[:half], items[half:]))

    def describe(self) -> str | None:
        """The first attribute changed, in words; None if forward changed none."""
        if not self.written:
            return None
        return f"attribute {self.written[0][1]!r}, set by forward"


def _concrete(value: Any, name: str) -> Any:
    """A size stored while traced with dynamic shapes (`x.shape[0]`, `tuple(x.shape)`, an
    item appended to a list): this call's, which eager stores. A list or dict in place."""
    if isinstance(value, _SYMBOLIC):
        return _hint(value, name)
    if type(value) in (tuple, torch.Size):
        return type(value)(_concrete(v, name) for v in value)
    if type(value) is list:
        value[:] = [_hint(v, name) if isinstance(v, _SYMBOLIC) else v for v in value]
    elif type(value) is dict:
        value.update({k: _hint(v, name) for k, v in value.items() if isinstance(v, _SYMBOLIC)})
    return value


def _hint(value: Any, name: str) -> Any:
    hint = value.node.hint
    if hint is None:
        raise NotImplementedError(
            f"aotgrad: forward stores a value that depends on tensor data in the attribute "
            f"{name!r}; the compiled module cannot set it at each call. Return it instead.")
    return {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}[type(value)](hint)
