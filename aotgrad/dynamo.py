"""The Dynamo front door: `torch.compile(model, backend="aotgrad")`.

Dynamo hands over an FX graph of torch-level ops and fake example inputs (parameters first);
it guards on everything that would change the graph, so the compiled call is used as is.
With dynamic shapes (`torch.compile(..., dynamic=True)`, or sizes Dynamo saw change), the
fake inputs have symbolic sizes of Dynamo's ShapeEnv and some inputs are sizes (`SymInt`s):
aotgrad traces with them, and whatever it or its backend assumes about the sizes becomes
part of Dynamo's guards, so one compiled graph serves every size those guards admit.
"""

from __future__ import annotations

import copy
import functools
import operator
import re
from dataclasses import replace
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from . import check
from .capture.kernel_choice import fold_constant_masks
from .semantics import hops
from .semantics.aliasing import AliasingChanged
from .api import CompiledFunction, checked_options, with_settings
from .backends.settings import compile_settings
from .semantics.dynamic import (falls_back_to_static, is_symbolic, item_symbol,
                                warn_static_fallback)
from .pipeline import Options, compile_call
from .runtime.call import CompiledCall
from .runtime.guards import function_modes_off, function_modes_on, under_a_function_mode


def make_backend(*, backend: Any = "inductor", partitioner: Callable | None = None,
                 memory_budget: float | None = None, decompositions=None,
                 keep_inference_input_mutations: bool = False,
                 compile_backward: str = "lazy", cudagraphs: bool = False,
                 mode: str | None = None, options: dict | None = None) -> Callable:
    made_with = dict(backend=backend, partitioner=partitioner, memory_budget=memory_budget,
                     decompositions=decompositions,
                     keep_inference_input_mutations=keep_inference_input_mutations,
                     compile_backward=compile_backward, cudagraphs=cudagraphs, mode=mode,
                     options=options)
    base = checked_options("backend", **made_with)  # each graph adds torch.compile's settings

    def aotgrad_dynamo_backend(gm: torch.fx.GraphModule, example_inputs, *,
                               mode: str | None = None, options: dict | None = None):
        if any(isinstance(x, list) for x in example_inputs):  # compiled autograd's graphs
            return unbox_list_inputs(gm, example_inputs, functools.partial(
                aotgrad_dynamo_backend, mode=mode, options=options))
        held = _held_tensors(gm)
        if held:  # the optimizer's parameters, its state (a compiled step)
            return lift_held_tensors(gm, held, example_inputs, functools.partial(
                aotgrad_dynamo_backend, mode=mode, options=options))
        hops.refuse_in_graph(gm.graph)
        fold_constant_masks(gm)
        graph_options = replace(with_settings(base, compile_settings(mode, options)),
                                static_inputs=dynamo_static_inputs(gm, example_inputs),
                                input_names=_user_names(gm))
        fakes = dynamo_fakes(gm, example_inputs)
        call = compile_dynamo_graph(_rebinding_unbacked(gm), fakes, graph_options)
        if call is None:  # Dynamo guards the sizes: one graph per shape, as calls arrive
            lazy = CompiledFunction(gm, graph_options)

            def run_lazy(*args):
                if function_modes_on() and under_a_function_mode():
                    return _without_function_modes(run_lazy, args)
                return lazy(*args)
            return run_lazy
        run_call = call.run
        # Dynamo does not guard on how inputs alias; a call aliased differently from the
        # example inputs compiles again, as aotgrad.compile does.
        realiased = compile_for_new_aliasing(gm, gm, fakes, graph_options)

        def run(*args):
            if function_modes_on() and under_a_function_mode():  # one C call when none
                return _without_function_modes(run, args)
            try:
                return run_call(args)
            except AliasingChanged:
                return realiased(*args)

        run.artifact = call.artifact
        return _marking_dynamic_outputs(run, _dynamic_output_dims(gm))

    return _Backend(aotgrad_dynamo_backend, made_with)


