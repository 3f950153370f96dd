"""`aot_export_joint_with_descriptors`: a module's joint graph whose inputs and outputs say
what they are, in `node.meta["desc"]`, and its companion compile.

The descriptors are torch's (same class names, fields and `expr()`), for the cases aotgrad
exports: parameters, buffers and plain inputs; tangents; plain outputs, mutated inputs'
new values and gradients. Outputs that alias an input or another output, and inputs that
share memory with a mutated input, are refused. `aot_compile_joint_with_descriptors`
compiles the joint as exported; a graph changed after export is refused (the runtime's plan
is derived from the module, not from the edited graph).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree
from torch import fx

from ..capture import joint
from ..capture.inputs import call_with_state, lift_state, nan_checks_off, state_swapped
from ..api import CompiledFunction
from ..schema import Backend, FunctionInfo
from .config import config
from .export import DATA_MUTATIONS, call_as_primals_and_tangents, refuse_non_functional
from ..pipeline import Options, capture_and_analyze
from ..verify import verify


@dataclass(frozen=True)
class AOTInput:
    def expr(self) -> str:
        raise NotImplementedError

    def is_param(self) -> bool:
        return False

    def is_buffer(self) -> bool:
        return False

    def is_tangent(self) -> bool:
        return False


@dataclass(frozen=True)
class AOTOutput:
    def expr(self) -> str:
        raise NotImplementedError

    def is_grad(self) -> bool:
        return False


@dataclass(frozen=True)
class ParamAOTInput(AOTInput):
    target: str

    def expr(self) -> str:
        return f"self.get_parameter({self.target!r})"

    def is_param(self) -> bool:
        return True


@dataclass(frozen=True)
class BufferAOTInput(AOTInput):
    target: str

    def expr(self) -> str:
        return f"self.get_buffer({self.target!r})"

    def is_buffer(self) -> bool:
        return True


@dataclass(frozen=True)
class PlainAOTInput(AOTInput):
    idx: int  # position among the flat user arguments (args, then kwargs)

    def expr(self) -> str:
        return f"args[{self.idx}]"


@dataclass(frozen=True)
class PlainAOTOutput(AOTOutput):
    idx: int

    def expr(self) -> str:
        return f"output[{self.idx}]"


@dataclass(frozen=True)
class InputMutationAOTOutput(AOTOutput):
    mutated_input: AOTInput

    def expr(self) -> str:
        return f"__input_mutation({self.mutated_input.expr()})"


@dataclass(frozen=True)
class TangentAOTInput(AOTInput):
    output: AOTOutput

    def expr(self) -> str:
        return f"__output_tangent({self.output.expr()})"

    def is_tangent(self) -> bool:
        return True


@dataclass(frozen=True)
class GradAOTOutput(AOTOutput):
    grad_of: AOTInput

    def expr(self) -> str:
        return f"__grad({self.grad_of.expr()})"

    def is_grad(self) -> bool:
        return True


@dataclass
class JointWithDescriptors:
    """The exported joint graph (replaceable), and how to call what it compiles to."""

    graph_module: fx.GraphModule
    params_spec: list[str]  # parameter names, in the order the compiled callable takes them
    buffers_spec: list[str]
    in_spec: pytree.TreeSpec
    out_spec: pytree.TreeSpec
    fake_mode: Any
    _module: torch.nn.Module
    _exported: fx.GraphModule
    _decompositions: Any
    _keep_inference_input_mutations: bool


@nan_checks_off()  # as compile_call: anomaly mode's NaN checks read fake data
def export_joint(stack: contextlib.ExitStack, mod: torch.nn.Module, args, kwargs,
                 decompositions, keep_inference_input_mutations: bool) -> JointWithDescriptors:
    lifted = lift_state(mod)
    params, buffers, state = list(lifted.params), list(lifted.buffers), lifted.tensors
    user_flat, user_spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    flat_args, flat_spec = pytree.tree_flatten((tuple([*state, *user_flat]), {}))
    c = capture_and_analyze(call_with_state(mod, lifted.names, user_spec), flat_args, flat_spec)
    refuse_non_functional(c, "aot_export_joint_with_descriptors", allowed=DATA_MUTATIONS)
    gm = joint.trace_joint(c.graph_fn, c.info, c.fakes, c.fake_mode, decompositions)
    joint.refuse_exported_backward_writes(joint.exported_backward_writes(gm))
    verify(gm)
    in_descs = [_input_desc(p, list(params), list(buffers)) for p in c.layout.first_position]
    _describe(gm, c.info, in_descs)
    call_as_primals_and_tangents(gm, c.info.num_graph_outputs)
    in_spec = pytree.tree_flatten(([*state, *args], dict(kwargs or {})))[1]
    return JointWithDescriptors(gm, list(params), list(buffers), in_spec, c.info.out_spec,
                                c.fake_mode, mod, gm, decompositions,
                                keep_inference_input_mutations)


def _input_desc(flat_position: int, params: list[str], buffers: list[str]) -> AOTInput:
    if flat_position < len(params):
        return ParamAOTInput(params[flat_position])
    if flat_position < len(params) + len(buffers):
        return BufferAOTInput(buffers[flat_position - len(params)])
    return PlainAOTInput(flat_position - len(params) - len(buffers))


def _describe(gm: fx.GraphModule, info: FunctionInfo, in_descs: list[AOTInput]) -> None:
    """meta["desc"] on each placeholder, and the output node's list of output descriptors."""
    out_descs = [InputMutationAOTOutput(in_descs[i]) for i in info.data_mutated_inputs]
    out_descs += [PlainAOTOutput(j) for j in range(len(info.outputs))]
    tangent_descs = [TangentAOTInput(d) for d, g in zip(out_descs, info.gets_tangent) if g]
    placeholders = gm.graph.find_nodes(op="placeholder")
    for node, desc in zip(placeholders, in_descs + tangent_descs):
        node.meta["desc"] = desc
    output = gm.graph.output_node()
    grads = output.args[0][info.num_graph_outputs:]
    output.meta["desc"] = out_descs + [None if g is None else GradAOTOutput(d)
                                       for g, d in zip(grads, in_descs)]


