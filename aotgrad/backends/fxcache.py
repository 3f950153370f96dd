"""Inductor's FX graph cache entered by key: a graph read from aotgrad's cache loads its
compiled code without Inductor hashing it again, and without fake values on its nodes.

When Inductor compiles a graph (or finds it in its FX graph cache), the compiled graph
carries its cache key. aotgrad's cache keeps it beside the stored graph, filed under a
digest of the context the key was computed in (`context_state`, kept whole too, so that a
miss can say what differs): the graph's role, static inputs, user-visible outputs, donated
inputs, and the global state Inductor's key reads besides the graph and its inputs (its
configuration, the cache key tag, deterministic algorithms, the thread count, matmul
precision, the default dtype). Our entry's key holds the graph and its
inputs' metadata; the context digest holds the rest. A later compile of the same stored
graph in the same context loads Inductor's entry by that key (`load`); anything else
(another context, a missing entry, an API this torch lacks) returns None and the graph is
compiled as usual, after its fake values are filled in (`fill_fake_values`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Callable, Sequence

import torch
from torch import fx

from ..schema import TRACED_VAL, GraphInfo

log = logging.getLogger("aotgrad.cache")

# Inductor's own passes of user code: a callable's identity is not its code, so a context
# holding one is never entered by key (Inductor's key holds the pass's uuid, ours cannot).
_CUSTOM_PASSES = ("pre_grad_custom_pass", "post_grad_custom_pre_pass",
                  "post_grad_custom_post_pass", "joint_custom_pre_pass",
                  "joint_custom_post_pass", "custom_partitioner_fn", "cudagraph_policy",
                  "_pre_fusion_custom_pass", "_post_fusion_custom_pass")


def fill_fake_values(gm: fx.GraphModule, fake_mode=None) -> None:
    """Compute `meta["val"]` of every op from the placeholders' fake values, as a trace
    leaves them (views share their base's fake storage). No grad: the graph's in-place ops
    (a buffer's new value copied in) write into fake inputs that may require grad."""
    if fake_mode is None:
        from torch._guards import detect_fake_mode
        placeholders = gm.graph.find_nodes(op="placeholder")
        fake_mode = detect_fake_mode([n.meta["val"] for n in placeholders])
    with fake_mode, torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "call_function":
                node.meta["val"] = fake_value(node)


def fake_value(node: fx.Node):
    """`node`'s op run on its inputs' fake values (under their fake mode), a restrided saved
    value's as traced (schema.TRACED_VAL)."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), _as_traced)
    return node.target(*args, **kwargs)


def _as_traced(node: fx.Node):
    return node.meta.get(TRACED_VAL, node.meta.get("val"))


def lacks_fake_values(gm: fx.GraphModule) -> bool:
    return any("val" not in n.meta for n in gm.graph.nodes if n.op == "call_function")


def context_state(info: GraphInfo, donated: Sequence[int] | None) -> dict[str, str] | None:
    """What Inductor's key holds besides the graph and its inputs, one text per part (each
    configuration entry a part of its own, so that a miss can name the one that differs);
    None where a graph must not be entered by key (CUDA graphs, Inductor's custom passes)."""
    from torch._inductor import config
    if info.cudagraphs is not None or config.triton.cudagraphs:
        return None
    if any(getattr(config, name, None) for name in _CUSTOM_PASSES):
        return None
    if _custom_backends():
        return None
    state = {"role": info.role, "static": list(info.static_inputs),
             "user outputs": [info.user_outputs.start, info.user_outputs.stop],
             "donated": donated, **_global_state()}
    flat = {}
    for part, value in state.items():
        if isinstance(value, dict):  # a configuration: an entry per setting
            flat.update((f"{part} {k}", v) for k, v in value.items())
        else:
            flat[part] = json.dumps(value, default=repr)
    return flat


def digest(state: dict[str, str] | None) -> str | None:
    if state is None:
        return None
    text = json.dumps(state, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def why_not_entered(records: dict, state: dict[str, str]) -> str:
    """Why none of a graph's stored keys serves this context: the parts in which the
    nearest stored context differs, as `name: stored -> here`."""
    stored = [r["context"] for r in records.values() if isinstance(r.get("context"), dict)]
    if not stored:  # records written before contexts were kept whole
        return "stored in another context (not recorded which)"
    nearest = min(stored, key=lambda other: len(_differing(other, state)))
    parts = _differing(nearest, state)
    text = ", ".join(f"{k}: {nearest.get(k)} -> {state.get(k)}" for k in parts[:4])
    return text + (f" (and {len(parts) - 4} more)" if len(parts) > 4 else "")


def _differing(a: dict, b: dict) -> list[str]:
    return [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _global_state() -> dict[str, Any]:
    from torch._inductor import config
    matmul = torch.backends.cuda.matmul
    state = {"inductor config": _portable(config),
             "cache key tag": torch.compiler.config.cache_key_tag,
             "deterministic": (torch.are_deterministic_algorithms_enabled(),
                               torch.is_deterministic_algorithms_warn_only_enabled(),
                               getattr(torch.utils.deterministic,
                                       "fill_uninitialized_memory", None)),
             "threads": (torch.get_num_threads(), config.cpp.threads,
                         getattr(config.cpp, "dynamic_threads", None)),
             "matmul": [getattr(matmul, name, None) for name in (
                 "fp32_precision", "allow_tf32", "allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction")],
             "default dtype": str(torch.get_default_dtype()),
             "bundled autograd cache": torch._functorch.config.bundled_autograd_cache}
    try:  # imported here: other Inductor modules import it lazily, and a context read
        # before that import (a warm process's first graph) would differ from one read after
        from torch._inductor import config_comms
    except ImportError:  # a torch without it
        return state
    state["comms config"] = _portable(config_comms)
    return state


def _portable(config) -> dict:
    try:
        saved = config.save_config_portable(ignore_private_configs=False)
    except TypeError:  # a torch whose signature differs
        saved = config.save_config_portable()
    return {k: repr(v) for k, v in sorted(saved.items())}


def _custom_backends() -> bool:
    try:
        from torch._inductor.codegen.common import custom_backend_passes
    except ImportError:
        return False
    return any(p is not None for p in custom_backend_passes.values())


def record_of(compiled: Any, state: dict[str, str] | None) -> dict | None:
    """What loads `compiled` again by key, where Inductor's FX graph cache holds it, with
    the context it was compiled in (for a later miss to say what differs)."""
    key = getattr(compiled, "_fx_graph_cache_key", None)
    if state is None or not isinstance(key, str):
        return None
    guards = getattr(compiled, "guards_expr", None)
    return {"key": key, "guards": guards if isinstance(guards, str) else None, "context": state}


def load(record: dict, gm: fx.GraphModule, example_inputs: Sequence[Any],
         info: GraphInfo) -> Callable | None:
    """The compiled graph of `record`'s key from Inductor's FX graph cache, post-compiled
    for this process as `compile_fx_inner` would; None where it is not there or the API
    differs (the caller compiles instead). Runs in the compile's tracing context."""
    try:
        from torch._inductor import async_compile, codecache, output_code
        from torch._inductor.utils import BoxedBool
        find = codecache.FxGraphCache.load_with_key
        constants_type = getattr(output_code, "CompiledFxGraphConstantsWithGm", None)
    except (ImportError, AttributeError) as exc:
        log.info("aotgrad cache: Inductor's cache by key unavailable (%s)", exc)
        return None
    clear = getattr(getattr(async_compile, "CompiledTritonKernels", None), "cache_clear", None)
    if clear is not None:  # as compile_fx_inner does before each graph
        clear()
    constants = constants_type(gm) if constants_type else output_code.CompiledFxGraphConstants()
    guards = record["guards"]
    try:
        compiled, _ = find(record["key"], [], example_inputs, local=True, remote_cache=None,
                           is_backward=info.role == "backward", constants=constants,
                           evaluate_guards=lambda expr, _hints: expr == guards)
        if compiled is None:
            return None
        kwargs = {"cudagraphs": BoxedBool(False), "is_backward": info.role == "backward",
                  "is_inference": info.role == "inference",
                  "static_input_idxs": list(info.static_inputs)}
        compiled.post_compile(example_inputs, constants, kwargs)
    except Exception as exc:  # an Inductor API of another torch: compile instead
        log.warning("aotgrad cache: loading Inductor's graph %s failed (%r); compiling",
                    record["key"], exc)
        return None
    return compiled
