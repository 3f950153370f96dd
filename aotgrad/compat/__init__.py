"""A drop-in for functorch's compile module: same names, signatures and graph conventions.

Switch with one import: `from aotgrad.compat import aot_function, nop`. One deliberate
difference: a compiled function compiles again for a new call signature (shapes, dtypes,
requires_grad, ...) instead of silently reusing the first graph; with `dynamic=True`, a
graph traced with symbolic sizes serves every call its shape guard accepts.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._decomp import get_decompositions
from torch._subclasses.fake_tensor import is_fake

from .. import check
from ..capture.inputs import lift_state, run_with_state
from ..api import CompiledFunction, CompiledModule
from ..backends.compilers import (compilation_context, eager_compiler, make_boxed_compiler,
                                  make_boxed_func, nop)
from ..partition.split import default_partition
from ..partition.remat import min_cut_rematerialization_partition
from ..dynamo import (compile_dynamo_graph, compile_for_new_aliasing, dynamo_fakes,
                      dynamo_static_inputs, guard_module_hooks)
from ..runtime.guards import fixed_inputs_check
from ..semantics.aliasing import AliasingChanged
from ..pipeline import Options
from .config import config
from .export import ExportGraphSignature, aot_export_joint_simple
from .kept_mutations import torch_outputs
from . import tools
from .tools import (debug_compile, draw_graph, draw_graph_compile, print_compile,
                    pythonkey_decompose, simple_ts_compile, ts_compile)
from ..schema import Backend

__all__ = [
    "aot_function", "aot_module", "aot_module_simplified", "aot_export_module",
    "aot_export_joint_simple", "aot_export_joint_with_descriptors",
    "aot_compile_joint_with_descriptors", "compiled_function", "compiled_module", "nop",
    "make_boxed_func", "make_boxed_compiler", "default_partition", "default_decompositions",
    "min_cut_rematerialization_partition", "memory_efficient_fusion", "config",
    "get_aot_compilation_context", "get_aot_graph_name", "get_graph_being_compiled",
    "print_compile", "debug_compile", "draw_graph", "draw_graph_compile", "ts_compile",
    "nnc_jit", "pythonkey_decompose", "minifier", "ExportGraphSignature",
]

aten = torch.ops.aten

# Pointwise backward and activation ops that are cheaper to fuse as their decompositions.
default_decompositions = get_decompositions([
    aten.detach, aten.gelu_backward, aten.leaky_relu_backward, aten.sigmoid_backward,
    aten.threshold_backward, aten.hardtanh_backward, aten.hardsigmoid_backward,
    aten.hardswish_backward, aten.tanh_backward, aten.silu_backward, aten.elu_backward,
    aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.elu, aten.leaky_relu,
    aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.conj_physical, aten.is_same_size,
    aten.cudnn_batch_norm, aten.cudnn_batch_norm_backward,
])


def _options(fw_compiler, bw_compiler, inference_compiler, partition_fn, decompositions,
             num_params_buffers=0, keep_inference_input_mutations=False,
             dynamic=False, compile_backward="lazy", where="aot_function") -> Options:
    check_compilers(where, fw_compiler, bw_compiler, inference_compiler, partition_fn)
    check.decomposition_table(where, decompositions)
    check.count(where, "num_params_buffers", num_params_buffers)
    check.flag(where, "keep_inference_input_mutations", keep_inference_input_mutations)
    check.flag(where, "dynamic", dynamic)
    forward = _kept_mutations if keep_inference_input_mutations else _fast
    backend = Backend(forward(fw_compiler), _fast(bw_compiler or fw_compiler),
                      forward(inference_compiler or fw_compiler), decompositions)
    return Options(backend, config.partitioner(partition_fn), keep_inference_input_mutations,
                   dynamic=dynamic, static_inputs=tuple(range(num_params_buffers)),
                   partitioner_static_inputs=(),  # functorch tells a partition_fn none
                   compile_backward=compile_backward)


def _fast(compiler: Callable) -> Callable:
    """`nop` runs the graph as it is: the eager backend does the same, as straight-line code
    without FX's per-op dispatch (codegen.py), so that this door's per-call overhead is the
    native door's. Any other compiler (one wrapping `nop` too) gets the graph itself."""
    return eager_compiler if compiler is nop else compiler


def _kept_mutations(compiler: Callable) -> Callable:
    """A forward compiler handed graphs that return no input they copied into, as torch's
    do (kept_mutations.py); `nop` sees no graph, and runs it as the runtime lays it out."""
    fast = _fast(compiler)
    return fast if fast is eager_compiler else torch_outputs(compiler)