def compile_joint(jd: JointWithDescriptors, partition_fn: Callable, fw_compiler: Callable,
                  bw_compiler: Callable | None, serializable: bool) -> Callable:
    """`f(*params, *buffers, *args, **kwargs)`, compiled by the pipeline with these compilers."""
    if serializable:
        raise NotImplementedError("aotgrad: aot_compile_joint_with_descriptors("
                                  "serializable=True) is not supported; pass serializable=False.")
    if jd.graph_module is not jd._exported:
        raise NotImplementedError(
            "aotgrad: compiling a joint graph replaced after aot_export_joint_with_descriptors "
            "is not supported yet; compile the module (aotgrad.compile) or export again.")
    backend = Backend(fw_compiler, bw_compiler or fw_compiler, fw_compiler, jd._decompositions)
    num_state = len(jd.params_spec) + len(jd.buffers_spec)
    options = Options(backend, config.partitioner(partition_fn),
                      jd._keep_inference_input_mutations, static_inputs=tuple(range(num_state)))
    return CompiledFunction(_module_call(jd._module, jd.params_spec + jd.buffers_spec), options)


def _module_call(mod: torch.nn.Module, names: list[str]) -> Callable:
    def call(*args, **kwargs):
        state = dict(zip(names, args[:len(names)]))
        with state_swapped(mod, state):
            return mod(*args[len(names):], **kwargs)
    return call


__all__ = [cls.__name__ for cls in (AOTInput, AOTOutput, ParamAOTInput, BufferAOTInput,
                                    PlainAOTInput, PlainAOTOutput, InputMutationAOTOutput,
                                    TangentAOTInput, GradAOTOutput, JointWithDescriptors)]
