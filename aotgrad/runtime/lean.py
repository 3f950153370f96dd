"""The short path of most training calls: an autograd.Function of one plan alone.

A plan is lean (`call._is_lean`) when nothing happens around its graphs but what autograd
needs: hold the inputs, save the forward's saved values, pass plain tangents to the backward.
For such a plan the forward and backward are generated as straight-line Python over its
constants (how many outputs, which take a tangent, what a missing tangent is made of), so a
call reads no flag and builds no slice. They are the staticmethods of a subclass of
CompiledFunction made per plan, still named "CompiledFunction": tools that look for compiled
regions by `grad_fn.name()` find them. Anything unusual in a backward (a stand-in ctx from a
tracer, create_graph=True) goes to CompiledFunction's general backward.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Sequence

import torch

from ..autograd import state as _compiled_autograd
from ..semantics import subclasses


def none_where_unreached(unreached: tuple, grads, outs):
    """`outs` with None for each input that no output in the loss reaches (eager's .grad
    stays None there, and optimizers skip the parameter: weight decay, momentum)."""
    if not unreached:
        return outs
    outs = list(outs)
    for i, outputs in unreached:
        if all(grads[k] is None for k in outputs):
            outs[i] = None
    return outs


_UNDETACHED = threading.local()


@contextlib.contextmanager
def undetached(inputs: Sequence[Any]):
    """The forward holds `inputs` for a double backward's replay, not the ones the runtime
    detached (no first-order gradient): the replay may read such an input with its history,
    as eager's second-order gradient does (a custom backward that returns None for it)."""
    _UNDETACHED.inputs = inputs
    try:
        yield
    finally:
        _UNDETACHED.inputs = None


def held_inputs(inputs: tuple) -> tuple:
    """The inputs a forward holds: `undetached`'s, taken once (a compiled call inside this
    one's graph holds its own)."""
    held = getattr(_UNDETACHED, "inputs", None)
    if held is None:
        return inputs
    _UNDETACHED.inputs = None
    return tuple(held)


def tangent(grad: torch.Tensor | None, meta, shape: "torch.Size | torch.Tensor | None"
            ) -> torch.Tensor:
    """What the backward graph takes for one output's gradient `grad`."""
    if grad is None and isinstance(shape, torch.Tensor):  # a subclass of symbolic shape
        return torch.zeros_like(shape)
    if grad is None and shape is not None:  # the meta's shape is symbolic: this call's
        return torch.zeros(shape, dtype=meta.dtype, device=meta.device)
    if grad is None and meta.subclass is None:  # the output took no part in the loss
        return torch.empty(meta.shape, dtype=meta.dtype, device=meta.device,
                           memory_format=meta.memory_format).zero_()
    if grad is None:
        return subclasses.zeros(meta.subclass)
    return grad.contiguous(memory_format=meta.memory_format)


def lean_function(call: Any, base: type) -> type:
    """A subclass of `base` (CompiledFunction) whose forward and backward are `call`'s."""
    cls = type(base)(base.__name__, (base,), {"__module__": base.__module__})
    node = cls._backward_cls
    node.call = call  # what the general backward and _compiled_autograd_key read of a ctx
    node.saved_sizes = ()  # a lean plan saves no sizes
    cls.forward = staticmethod(_forward(call))
    cls.backward = staticmethod(_backward(call, node, base.backward))
    # The engine runs a node by its `apply` (torch's PyNode::apply reads the attribute off the
    # node and calls it with the gradients, on 2.11 as on 2.13, where only a Function that
    # sets `boxed_grads_call` is called another way). BackwardCFunction.apply only chooses
    # between `backward` and `vjp`: with neither used here, the node calls the backward itself.
    node.apply = cls.backward
    return cls


