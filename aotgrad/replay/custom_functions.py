"""Custom autograd.Functions in a double backward's replay.

A replay (double_backward.py) re-runs the ATen ops eager runs. A custom Function is more
than its ops: its forward runs outside autograd, and its backward is the user's Python,
which eager records op by op when the backward runs with create_graph=True (or wraps in an
error node, when it is `once_differentiable`). So the replay calls the Function as eager
does:

- While the replay is traced, `FunctionCalls` notes each `Function.apply` that makes an
  autograd node: the graph nodes its forward added, its inputs and outputs. Hooks on that
  node note the graph nodes its backward added, between the gradients it received and the
  ones it returned.
- `call_functions` replaces each forward's nodes with one node that applies the Function
  again (to aliases of its inputs), and each backward's with one node that runs autograd
  on that application alone, with create_graph=True: autograd's engine calls the user's
  backward as eager's does (materializing gradients, checking and casting what it returns,
  wrapping once_differentiable results in the error node).

The aliases keep the gradients autograd returns for the inputs to the Function's own: an
input that is computed from another would otherwise collect that one's gradient too.

A Function that Dynamo captured (its `autograd_function_apply`) is refused: Dynamo traces
its backward with grad mode off and drops the grad mode switches inside it, so whether eager
would record the backward (not if `once_differentiable`, nor its `no_grad` regions) is lost.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.function import BackwardCFunction
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot

from ..semantics.mends import patched
from .random_values import is_random

aten = torch.ops.aten
_APPLY = torch.autograd.Function.__dict__["apply"].__func__  # unpatched
_HOP = getattr(torch.ops.higher_order, "autograd_function_apply", None)


class CustomFunctionUnsupported(Exception):
    """A custom Function whose replay would differ from eager; the message names it."""


def _unsupported(what: str) -> CustomFunctionUnsupported:
    return CustomFunctionUnsupported(f"{what}. Call it outside the compiled function")


@dataclass
class FunctionCall:
    """One application of a custom Function in a replay's trace, filled in as the trace
    reaches its forward and its backward."""

    name: str
    apply: Callable  # (*args, **kwargs) -> the Function applied to them
    spec: pytree.TreeSpec  # of (args, kwargs)
    leaves: list  # of (args, kwargs): a graph node for each traced tensor
    direct: list[int]  # the leaves that are positional tensor arguments: the node's inputs
    grad_enabled: bool
    start: fx.Node  # the last node before the forward's (while tracing)
    forward_nodes: list[fx.Node] = field(default_factory=list)
    outputs: list = field(default_factory=list)  # a node per tensor output, else None
    backward_start: fx.Node | None = None  # the last node before the backward's, once run
    backward_nodes: list[fx.Node] = field(default_factory=list)
    grad_outputs: list = field(default_factory=list)  # a node (or None) per output
    grad_inputs: list = field(default_factory=list)  # a node (or None) per input


class FunctionCalls:
    """While a replay is traced: note each custom Function application that makes an
    autograd node (Function.apply is patched meanwhile; so is Dynamo's operator, to refuse
    it)."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.calls: list[FunctionCall] = []
        self.nodes: set = set()  # the autograd nodes the calls made
        self._depth = 0  # inside a call: a nested one is part of it
        self._patches = contextlib.ExitStack()
        self._thread = threading.get_ident()  # the patches serve other threads unchanged

    def __enter__(self):
        calls = self

        def apply(cls, *args, **kwargs):
            return calls.applied(cls.__name__, functools.partial(_APPLY, cls), args, kwargs,
                                 lambda: _APPLY(cls, *args, **kwargs))

        self._patches.enter_context(patched(torch.autograd.Function,
                                                    apply=classmethod(apply)))
        if _HOP is not None:  # Dynamo's graphs apply a Function through this operator
            hop_call = type(_HOP).__call__

            def hop(op, fwd, bwd, *args, **kwargs):
                return calls.applied(_CAPTURED_BY_DYNAMO, None, args, kwargs,
                                     lambda: hop_call(op, fwd, bwd, *args, **kwargs))

            self._patches.enter_context(patched(type(_HOP), __call__=hop))
        return self

    def __exit__(self, *exc):
        self._patches.close()

    def applied(self, name: str, reapply: Callable | None, args: tuple, kwargs: dict,
                run: Callable):
        """`run()`, the application of a Function to `args`, noted unless nested (or
        refused, with no way to `reapply` it)."""
        if self._depth or threading.get_ident() != self._thread:
            return run()
        start, grad_enabled = _last(self.graph), torch.is_grad_enabled()
        self._depth += 1
        try:
            out = run()
        finally:
            self._depth -= 1
        node = _function_node(out)
        if node is not None and reapply is None:
            raise CustomFunctionUnsupported(name)
        if node is not None:
            if any(o is a for o in _outputs(out) for a in args):  # ctx.mark_dirty
                raise _unsupported(f"{name}, which modifies an input in place")
            call = FunctionCall(name, reapply, *_leaves(args, kwargs), grad_enabled, start)
            self._note(call, node, out)
        return out

    def _note(self, call: FunctionCall, node, out) -> None:
        call.forward_nodes = _since(self.graph, call.start)
        call.outputs = [_node_of(o) for o in _outputs(out)]
        node.register_prehook(lambda grad_outputs: self._backward_starts(call, grad_outputs))
        node.register_hook(lambda grad_inputs, _: self._backward_ends(call, grad_inputs))
        self.nodes.add(node)
        self.calls.append(call)

    def _backward_starts(self, call: FunctionCall, grad_outputs) -> None:
        if call.backward_start is not None:
            raise _unsupported(f"{call.name}, whose backward runs twice")
        call.backward_start = _last(self.graph)
        call.grad_outputs = [_node_of(g) for g in grad_outputs]

    def _backward_ends(self, call: FunctionCall, grad_inputs) -> None:
        call.backward_nodes = _since(self.graph, call.backward_start)
        call.grad_inputs = [_node_of(g) for g in grad_inputs]


