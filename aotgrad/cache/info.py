"""What the analysis and the trace learned about a call, as JSON, for an entry keyed before
the trace (cache/program.py): `FunctionInfo` (the plan of input mutations, the outputs'
aliasing and requires_grad, their view replays as `ViewChain`s: cache/views.py) and
`TraceFacts`.

Only the frozen dataclasses of `schema` listed here are decoded, field by field, from
tagged JSON values; nothing is evaluated. A value with no encoding (a callable, a pytree
node type without a serialized name, a tensor subclass) raises `Unencodable`.
"""

from __future__ import annotations

import enum
from dataclasses import fields, is_dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..schema import (FunctionInfo, InputInfo, OutputInfo, OutputKind, PlainMeta, StorageSwap,
                      TensorMeta, TraceFacts)
from . import codec
from .codec import Unencodable
from .views import ViewChain, ViewStep

# ViewStep checks, as it is built, that its op is an ATen view op (an output view's replay).
_CLASSES = {cls.__name__: cls for cls in (FunctionInfo, InputInfo, OutputInfo, TensorMeta,
                                          StorageSwap, PlainMeta, TraceFacts, ViewChain,
                                          ViewStep)}
_ENUMS = {OutputKind.__name__: OutputKind}


def encode(v: Any) -> Any:
    if isinstance(v, pytree.TreeSpec):  # a dataclass too, of types and contexts
        return {"treespec": _treespec(v)}
    if is_dataclass(v) and not isinstance(v, type):
        name = type(v).__name__
        if _CLASSES.get(name) is not type(v):
            raise Unencodable(f"a {name} in the analysis")
        return {"dataclass": [name, {f.name: encode(getattr(v, f.name)) for f in fields(v)}]}
    if isinstance(v, enum.Enum) and _ENUMS.get(type(v).__name__) is type(v):
        return {"enum": [type(v).__name__, v.name]}
    if isinstance(v, torch._ops.OpOverload):
        return {"op": codec.encode_target(v)}
    if isinstance(v, list):
        return [encode(x) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):
        return {"tuple": [encode(x) for x in v]}
    if callable(v) and not isinstance(v, (torch.dtype, torch.device)):
        raise Unencodable(f"a callable in the analysis ({type(v).__name__})")
    return codec.encode_value(v)


def _treespec(spec: pytree.TreeSpec) -> str:
    try:
        return pytree.treespec_dumps(spec)
    except Exception as exc:  # a node type registered without a serialized name
        raise Unencodable(f"the output's pytree structure ({exc})") from None


def decode(v: Any) -> Any:
    if isinstance(v, list):
        return [decode(x) for x in v]
    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "dataclass":
        name, values = x
        return _CLASSES[name](**{k: decode(y) for k, y in values.items()})
    if tag == "enum":
        return _ENUMS[x[0]][x[1]]
    if tag == "treespec":
        return pytree.treespec_loads(x)
    if tag == "op":
        return codec.decode_target(x)
    if tag == "tuple":
        return tuple(decode(y) for y in x)
    return codec.decode_value(v)
