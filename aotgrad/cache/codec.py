"""FX graphs and their values <-> JSON, with no pickle and no code to execute.

A graph is a list of nodes: opcode, name, target, arguments, and the few meta entries a
later stage reads. Targets are ATen operator overloads, named `aten::add.Tensor` and found
again through `torch.ops`, or one of a short list of Python functions: decoding resolves
names, it never evaluates text. Values are JSON literals or tagged objects (dtypes,
devices, tuples...). A small tensor constant a graph holds (a model's `torch.tensor(...)`)
is written by value, so that its bytes are part of the key. Whatever has no encoding raises
`Unencodable`, naming it: the compile is then not cached, and the bypass log says why.
"""

from __future__ import annotations

import base64
import enum
import importlib
import math
import operator
from dataclasses import fields, is_dataclass
from typing import Any, Callable

import torch
from torch import fx

from ..semantics.dynamic import item_symbol


class Unencodable(Exception):
    """A value, target or graph the cache cannot write down safely (the reason is the text)."""


# Python functions a graph may call, by the name an entry gives them.
_PY_TARGETS: dict[str, Callable] = {f"operator.{name}": getattr(operator, name) for name in (
    "getitem", "add", "sub", "mul", "truediv", "floordiv", "mod", "neg", "pow", "eq", "ne",
    "lt", "le", "gt", "ge")}
_PY_NAMES = {id(f): name for name, f in _PY_TARGETS.items()}
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values()
           if isinstance(d, torch.dtype)}
_LAYOUTS = {str(x).removeprefix("torch."): x for x in vars(torch).values()
            if isinstance(x, torch.layout)}
_FORMATS = {str(x).removeprefix("torch."): x for x in vars(torch).values()
            if isinstance(x, torch.memory_format)}


# ---- values ---------------------------------------------------------------------------------

