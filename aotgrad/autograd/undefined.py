"""Which gradients eager leaves undefined (None), where a custom backward returned None.

A custom backward may return None for an input that needs a gradient: eager's engine then
passes an undefined gradient on, each C++ formula given only undefined gradients returns
undefined ones, hooks see None, and `.grad` stays None. The specialized graph cannot carry
that: its traced ops read zeros in place of the None (`specialize.zeros_for_none`). So the
program's calls are read once more, for what each gradient is made of: `ALWAYS` defined
(it reaches back to a root's gradient or a tensor a custom backward cannot withhold), or
a set of custom backwards' results (`slots`), defined at a run where any of those is. The
Python calls that take a gradient (hooks, `.grad` accumulation, `autograd.grad`'s results)
take it through `hooks.undefined_if_none`, given those results: None where all are None.
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

from . import hooks

ALWAYS = None  # defined at every run
Sources = Any  # ALWAYS, a frozenset of (custom backward's call, output index), or a list


def gradient_sources(program: fx.Graph) -> dict[fx.Node, Sources]:
    found: dict[fx.Node, Sources] = {}
    for node in program.nodes:
        found[node] = _sources(node, found)
    return found


def slots_of(found: dict[fx.Node, Sources], arg: Any) -> list[tuple[fx.Node, int]] | None:
    """The custom backwards' results a gradient arg is defined by (sorted: the graph is
    the same at every trace); None where it is always defined, or never (a literal None)."""
    sources = _item(found, arg)
    if sources is ALWAYS or not sources:
        return None
    return sorted(sources, key=lambda slot: (slot[0].name, slot[1]))


# The gradient arguments of the Python calls that may be given None, as eager gives them.
GRADIENT_ARGS: dict[Any, tuple[int, ...]] = {
    hooks.accumulate_into: (1,),
    hooks.run_tensor_hook: (1,),
    hooks.run_cpp_tensor_hooks: (1,),
    hooks.run_node_pre_hook: (1,),
    hooks.run_node_post_hook: (1, 2),
}


def _item(found: dict[fx.Node, Sources], arg: Any) -> Sources:
    if arg is None:
        return frozenset()  # never defined
    if not isinstance(arg, fx.Node):
        return ALWAYS
    sources = found.get(arg, ALWAYS)
    return ALWAYS if isinstance(sources, list) else sources


def _union(items: list[Sources]) -> Sources:
    if any(item is ALWAYS for item in items):
        return ALWAYS
    return frozenset().union(*items)


def _sources(node: fx.Node, found: dict[fx.Node, Sources]) -> Sources:
    """One call's: per item where its items differ (a list or tuple result)."""
    target = node.target
    if node.op != "call_function":
        return ALWAYS
    if target is operator.getitem:
        whole = found.get(node.args[0], ALWAYS)
        return whole[node.args[1]] if isinstance(whole, list) else whole
    if target is hooks.call_formula:  # undefined where all its gradients are
        items = [_item(found, g) for g in node.args[1]]
        return items if node.args[0] == "validate_outputs" else _union(items)
    if target is hooks.run_python_backward:
        return [frozenset({(node, k)}) for k in range(len(node.args[2]))]
    if target in hooks.TENSOR_HOOKS:
        return _item(found, node.args[1])
    if target in hooks.NODE_HOOKS:
        return [_item(found, g) for g in node.args[1]]
    if target is hooks.add_gradients:
        return _union([_item(found, g) for g in node.args])
    if target is hooks.run_region_backward:  # (ctx, saved, *grads)
        return _union([_item(found, g) for g in node.args[2:]])
    return ALWAYS


def defining_nodes(trace: Any, arg: Any) -> Any:
    """For a program's gradient arg (or list of them): the specialized graph's nodes of the
    custom backward results it is defined by; None where it is always defined."""
    if isinstance(arg, (list, tuple)):
        return [defining_nodes(trace, a) for a in arg]
    slots = slots_of(trace.sources, arg)
    if slots is None:
        return None
    results = [trace.values[call][k] for call, k in slots]
    return [trace.to_proxy(r).node for r in results if r is not None]


def wrap_undefined(graph: fx.Graph, maybe_undefined: list[tuple[fx.Node, int, Any]]) -> None:
    """Each recorded gradient arg through `hooks.undefined_if_none`, just before its call
    (after order_like_eager: its hook chains stay as the engine built them)."""
    for node, index, defining in maybe_undefined:
        node.update_arg(index, _wrapped(graph, node, node.args[index], defining))


def _wrapped(graph: fx.Graph, call: fx.Node, arg: Any, defining: Any) -> Any:
    if isinstance(arg, (list, tuple)) and isinstance(defining, list):
        return type(arg)(_wrapped(graph, call, a, d) for a, d in zip(arg, defining))
    if defining is None or not isinstance(arg, fx.Node):
        return arg
    with graph.inserting_before(call):
        wrapped = graph.call_function(hooks.undefined_if_none, (arg, *defining))
    wrapped.meta = dict(arg.meta)
    return wrapped


def zeros_after_hooks(graph: fx.Graph) -> None:
    """A hook given None returns None: the traced ops after it read the zeros they had
    made for that None instead (`hooks.or_else`)."""
    for node in list(graph.nodes):
        if node.target in hooks.TENSOR_HOOKS:
            _read_or_else(graph, node, node.args[1])
        elif node.target in hooks.NODE_HOOKS:
            for read in [u for u in node.users if u.target is operator.getitem]:
                _read_or_else(graph, read, node.args[1][read.args[1]])


def _read_or_else(graph: fx.Graph, read: fx.Node, given: Any) -> None:
    if not isinstance(given, fx.Node) or given.target is not hooks.undefined_if_none:
        return
    traced = hooks.traced_users(read)
    if not traced:
        return
    with graph.inserting_after(read):
        value = graph.call_function(hooks.or_else, (read, _made(given)))
    value.meta = dict(read.meta)
    for user in traced:
        user.replace_input_with(read, value)


def _made(node: fx.Node) -> fx.Node:
    """The value the traced ops made for a gradient that wrappers and hooks pass on (a
    tensor; or a custom backward's result, which zeros_for_none makes zeros)."""
    while True:
        if node.target is hooks.undefined_if_none:
            node = node.args[0]
        elif node.target in hooks.TENSOR_HOOKS:
            node = node.args[1]
        elif node.target is operator.getitem and node.args[0].target in hooks.NODE_HOOKS:
            node = node.args[0].args[1][node.args[1]]
        else:
            return node
