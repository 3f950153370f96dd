"""A drop-in for functorch's compile module: same names, signatures and graph conventions.

Switch with one import: `from aotgrad.compat import aot_function, nop`. One deliberate
difference: a compiled function compiles again for a new call signature (shapes, dtypes,
requires_grad, ...) instead of silently reusing the first graph; with `dynamic=True`, a
graph traced with symbolic sizes serves every call its shape guard accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._decomp import get_decompositions

from . import analysis, capture, joint, subclasses
from .api import CompiledFunction, CompiledModule
from .backends import (Backend, compilation_context, make_boxed_compiler,
                       make_boxed_func, nop)
from .partition import default_partition
from .remat import min_cut_rematerialization_partition
from .dynamo import compile_dynamo_graph, dynamo_fakes
from .pipeline import Options, capture_and_analyze
from .verify import verify

__all__ = [
    "aot_function", "aot_module", "aot_module_simplified", "aot_export_module",
    "aot_export_joint_simple", "compiled_function", "compiled_module", "nop",
    "make_boxed_func", "make_boxed_compiler", "default_partition", "default_decompositions",
    "min_cut_rematerialization_partition",
    "get_aot_compilation_context", "get_aot_graph_name", "ExportGraphSignature",
]

aten = torch.ops.aten

# Pointwise backward and activation ops that are cheaper to fuse as their decompositions.
default_decompositions = get_decompositions([
    aten.detach, aten.gelu_backward, aten.leaky_relu_backward, aten.sigmoid_backward,
    aten.threshold_backward, aten.hardtanh_backward, aten.hardsigmoid_backward,
    aten.hardswish_backward, aten.tanh_backward, aten.silu_backward, aten.elu_backward,
    aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.elu, aten.leaky_relu,
    aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.conj_physical, aten.is_same_size,
])


def _options(fw_compiler, bw_compiler, inference_compiler, partition_fn, decompositions,
             num_params_buffers=0, keep_inference_input_mutations=False,
             dynamic=False) -> Options:
    backend = Backend(fw_compiler, bw_compiler or fw_compiler,
                      inference_compiler or fw_compiler, decompositions)
    return Options(backend, partition_fn, keep_inference_input_mutations, dynamic=dynamic,
                   static_inputs=tuple(range(num_params_buffers)))


def aot_function(fn: Callable, fw_compiler: Callable, bw_compiler: Callable | None = None,
                 partition_fn: Callable = default_partition, decompositions=None,
                 num_params_buffers: int = 0, keep_inference_input_mutations: bool = False,
                 inference_compiler: Callable | None = None, *, dynamic: bool = False):
    """`fn` compiled on first call with `fw_compiler`/`bw_compiler`, as in functorch; with
    `dynamic=True`, for symbolic sizes (one graph for many shapes)."""
    return CompiledFunction(fn, _options(fw_compiler, bw_compiler, inference_compiler,
                                         partition_fn, decompositions, num_params_buffers,
                                         keep_inference_input_mutations, dynamic))


def aot_module(mod: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """`mod` with its forward compiled; parameters and buffers are lifted as inputs."""
    def with_compilers(fw_compiler, bw_compiler=None, partition_fn=default_partition,
                       decompositions=None, keep_inference_input_mutations=False,
                       inference_compiler=None, *, dynamic=False):
        return _options(fw_compiler, bw_compiler, inference_compiler, partition_fn,
                        decompositions, 0, keep_inference_input_mutations, dynamic)

    return CompiledModule(mod, with_compilers(*args, **kwargs))


def aot_module_simplified(mod: torch.nn.Module, args: Sequence[Any], fw_compiler: Callable,
                          bw_compiler: Callable | None = None,
                          partition_fn: Callable = default_partition, decompositions=None,
                          keep_inference_input_mutations: bool = False,
                          inference_compiler: Callable | None = None, **_ignored):
    """Compile now, for these flat `args`; returns `forward(*args)` (Dynamo's convention)."""
    state = [*mod.parameters(), *mod.buffers()]
    names = [n for n, _ in mod.named_parameters()] + [n for n, _ in mod.named_buffers()]

    def flat_forward(*flat):
        params = dict(zip(names, flat[:len(state)]))
        return capture.run_with_state(mod, params, tuple(flat[len(state):]))

    options = _options(fw_compiler, bw_compiler, inference_compiler, partition_fn,
                       decompositions, len(state), keep_inference_input_mutations)
    # From Dynamo with dynamic shapes: its fakes, with symbolic sizes, for one graph.
    example = dynamo_fakes(mod, args) if isinstance(mod, fx.GraphModule) else list(args)
    call = compile_dynamo_graph(flat_forward, [*state, *example], options)
    if call is None:  # one graph per shape, as calls arrive (Dynamo guards the sizes)
        lazy = CompiledFunction(flat_forward, options)

        def forward(*runtime_args):
            return lazy(*state, *runtime_args)
    else:
        def forward(*runtime_args):
            return call.run([*state, *runtime_args])

    forward.zero_grad = mod.zero_grad
    forward.named_parameters = mod.named_parameters
    forward.named_buffers = mod.named_buffers
    return forward


compiled_function = aot_function
compiled_module = aot_module


def get_aot_compilation_context() -> tuple[list[str], str, int]:
    """(graphs being compiled, model name, graph number), as in functorch."""
    return compilation_context()


def get_aot_graph_name() -> str:
    graphs, model, n = compilation_context()
    return f"{model}__{'_'.join(graphs)}_{n}"


# ---- export -------------------------------------------------------------------------------

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


def aot_export_joint_simple(func: Callable, args: Sequence[Any], *, trace_joint: bool,
                            num_params_buffers: int = 0, decompositions=None) -> fx.GraphModule:
    """One functional graph of `func` (flat tensors in, flat tensors out), with no input
    mutations and no aliased outputs. With `trace_joint`, the joint forward+backward graph:
    inputs `primals_*` then `tangents_*`, outputs the forward's then one gradient per input."""
    flat, in_spec = pytree.tree_flatten((tuple(args), {}))
    traced = _trace_for_export(func, flat, in_spec, decompositions, trace_joint)
    _refuse_mutations_and_aliases(traced.info)
    gm = traced.graph
    if trace_joint:
        _call_as_primals_and_tangents(gm, traced.info.num_graph_outputs)
    return gm


def _call_as_primals_and_tangents(gm: fx.GraphModule, num_fw_outputs: int) -> None:
    """functorch's joint convention: `gm(primals, tangents) -> (outputs, gradients)`."""
    from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    num_tangents = sum(n.name.startswith("tangents") for n in placeholders)
    num_primals = len(placeholders) - num_tangents
    outs = list(gm.graph.output_node().args[0])
    _, in_spec = pytree.tree_flatten(([0] * num_primals, [0] * num_tangents))
    _, out_spec = pytree.tree_flatten((tuple(outs[:num_fw_outputs]),
                                       tuple(outs[num_fw_outputs:])))
    gm.graph._codegen = _PyTreeCodeGen(_PyTreeInfo(["primals", "tangents"], in_spec, out_spec))
    gm.recompile()


@dataclass
class _Traced:
    info: analysis.FunctionInfo
    graph: fx.GraphModule


def _trace_for_export(fn, flat, in_spec, decompositions, trace_joint: bool) -> _Traced:
    c = capture_and_analyze(fn, flat, in_spec)
    trace = joint.trace_joint if trace_joint else joint.trace_inference
    gm = trace(c.graph_fn, c.info, c.fakes, c.fake_mode, decompositions)
    subclasses.refuse_in_export(c.fakes, gm, "aot_export_joint_simple")
    return _Traced(c.info, verify(gm))


def _refuse_mutations_and_aliases(info: analysis.FunctionInfo) -> None:
    if any(x.mutated or x.storage_swap is not None for x in info.inputs):
        raise RuntimeError("aot_export_joint_simple: the function mutates an input; "
                           "export graphs must be functional. Return the new value instead.")
    if any(o.kind is not analysis.OutputKind.PLAIN for o in info.outputs):
        raise RuntimeError("aot_export_joint_simple: an output aliases an input or another "
                           "output; return a fresh tensor (e.g. .clone()).")


def aot_export_module(mod: torch.nn.Module, args: Sequence[Any], *, decompositions=None,
                      trace_joint: bool, output_loss_index: int | None = None):
    """`mod` as one functional graph plus a signature naming its inputs and outputs.

    Inputs are parameters, buffers, then user inputs. Outputs are new values of mutated
    buffers, the user outputs, then (with `trace_joint`) the gradients of the scalar output
    `output_loss_index` with respect to each parameter that requires grad."""
    if trace_joint and output_loss_index is None:
        raise RuntimeError("aot_export_module(trace_joint=True) needs output_loss_index, the "
                           "position of the scalar loss among the module's outputs.")
    from .export import export_module
    return export_module(mod, args, decompositions, trace_joint, output_loss_index)


def __getattr__(name: str):
    unsupported = {"memory_efficient_fusion",
                   "ts_compile", "draw_graph", "print_compile", "aot_export_joint_with_descriptors",
                   "clear_compile_cache", "memory_efficient_pointwise_fusion",
                   "debug_compile", "draw_graph_compile", "simple_ts_compile", "nnc_jit"}
    if name in unsupported:
        raise NotImplementedError(f"aotgrad.compat.{name} is not supported yet.")
    raise AttributeError(f"module 'aotgrad.compat' has no attribute {name!r}")
