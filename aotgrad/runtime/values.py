"""How the guards compare what a compiled function or module read besides its arguments:
numbers and strings by value, short plain lists and dicts item by item, the rest by
identity (runtime/module_guard.py); and a function's own parts, read live."""

from __future__ import annotations

import functools
import inspect
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

    __slots__ = ("function", "get")

    def __init__(self, function: types.FunctionType):
        self.function = function
        self.get = functools.partial(getattr, function)  # C calls only: read at every call

    def parts(self) -> list[str]:
        """Its code; its defaults where it has some (few functions do: fewer to compare)."""
        return ["__code__", *(name for name in ("__defaults__", "__kwdefaults__")
                              if getattr(self.function, name) is not None)]


def class_members(cls: type, functions: list, start: str) -> list[tuple[type, str, Any]]:
    """The attributes of `cls` that `functions` name (`start` too) and that hold code (methods,
    properties) or a number or string, as they are now: one patched (`Cls.helper = f`,
    `Cls.scale = 3.0`) runs other code, or the graph took the old value."""
    names = set().union(*(global_names(f.__code__) for f in functions))
    named = [n for n in sorted(names) if _code_or_constant(inspect.getattr_static(cls, n, None))]
    return [(cls, n, _member(cls, n)) for n in [start, *named]]


def members_changed(members: list[tuple[type, str, Any]]) -> str | None:
    for cls, name, value in members:
        if _member(cls, name) is not value:
            return f"{cls.__name__}.{name}"
    return None


def _code_or_constant(attribute: Any) -> bool:
    return bool(class_code(attribute)) or type(attribute) in _BY_VALUE


def _member(cls: type, name: str) -> Any:
    value = getattr(cls, name, None)
    return getattr(value, "__func__", value)  # a classmethod is bound anew at each read


def class_code(attribute: Any) -> list[types.FunctionType]:
    """The function a class attribute runs when read or called: a method's, a static or
    class method's, a property's getter."""
    if isinstance(attribute, property):
        attribute = attribute.fget
    attribute = getattr(attribute, "__func__", attribute)
    return [attribute] if isinstance(attribute, types.FunctionType) else []


def global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # a lambda or comprehension inside
            names |= global_names(const)
    return names
