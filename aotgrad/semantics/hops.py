"""Higher-order ops (HOPs): control flow, compiled regions, flex attention, effects.

Dynamo hands a backend `torch.cond`, `while_loop`, `scan`, `map`, `invoke_subgraph`
(`nested_compile_region`), `flex_attention`, `with_effects`... as single nodes that call
FX subgraphs. PyTorch gives each HOP one rule per dispatch mode, looked up by the mode's
exact class, so our functional mode (a subclass of FunctionalTensorMode) would find none.
`functionalize_hop` runs the rule PyTorch registered for FunctionalTensorMode with our mode:
the op is traced as one node, its subgraphs functionalized, and its autograd (each HOP's
own autograd.Function) gives the backward as HOP nodes too. The partitioner treats a HOP
node as one op: it saves or recomputes its outputs, never what its subgraphs compute.

Compiled regions (`invoke_subgraph`) are aotgrad's own while it compiles (regions.py): each
body is traced and partitioned once, and its calls reuse that. This module's rules take the
calls regions.py leaves to PyTorch.
"""

from __future__ import annotations

import torch
from torch._subclasses.functional_tensor import FunctionalTensorMode

from ..tables import HOPS_NEEDING_SHAPE_ENV, REFUSED_HOPS


def functionalize_hop(mode: FunctionalTensorMode, hop: torch._ops.HigherOrderOperator,
                      args: tuple, kwargs: dict):
    """Run `hop` under functionalization (`mode` is off the stack: PyTorch's convention)."""
    refuse_by_name(hop.name())
    refuse_without_shape_env(hop)
    rule = hop.python_key_table.get(FunctionalTensorMode)
    if rule is None:
        raise NotImplementedError(
            f"aotgrad: the higher-order op {hop.name()} has no functionalization rule in this "
            "torch, so aotgrad cannot trace it. Call it outside the compiled function "
            "(torch.compiler.disable), or use torch.compile's default backend.")
    return rule(mode, *args, **kwargs)


def refuse_by_name(name: str) -> None:
    if name in REFUSED_HOPS:
        raise NotImplementedError(f"aotgrad: {name}: {REFUSED_HOPS[name]}.")


def refuse_in_graph(graph: torch.fx.Graph) -> None:
    """Before tracing a graph Dynamo made: the refused HOPs it calls, named."""
    for node in graph.nodes:
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            refuse_by_name(node.target.name())


def refuse_without_shape_env(hop: torch._ops.HigherOrderOperator) -> None:
    """`while_loop` gives its iteration count a symbol: it needs the shape environment that
    Dynamo's fake tensors carry (aotgrad.compile's own, with static shapes, have none).
    Asked of its call too (user_checks.py): with an input that requires grad, its autograd
    rule runs first, and failed on the missing environment with an AttributeError."""
    if hop.name() not in HOPS_NEEDING_SHAPE_ENV:
        return
    fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if fake_mode is not None and fake_mode.shape_env is None:
        raise NotImplementedError(
            f"aotgrad: {hop.name()} is supported through torch.compile(backend=\"aotgrad\") "
            "only (its trip count needs Dynamo's symbolic shapes). Compile the function with "
            "torch.compile, or call it outside the compiled function.")


def hop_counts(graph: torch.fx.Graph) -> dict[str, int]:
    """How many times each higher-order op is called in `graph` (with_effects apart: it
    wraps one plain op), for `explain`: the partitioner treats each call as one op."""
    counts: dict[str, int] = {}
    for node in graph.nodes:
        target = node.target
        if node.op == "call_function" and isinstance(target, torch._ops.HigherOrderOperator) \
                and target is not torch.ops.higher_order.with_effects:
            counts[target.name()] = counts.get(target.name(), 0) + 1
    return counts
