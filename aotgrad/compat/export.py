"""Export: every export door's graph (aot_export_module, aot_export_joint_simple, the descriptors'
joint) and the one place that refuses what an exported graph cannot hold."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import contextlib

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._guards import detect_fake_mode

from .. import check
from ..capture import joint
from ..semantics import subclasses
from .config import config
from ..pipeline import capture_and_analyze
from ..verify import verify
from ..capture.inputs import call_with_state, lift_state, nan_checks_off
from ..schema import TRACED_OUTPUTS, FunctionInfo, OutputKind, SubclassMeta, is_tangent


@dataclass(frozen=True)
class BackwardSignature:
    gradients_to_parameters: dict[str, str]
    gradients_to_user_inputs: dict[str, str]
    loss_output: str


@dataclass(frozen=True)
class ExportGraphSignature:
    """Which graph inputs and outputs are parameters, buffers, user values, gradients."""

    parameters: list[str]
    buffers: list[str]
    user_inputs: list[str]
    user_outputs: list[str]
    inputs_to_parameters: dict[str, str]
    inputs_to_buffers: dict[str, str]
    buffers_to_mutate: dict[str, str]
    user_inputs_to_mutate: dict[str, str]
    in_spec: Any = None
    out_spec: Any = None
    backward_signature: BackwardSignature | None = None
    parameters_to_mutate: dict[str, str] = field(default_factory=dict)
    # Effect tokens threaded through the graph: aotgrad's exported graphs take none.
    input_tokens: list[str] = field(default_factory=list)
    output_tokens: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExportRequest:
    """What `aot_export_module` was asked for, as torch's keywords name it."""

    decompositions: Mapping | None
    trace_joint: bool
    loss_index: int | None
    pre_dispatch: bool = False
    dynamic_shapes: bool | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)


@nan_checks_off()  # as compile_call: anomaly mode's NaN checks read fake data
def export_module(mod: torch.nn.Module, args: Sequence[Any], request: ExportRequest):
    if config.functionalize_rng_ops:  # torch's refusal, word for word
        raise RuntimeError(
            "Functionalized RNG is not currently supported in the aot_export workflow. Please "
            "file a github issue,\nor otherwise set torch._functorch.config.functionalize_rng_ops"
            " = False.")
    if request.trace_joint:
        _refuse_pytree_inputs(args, request.kwargs)
    state = lift_state(mod)
    user_flat, user_spec = pytree.tree_flatten((tuple(args), dict(request.kwargs)))
    forward = call_with_state(mod, state.names, user_spec)
    flat = [*state.tensors, *user_flat]
    flat_args, in_spec = pytree.tree_flatten((tuple(flat), {}))
    # torch exports an inference graph under no_grad (a pre-dispatch one keeps grad mode).
    inference = not (request.trace_joint or request.pre_dispatch)
    with torch.no_grad() if inference else contextlib.nullcontext():
        c = capture_and_analyze(forward, flat_args, in_spec, dynamic=_dynamic(request, flat))
    info = c.info
    refuse_non_functional(c, "aot_export_module", allowed=MUTATIONS_RETURNED)
    wrt = [i for i, t in enumerate(c.inputs[:len(state.params)]) if t.requires_grad]
    gm = _trace(c, request, wrt)
    refuse_subclasses(c.fakes, gm, "aot_export_module")
    verify(gm)
    joint.name_inputs_as_args(gm)  # a joint export's too, as torch's
    sig = _signature(gm, info, list(state.params), list(state.buffers), wrt, request.loss_index,
                     info.out_spec)
    in_spec = pytree.tree_flatten(((*state.tensors, *args), dict(request.kwargs)))[1]
    return gm, replace(sig, in_spec=in_spec)


def _dynamic(request: ExportRequest, flat: Sequence[Any]) -> bool:
    """torch's rule: unless told, symbolic sizes exactly when the inputs are fakes of a mode
    with a ShapeEnv."""
    if request.dynamic_shapes is not None:
        return request.dynamic_shapes
    mode = detect_fake_mode(flat)
    return mode is not None and mode.shape_env is not None


def _refuse_pytree_inputs(args: Sequence[Any], kwargs: dict) -> None:
    """The joint export calls the module with its flat inputs, as torch's does."""
    if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
        raise RuntimeError("aot_export_module(trace_joint=True) takes tensors as inputs, "
                           "not pytrees or keyword arguments: aotgrad, like torch, calls the "
                           "module with the flat inputs. Flatten them in a wrapper module.")