def _forward(call: Any) -> Callable:
    """The forward: hold the inputs, run the graph, save the values after the outputs."""
    n = call.num_fw_outputs
    # _hold: versions of inputs not saved, or inputs the runtime passes detached
    hold = ("_hold(ctx, _held(inputs))" if call.holds_versions
            else "ctx.primals = inputs")  # every input is saved: autograd checks its version
    outputs = "".join(f"outs[{i}], " for i in range(n))
    # What set_materialize_grads(False) and save_for_backward set, without their frames
    # (the C++ side of Function.apply reads these attributes).
    source = ("def forward(ctx, call, *inputs):\n"
              f"    {hold}\n"
              "    ctx.materialize_grads = False\n"
              "    outs = _graph(list(inputs))\n"
              f"    ctx.to_save = tuple(outs[{n}:])\n"
              + ("    _hold_outputs(ctx, outs)\n" if call.saved_outputs else "")
              + ("    _hold_fed(ctx, outs)\n" if call.fed_outputs else "")
              + f"    return ({outputs})\n")
    scope = {"_hold": call.double_backward.hold, "_held": held_inputs, "_graph": call.forward,
             "_hold_outputs": call.saved_outputs and call.saved_outputs.hold,
             "_hold_fed": call.fed_outputs and call.fed_outputs.hold}
    return _generated(source, scope, "forward")


def _backward(call: Any, node: type, general: Callable) -> Callable:
    """The backward, in this frame, for a real node outside create_graph and tracing: the
    saved values and tangents to the backward graph, then the node's references dropped."""
    metas = call.plan.info.graph_output_metas
    scope = {"_node": node, "_grad": torch.is_grad_enabled, "_ca": _compiled_autograd,
             "_general": general, "_call": call,
             "_keep_graph": torch._C._autograd._get_current_graph_task_keep_graph,
             "_unreached": functools.partial(none_where_unreached, call.plan.unreached_grads),
             "_check_outputs": call.saved_outputs and call.saved_outputs.check,
             "_check_fed": call.fed_outputs and call.fed_outputs.check}
    tangents = []
    for i in call.tangent_outputs:
        scope[f"_zeros{i}"] = functools.partial(tangent, None, metas[i], None)
        scope[f"_format{i}"] = metas[i].memory_format
        layout = ("" if metas[i].memory_format == torch.contiguous_format
                  else f"memory_format=_format{i}")
        tangents.append(f"grads[{i}].contiguous({layout}) if grads[{i}] is not None "
                        f"else _zeros{i}()")
    # Dynamo (torch's compiled autograd) passes a stand-in ctx, and so does aotgrad's capture
    # (after marking `capturing` while the engine walks): those take the general backward.
    source = ("def backward(ctx, *grads):\n"
              "    if type(ctx) is not _node or _grad() or _ca.capturing:\n"
              "        return _general(ctx, *grads)\n"
              # an output eager's node saved, changed by the caller since: eager's error
              + ("    _check_outputs(ctx, grads)\n" if call.saved_outputs else "")
              # a hook on an output others are computed from: eager's sees more (fed_outputs)
              + ("    _check_fed(ctx, grads)\n" if call.fed_outputs else "") +
              f"    args = [*ctx.saved_tensors, {', '.join(tangents)}]\n"
              # the backward may free each saved value after its last use: no other
              # reference may remain, neither autograd's (unless retain_graph) nor ours
              "    ctx.maybe_clear_saved_tensors()\n"
              "    if not _keep_graph():\n"
              "        ctx.primals = None\n"
              + ("    return (None, *_unreached(grads, _call.backward(args)))\n"
                 if call.plan.unreached_grads else
                 "    return (None, *_call.backward(args))\n"))
    return left_to_python(_generated(source, scope, "backward"))


def left_to_python(fn: Callable) -> Callable:
    """`fn`, which Dynamo's frame hook now runs as plain Python, and every frame it calls.
    The engine calls a backward under that hook where `loss.backward()` runs inside a
    compiled function (a whole training step, after Dynamo's graph break at `.backward()`):
    Dynamo then traced aotgrad's backward as user code, and the compile of a lazy backward
    below it, into graphs for the backend to compile again (each first step). Torch's own
    compiled backward is skipped as torch's code. Dynamo still inlines it where it does not
    start a frame (the graph torch's compiled autograd captures)."""
    try:  # private to Dynamo: where it is missing, Dynamo traces these frames as before
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:
        return fn
    set_code_exec_strategy(fn.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    return fn


def _generated(source: str, scope: dict, name: str) -> Callable:
    exec(compile(source, f"<aotgrad lean {name}>", "exec"), scope)
    fn = scope[name]
    fn.source = source
    return fn