def encode_value(v: Any, node_ref: Callable[[fx.Node], Any] | None = None) -> Any:
    """A JSON value for `v`; nodes through `node_ref` (graph arguments)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, fx.Node) and node_ref is not None:
        return {"node": node_ref(v)}
    if isinstance(v, list):
        return [encode_value(x, node_ref) for x in v]
    if isinstance(v, tuple) and not hasattr(v, "_fields"):  # not a namedtuple
        return {"tuple": [encode_value(x, node_ref) for x in v]}
    if isinstance(v, torch.dtype):
        return {"dtype": str(v).removeprefix("torch.")}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    if isinstance(v, torch.layout):
        return {"layout": str(v).removeprefix("torch.")}
    if isinstance(v, torch.memory_format):
        return {"memory_format": str(v).removeprefix("torch.")}
    if isinstance(v, complex):
        return {"complex": [encode_value(v.real), encode_value(v.imag)]}
    if isinstance(v, slice):
        return {"slice": [encode_value(x, node_ref) for x in (v.start, v.stop, v.step)]}
    if v is Ellipsis:  # x[..., :n] in a Dynamo graph
        return {"ellipsis": None}
    raise Unencodable(f"a graph value of type {type(v).__name__}")


def decode_value(v: Any, nodes: dict[str, fx.Node] | None = None) -> Any:
    if isinstance(v, list):
        return [decode_value(x, nodes) for x in v]
    if not isinstance(v, dict):
        return v
    (tag, x), = v.items()
    if tag == "node":
        return nodes[x]
    if tag == "tuple":
        return tuple(decode_value(y, nodes) for y in x)
    if tag == "float":
        return float(x)
    if tag == "dtype":
        return _DTYPES[x]
    if tag == "device":
        return torch.device(x)
    if tag == "layout":
        return _LAYOUTS[x]
    if tag == "memory_format":
        return _FORMATS[x]
    if tag == "complex":
        return complex(decode_value(x[0]), decode_value(x[1]))
    if tag == "slice":
        return slice(*(decode_value(y, nodes) for y in x))
    if tag == "ellipsis":
        return Ellipsis
    raise ValueError(f"unknown tag {tag!r}")


def fingerprint(v: Any) -> Any:
    """A JSON description of metadata for a cache key (never decoded): frozen dataclasses
    field by field, functions by qualified name, tree specs by their string."""
    if is_dataclass(v) and not isinstance(v, type):
        return {type(v).__qualname__: {f.name: fingerprint(getattr(v, f.name))
                                        for f in fields(v)}}
    if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
        return [fingerprint(x) for x in v]
    if isinstance(v, range):
        return {"range": [v.start, v.stop, v.step]}
    if callable(v) and hasattr(v, "__qualname__"):
        return {"callable": f"{getattr(v, '__module__', '')}.{v.__qualname__}"}
    if isinstance(v, torch.Tensor):
        return {"tensor": [list(v.shape), str(v.dtype)]}
    if isinstance(v, enum.Enum):  # metadata's kinds (OutputKind); never a graph value
        return {"enum": f"{type(v).__qualname__}.{v.name}"}
    try:
        return encode_value(v)
    except Unencodable:
        return {"repr": f"{type(v).__qualname__}:{v!s}"}


# ---- tensors' metadata ---------------------------------------------------------------------

def encode_tensor_meta(t: Any) -> dict:
    """What rebuilds a fake value of the same geometry: shape, strides, offset, dtype, device,
    requires_grad (plain strided tensors of static shapes only)."""
    if not isinstance(t, torch.Tensor):
        raise Unencodable(f"a graph input that is a {type(t).__name__}, not a tensor "
                          "(a symbolic size)")
    if type(t).__name__ not in ("FakeTensor", "Tensor", "Parameter") or t.layout != torch.strided:
        raise Unencodable(f"a graph input of type {type(t).__name__}, layout {t.layout}")
    if any(not isinstance(s, int) for s in (*t.shape, *t.stride(), t.storage_offset())):
        raise Unencodable("symbolic shapes (dynamic=True)")
    if item_symbol(t) is not None:
        # A float Dynamo made dynamic: a 0-d tensor whose value the graph reads as a symbol.
        # Where the passes cannot keep it symbolic they specialize it (its value becomes a
        # constant of the graph, guarded in Dynamo's ShapeEnv); a hit would skip both, and
        # serve the constant for every value.
        raise Unencodable("a float Dynamo made dynamic (its value may be specialized)")
    meta = {"shape": list(t.shape), "stride": list(t.stride()), "offset": t.storage_offset(),
            "dtype": encode_value(t.dtype), "device": str(t.device),
            "requires_grad": t.requires_grad}
    # The trace reads a conjugate or negative input's bit (capture/inputs.py): keyed where set.
    meta.update({bit: True for bit in _LAZY_BITS if getattr(t, f"is_{bit}")()})
    return meta


_LAZY_BITS = ("conj", "neg")


def fake_from_meta(meta: dict, fake_mode) -> torch.Tensor:
    with fake_mode:
        t = torch.empty_strided(meta["shape"], meta["stride"], dtype=decode_value(meta["dtype"]),
                                device=torch.device(meta["device"]))
        if meta["offset"]:
            t = t.as_strided(meta["shape"], meta["stride"], meta["offset"])
    if meta.get("conj"):
        torch._C._set_conj(t, True)
    if meta.get("neg"):
        torch._C._set_neg(t, True)
    return t.requires_grad_(meta["requires_grad"])


# ---- graphs -------------------------------------------------------------------------------

def encode_target(target: Any, extra: dict[str, Callable] | None = None) -> str:
    """`extra`: more Python functions by name (a caller's own, e.g. compiled autograd's)."""
    if isinstance(target, torch._ops.OpOverload):
        return f"op:{target.name()}"
    name = _PY_NAMES.get(id(target))
    if name is None:
        name = next((n for n, f in (extra or {}).items() if f is target), None)
    if name is not None:
        return f"py:{name}"
    raise Unencodable(f"a call of {getattr(target, '__qualname__', target)!s}, which the "
                      "cache cannot name safely")


def decode_target(text: str, extra: dict[str, Callable] | None = None) -> Any:
    kind, _, name = text.partition(":")
    if kind == "py":
        return {**_PY_TARGETS, **(extra or {})}[name]
    if kind != "op":
        raise ValueError(f"unknown target {text!r}")
    namespace, _, rest = name.partition("::")
    op_name, _, overload = rest.partition(".")
    return getattr(_op_packet(namespace, op_name), overload or "default")


# Modules that define ops of a namespace when imported: Inductor's own prims (its random
# seeds, its low-memory max pool) exist once Inductor's decompositions are loaded, which a
# warm process reading an entry before any trace has not done.
_DEFINED_BY = {"prims": ("torch._inductor.inductor_prims",)}


def _op_packet(namespace: str, op_name: str) -> Any:
    try:
        return getattr(getattr(torch.ops, namespace), op_name)
    except AttributeError:
        for module in _DEFINED_BY.get(namespace, ()):
            importlib.import_module(module)
        return getattr(getattr(torch.ops, namespace), op_name)  # AttributeError: not loaded


# ---- tensor constants ------------------------------------------------------------------------

# Larger constants leave the compile uncached: an entry is JSON, read whole on every hit.
CONSTANT_BYTES = 1 << 16


def encode_constant(t: Any) -> dict:
    """A plain tensor a graph holds, by value: dtype, shape, device and its bytes."""
    if type(t) is not torch.Tensor or t.layout != torch.strided or t.is_quantized \
            or t.device.type == "meta":
        raise Unencodable(f"a graph constant of type {type(t).__name__}")
    nbytes = t.numel() * t.element_size()
    if t.requires_grad or not t.is_contiguous() or nbytes > CONSTANT_BYTES:
        raise Unencodable(f"a tensor constant ({nbytes} bytes, contiguous "
                          f"{t.is_contiguous()}, requires_grad {t.requires_grad})")
    if not _owns_its_storage(t, nbytes):  # an as_strided on it reads memory beyond it
        raise Unencodable(f"a tensor constant that is a view of more memory (offset "
                          f"{t.storage_offset()}, stride {t.stride()})")
    data = t.detach().resolve_conj().resolve_neg().cpu().reshape(-1).view(torch.uint8)
    return {"dtype": encode_value(t.dtype), "shape": list(t.shape), "device": str(t.device),
            "bytes": base64.b64encode(data.numpy().tobytes()).decode("ascii")}


def _owns_its_storage(t: torch.Tensor, nbytes: int) -> bool:
    """Whether `t`'s bytes are its whole storage, in its decoded layout (a size-1 dim's
    stride too): decoded, a constant has a storage of its own, contiguous."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == nbytes and \
        t.stride() == torch.empty(t.shape, device="meta").stride()