def check_compilers(where: str, fw_compiler, bw_compiler=None, inference_compiler=None,
                    partition_fn=default_partition) -> None:
    check.function(where, "fw_compiler", fw_compiler)
    check.function(where, "bw_compiler", bw_compiler, optional=True)
    check.function(where, "inference_compiler", inference_compiler, optional=True)
    check.function(where, "partition_fn", partition_fn)


def aot_function(fn: Callable, fw_compiler: Callable, bw_compiler: Callable | None = None,
                 partition_fn: Callable = default_partition, decompositions=None,
                 num_params_buffers: int = 0, keep_inference_input_mutations: bool = False,
                 inference_compiler: Callable | None = None, *, dynamic: bool = False,
                 enable_log: bool = True, disable_functionalization: bool = False,
                 _disable_torch_fn_metadata_mode: bool = False, compile_backward: str = "lazy"):
    """`fn` compiled on first call with `fw_compiler`, as in functorch, and with
    `bw_compiler` at its first backward (`compile_backward="ahead"`: with the forward, as
    torch's `force_non_lazy_backward_lowering`); with `dynamic=True`, for symbolic sizes
    (one graph for many shapes; its backward is compiled ahead, as its compiler may add to
    the shape guard).

    `enable_log` and `_disable_torch_fn_metadata_mode` change only torch's logging and node
    metadata. `disable_functionalization`: a function that mutates nothing is traced without
    functionalization whatever the flag says (pure.py); one that mutates is functionalized
    anyway, because the runtime applies the mutations the functional graph returns."""
    check.function("aot_function", "fn", fn)
    return CompiledFunction(fn, _options(fw_compiler, bw_compiler, inference_compiler,
                                         partition_fn, decompositions, num_params_buffers,
                                         keep_inference_input_mutations, dynamic,
                                         compile_backward))


def aot_module(mod: torch.nn.Module, *args, **kwargs) -> torch.nn.Module:
    """`mod` with its forward compiled; parameters and buffers are lifted as inputs."""
    def with_compilers(fw_compiler, bw_compiler=None, partition_fn=default_partition,
                       decompositions=None, keep_inference_input_mutations=False,
                       inference_compiler=None, *, dynamic=False, enable_log=True,
                       disable_functionalization=False, _disable_torch_fn_metadata_mode=False,
                       compile_backward="lazy"):
        return _options(fw_compiler, bw_compiler, inference_compiler, partition_fn,
                        decompositions, 0, keep_inference_input_mutations, dynamic,
                        compile_backward, where="aot_module")

    check.module("aot_module", mod)
    check.not_data_parallel("aot_module", mod)
    refuse_fake_state(mod)
    return CompiledModule(mod, with_compilers(*args, **kwargs))


def nnc_jit(f: Callable[..., Any]) -> Callable[..., Any]:
    """`f` compiled by aot_function, both graphs frozen TorchScript."""
    return aot_function(f, simple_ts_compile)


def memory_efficient_fusion(fn: Callable | torch.nn.Module, **kwargs: Any):
    """`fn` (a function or module) compiled with the min-cut partitioner, the default
    decompositions and TorchScript; `kwargs` override any of them, as in functorch."""
    settings = {"fw_compiler": ts_compile, "bw_compiler": ts_compile,
                "partition_fn": min_cut_rematerialization_partition,
                "decompositions": default_decompositions, **kwargs}
    if isinstance(fn, torch.nn.Module):
        return aot_module(fn, **settings)
    return aot_function(fn, **settings)


