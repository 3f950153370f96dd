"""Straight-line Python for an FX graph: the "eager" backend's compiled form.

FX's own code calls `torch.ops.aten.mul.Tensor(...)`: four attribute lookups and a Python
`OpOverload.__call__` frame per op. Here each op's fastest C++ entry point (`bindings.py`) is
bound once as a global, every value is a local, and each value is dropped right after its
last use, so the function costs little more than the kernels it launches.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from torch import fx

from .bindings import fast_binding

_LITERALS = (int, bool, str, type(None))  # repr() of these reads back as the same value


class _Namer:
    def __init__(self):
        self.globals: dict[str, Any] = {}
        self._ids: dict[int, str] = {}

    def constant(self, value: Any) -> str:
        if isinstance(value, _LITERALS) or (isinstance(value, float) and math.isfinite(value)):
            return repr(value)
        return self.constant_object(value, "c")  # dtypes, devices, nan/inf, memory formats

    def constant_object(self, value: Any, hint: str) -> str:
        name = self._ids.get(id(value))
        if name is None:
            name = self._ids[id(value)] = f"_{hint}{len(self.globals)}"
            self.globals[name] = value
        return name


def python_function(gm: fx.GraphModule) -> Callable[[list], Any]:
    """A boxed function running `gm`'s graph: takes a list of inputs (and clears it)."""
    namer = _Namer()
    var: dict[fx.Node, str] = {}
    nodes = list(gm.graph.nodes)
    last_use = {inp: node for node in nodes for inp in node.all_input_nodes}
    dying: dict[fx.Node, list[str]] = {}
    for value, user in last_use.items():
        dying.setdefault(user, []).append(value)

    def arg(a) -> str:
        if isinstance(a, fx.Node):
            return var[a]
        if isinstance(a, (list, tuple)):
            inner = ", ".join(arg(x) for x in a)
            return f"[{inner}]" if isinstance(a, list) else f"({inner}{',' if len(a) == 1 else ''})"
        if isinstance(a, dict):  # a user Triton kernel's arguments, by name: values may be nodes
            return "{" + ", ".join(f"{arg(k)}: {arg(v)}" for k, v in a.items()) + "}"
        return namer.constant(a)

    lines, params = [], []
    for i, node in enumerate(nodes):
        var[node] = f"v{i}"
        if node.op == "placeholder":
            params.append(var[node])
        elif node.op == "get_attr":
            lines.append(f"{var[node]} = {namer.constant_object(_attr(gm, node.target), 'a')}")
        elif node.op == "call_function":
            fn = namer.constant_object(fast_binding(node), "f")
            args = [arg(a) for a in node.args] + [f"{k}={arg(v)}" for k, v in node.kwargs.items()]
            lines.append(f"{var[node]} = {fn}({', '.join(args)})")
        elif node.op == "output":
            lines.append(f"return {arg(node.args[0])}")
            continue
        else:
            raise NotImplementedError(f"codegen: {node.op} nodes are not supported")
        dead = [var[v] for v in dying.get(node, ()) if v.op != "get_attr"]
        if dead:
            lines.append(f"del {', '.join(dead)}")
    header = ["def run(args):"]
    if params:
        header.append(f"    {', '.join(params)}, = args")
    header.append("    args.clear()")
    source = "\n".join(header + [f"    {line}" for line in lines]) + "\n"
    scope = dict(namer.globals)
    exec(compile(source, "<aotgrad graph>", "exec"), scope)
    run = scope["run"]
    run._boxed_call = True
    run.source = source
    return run


def _attr(gm: fx.GraphModule, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj
