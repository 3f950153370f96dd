"""Compiled autograd: the whole backward pass, captured when `.backward()` (or
`torch.autograd.grad`) runs, as one FX graph that a compiler sees at once.

    with aotgrad.compiled_autograd.enable("eager"):
        loss.backward()

Modules: `api.py` (enable, the session, the eager fallback), `capture.py` (the instance the
engine calls: it records the backward as a program), `specialize.py` (the program traced
for a run's sizes, guarded; `layouts.py`, `undefined.py` and `ready.py`: passes over that
graph, a Python call's result in the traced layout, eager's None gradients, eager's order
of the accumulations one node readies), `inductor.py` (`enable("inductor")`: its ATen
segments compiled), `hooks.py` (what the graph calls at run time), `cache.py` (keys, miss
reasons), `state.py` (the flag call.py reads, importable alone: this package loads the
rest on first use).
"""

import importlib

__all__ = ["enable", "Stats", "Uncapturable"]
_HOME = {"enable": "api", "Stats": "api", "Uncapturable": "capture"}


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'aotgrad.compiled_autograd' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
