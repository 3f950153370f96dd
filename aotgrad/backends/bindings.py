"""Faster Python entry points for ATen overloads, for the generated eager backend.

`OpOverload._op` converts its Python arguments through the operator schema: about half a
microsecond more per call than the bindings `torch.sin`, `Tensor.expand`, ... use. For a
small graph that is a good part of a call's time. A binding is used for a graph node only
when a probe shows it reaches the very same overload with the very same arguments: both are
called on the node's fake arguments under a dispatch mode that records the first operator
call and stops. Decisions are cached per overload and argument types.

Torch-function modes see a graph's ops through either entry point; factory functions are
left alone, since `with torch.device(...)` rewrites those when called through the bindings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils._python_dispatch import TorchDispatchMode

# Where torch's generated bindings live, by the overload's namespace-free name.
_NAMESPACES = tuple(getattr(torch._C, name) for name in (
    "_VariableFunctions", "_nn", "_linalg", "_special", "_fft", "TensorBase")
    if hasattr(torch._C, name))
_decided: dict[tuple, Any] = {}


def _factories() -> frozenset:
    try:
        from torch.utils._device import _device_constructors
        return frozenset(_device_constructors())
    except (ImportError, AttributeError):
        return frozenset()


_FACTORIES = _factories()


def fast_binding(node: fx.Node) -> Any:
    """The fastest callable with the same meaning as `node.target` for this node's arguments."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return target
    args = _example(node.args)
    kwargs = _example(node.kwargs)
    if args is _UNKNOWN or kwargs is _UNKNOWN or not _has_tensor(args):
        return target._op  # factories and the like: rare on a hot path
    key = (target, _types(args), _types(kwargs))
    if key not in _decided:
        _decided[key] = _prove(target, args, kwargs)
    return _decided[key]


def _prove(target: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    reference = _first_dispatch(target._op, args, kwargs)
    name = target._schema.name.split("::")[-1]
    if reference is None:
        return target._op
    for namespace in _NAMESPACES:
        binding = getattr(namespace, name, None)
        if binding is not None and binding not in _FACTORIES and \
                _same(_first_dispatch(binding, args, kwargs), reference):
            return binding
    return target._op


class _Dispatched(Exception):
    pass


class _StopAtFirstOp(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        raise _Dispatched(func, args, kwargs or {})


def _first_dispatch(fn, args: tuple, kwargs: dict) -> tuple | None:
    """(overload, args, kwargs) of the first operator `fn` dispatches to."""
    try:  # autocast would put its own casts first, whatever the overload
        with torch._C._DisableAutocast(), _StopAtFirstOp():
            fn(*args, **kwargs)
    except _Dispatched as hit:
        return hit.args
    except Exception:  # arguments the binding does not accept: not a candidate
        return None
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal as dispatched: tensors by identity, everything else by type and value."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


_UNKNOWN = object()


def _example(value: Any) -> Any:
    """`value` with each node replaced by its example value (from tracing)."""
    if isinstance(value, fx.Node):
        return value.meta.get("val", _UNKNOWN)
    if isinstance(value, (list, tuple)):
        items = [_example(v) for v in value]
        return _UNKNOWN if any(v is _UNKNOWN for v in items) else type(value)(items)
    if isinstance(value, dict):
        items = {k: _example(v) for k, v in value.items()}
        return _UNKNOWN if any(v is _UNKNOWN for v in items.values()) else items
    return value


def _has_tensor(args: tuple) -> bool:
    return any(isinstance(a, torch.Tensor) for a in args)


def _types(value: Any) -> Any:
    """What overload resolution looks at: types, into lists and dicts."""
    if isinstance(value, torch.Tensor):
        return torch.Tensor
    if isinstance(value, (list, tuple)):
        return type(value), tuple(_types(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _types(v)) for k, v in value.items())
    return type(value)
