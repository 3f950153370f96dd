"""Which names the modules hold in `_parameters`, `_buffers` and `_modules`, as at the
compile: a part of what `module_guard.ModuleAttributes` compares at each call."""

from __future__ import annotations

import itertools
import operator
from typing import Any

import torch

REGISTRIES = {"_parameters": "parameter", "_buffers": "buffer", "_modules": "submodule"}
GONE = object()
_NONES = itertools.repeat(None)  # never exhausted: map stops at its other iterables' end


class RegisteredNames:
    """The names the modules hold in `_parameters`, `_buffers` and `_modules`, and which of
    the first two's hold None, as at the compile. Checked at every call, so in C loops
    (`map`), not Python ones: the names' count over all the dicts, that each name is still
    there, that each None is still None; together they say the names are the same. (An
    existing entry's object is compared only where it was tied to another's: parameters and
    buffers are read at each call, submodules are `ModuleAttributes.edges`.) A dict replaced
    whole is not seen, nor a reordering of the same names; torch's own `del seq[i]` first
    deletes from the old dict."""

    def __init__(self, named: list[tuple[str, torch.nn.Module]]):
        self.registries = [(path, kind, getattr(m, kind), dict(getattr(m, kind)))
                           for path, m in named for kind in REGISTRIES]
        self.dicts = [d for _, _, d, _ in self.registries]
        self.count = sum(map(len, self.dicts))
        state = [(d, n, v) for _, kind, d, before in self.registries if kind != "_modules"
                 for n, v in before.items()]
        self.state_dicts, self.state_names = [d for d, _, _ in state], [n for _, n, _ in state]
        self.none_dicts = [d for d, _, v in state if v is None]
        self.none_names = [n for _, n, v in state if v is None]
        # Names that held one tensor (tied weights, `head.weight = emb.weight`): the graphs
        # read it once, by its first name, so a name given a tensor of its own was not read.
        first: dict[int, int] = {}
        tied = [(first.setdefault(id(v), k), k) for k, (_, _, v) in enumerate(state)
                if v is not None]
        tied = [(state[i], state[k]) for i, k in tied if i != k]
        self.tied = [[pair[k][j] for pair in tied] for k in (0, 1) for j in (0, 1)] if tied \
            else None

    def changed(self) -> str | None:
        """Which name changed, in words; None if none did."""
        if (sum(map(len, self.dicts)) != self.count
                or not all(map(operator.contains, self.state_dicts, self.state_names))
                or not all(map(operator.is_,  # each name is there, by the check before
                               map(operator.getitem, self.none_dicts, self.none_names),
                               _NONES))):
            return self._which()
        if self.tied is not None:
            dicts, names, tied_dicts, tied_names = self.tied
            if not all(map(operator.is_, map(operator.getitem, dicts, names),
                           map(operator.getitem, tied_dicts, tied_names))):
                return "a parameter or buffer tied to another at the compile, set apart"
        return None

    def _which(self) -> str:
        """The first difference, found the slow way (once per change)."""
        for path, kind, now, before in self.registries:
            for name in [*now, *before]:
                what = _name_change(before.get(name, GONE), now.get(name, GONE))
                if what is not None:
                    full = f"{path}.{name}" if path else name
                    return f"{REGISTRIES[kind]} {full!r} ({what})"
        return "the parameters, buffers or submodules"  # not reached: the checks agree


def _name_change(before: Any, now: Any) -> str | None:
    if before is GONE and now is not GONE:
        return "added"
    if now is GONE and before is not GONE:
        return "removed"
    if before is None and now is not None:
        return "None at the compile"
    return None