def _without_function_modes(run: Callable, args: tuple):
    """`run(*args)` with the caller's torch function modes off. Dynamo traced the graph
    under them (it guards on the mode stack), inlining what their `__torch_function__` did
    to each call; the compiled code runs torch's functions (the eager backend's bindings,
    Inductor's extern kernels), which a mode still on would see and rewrite a second time
    (`torch.sin` doubled twice). A default device alone stays on (`under_a_function_mode`
    tells it apart, only when some mode is on): Dynamo wrote its device into the graph's
    factories, which the compiled code passes on, so it changes nothing there; with a
    user's mode it comes off with the others."""
    with function_modes_off():
        return run(*args)


def _rebinding_unbacked(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """`gm`, whose trace on fake values names each size it computes from data (`nonzero`'s
    count, `.item()`) by Dynamo's symbol for it, not a fresh one. Otherwise the tangent of an
    output of size `u0 + 2` (Dynamo's symbol) held a symbol the forward never computed, and the
    backward's sizes were refused as unknown. Runs on real tensors are left as they are."""
    from torch._guards import detect_fake_mode
    if not any("unbacked_bindings" in n.meta for n in gm.graph.nodes):
        return gm
    plain = gm.forward

    @functools.wraps(plain)
    def forward(*args):
        if detect_fake_mode(args) is None:
            return plain(*args)
        return _Rebinding(gm).run(*args)
    gm.forward = forward
    return gm


class _Rebinding(torch.fx.Interpreter):
    """Runs a graph renaming the fresh unbacked symbols of each node to those Dynamo's trace
    gave it. aotgrad traces a graph several times (analyses, then the joint) on the same fake
    inputs; an op memoized on its input (`nonzero`) returns the symbol already renamed."""

    def run_node(self, n: torch.fx.Node):
        from torch._guards import detect_fake_mode
        from torch.fx.experimental.symbolic_shapes import rebind_unbacked
        result = super().run_node(n)
        bindings = n.meta.get("unbacked_bindings")
        if bindings and not _already_bound(bindings, result):
            rebind_unbacked(detect_fake_mode().shape_env, n, result)
        return result


def _already_bound(bindings: dict, result) -> bool:
    """Whether each of `result`'s sizes that Dynamo bound to a symbol already stands for it."""
    for symbol, path in bindings.items():
        value = pytree.key_get(result, path)
        if isinstance(value, torch.SymInt) and value.node.expr != symbol:
            return False
    return True


def _dynamic_output_dims(gm: torch.fx.GraphModule) -> tuple[tuple[int, frozenset[int]], ...]:
    """(output index, its dims of symbolic size) for each output tensor that has some."""
    from torch.fx.experimental.symbolic_shapes import is_concrete_int
    (out,) = gm.graph.find_nodes(op="output")
    if not isinstance(out.args[0], (tuple, list)):
        return ()
    dims = []
    for i, node in enumerate(out.args[0]):
        value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            symbolic = frozenset(d for d, n in enumerate(value.shape) if not is_concrete_int(n))
            if symbolic:
                dims.append((i, symbolic))
    return tuple(dims)


# The attribute Dynamo reads: torch 2.13's unguarded one; 2.11 reads only the one
# `maybe_mark_dynamic` sets, which guards (what its AOTAutograd sets).
_DYNAMIC_DIMS = ("_dynamo_propagated_dynamic_indices" if torch.__version__ >= (2, 13)
                 else "_dynamo_weak_dynamic_indices")


def _marking_dynamic_outputs(run: Callable, dims: tuple) -> Callable:
    """`run`, whose outputs carry the dims Dynamo should take as dynamic where they feed
    the graph after a break (the attribute torch's AOTAutograd sets, which Dynamo reads
    without guarding on it): a new size there no longer compiles the next graph again."""
    if not dims:
        return run

    def marked(*args):
        outs = run(*args)
        for i, symbolic in dims:
            out = outs[i]
            if isinstance(out, torch.Tensor):
                setattr(out, _DYNAMIC_DIMS, getattr(out, _DYNAMIC_DIMS, set()) | symbolic)
        return outs

    marked.artifact = run.artifact
    return marked


class _Backend:
    """`make_backend`'s compiler, which pickles as the options it was made from:
    `torch.save(torch.compile(model, backend="aotgrad"))` pickles the backend, as it does
    torch's own, where a function made inside `make_backend` cannot be pickled."""

    def __init__(self, compiler: Callable, made_with: dict):
        functools.update_wrapper(self, compiler)
        # The name Dynamo logs, and the registered backend's: Dynamo then drops, after each
        # compile, its weak references to the tensors it traced, as for backend="aotgrad".
        # A backend it does not know keeps them, and `torch.utils.swap_tensors` refuses a
        # tensor with weak references (`model.to(torch.float64)` under
        # `torch.__future__.set_swap_module_params_on_conversion(True)` raised).
        self.__name__ = "aotgrad"
        self._compiler, self._made_with = compiler, made_with

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, **kwargs):
        guard_module_hooks(gm)
        return self._compiler(gm, example_inputs, **kwargs)

    def __reduce__(self):
        return _remake_backend, (self._made_with,)


