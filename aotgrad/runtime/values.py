"""How the guards compare what a compiled function or module read besides its arguments:
numbers and strings by value, short plain lists and dicts item by item, the rest by
identity (runtime/module_guard.py); and a function's own parts, read live."""

from __future__ import annotations

import types
from typing import Any

# A plain list or dict read as a whole (a closed-over `scale = [2.0]`, a global config dict)
# is also compared item by item, up to this many items: its items are what the graphs took.
CONTAINER_ITEMS = 32


def contents_of(value: Any) -> tuple | None:
    """A plain list's items, or a plain dict's keys and items, as they are now; None for
    anything else, or a longer one (compared by identity only)."""
    if type(value) is list and len(value) <= CONTAINER_ITEMS:
        return tuple(value)
    if type(value) is dict and len(value) <= CONTAINER_ITEMS:
        return (*value, *value.values())
    return None


def unchanged(now: Any, value: Any, contents: tuple | None) -> bool:
    """Is `now` what `value` was, `contents` its items then (`contents_of`)?"""
    if now is not value:
        return _same(now, value)
    if contents is None:
        return True
    items = contents_of(now)  # the same object: a list or a dict
    return items is not None and len(items) == len(contents) and all(map(_same, items, contents))


_BY_VALUE = (bool, int, float, complex, str)


def _same(now: Any, value: Any) -> bool:
    """Identity; for numbers and strings, equal values; for tuples, the same items."""
    if now is value:
        return True
    if type(now) is not type(value):
        return False
    if type(value) is tuple:
        return len(now) == len(value) and all(map(_same, now, value))
    if type(value) is float:  # by its bits: 0.0 == -0.0 (1 / x differs), nan != nan
        return now.hex() == value.hex()
    return isinstance(value, _BY_VALUE) and now == value


class Definition:
    """A function's own parts a call runs besides its globals and closure, read live as a
    module's dict is for its globals: its code (IPython's autoreload sets `__code__` in
    place when the file is edited) and its default arguments (`f.__defaults__ = ...`)."""

    PARTS = ("__code__", "__defaults__", "__kwdefaults__")
    __slots__ = ("function",)

    def __init__(self, function: types.FunctionType):
        self.function = function

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self.function, name, default)
