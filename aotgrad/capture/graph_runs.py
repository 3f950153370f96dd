"""Dynamo's graph modules run one node at a time while aotgrad traces them.

Running a graph node by node (an `fx.Interpreter`) makes each node the current one while
its ops are traced, so the ATen nodes carry the user's stack traces and module paths, and
lets a few targets go where a trace needs them: compiled regions, checkpointed blocks, and
functions aotgrad patches by name (`.data` reads, saved-tensor hook switches).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch.fx.experimental import _config as fx_config

from ..semantics import checkpoints, mends, regions
from .own_saves import check_saves_at_backward

# Dynamo's call of a custom autograd.Function (absent from older torch)
_FUNCTION_APPLY = getattr(torch.ops.higher_order, "autograd_function_apply", None)


def node_by_node(fn: Callable) -> Callable:
    """A graph module (Dynamo's) run one node at a time, as the current node while its ops
    are traced: the ATen nodes then carry its `stack_trace`, `nn_module_stack` and
    `source_fn_stack`, which point backends' messages and profiles at the user's code.
    Other callables as they are, and a graph module whose call runs more than its graph."""
    if not isinstance(fn, torch.fx.GraphModule) or not runs_its_graph(fn):
        return fn
    return interpreted(fn)


def interpreted(gm: torch.fx.GraphModule) -> Callable:
    """`gm`'s graph run node by node (a higher-order op's body always is: not asked)."""
    def run(*args):
        return _NodeByNode(gm).run(*args)

    run.__name__ = type(gm).__name__
    return run


def runs_its_graph(gm: torch.fx.GraphModule) -> bool:
    """Whether calling `gm` runs the code of its graph as it is now: no hook of its own and
    no `forward` of the instance's own, and code made from the graph (a pass that edits a
    graph without `recompile()` leaves the old code). Global module hooks are not asked:
    Dynamo's graphs are called by no user code, and ran them inside already."""
    if "forward" in vars(gm) or any((gm._forward_hooks, gm._forward_pre_hooks,
                                     gm._backward_hooks, gm._backward_pre_hooks)):
        return False
    needs_recompile = getattr(type(gm), "_needs_recompile", None)
    if needs_recompile is not None and needs_recompile():  # lazy: made from the graph at its call
        return True
    if getattr(fx_config, "enrich_profiler_metadata", False):  # code names a per-file key:
        return True  # not comparable (its graph, as before)
    return gm.code == gm.graph.python_code(root_module="self").src


class _NodeByNode(torch.fx.Interpreter):
    """Calls `torch._C._autograd._get_data_attr` (Dynamo's `.data`) and the switches of
    saved-tensor hooks by their names, as the graph's own code does: a double backward's
    trace replaces the first to see `.data` reads, functional_mode the others.
    Compiled regions' calls go to `regions.call_region`: each body is traced once; inside
    `regions.inlined()` (a double backward's replay) the body runs in place, as in eager.
    So does a checkpointed block's there: its higher-order op records the body's ops under
    torch's own dispatch modes, whose detaches (below autograd, invisible to eager's
    history) the replay would take for the user's. Elsewhere a plain checkpoint's body runs
    once, tagged (`semantics/checkpoints.py`); a selective one goes to torch's op."""

    def call_function(self, target, args, kwargs):
        if any(target is t for t in _BY_NAME):  # by its module's attribute, as the code does
            target = getattr(torch._C._autograd, target.__name__)
        elif target is regions.INVOKE_SUBGRAPH and regions.inline(args[1]):
            body, _, *operands = args
            return tuple(interpreted(body)(*operands))
        elif target is regions.INVOKE_SUBGRAPH:
            target = regions.call_region
        elif target is regions.CHECKPOINT and regions.replaying():
            body, *operands = args
            return interpreted(body)(*operands)
        elif target is regions.CHECKPOINT and checkpoints.is_plain(args[0]):
            body, *operands = args
            # Not told reentrant: Dynamo lifts the parameters the body reads into its
            # operands, so eager's rule (no gradient unless an input requires grad) cannot
            # be applied to the user's inputs alone (tests/test_remat.py, xfail).
            return checkpoints.run_region(interpreted(body), operands, reentrant=False,
                                          preserve_rng_state=kwargs.get(
                                              "preserve_rng_state", True))
        elif target is _FUNCTION_APPLY and target is not None:
            out = super().call_function(target, args, kwargs)
            check_saves_at_backward(out)
            return out
        elif target is regions.CHECKPOINT:  # a selective one, to torch's op
            with checkpoints.dynamo_selective_region(kwargs.get("preserve_rng_state", True)):
                return super().call_function(target, args, kwargs)
        return super().call_function(target, args, kwargs)


_BY_NAME = (torch._C._autograd._get_data_attr, mends.DISABLE_HOOKS, mends.ENABLE_HOOKS)