def guard_module_hooks(gm: torch.fx.GraphModule) -> None:
    """Have Dynamo guard the module hook dicts it finds empty, the global ones included,
    unless the user set `skip_nnmodule_hook_guards`. By default it skips those guards, so a
    hook registered after the compile (`register_forward_hook`, a full backward hook) never
    ran: the graph held the modules as they were, silently. Dynamo reads the option when it
    builds the guards of the frame it is compiling, after this backend returns, so the first
    graph is guarded too; the guards are a length check per hook dict."""
    config = torch._dynamo.config
    if config.skip_nnmodule_hook_guards and config._is_default("skip_nnmodule_hook_guards"):
        config.skip_nnmodule_hook_guards = False
    if not config.skip_nnmodule_hook_guards and \
            any("nn_module_stack" in n.meta for n in gm.graph.nodes):
        _guard_global_hooks_empty()


_GLOBAL_HOOKS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                 "_global_backward_pre_hooks", "_global_backward_hooks")


def _guard_global_hooks_empty() -> None:
    """Guard that the global module hooks Dynamo found empty stay so: it checks only their
    type, and a `register_module_forward_hook` after the compile (`ModuleTracker`, a
    profiler's) never ran for the graph's modules. The guard goes into the frame's guards
    (Dynamo builds them after this backend returns)."""
    from torch._dynamo.guards import GuardBuilder, install_guard
    from torch._dynamo.source import AttrSource
    from torch._dynamo import symbolic_convert
    tx = getattr(symbolic_convert.tls, "current_tx", None)
    if tx is None:  # the backend called outside a Dynamo compile
        return
    module = tx.nn_modules_globals_vt.source
    hooks = torch.nn.modules.module
    install_guard(*(AttrSource(module, name).make_guard(GuardBuilder.SEQUENCE_LENGTH)
                    for name in _GLOBAL_HOOKS if not getattr(hooks, name)))


def _remake_backend(made_with: dict) -> Callable:
    return make_backend(**made_with)


def compile_for_new_aliasing(fn: Callable, gm: torch.fx.GraphModule | None, fakes: list,
                             options: Options) -> Callable:
    """What compiles a call of `fn` (running Dynamo's `gm`) whose inputs alias differently
    from Dynamo's example inputs: aotgrad.compile's per-signature compile, on the call's
    tensors. It has no ShapeEnv, so a graph reading values that depend on data (`.item()`,
    `nonzero`) is refused by name."""
    if not _reads_data(gm, fakes):
        return CompiledFunction(fn, options)

    def refuse(*args):
        raise NotImplementedError(
            "aotgrad: this graph from Dynamo reads values that depend on tensor data "
            "(`.item()`, `nonzero`, boolean masks) and was called with inputs that share "
            "memory differently from the call it was compiled for (views of one tensor, one "
            "of which it writes into); aotgrad cannot compile it again for that aliasing. "
            "Pass tensors that do not share memory (`.clone()` one of them).")
    return refuse


