"""Arguments of the public entry points, checked where they are given.

A wrong argument raises at the call that passed it, with a message starting `aotgrad:` that
names the argument, what it got and what it takes, instead of a raw Python error at the
first call of the compiled function, deep inside the pipeline.
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Mapping
from typing import Any

import torch


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}" if len(text) <= 60 else type(value).__name__


def fail(where: str, name: str, value: Any, wanted: str, exc: type = TypeError):
    raise exc(f"aotgrad: {where}: {name} must be {wanted}, got {_got(value)}")


def function_or_module(where: str, value: Any) -> None:
    if not callable(value):
        fail(where, "the first argument", value, "a function or an nn.Module")


def module(where: str, value: Any) -> None:
    if not isinstance(value, torch.nn.Module):
        fail(where, "mod", value, "an nn.Module")


def function(where: str, name: str, value: Any, optional: bool = False) -> None:
    if not (callable(value) or (optional and value is None)):
        wanted = "a callable" + (" or None" if optional else "")
        fail(where, name, value, wanted)


def flag(where: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(where, name, value, "True or False")


def optional_type(where: str, name: str, value: Any, kind: type, what: str) -> None:
    if value is not None and not isinstance(value, kind):
        fail(where, name, value, f"{what} or None")


def count(where: str, name: str, value: Any, least: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(where, name, value, f"an int >= {least}")
    if value < least:
        fail(where, name, value, f"an int >= {least}", ValueError)


def budget(where: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(where, "memory_budget", value, "a number in [0, 1] or None")
    if not 0.0 <= value <= 1.0:
        fail(where, "memory_budget", value, "in [0, 1] (the share of saved activation "
             "memory kept)", ValueError)


def decomposition_table(where: str, value: Any) -> None:
    optional_type(where, "decompositions", value, Mapping,
                  "a dict {op overload: decomposition}")


def compile_options(where: str, *, partitioner=None, memory_budget=None, decompositions=None,
                    dynamic=False, keep_inference_input_mutations=False, max_entries=1,
                    mode=None, options=None) -> None:
    """The options `aotgrad.compile` and `aotgrad.backend` share (the backend and
    compile_backward are checked where they are resolved, with their own messages; the
    names in `mode` and `options`, where they are read)."""
    optional_type(where, "mode", mode, str, "a torch.compile mode ('max-autotune', ...)")
    optional_type(where, "options", options, Mapping, "a dict of Inductor settings")
    function(where, "partitioner", partitioner, optional=True)
    budget(where, memory_budget)
    decomposition_table(where, decompositions)
    flag(where, "dynamic", dynamic)
    flag(where, "keep_inference_input_mutations", keep_inference_input_mutations)
    count(where, "max_entries", max_entries, least=1)


# Data-parallel wrappers communicate in module hooks (DDP's gradient all-reduce, FSDP's
# all-gather before forward and reshard after it). Traced into a graph, those hooks would run
# once, at trace time, and never again: each step would skip the communication. Looked up by
# the module that defines them, so that a program that never imported one pays nothing.
_DATA_PARALLEL = (  # (module, class name, what it is, how to compile it instead)
    ("torch.nn.parallel", "DistributedDataParallel", "DistributedDataParallel",
     "DDP(aotgrad.compile(model)), or torch.compile(DDP(model), backend=\"aotgrad\")"),
    ("torch.distributed.fsdp", "FSDPModule", "sharded by fully_shard (FSDP2)",
     "fully_shard(aotgrad.compile(block)) per block, or torch.compile(model, "
     "backend=\"aotgrad\")"),
    ("torch.distributed.fsdp", "FullyShardedDataParallel", "FullyShardedDataParallel",
     "FSDP(aotgrad.compile(block)), or torch.compile(model, backend=\"aotgrad\")"),
)


def not_data_parallel(where: str, mod: torch.nn.Module) -> None:
    """Refuse a module that is, or holds, a data-parallel wrapper (see _DATA_PARALLEL)."""
    for module_name, class_name, what, instead in _DATA_PARALLEL:
        kind = getattr(sys.modules.get(module_name), class_name, None)
        if kind is None:
            continue
        for name, sub in mod.named_modules():
            if isinstance(sub, kind):
                raise NotImplementedError(
                    f"aotgrad: {where}: module {name or 'mod'!r} is {what}, whose "
                    "communication runs in hooks that a trace would run once; compile the "
                    f"module it wraps instead: {instead}")
