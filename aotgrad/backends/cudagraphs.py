"""CUDA graphs: each compiled graph of a training step replayed as one recorded launch.

`aotgrad.compile(..., cudagraphs=True)` and `torch.compile(backend="aotgrad",
mode="reduce-overhead")` record the forward and the backward in Inductor's cudagraph trees,
the memory pool torch's own `reduce-overhead` uses: parameters and buffers are static inputs
(their memory is recorded as it is), every other input is copied into the graph's memory
before a replay, the forward's saved values stay in the pool for the backward, and a new
shape (a new compile, or under dynamic shapes a new size) records a new graph. Inductor
records its own graphs (`compile_fx_inner`'s `cudagraphs` box); the graphs of any other
backend (the eager backend, a compiler callable) are wrapped here in the same trees.

Where a graph cannot be recorded (tensors off CUDA, dynamic shapes through a backend other
than Inductor, data-dependent ops, an input mutation the trees cannot keep), it runs as
compiled and the reason is logged on the "aotgrad" logger. As with torch's, the outputs of
a replay live in the pool until the next replay of the same graph overwrites them.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import fx

from ..schema import GraphInfo
from ..tables import written_arguments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudagraphState:
    """One compile's switch and device, shared by its forward and backward as Inductor shares
    them: a forward left unrecorded leaves its backward unrecorded too, and a backward finds
    the device whose tree holds its forward."""

    enabled: Any  # torch._inductor.utils.BoxedBool, turned off where a graph is not recorded
    device: Any  # torch._inductor.cudagraph_utils.BoxedDeviceIndex, set by the forward

    @staticmethod
    def new() -> "CudagraphState":
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool
        return CudagraphState(BoxedBool(True), BoxedDeviceIndex(None))


def fallback_reasons(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> list[str]:
    """Why `gm` cannot be recorded as a CUDA graph by aotgrad; empty when it can."""
    values = [*example_inputs, *(n.meta.get("val") for n in gm.graph.nodes)]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    devices = {t.device for t in tensors if t.device.type != "meta"}
    reasons = []
    off_cuda = sorted(str(d) for d in devices if d.type != "cuda")
    if off_cuda:
        reasons.append(f"tensors on {', '.join(off_cuda)} (a CUDA graph records CUDA work only)")
    elif len(devices) > 1:
        reasons.append(f"several devices {sorted(map(str, devices))}")
    if any(_symbolic(v) for v in example_inputs):
        reasons.append(_DYNAMIC)
    node = _first_unrecordable(gm)
    if node is not None:
        reasons.append(f"data-dependent op {node.target} ({node.name})")
    return reasons


_DYNAMIC = ("dynamic shapes (compile with dynamic=False, or use the Inductor backend, which "
            "records one graph per size)")
_INDUCTOR_RECORDS = (_DYNAMIC,)


def _symbolic(value: Any) -> bool:
    if isinstance(value, torch.SymInt):
        return True
    if not isinstance(value, torch.Tensor):
        return False
    return any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride()))


def _first_unrecordable(gm: fx.GraphModule) -> fx.Node | None:
    """The first op a recording cannot hold: Inductor's list (host syncs such as `.item()`,
    ops whose output size depends on values such as `nonzero`, unbacked sizes)."""
    from torch._inductor.utils import get_first_incompatible_cudagraph_node
    return get_first_incompatible_cudagraph_node(gm)


def mutated_inputs(gm: fx.GraphModule) -> tuple[int, ...]:
    """The graph inputs an op of the graph writes into (an input mutation kept in the graph)."""
    placeholders = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
    written = set()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            args = written_arguments(node.target, node.args, node.kwargs)
            written.update(placeholders[v] for v in args if v in placeholders)
    return tuple(sorted(written))


def inductor_kwargs(info: GraphInfo) -> dict[str, Any]:
    """`compile_fx_inner`'s arguments for recording a graph (none when not asked): the
    compile's shared switch and device."""
    state = info.cudagraphs
    if state is None:
        return {}
    return {"cudagraphs": state.enabled, "boxed_forward_device_index": state.device}