def _trace(c, request: ExportRequest, wrt: list[int]) -> fx.GraphModule:
    decompositions = request.decompositions
    if request.trace_joint:
        _refuse_other_grad_outputs(c.info, request.loss_index)
        return joint.trace_loss_joint(c.graph_fn, c.info, c.fakes, c.fake_mode, decompositions,
                                      request.loss_index, wrt)
    if request.pre_dispatch:
        return _trace_pre_dispatch(c, decompositions)
    return joint.trace_inference(c.graph_fn, c.info, c.fakes, c.fake_mode, decompositions)


def _refuse_other_grad_outputs(info: FunctionInfo, loss_index: int) -> None:
    """torch's joint export differentiates the loss alone: any other output that requires
    grad would lose its gradient, so torch refuses it (RuntimeError), and so does aotgrad."""
    user = info.outputs
    for i, o in enumerate(user):
        if o.requires_grad and i != loss_index:
            raise RuntimeError(
                "Found an output of the forward that requires gradients, that was not the "
                f"scalar loss. You specified that output index {loss_index} is the loss, but "
                f"the output at index {i} requires gradients. Call .detach() on it.")
    loss = user[loss_index] if loss_index < len(user) else None
    if loss is None or not loss.requires_grad:
        raise RuntimeError(f"The output at index {loss_index} was marked as the loss, but it "
                           "does not require gradients")


def _trace_pre_dispatch(c, decompositions) -> fx.GraphModule:
    """The module's ATen ops before decomposition (`aten.linear`, not `addmm`), grad mode
    changes included, as torch's pre-dispatch export gives them. Without functionalization,
    so only for a module that mutates nothing."""
    from torch.fx.experimental.proxy_tensor import make_fx
    if any(x.mutated for x in c.info.inputs) or not c.pure:
        raise NotImplementedError("aotgrad: aot_export_module(pre_dispatch=True) of a module "
                                  "that mutates a tensor is not supported; export with "
                                  "pre_dispatch=False (a functional, decomposed graph).")

    def outputs(*primals):
        return list(pytree.tree_leaves(c.graph_fn(*primals)))

    refuse_subclasses(c.fakes, _NO_OUTPUT_LAYOUTS, "pre_dispatch export")
    with c.fake_mode:
        gm = make_fx(outputs, decomposition_table=dict(decompositions or {}),
                     pre_dispatch=True)(*c.fakes)
    gm.meta[TRACED_OUTPUTS] = ()  # subclass inputs were refused above
    return joint.cleanup(gm)


# A stand-in graph for refuse_subclasses before tracing: the inputs alone are checked.
_NO_OUTPUT_LAYOUTS = fx.GraphModule(torch.nn.Module(), fx.Graph())
_NO_OUTPUT_LAYOUTS.meta[TRACED_OUTPUTS] = ()


def _signature(gm, info, params, buffers, wrt, loss_index, out_spec) -> ExportGraphSignature:
    in_names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    out_names = [getattr(n, "name", None) for n in gm.graph.output_node().args[0]]
    state = params + buffers
    mutated = list(info.data_mutated_inputs)
    mutation_outputs = dict(zip(mutated, out_names[:len(mutated)]))
    user_outs = out_names[len(mutated):info.num_graph_outputs]
    backward = None
    if loss_index is not None:
        grads = out_names[info.num_graph_outputs:]
        backward = BackwardSignature(
            gradients_to_parameters={g: params[i] for g, i in zip(grads, wrt) if g},
            gradients_to_user_inputs={},
            loss_output=user_outs[loss_index])
    return ExportGraphSignature(
        parameters=params,
        buffers=buffers,
        user_inputs=in_names[len(state):],
        user_outputs=user_outs,
        inputs_to_parameters=dict(zip(in_names, params)),
        inputs_to_buffers=dict(zip(in_names[len(params):], buffers)),
        parameters_to_mutate={o: params[i] for i, o in mutation_outputs.items()
                              if i < len(params)},
        buffers_to_mutate={o: buffers[i - len(params)] for i, o in mutation_outputs.items()
                           if len(params) <= i < len(state)},
        user_inputs_to_mutate={o: in_names[i] for i, o in mutation_outputs.items()
                               if i >= len(state)},
        out_spec=out_spec,
        backward_signature=backward,
    )