def decode_constant(c: dict) -> torch.Tensor:
    raw = bytearray(base64.b64decode(c["bytes"]))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(decode_value(c["dtype"])).reshape(c["shape"]).to(c["device"], copy=True)


def _constant(gm: fx.GraphModule, target: str) -> Any:
    if "." in target:  # a submodule's attribute: a module's state, not the graph's own
        raise Unencodable(f"a get_attr node ({target}) into a submodule")
    return getattr(gm, target)


def encode_graph(gm: fx.GraphModule, node_meta: Callable[[fx.Node], dict],
                 names: Callable[[int, fx.Node], str] | None = None,
                 targets: dict[str, Callable] | None = None) -> list:
    """The graph as [[opcode, name, target, args, kwargs, meta], ...]. `names(i, node)`
    renames nodes (a key renames them by position, so names do not matter); `targets`
    names more Python functions the graph may call."""
    renamed: dict[fx.Node, str] = {}
    rows = []
    for i, node in enumerate(gm.graph.nodes):
        renamed[node] = names(i, node) if names is not None else node.name
        if node.op in ("call_module", "call_method"):
            raise Unencodable(f"a {node.op} node ({node.target}): graphs calling submodules")
        if node.op == "get_attr":  # its name too: Inductor's cache hashes the graph's code
            rows.append([node.op, renamed[node], node.target,
                         {"constant": encode_constant(_constant(gm, node.target))}, [],
                         node_meta(node)])
            continue
        target = encode_target(node.target, targets) if node.op == "call_function" else None
        ref = renamed.__getitem__
        # Pairs, not an object: the order is part of the code a compiler's cache hashes.
        kwargs = [[k, encode_value(v, ref)] for k, v in node.kwargs.items()]
        rows.append([node.op, renamed[node], target, encode_value(node.args, ref), kwargs,
                     node_meta(node)])
    return rows


def _kwargs(encoded: list, nodes: dict[str, fx.Node]) -> dict:
    return {k: decode_value(v, nodes) for k, v in encoded}


def decode_graph(rows: list, targets: dict[str, Callable] | None = None) -> fx.GraphModule:
    """The graph (without meta: the caller restores what it stored); `targets` as encoded."""
    graph = fx.Graph()
    nodes: dict[str, fx.Node] = {}
    root = torch.nn.Module()  # holds the constants; GraphModule copies what get_attr reads
    for op, name, target, args, kwargs, _ in rows:
        if op == "placeholder":
            node = graph.placeholder(name)
        elif op == "get_attr":
            setattr(root, target, decode_constant(args["constant"]))
            node = graph.create_node(op, target, name=name)
        elif op == "output":
            node = graph.output(decode_value(args, nodes)[0])
        elif op == "call_function":
            node = graph.create_node(op, decode_target(target, targets),
                                     tuple(decode_value(args, nodes)), _kwargs(kwargs, nodes),
                                     name=name)
        else:
            raise ValueError(f"unknown opcode {op!r}")
        nodes[name] = node
    return fx.GraphModule(root, graph)