def _reads_data(gm: torch.fx.GraphModule | None, fakes: list) -> bool:
    """Whether the graph takes `.item()` of an input, or computes an unbacked size."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    if any(item_symbol(f) is not None for f in fakes):
        return True
    return gm is not None and any(free_unbacked_symbols(v) for n in gm.graph.nodes
               for v in _symbolic_values(n.meta.get("example_value")))


def _symbolic_values(value) -> list:
    """The tensors and sizes in a node's example value; not the other things Dynamo keeps
    there (a `nonstrict_trace` call's pytree spec), which hold no symbols."""
    kinds = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
    return [v for v in pytree.tree_leaves(value) if isinstance(v, kinds)]


def unbox_list_inputs(gm: torch.fx.GraphModule, example_inputs, compile_flat: Callable
                      ) -> Callable:
    """`gm` compiled by `compile_flat` with each input that is a list of tensors (the boxed
    `inputs` that compiled autograd hands its graph) taken as that many graph inputs. A call
    passes the lists; those Dynamo marks as stolen are emptied before the graph runs, so that
    each tensor is freed as soon as the graph is done with it, not when the call returns."""
    lengths = [len(x) if isinstance(x, list) else None for x in example_inputs]
    placeholders = gm.graph.find_nodes(op="placeholder")
    stolen = [i for i, n in enumerate(placeholders) if n.meta.get("steal_arg")
              and lengths[i] is not None]
    flat_gm = _flat_placeholders(gm, lengths)
    compiled = compile_flat(flat_gm, _flat(example_inputs, lengths))

    def run(*args):
        flat = _flat(args, lengths)
        for i in stolen:
            args[i].clear()
        return compiled(*flat)

    run.artifact = getattr(compiled, "artifact", None)
    return run


def lift_held_tensors(gm: torch.fx.GraphModule, held: dict[str, torch.Tensor], example_inputs,
                      compile_flat: Callable) -> Callable:
    """`gm` compiled by `compile_flat` with the tensors it holds (`get_attr`) taken as its
    first inputs, read at each call. Dynamo puts there what a compiled optimizer step
    updates in place (parameters, momentum buffers, step counts); as constants, their
    writes were refused (a parameter requires grad) or would be lost. `held`: the tensors
    by target (`_held_tensors`)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))  # Dynamo's graph stays as it was
    first = next(iter(graph.nodes))
    for node in list(graph.find_nodes(op="get_attr")):
        if node.target in held:
            with graph.inserting_before(first):
                placeholder = graph.placeholder(node.name)
            placeholder.meta = {"example_value": held[node.target], **node.meta}
            node.replace_all_uses_with(placeholder)
            graph.erase_node(node)
    lifted = torch.fx.GraphModule(gm, graph)
    tensors = list(held.values())
    compiled = compile_flat(lifted, [*tensors, *example_inputs])

    def run(*args):
        return compiled(*tensors, *args)

    run.artifact = getattr(compiled, "artifact", None)
    return run


def _held_tensors(gm: torch.fx.GraphModule) -> dict[str, torch.Tensor]:
    """The tensors `gm`'s get_attr nodes read, by target."""
    held = {}
    for node in gm.graph.find_nodes(op="get_attr"):
        value = operator.attrgetter(node.target)(gm)
        if isinstance(value, torch.Tensor):
            held[node.target] = value
    return held


def _flat(args, lengths: list[int | None]) -> list:
    flat = []
    for a, n in zip(args, lengths):
        if n is None:
            flat.append(a)
        else:
            flat.extend(a)
    return flat


def _flat_placeholders(gm: torch.fx.GraphModule, lengths: list[int | None]
                       ) -> torch.fx.GraphModule:
    """A copy of `gm` whose list inputs are one placeholder per element, gathered back into
    a list inside (Dynamo indexes it with getitem). The elements' fakes (`example_value`,
    read for dynamic shapes) come from the list's."""
    gm = torch.fx.GraphModule(gm, copy.deepcopy(gm.graph))
    graph = gm.graph
    for node, n in zip(list(graph.find_nodes(op="placeholder")), lengths):
        if n is None:
            continue
        fakes = node.meta.get("example_value") or [None] * n
        with graph.inserting_before(node):
            elements = [graph.placeholder(f"{node.name}_{k}") for k in range(n)]
        for element, fake in zip(elements, fakes):
            if fake is not None:
                element.meta["example_value"] = fake
        with graph.inserting_after(elements[-1] if elements else node):
            boxed = graph.call_function(list, (tuple(elements),))
        node.replace_all_uses_with(boxed)
        graph.erase_node(node)
    gm.recompile()
    return gm


# Dynamo's source names (`L['self']._modules['fc1']._parameters['weight']`) as the user
# writes them (`fc1.weight`): the module attribute hops, then the frame's local `L[...]`.
_SOURCE_HOPS = (re.compile(r"\._(?:modules|parameters|buffers)\['([^']*)'\]"), r".\1")
_ROOT_MODULE = re.compile(r"^L\['(?:self|fn|mod|model|module)'\]\.")
_LOCAL = re.compile(r"^L\['([^']*)'\]")


def _user_names(gm: torch.fx.GraphModule) -> tuple[str, ...]:
    """The user's name of each of the graph's inputs, for reports; "" where Dynamo gave none."""
    names = []
    for node in gm.graph.find_nodes(op="placeholder"):
        source = getattr(node.meta.get("grapharg"), "source", None)
        name = getattr(source, "name", "")
        name = name() if callable(name) else name  # a method before torch 2.13
        name = _SOURCE_HOPS[0].sub(_SOURCE_HOPS[1], name or "")
        names.append(_LOCAL.sub(r"\1", _ROOT_MODULE.sub("", name)))
    return tuple(names)


def compile_dynamo_graph(fn: Callable, flat: list, options: Options) -> CompiledCall | None:
    """`fn` compiled once for Dynamo's flat inputs, symbolic sizes included (guards land in
    Dynamo's). None, after a warning, where it cannot be compiled for symbolic sizes: the
    caller then compiles per shape."""
    from torch._dynamo.exc import RestartAnalysis
    _, in_spec = pytree.tree_flatten((tuple(flat), {}))
    try:
        return compile_call(fn, flat, in_spec, options)
    except RestartAnalysis:  # Dynamo's request to trace again (a float to specialize)
        raise
    except Exception as exc:
        if not (is_symbolic(flat) and falls_back_to_static(exc)):
            raise
        warn_static_fallback("a graph from Dynamo", exc)
        return None


def dynamo_fakes(gm: torch.fx.GraphModule, example_inputs) -> list:
    """With dynamic shapes, Dynamo's fakes of the inputs, with the symbolic sizes it chose
    (it passes the real tensors as example inputs; its fakes are on the graph's
    placeholders); so too where a float it made dynamic comes as a 0-d tensor, whose fake
    holds the symbol its `.item()` stands for. Otherwise the example inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    fakes = [n.meta.get("example_value") for n in placeholders]
    if len(fakes) != len(example_inputs) or any(f is None for f in fakes):
        return list(example_inputs)
    unspecialized = any(getattr(f, "item_memo", None) is not None for f in fakes)
    return fakes if is_symbolic(fakes) or unspecialized else list(example_inputs)


def dynamo_static_inputs(gm: torch.fx.GraphModule, inputs) -> tuple[int, ...]:
    """The inputs Dynamo marks as living across calls: parameters and buffers, interleaved
    among the others in the order the modules use them."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    return tuple(i for i, (node, x) in enumerate(zip(placeholders, inputs))
                 if isinstance(x, torch.nn.Parameter)
                 or node.meta.get("tensor_dict", {}).get("_dynamo_static_input_type"))


aotgrad_backend = make_backend()