def aot_module_simplified(mod: torch.nn.Module, args: Sequence[Any], fw_compiler: Callable,
                          bw_compiler: Callable | None = None,
                          partition_fn: Callable = default_partition, decompositions=None,
                          keep_inference_input_mutations: bool = False,
                          inference_compiler: Callable | None = None,
                          compiler_config_extra: Any = None, ignore_shape_env: bool = False,
                          disable_functionalization: bool = False,
                          pre_grad_passes: Callable | None = None,
                          compile_region_name: str | None = None, cudagraphs: Any = None,
                          boxed_forward_device_index: Any = None):
    """Compile now, for these flat `args`; returns `forward(*args)` (Dynamo's convention).
    The caller guards the inputs, as Dynamo does: a call that changes what the graph
    assumes of them (an input's requires_grad, a tensor passed twice) raises
    `InputsChanged` instead of compiling again. Inputs that share memory otherwise than the
    example inputs (views of one tensor, which Dynamo does not guard) compile again.

    `pre_grad_passes(mod, args)` rewrites a GraphModule first. `ignore_shape_env=True`
    leaves Dynamo's symbolic sizes alone: one graph per shape, as calls arrive.
    `compiler_config_extra` and `compile_region_name` key torch's compile cache, which
    aotgrad does not have; `disable_functionalization` is as in `aot_function`. `cudagraphs`
    and `boxed_forward_device_index` (torch 2.11's keywords, gone in 2.13) are Inductor's
    boxes for CUDA graphs, which aotgrad's compiles do not use."""
    check.module("aot_module_simplified", mod)
    check.function("aot_module_simplified", "pre_grad_passes", pre_grad_passes, optional=True)
    if pre_grad_passes is not None and isinstance(mod, fx.GraphModule):
        mod = pre_grad_passes(mod, args)
    if isinstance(mod, fx.GraphModule):  # a Dynamo graph: hooks added later must be seen
        guard_module_hooks(mod)
    refuse_fake_state(mod)
    lifted = lift_state(mod)
    state, names = lifted.tensors, lifted.names

    def flat_forward(*flat):
        params = dict(zip(names, flat[:len(state)]))
        return run_with_state(mod, params, tuple(flat[len(state):]))
    if isinstance(mod, fx.GraphModule):  # keyed by its graph before the trace (cache/program.py)
        flat_forward.aotgrad_program = (mod, tuple(names))

    options = replace(_options(fw_compiler, bw_compiler, inference_compiler, partition_fn,
                               decompositions, len(state), keep_inference_input_mutations,
                               where="aot_module_simplified"),
                      input_names=tuple(names))
    if isinstance(mod, fx.GraphModule):  # Dynamo's parameters and buffers are its inputs
        options = replace(options, static_inputs=options.static_inputs + tuple(
            len(state) + i for i in dynamo_static_inputs(mod, args)))
    if _from_dynamo(mod):  # torch tells a partition_fn of static inputs in Dynamo's graphs only
        options = replace(options, partitioner_static_inputs=None)
    # From Dynamo with dynamic shapes: its fakes, with symbolic sizes, for one graph.
    symbolic = isinstance(mod, fx.GraphModule) and not ignore_shape_env
    example = dynamo_fakes(mod, args) if symbolic else list(args)
    call = compile_dynamo_graph(flat_forward, [*state, *example], options)
    if call is None:  # one graph per shape, as calls arrive (Dynamo guards the sizes)
        lazy = CompiledFunction(flat_forward, options)

        def forward(*runtime_args):
            return lazy(*state, *runtime_args)
    else:
        refuse_fake_constants(call.artifact.forward_graph)
        gm = mod if isinstance(mod, fx.GraphModule) else None
        forward = _fixed_inputs_forward(call, state, example, compile_for_new_aliasing(
            flat_forward, gm, [*state, *example], options))

    if _is_flattening_wrapper(mod):
        forward = _boxed_forward(forward)
    forward.zero_grad = mod.zero_grad
    forward.named_parameters = mod.named_parameters
    forward.named_buffers = mod.named_buffers
    forward.serialize = None  # torch's, where the compile cannot be serialized (aotgrad's not)
    return forward


def _from_dynamo(mod: torch.nn.Module) -> bool:
    return isinstance(mod, fx.GraphModule) and "dynamo_compile_id" in mod.meta


def _is_flattening_wrapper(mod: torch.nn.Module) -> bool:
    """Dynamo's `GmWrapper`: a graph taking nested inputs (lists), wrapped by torch's
    `flatten_graph_inputs` to take them flat, which then calls the compiled function with
    one list of them (a backend written for torch's aot_autograd does so)."""
    utils = sys.modules.get("torch._dynamo.utils")  # not loaded: no Dynamo graph either
    return utils is not None and isinstance(mod, utils.GmWrapper)


def _boxed_forward(forward: Callable) -> Callable:
    """`forward` called as torch calls a GmWrapper's: with one list, which it empties so that
    the caller's references do not keep the inputs alive through the call."""
    def boxed(runtime_args: list):
        args = list(runtime_args)
        runtime_args.clear()
        return forward(*args)
    return boxed


def _fixed_inputs_forward(call, state: Sequence[torch.Tensor], example: Sequence[Any],
                          realiased: Callable) -> Callable:
    """`forward(*args)` running `call` on the module's state and `args`. Dynamo guards what
    the graph assumes of its inputs but how they share memory: a call whose inputs alias
    otherwise compiles again (`realiased`), as aotgrad's Dynamo backend does."""
    check_inputs = fixed_inputs_check([*state, *example])

    def forward(*runtime_args):
        flat = [*state, *runtime_args]
        check_inputs(flat)
        try:
            return call.run(flat)
        except AliasingChanged:
            return realiased(*flat)
    return forward


