"""Stages 2 and 3 without functionalization, for functions that mutate nothing.

Functionalization replaces in-place ops by out-of-place ones. A function without any (the
training step of most models) gives it nothing to do, yet it costs about a third of a
trace: a Python wrapper around every tensor and a mode around every op. So the analysis
first runs the function on the fake inputs themselves, under a mode that stops at the first
op that functionalization would have to handle (`tables.needs_functionalization`: it
mutates, has an effect, is an error check or a higher-order op). When none comes, that run
is the analysis, exact without functionalization: no input is mutated, an output aliases
what its `_base` says. The graph is then traced the same way, and checked op by op after
decompositions. Anything else (an op stopped, any exception) takes the functionalized way
(`analysis.analyze`, `joint.trace_joint`), which raises what the user must see.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import analysis, joint, oplog, user_checks
from .analysis import graph_outputs
from ..schema import JOINT_FW_OUTPUTS, SIZE_INPUT, FunctionInfo, Geometry, InputInfo
from .inputs import OutputBox, global_state_restored_on_error
from ..semantics.autocast import autocast_on, eager_cast_cache
from ..semantics.dynamic import geometry, is_symbolic
from ..semantics.inference import decompose_tracking_views
from ..tables import needs_functionalization

_needs_functionalization = functools.cache(needs_functionalization)


class NeedsFunctionalization(Exception):
    """Raised at the first op that a trace without functionalization cannot take."""


class _StopAtImpureOps(TorchDispatchMode):
    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """The Dynamo that `scan` or `map` runs to capture its body (it stops here after)
        must not see this mode: it would skip the body's frame, and keep skipping it in
        the user's eager calls."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = decompose_tracking_views(self, func, args, kwargs)
        if out is not NotImplemented:  # its parts came through here
            return out
        if _needs_functionalization(func):
            raise NeedsFunctionalization(str(func))  # before it runs: the fakes stay intact
        out = func(*args, **(kwargs or {}))
        oplog.note(func, args, kwargs, out)
        return out


@contextlib.contextmanager
def plain_mode(checked: bool = True):
    """`capture.functional_mode` without functionalization: every op is checked (unless
    `checked` is False), and the caller's saved-tensor hooks are shadowed."""
    stop = _StopAtImpureOps() if checked else contextlib.nullcontext()
    with _shadowed_saved_tensor_hooks(), stop:
        yield


def _shadowed_saved_tensor_hooks():
    """The caller's saved-tensor hooks are for the compiled forward's values, not the fake
    ones: identity hooks shadow them. Only where there are some: under any hooks, autograd
    detaches each saved value it unpacks, an `alias` node in the trace and a dispatch."""
    if torch._C._autograd._top_saved_tensors_default_hooks(True) is None:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


# ---- stage 2: analysis ----------------------------------------------------------------------

def analyze(graph_fn: Callable, fakes: Sequence[Any], is_leaf: Sequence[bool],
            box: OutputBox, fake_mode: FakeTensorMode) -> FunctionInfo | None:
    """`analysis.analyze` for a function that mutates nothing; None for any other."""
    requires_grad = [getattr(f, "requires_grad", False) for f in fakes]
    geometry, held = [_geometry_of(f) for f in fakes], analysis.storages(fakes)
    try:
        with global_state_restored_on_error(), analysis.on_fakes(fake_mode, fakes), plain_mode(), \
                user_checks.user_code_checks(fakes), oplog.recording(fakes, _same) as ops:
            outs = graph_fn(*fakes)
        if ops is not None:  # out of the user code's checks: it reads grad_fn
            ops.returned(outs, fakes)
    except Exception:  # noqa: BLE001 - the functionalized analysis raises it again, explained
        _restore_requires_grad(fakes, requires_grad)
        return None
    if [_geometry_of(f) for f in fakes] != geometry or analysis.storages(fakes) != held:
        return None  # .data assigned, unseen by modes: the functionalized analysis refuses it
    if [getattr(f, "requires_grad", False) for f in fakes] != requires_grad:
        _restore_requires_grad(fakes, requires_grad)  # requires_grad_() on an input:
        return None  # the functionalized analysis records it on a wrapper, not on the fake
    inputs = tuple(_input_info(f, leaf, rg) for f, leaf, rg in zip(fakes, is_leaf, requires_grad))
    saved = [analysis.saved_by_own_node(o) for o in outs]
    return analysis.describe(inputs, fakes, outs, box, saved=saved)


def _input_info(fake: Any, is_leaf: bool, requires_grad: bool) -> InputInfo:
    if not isinstance(fake, torch.Tensor):
        return SIZE_INPUT
    return InputInfo(requires_grad=requires_grad, is_leaf=is_leaf, mutates_data=False,
                     mutates_metadata=False, mutation_hidden_from_autograd=True,
                     version_bumps=0, final_geometry=geometry(fake))


def _geometry_of(a: Any) -> Geometry | None:
    return geometry(a) if isinstance(a, torch.Tensor) else None  # None: a size input