def inductor_config(info: GraphInfo):
    """Inductor's config while it compiles a graph to record: some of its passes read the
    global switch rather than the box (as torch's own annotation path patches it), and its
    FX graph cache keys on it, so that a graph compiled without recording is not reused."""
    from torch._inductor import config
    if info.cudagraphs is None or not info.cudagraphs.enabled or config.triton.cudagraphs:
        return contextlib.nullcontext()
    return config.patch({"triton.cudagraphs": True})


def report_inductor(info: GraphInfo, compiled: Any, was_enabled: bool, gm: fx.GraphModule,
                    example_inputs: Sequence[Any]) -> None:
    """Log why Inductor did not record a graph it was asked to: aotgrad's own reasons where
    it finds one (Inductor records dynamic shapes, one graph per size), else Inductor's."""
    state = info.cudagraphs
    if state is None or not was_enabled or state.enabled:
        return
    reasons = [r for r in fallback_reasons(gm, example_inputs) if r not in _INDUCTOR_RECORDS]
    if not reasons:
        cached = getattr(compiled, "cudagraph_info", None)
        reason = getattr(compiled, "disabled_cudagraphs_reason", None) or ", ".join(
            getattr(cached, "cudagraph_fail_reasons", None) or ["Inductor did not record it"])
        reasons = [reason.strip()]
    _log_skip(info.role, reasons)


def record(compiled: Callable, gm: fx.GraphModule, example_inputs: Sequence[Any],
           info: GraphInfo) -> Callable:
    """`compiled` (boxed) replayed from a CUDA graph in the cudagraph trees, or, with the
    reason logged, as it is."""
    state = info.cudagraphs
    if not state.enabled:  # the forward was not recorded
        return compiled
    reasons = fallback_reasons(gm, example_inputs)
    if reasons:
        state.enabled.value = False
        _log_skip(info.role, reasons)
        return _after_recorded_forward(compiled, state) if info.role == "backward" else compiled
    device = next(t.device.index for t in example_inputs if isinstance(t, torch.Tensor))
    if info.role == "forward":
        state.device.set(device)
    return _cudagraphify(compiled, gm, info, device)


def _cudagraphify(compiled: Callable, gm: fx.GraphModule, info: GraphInfo,
                  device: int) -> Callable:
    from torch._inductor.compile_fx import cudagraphify
    from torch._inductor.cudagraph_utils import get_placeholder_info
    outputs = gm.graph.output_node().args[0]
    kwargs = dict(device_index=device, is_backward=info.role == "backward",
                  is_inference=info.role == "inference",
                  stack_traces=[getattr(o, "meta", {}).get("stack_trace") for o in outputs],
                  placeholders=tuple(get_placeholder_info(gm.graph)),
                  mutated_input_idxs=mutated_inputs(gm))
    accepted = inspect.signature(cudagraphify).parameters  # torch 2.11 and 2.13 alike
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    run = cudagraphify(compiled, static_input_idxs=tuple(info.static_inputs), **kwargs)
    run._boxed_call = True
    return run


def _after_recorded_forward(compiled: Callable, state: CudagraphState) -> Callable:
    """A backward run outside the trees after a recorded forward: the tree must still learn
    that the forward's backward ran, or it keeps the forward's pool pending."""
    if state.device.value is None:
        return compiled
    from torch._inductor import cudagraph_trees
    manager = cudagraph_trees.get_manager(state.device.value, create_if_none_exists=False)
    if manager is None:
        return compiled

    def run(args: list):
        manager.set_to_running_backward()
        return compiled(args)
    run._boxed_call = True
    return run


def _log_skip(role: str, reasons: Sequence[str]) -> None:
    log.warning("aotgrad: CUDA graphs: the %s graph runs without a CUDA graph: %s", role,
                "; ".join(reasons))