# Dynamo traces a Function's backward with grad mode off, dropping the grad mode switches
# inside (once_differentiable's, a no_grad region's): what eager would record is lost.
_CAPTURED_BY_DYNAMO = (
    "a Function captured by torch.compile (Dynamo traces its backward under no_grad, so "
    "whether eager would differentiate it is lost). Run it outside the compiled region "
    "(torch.compiler.disable), or compile with aotgrad.compile")


def _function_node(out) -> BackwardCFunction | None:
    for o in _outputs(out):
        if isinstance(o, torch.Tensor) and isinstance(o.grad_fn, BackwardCFunction):
            return o.grad_fn
    return None


def _outputs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _leaves(args: tuple, kwargs: dict) -> tuple:
    """(spec, leaves with each tensor as its node, positions of the positional tensors:
    the Function's inputs, whose gradients its backward returns)."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    direct, position = [], 0
    for arg in args:
        direct += [position] if isinstance(arg, torch.Tensor) else []
        position += len(pytree.tree_leaves(arg))
    return spec, [_leaf_node(x) for x in leaves], direct


def _leaf_node(x):
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _unsupported("a Function given a symbolic size (dynamic=True)")
    if not isinstance(x, torch.Tensor):
        return x
    node = _node_of(x)
    if node is None and isinstance(x, FakeTensor):
        raise _unsupported("a Function given a tensor the trace does not follow")
    return x if node is None else node  # a real tensor: a constant


def _node_of(t) -> fx.Node | None:
    if not isinstance(t, torch.Tensor):
        return None
    proxy = get_proxy_slot(t, get_proxy_mode().tracer, None)
    return None if proxy is None else proxy.proxy.node


def _last(graph: fx.Graph) -> fx.Node:
    return next(iter(reversed(graph.nodes)))


def _since(graph: fx.Graph, start: fx.Node) -> list[fx.Node]:
    """The nodes after `start`, in order."""
    if start._erased:  # the tracer dropped it meanwhile: where the nodes begin is lost
        raise _unsupported("a Function whose trace could not be delimited")
    nodes = []
    for node in reversed(graph.nodes):
        if node is start:
            break
        nodes.append(node)
    return nodes[::-1]


# ---- the replay graph ----------------------------------------------------------------------

def call_functions(graph: fx.Graph, calls: list[FunctionCall], grad_mode_key: str) -> None:
    """Replace each noted forward and backward by a call of the Function and of autograd
    on it; then drop the nodes they traced (`grad_mode_key`: node.meta's grad mode)."""
    for call in calls:
        _check(call)
    order = {n: i for i, n in enumerate(graph.nodes)}
    traced = {n for call in calls for n in call.forward_nodes + call.backward_nodes}
    env: dict[fx.Node, fx.Node] = {}  # a traced value -> the node that stands for it now
    applications = [_replace_forward(graph, call, env, grad_mode_key) for call in calls]
    backwards = [(c, a) for c, a in zip(calls, applications)
                 if any(g in c.backward_nodes for g in c.grad_inputs)]  # else nothing to do
    for call, application in sorted(backwards, key=lambda ca: order[ca[0].backward_nodes[0]]):
        _replace_backward(graph, call, application, env)
    for node in reversed([n for n in graph.nodes if n in traced]):
        if any(user not in traced for user in node.users):
            raise _unsupported(f"a Function whose value {node.name} is used outside it")
        graph.erase_node(node)


def _check(call: FunctionCall) -> None:
    """Refuse a forward that draws (its application would draw again); forget the nodes the
    tracer dropped after they were noted (sizes no op used)."""
    if any(is_random(n.target) for n in call.forward_nodes):
        raise _unsupported(f"{call.name}, which draws random numbers")
    call.forward_nodes = [n for n in call.forward_nodes if not n._erased]
    call.backward_nodes = [n for n in call.backward_nodes if not n._erased]
    if not call.forward_nodes:
        raise _unsupported(f"{call.name}, whose forward computes nothing traced")


def _replace_forward(graph: fx.Graph, call: FunctionCall, env: dict,
                     grad_mode_key: str) -> fx.Node:
    inputs = [env.get(x, x) for x in call.leaves if isinstance(x, fx.Node)]
    with graph.inserting_before(call.forward_nodes[0]):
        application = graph.call_function(_applier(call), tuple(inputs))
    application.meta[grad_mode_key] = call.grad_enabled
    for k, out in enumerate(call.outputs):
        if out is not None:
            env[out] = _element(graph, application, k, call.grad_enabled, grad_mode_key)
            _replace_outside(out, env[out], call.forward_nodes)
    return application


def _replace_backward(graph: fx.Graph, call: FunctionCall, application: fx.Node,
                      env: dict) -> None:
    grad_outputs = [env.get(g, g) for g in call.grad_outputs]
    with graph.inserting_before(call.backward_nodes[0]):
        node = graph.call_function(_differentiator(call), (application, *grad_outputs))
    inside = set(call.backward_nodes)
    for k, grad in enumerate(call.grad_inputs):
        if grad in inside:  # else the backward passed a gradient on as it came
            env[grad] = _element(graph, node, k, True, None)
            _replace_outside(grad, env[grad], inside)


def _replace_outside(node: fx.Node, new: fx.Node, region) -> None:
    """Uses of `node` by nodes outside `region` now read `new`."""
    region = set(region)
    node.replace_all_uses_with(new, delete_user_cb=lambda user: user not in region)


def _element(graph: fx.Graph, node: fx.Node, k: int, grad_enabled: bool, key) -> fx.Node:
    with graph.inserting_after(node):
        element = graph.call_function(operator.getitem, (node, k))
    if key is not None:
        element.meta[key] = grad_enabled
    return element


def _applier(call: FunctionCall) -> Callable:
    """(the Function's tensor arguments) -> (its outputs..., aliases of its inputs...)."""
    positions = [i for i, x in enumerate(call.leaves) if isinstance(x, fx.Node)]

    def apply_function(*tensors):
        leaves = list(call.leaves)
        for i, t in zip(positions, tensors):
            leaves[i] = t
        aliases = [aten.alias(leaves[i]) for i in call.direct]
        for i, alias in zip(call.direct, aliases):
            leaves[i] = alias
        args, kwargs = pytree.tree_unflatten(leaves, call.spec)
        return (*_outputs(call.apply(*args, **kwargs)), *aliases)

    apply_function.__name__ = f"apply_{_identifier(call.name)}"
    return apply_function


def _differentiator(call: FunctionCall) -> Callable:
    """(the application, a gradient or None per output) -> a gradient or None per input,
    as autograd computes them with create_graph=True: through the Function's backward."""
    num_outputs = len(call.outputs)

    def backward_of_function(application, *grad_outputs):
        outs, aliases = application[:num_outputs], application[num_outputs:]
        pairs = [(o, g) for o, g in zip(outs, grad_outputs) if g is not None]
        wrt = [a for a in aliases if a.requires_grad]
        grads = iter(torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                                         create_graph=True, allow_unused=True)
                     if wrt and pairs else ())
        return tuple(next(grads) if a.requires_grad else None for a in aliases)

    backward_of_function.__name__ = f"backward_of_{_identifier(call.name)}"
    return backward_of_function


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)