def _restore_requires_grad(fakes: Sequence[Any], requires_grad: Sequence[bool]) -> None:
    for f, rg in zip(fakes, requires_grad):
        if isinstance(f, torch.Tensor) and f.is_leaf and f.requires_grad != rg:
            f.requires_grad_(rg)


# ---- stage 3: tracing -----------------------------------------------------------------------

def trace_joint(graph_fn: Callable, info: FunctionInfo, fakes: Sequence[torch.Tensor],
                fake_mode: FakeTensorMode, decompositions: Mapping | None) -> fx.GraphModule:
    """`joint.trace_joint`, without functionalization where the trace allows it."""
    def plain_joint(primals, tangents):
        # The analysis ran the forward under the check already (a mode costs ~5 us an op);
        # the backward's ops are new. The graph is checked whole after.
        with plain_mode(checked=False):
            outs = graph_outputs(info, primals, graph_fn(*primals))
        joint.tag_traced_forward()
        with plain_mode():
            return outs + joint.input_grads(outs, info.gets_tangent, primals, tangents)

    tangents = joint.fake_tangents(info, fake_mode)
    gm, all_leaves = None, eager_cast_cache(info)
    if all_leaves or not autocast_on():
        gm = _trace_plain(plain_joint, (list(fakes), tangents), fake_mode, decompositions, True,
                          all_leaves)
    if gm is None:
        return outputs_as_analysed(
            joint.trace_joint(graph_fn, info, fakes, fake_mode, decompositions), info)
    gm.meta[JOINT_FW_OUTPUTS] = joint.num_forward_outputs(gm, info)
    joint.mark_overwritten_inputs(gm, info, fakes)
    return outputs_as_analysed(gm, info)


def trace_inference(graph_fn: Callable, info: FunctionInfo, fakes: Sequence[torch.Tensor],
                    fake_mode: FakeTensorMode, decompositions: Mapping | None,
                    keep_input_mutations: bool = False) -> fx.GraphModule:
    """`joint.trace_inference`, without functionalization where the trace allows it (no
    input is mutated: `keep_input_mutations` changes nothing then)."""
    def plain_inference(primals):
        with plain_mode(checked=False):  # the analysis ran it under the check already
            return graph_outputs(info, primals, graph_fn(*primals))

    gm = _trace_plain(plain_inference, (list(fakes),), fake_mode, decompositions, False)
    if gm is None:
        gm = joint.trace_inference(graph_fn, info, fakes, fake_mode, decompositions,
                                   keep_input_mutations)
    else:
        gm = joint.name_inputs_as_args(gm)
    return outputs_as_analysed(gm, info)


def outputs_as_analysed(gm: fx.GraphModule, info: FunctionInfo) -> fx.GraphModule:
    """The trace runs torch's Python decompositions where the analysis ran eager's kernels:
    one that computes another shape or dtype (torch 2.11's LSTM states, before mends.py)
    would make the compiled function return something eager does not. Refused, by output."""
    metas = info.graph_output_metas
    if any(m is not None and m.subclass is not None for m in metas):
        return gm  # the graph returns a subclass output's inner tensors in its place
    values = [getattr(a, "meta", {}).get("val") for a in gm.graph.output_node().args[0]]
    for i, (meta, value) in enumerate(zip(metas, values)):
        if meta is None or not isinstance(value, torch.Tensor):
            continue
        if value.dtype != meta.dtype or not _same_shape(tuple(value.shape), meta.shape):
            raise NotImplementedError(
                f"aotgrad: output {i} of the traced graph is {value.dtype} "
                f"{list(value.shape)} where the analysis (eager's kernels) found "
                f"{meta.dtype} {list(meta.shape)}: torch's decomposition of an op in the "
                "function, which the trace runs in place of eager's kernel, computes another "
                "result; or nested autocast regions of two dtypes that cast one leaf, where "
                "autocast's cast cache reuses the inner region's cast (the trace keeps the "
                "cache, the analysis does not). Run that op (or region) outside "
                "the compiled function (torch.compiler.disable), and report it to aotgrad.")
    return gm


def _same_shape(traced: tuple, analysed: tuple) -> bool:
    """Sizes that are symbols (dynamic shapes) are not compared: only their number."""
    return len(traced) == len(analysed) and all(
        a == b for a, b in zip(traced, analysed) if not (is_symbolic(a) or is_symbolic(b)))


def _trace_plain(fn: Callable, args: tuple, fake_mode: FakeTensorMode,
                 decompositions: Mapping | None, differentiates: bool,
                 cast_cache: bool = False) -> fx.GraphModule | None:
    """The graph of `fn`, or None where it needs functionalization (decompositions run below
    the checking mode: their ops are checked in the graph)."""
    try:
        with global_state_restored_on_error():
            gm = joint.trace(fn, args, fake_mode, decompositions, differentiates, cast_cache)
    except Exception:  # noqa: BLE001 - the functionalized trace raises it again, explained
        return None
    if any(_needs_functionalization(n.target) for n in gm.graph.nodes if _is_op(n)):
        return None
    return gm


def _is_op(node: fx.Node) -> bool:
    """An ATen or higher-order op (not a getitem or an operation on sizes)."""
    return node.op == "call_function" and isinstance(
        node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator))