def refuse_fake_state(mod: torch.nn.Module) -> None:
    """Torch's refusal, word for word: a module whose parameters or buffers are fake tensors
    (made under a FakeTensorMode) cannot run for real."""
    for kind, named in (("buffer", mod.named_buffers()), ("param", mod.named_parameters())):
        for name, t in named:
            if is_fake(t):
                raise AssertionError(f"Unexpected fake {kind} {name}: aotgrad: the module "
                                     "holds a fake tensor; build it outside FakeTensorMode.")


def refuse_fake_constants(gm: fx.GraphModule) -> None:
    """A fake tensor the function closed over becomes a constant of the graph, which no real
    call could run: refused at compile time, as torch does."""
    for name, t in gm.named_buffers():
        if is_fake(t):
            raise AssertionError(f"Unexpected fake buffer {name}: aotgrad: the function "
                                 "closes over a fake tensor; pass it as an argument instead.")


compiled_function = aot_function
compiled_module = aot_module


def get_aot_compilation_context() -> tuple[list[str], str, int]:
    """(the graph being compiled, `["<compile id>_<role>"]`; the model name, "model"; how many
    graphs were compiled before it), as in functorch."""
    return compilation_context()


def get_aot_graph_name() -> str:
    """`model__<compile id>_<role>_<graphs compiled before>`, as functorch names it."""
    graphs, model, n = compilation_context()
    return f"{model}__{'_'.join(graphs)}_{n}"


get_graph_being_compiled = get_aot_graph_name


# ---- export -------------------------------------------------------------------------------

def aot_export_module(mod: torch.nn.Module, args: Sequence[Any], *, decompositions=None,
                      trace_joint: bool, output_loss_index: int | None = None,
                      pre_dispatch: bool = False, dynamic_shapes: bool | None = None,
                      kwargs: dict[str, Any] | None = None):
    """`mod` as one functional graph plus a signature naming its inputs and outputs.

    Inputs are parameters, buffers, then user inputs (`args`, then `kwargs`, flattened), named
    `argN_1` as torch names them. Outputs are new values of mutated buffers, the user
    outputs, then (with `trace_joint`) the gradients of the scalar output
    `output_loss_index` with respect to each parameter that requires grad. `pre_dispatch`:
    the graph before decomposition (torch-level ATen ops, grad mode changes kept), for a
    module that mutates nothing. `dynamic_shapes`: symbolic sizes; None, when the inputs are
    fakes with a ShapeEnv."""
    check.module("aot_export_module", mod)
    check.decomposition_table("aot_export_module", decompositions)
    if pre_dispatch and trace_joint:
        raise RuntimeError("pre_dispatch is not supported when trace_joint is True.")
    if trace_joint and output_loss_index is None:
        raise RuntimeError("aot_export_module(trace_joint=True) needs output_loss_index, the "
                           "position of the scalar loss among the module's outputs.")
    from .export import ExportRequest, export_module
    request = ExportRequest(decompositions, trace_joint, output_loss_index, pre_dispatch,
                            dynamic_shapes, kwargs or {})
    return export_module(mod, args, request)


def aot_export_joint_with_descriptors(stack, mod: torch.nn.Module, args, kwargs=None, *,
                                      decompositions=None,
                                      keep_inference_input_mutations: bool = False,
                                      ignore_shape_env: bool = False,
                                      disable_functionalization: bool = False,
                                      _record_nn_module_stack: bool = False,
                                      _disable_torch_fn_metadata_mode: bool = False):
    """The joint graph of `mod`, its inputs and outputs described in `meta["desc"]`
    (descriptors.py)."""
    from .descriptors import export_joint
    check.module("aot_export_joint_with_descriptors", mod)
    check.decomposition_table("aot_export_joint_with_descriptors", decompositions)
    return export_joint(stack, mod, args, kwargs, decompositions,
                        keep_inference_input_mutations)


def aot_compile_joint_with_descriptors(jd, *, partition_fn: Callable = default_partition,
                                       fw_compiler: Callable = nop,
                                       bw_compiler: Callable | None = nop,
                                       serializable: bool = False):
    """A callable `f(*params, *buffers, *args, **kwargs)` from `jd` (descriptors.py)."""
    from .descriptors import compile_joint
    check_compilers("aot_compile_joint_with_descriptors", fw_compiler, bw_compiler, None,
                    partition_fn)
    return compile_joint(jd, partition_fn, fw_compiler, bw_compiler, serializable)


def __getattr__(name: str):
    if name == "minifier":  # torch's, imported at first use (see tools)
        return tools.minifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
