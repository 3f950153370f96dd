"""The Dynamo front door: `torch.compile(model, backend="aotgrad")`.

Dynamo hands over an FX graph of torch-level ops and fake example inputs (parameters first);
it guards on everything that would change the graph, so the compiled call is used as is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

from .aliasing import AliasingChanged
from .backends import resolve_backend
from .api import CompiledFunction, choose_partitioner
from .pipeline import Options, compile_call


def make_backend(*, backend: Any = "inductor", partitioner: Callable | None = None,
                 memory_budget: float | None = None, decompositions=None,
                 keep_inference_input_mutations: bool = False) -> Callable:
    options = Options(resolve_backend(backend, decompositions),
                      choose_partitioner(partitioner, memory_budget),
                      keep_inference_input_mutations)

    def aotgrad_dynamo_backend(gm: torch.fx.GraphModule, example_inputs):
        if _is_symbolic(example_inputs):
            # Dynamo generalized some sizes. aotgrad's graphs are static: compile this graph
            # again for each concrete signature as calls arrive (one entry per shape).
            lazy = CompiledFunction(gm, options)
            return lambda *args: lazy(*args)
        flat = list(example_inputs)
        _, in_spec = pytree.tree_flatten((tuple(flat), {}))
        num_params = _num_leading_parameters(flat)
        call = compile_call(gm, flat, in_spec, replace(options, num_params_buffers=num_params))
        run_call = call.run
        # Dynamo does not guard on how inputs alias; a call aliased differently from the
        # example inputs compiles again, as aotgrad.compile does.
        realiased = CompiledFunction(gm, options)

        def run(*args):
            try:
                return run_call(args)
            except AliasingChanged:
                return realiased(*args)

        run.artifact = call.artifact
        return run

    return aotgrad_dynamo_backend


def _num_leading_parameters(inputs) -> int:
    """Dynamo lifts parameters as the first inputs; they live across calls."""
    count = 0
    while count < len(inputs) and isinstance(inputs[count], torch.nn.Parameter):
        count += 1
    return count


def _is_symbolic(example_inputs) -> bool:
    for x in example_inputs:
        sizes = tuple(x.shape) + tuple(x.stride()) if isinstance(x, torch.Tensor) else (x,)
        if any(isinstance(s, (torch.SymInt, torch.SymFloat, torch.SymBool)) for s in sizes):
            return True
    return False


aotgrad_backend = make_backend()


def register() -> None:
    """Make `backend="aotgrad"` known to Dynamo without relying on the installed entry point."""
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "aotgrad" not in _BACKENDS:
        register_backend(name="aotgrad")(aotgrad_backend)