@nan_checks_off()
def aot_export_joint_simple(func: Callable, args: Sequence[Any], *, trace_joint: bool,
                            num_params_buffers: int = 0, decompositions=None) -> fx.GraphModule:
    """One functional graph of `func` (flat tensors in, flat tensors out), with no input
    mutations and no aliased outputs. With `trace_joint`, the joint forward+backward graph:
    inputs `primals_*` then `tangents_*`, outputs the forward's then one gradient per input."""
    check.function("aot_export_joint_simple", "func", func)
    check.decomposition_table("aot_export_joint_simple", decompositions)
    _refuse_pytrees("inputs", pytree.tree_flatten(tuple(args))[1])
    flat, in_spec = pytree.tree_flatten((tuple(args), {}))
    c = capture_and_analyze(func, flat, in_spec)
    trace = joint.trace_joint if trace_joint else joint.trace_inference
    gm = trace(c.graph_fn, c.info, c.fakes, c.fake_mode, decompositions)
    refuse_subclasses(c.fakes, gm, "aot_export_joint_simple")
    joint.refuse_exported_backward_writes(joint.exported_backward_writes(gm))
    verify(gm)
    refuse_non_functional(c, "aot_export_joint_simple")
    _refuse_pytrees("outputs", c.info.out_spec)
    if trace_joint:
        call_as_primals_and_tangents(gm, c.info.num_graph_outputs)
    return gm


def _refuse_pytrees(what: str, spec: pytree.TreeSpec) -> None:
    """Torch's calling convention for this export: one flat list or tuple each way."""
    if spec.is_leaf() or spec.type not in (list, tuple):
        raise RuntimeError(f"aot_export_joint_simple requires {what} to be a single "
                           f"list/tuple. spec={spec}")
    if not all(child.is_leaf() for child in spec.children()):
        raise RuntimeError(f"aot_export_joint_simple requires individual {what} not to be "
                           f"pytrees. spec={spec}")


def call_as_primals_and_tangents(gm: fx.GraphModule, num_fw_outputs: int) -> None:
    """functorch's joint convention: `gm(primals, tangents) -> (outputs, gradients)`."""
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    num_tangents = sum(map(is_tangent, placeholders))
    num_primals = len(placeholders) - num_tangents
    outs = list(gm.graph.output_node().args[0])
    _, in_spec = pytree.tree_flatten(([0] * num_primals, [0] * num_tangents))
    _, out_spec = pytree.tree_flatten((tuple(outs[:num_fw_outputs]),
                                       tuple(outs[num_fw_outputs:])))
    gm.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(["primals", "tangents"], in_spec, out_spec))
    gm.recompile()


# ---- what no export door hands out ---------------------------------------------------------

class ExportUnsupported(NotImplementedError):
    """What aotgrad cannot export as one functional graph over the caller's tensors. A
    RuntimeError, as torch's own export refusals are."""


# What a door's graph may return as new input values (the rest of a mutation is refused).
NO_MUTATIONS = frozenset()  # aot_export_joint_simple: a pure function of its inputs
DATA_MUTATIONS = frozenset({"data"})  # descriptors: new values, same geometry
MUTATIONS_RETURNED = frozenset({"data", "metadata"})  # aot_export_module's signature


def refuse_non_functional(c, door: str, allowed: frozenset = NO_MUTATIONS) -> None:
    """The one check of every export door: the graph is functional over independent inputs
    and returns no alias, whatever mutations it returns are ones the door can describe."""
    reason = _non_functional(c, allowed)
    if reason is not None:
        raise ExportUnsupported(f"aotgrad: {door}: {reason}")


def _non_functional(c, allowed: frozenset) -> str | None:
    inputs = c.info.inputs
    if any(x.storage_swap is not None for x in inputs):
        return "the function calls set_() on an input; an exported graph cannot swap storages. " \
               "Return the tensor instead."
    if c.aliasing is not None and c.aliasing.groups:
        return "inputs that share memory are mutated; an exported graph takes independent " \
               "inputs. Pass clones."
    if any(x.mutates_data and "data" not in allowed for x in inputs) or \
            any(x.mutates_metadata and "metadata" not in allowed for x in inputs):
        return "the function mutates an input (or its metadata); export graphs must be " \
               "functional here. Return the new value instead."
    if any(o.kind is not OutputKind.PLAIN for o in c.info.outputs):
        return "an output aliases an input or another output; return a fresh tensor " \
               "(e.g. .clone())."
    return None


def refuse_subclasses(fakes: Sequence[torch.Tensor], gm: fx.GraphModule, door: str) -> None:
    """Export hands out the plain graph with a signature of the caller's tensors, which has
    no place yet for how a subclass splits."""
    layouts = [subclasses.describe(f) for f in fakes] + list(gm.meta[TRACED_OUTPUTS])
    if any(isinstance(m, SubclassMeta) for m in layouts):
        raise ExportUnsupported(
            f"aotgrad: {door} does not support tensor subclass inputs or outputs yet; pass "
            "their inner tensors (t.__tensor_flatten__()) and rebuild the subclass outside.")
