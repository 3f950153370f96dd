"""The compiler instance the autograd engine calls while it walks a backward graph.

On a cache miss the engine (`torch._C._dynamo.compiled_autograd`) creates one
`BackwardCapture`, hands it the tensors, sizes and scalars it lifted out of the graph
(`begin_capture`), then walks the nodes in execution order, calling a method for each thing
it would run: a C++ node's formula (`apply_functional`), a Python node's backward
(`proxy_call_backward`), a hook, a gradient sum, an accumulation into `.grad`. The instance
records each as one call of a *program* (an FX graph over the lifted inputs) and returns it
(`end_capture`); the engine runs it for this backward and every later one with the same key.

The program holds no decision about sizes: a formula is one call (`hooks.call_formula`), not
its ops. `specialize.py` turns it into the graph a compiler sees: the formulas traced into
ATen ops on fake tensors for the sizes of a call, with the guards those ops assumed (a dim
is 1, two dims are equal), checked before each run. Sizes that break them specialize again.
An aotgrad region's backward is inlined op by op; what stays a Python call is what must run
as eager runs it: hooks, user autograd.Function backwards, `.grad` accumulation.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing, track_tensor_tree

from . import hooks
from .cache import CaptureKey, Lifted
from ..schema import ENGINE_NODE
from .ready import mark_pushes
from .specialize import Trace, mark_readiness

log = logging.getLogger("aotgrad.autograd")
_ids = itertools.count()


class Uncapturable(RuntimeError):
    """This backward cannot be captured: the engine runs it eagerly (api.py)."""


def _batched(t: Any) -> bool:
    is_batched = getattr(torch._C._functorch, "is_legacy_batchedtensor", None)
    return isinstance(t, torch.Tensor) and is_batched is not None and is_batched(t)


class MissingMethod(Uncapturable, AttributeError):
    """The engine called a method aotgrad's capture lacks (another torch release's)."""


class BackwardCapture(Trace):
    """One capture: made by the engine on a cache miss, driven by its calls."""

    def __init__(self, session: Any):
        super().__init__()
        self.session = session
        self.walk: list[str] = []
        self.node = "the root"
        self.node_index = -1  # the engine node whose calls are being recorded
        self.failure: str | None = None  # raised at end_capture (see `_deferred`)
        # id(a tensor hook's result) -> (its node, the gradient before that node's tensor
        # hooks, the result); and the nodes whose backward ran (see `_as_eager_captures`).
        self.hooked: dict[int, tuple[int, Any, Any]] = {}
        self.ran: set[int] = set()

    # -- setup and teardown -------------------------------------------------------------
    def begin_capture(self, inputs: list, sizes: list, scalars: list, origins=None,
                      accumulate_grad: bool = True, check_nans: bool = False, *_):
        from torch.fx.experimental.symbolic_shapes import _suppress_guards
        self.session.begin(self)
        if check_nans:
            raise Uncapturable("anomaly detection's NaN checks (detect_anomaly)")
        if any(_batched(t) for t in inputs):  # no fake tensor stands for one
            raise Uncapturable("batched gradients (autograd.grad(..., is_grads_batched=True))")
        self.key_parts = _lifted(inputs, sizes, origins)
        fakes, sym_sizes, sym_scalars = self.open(inputs, sizes, scalars, duck=True)
        # The program decides nothing about sizes (its formulas are calls): what the fake
        # runs assume here is assumed again, and guarded, where specialize.py traces them.
        self.stack.enter_context(_suppress_guards(self.shape_env))
        return f"aotgrad-compiled-autograd-{next(_ids)}", fakes, sym_sizes, sym_scalars

    def end_capture(self, outputs: Sequence[Any]):
        if self.failure is not None:
            raise Uncapturable(self.failure)
        outputs = self._as_eager_captures(outputs)
        self.tracer.create_node("output", "output",
                                (self.tracer.create_arg(self.to_proxy(outputs)),), {})
        self.close()
        mark_readiness(self.tracer.graph)
        mark_pushes(self.tracer.graph)
        program = fx.GraphModule(self.tracer.root, self.tracer.graph, "BackwardProgram")
        captured = self.session.captured(program, CaptureKey(tuple(self.walk), self.key_parts))
        return run_captured, captured

    def _as_eager_captures(self, outputs: Sequence[Any]) -> list:
        """`autograd.grad`'s results. Where a non-leaf input's node runs too (a later input
        needs it), eager takes its gradient before the tensor's hooks, which then run with
        the node; the engine's walk hands over the hooks' result: take the one before."""
        return [self._before_node_hooks(out) for out in outputs]

    def _before_node_hooks(self, grad: Any) -> Any:
        hooked = self._hooked(grad)
        return grad if hooked is None or hooked[0] not in self.ran else hooked[1]

    def _hooked(self, grad: Any) -> tuple[int, Any, Any] | None:
        hooked = self.hooked.get(id(grad))
        return hooked if hooked is not None and hooked[2] is grad else None

    # -- the engine's calls, in the order it walks -----------------------------------
    def set_node_origin(self, name: str, index: int, pyobj: Any = None) -> None:
        self.node = f"node {index} {name.replace('torch::autograd::', '')}"
        self.node_index = index
        self.walk.append(self.node)

    def log_compile_reasons(self, reasons: Sequence[str]) -> None:
        self.engine_reasons = list(reasons)

    def bind_function(self, name: str, fn: Callable, is_custom_function: bool,
                      is_traceable: bool) -> str:
        hooks.BOUND[name] = (fn, is_traceable)
        return name

    def apply_functional(self, name: str, grads: Sequence, args: Any, output_metadata):
        return self._deferred(self._formula, output_metadata, name, grads, args,
                              output_metadata)

    def _formula(self, name: str, grads: Sequence, args: Any, metas: Sequence) -> list:
        _, traceable = _bound(name)
        self.ran.add(self.node_index)
        if not traceable:
            raise Uncapturable(f"{self.node}: its C++ backward is not marked traceable")
        call = (name, list(grads), *args)
        try:
            with disable_proxy_modes_tracing():
                result = hooks.call_formula(*call)
            _no_data_dependent_sizes(self.shape_env)
        except Exception as error:  # noqa: BLE001 - decided where the program is specialized
            # Its ops cannot run on these fakes, whose sizes are all symbols (upsampling's
            # backward takes its sizes as ints; ctc_loss's has no fake kernel; a size read
            # from a tensor's values): recorded, stood in for by its outputs' metadata. A
            # specialization traces it on this run's sizes, or, where that fails too, runs
            # it as the eager engine does.
            log.debug("compiled autograd: %s: %s runs on stand-ins in the capture (%s)",
                      self.node, name, f"{type(error).__name__}: {error}".splitlines()[0])
            result = [_stand_in(m) for m in metas]
        track_tensor_tree(result, self._call(hooks.call_formula, *call), constant=None,
                          tracer=self.tracer)
        return result

    def _deferred(self, call: Callable, metas: Sequence, *args: Any) -> Any:
        """A failure inside a node's call would leave the engine's swapped-in fakes in the
        node (it restores its saved tensors only after the call returns), and the eager
        rerun would compute on them: stand in for the outputs, fail at end_capture."""
        if self.failure is None:
            try:
                return call(*args)
            except Exception as error:  # noqa: BLE001 - reported whole at end_capture
                self.failure = f"{type(error).__name__}: {error}".splitlines()[0]
        return [_stand_in(m) for m in metas]

    def validate_outputs(self, _name: str, outputs: Sequence, args: Any, output_metadata):
        _bound("validate_outputs")
        return self._record(hooks.call_formula, ("validate_outputs", list(outputs), *args))

    def accumulate(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        # A call, not the add itself: a custom backward's None (no contribution) reaches it
        # where the program runs unspecialized (specialize.py's trace holds the add).
        return self._record(hooks.add_gradients, (old, new))

    def accumulate_grad(self, variable: torch.Tensor, *args):
        # torch 2.11: (variable, grad, has_post_hooks) -> None; 2.13 adds the current .grad
        # before grad and returns the new .grad.
        grad, has_post_hooks = (args[0], args[1]) if len(args) == 2 else (args[1], args[2])
        self.walk.append(f"accumulate into .grad ({self.node})")
        result = self._effect(hooks.accumulate_into, variable, grad, has_post_hooks)
        return None if len(args) == 2 else result

    def tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        return self._tensor_hook(inputs, i, "tensor hook", hooks.run_tensor_hook,
                                 self.proxies["hooks"][hook_id])

    def cpp_tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        return self._tensor_hook(inputs, i, "retain_grad", hooks.run_cpp_tensor_hooks, hook_id)

    def _tensor_hook(self, inputs: list, i: int, what: str, run: Callable, hook: Any) -> list:
        self.walk.append(f"{what} on input {i} of {self.node}")
        hooked = self._hooked(inputs[i])  # an earlier hook's result: its gradient before
        first = inputs[i] if hooked is None else hooked[1]
        inputs[i] = self._effect(run, hook, inputs[i])
        self.hooked[id(inputs[i])] = (self.node_index, first, inputs[i])
        return inputs

    def pre_hook(self, inputs: Sequence, hook_id: int) -> list:
        self.walk.append(f"pre-hook of {self.node}")
        self.ran.add(self.node_index)
        return self._effect(hooks.run_node_pre_hook, self.proxies["hooks"][hook_id],
                            list(inputs))

    def post_hook(self, outputs: Sequence, inputs: Sequence, hook_id: int) -> list:
        self.walk.append(f"post-hook of {self.node}")
        return self._effect(hooks.run_node_post_hook, self.proxies["hooks"][hook_id],
                            list(outputs), list(inputs))

    def post_acc_grad_hook(self, param: torch.Tensor, hook_id: int) -> list:
        self.walk.append(f"post-accumulate-grad hook ({self.node})")
        return [self._effect(hooks.run_post_accumulate_hook, self.proxies["hooks"][hook_id],
                             param)]

    def unpack_hook(self, hook_id: int, data_id: int) -> torch.Tensor:
        raise Uncapturable("saved-tensor pack/unpack hooks (torch.autograd.graph."
                           "saved_tensors_hooks): an unpacked tensor's shape is unknown "
                           "until the hook runs")

    def proxy_call_backward(self, inputs: Sequence, output_metadatas: Sequence,
                            saved_tensors: Sequence, backward_idx: int, ctx: Any,
                            backward_state_idx: int | None = None, *_) -> tuple:
        return tuple(self._deferred(self._python_backward, output_metadatas, inputs,
                                    output_metadatas, saved_tensors, backward_idx, ctx,
                                    backward_state_idx))

    def _python_backward(self, inputs, output_metadatas, saved_tensors, backward_idx, ctx,
                         backward_state_idx) -> tuple:
        from ..runtime.call import CompiledFunction
        if backward_state_idx is not None:
            raise Uncapturable(f"{self.node}: a backward holding Dynamo's BackwardState")
        self.ran.add(self.node_index)
        ctx_proxy = self.proxies["hooks"][backward_idx]
        if issubclass(ctx._forward_cls, CompiledFunction):  # aotgrad's region: inline its ops
            # Recorded, not run: its results stand in from the engine's metadata. Run here, on
            # these symbolic fakes, its few hundred ops cost seconds of size reasoning (40% of
            # a 2-layer GPT-2's first backward), and specialize.py traces them anyway.
            metas = [_meta(m) for m in output_metadatas]
            result = tuple(hooks.RESULT_LIKE[hooks.run_python_backward](ctx, (), metas))
            proxy = self._call(hooks.run_region_backward, ctx_proxy, list(saved_tensors),
                               *inputs)
            track_tensor_tree(result, proxy, constant=None, tracer=self.tracer)
            return result
        self.session.note_opaque(ctx._forward_cls)
        metas = [_meta(m) for m in output_metadatas]
        return self._effect(hooks.run_python_backward, ctx_proxy, list(saved_tensors), metas,
                            *inputs)

    # CopySlices (an in-place op on a view of a leaf-less base): its own prologue and
    # epilogue around the view's formula, recorded like the formula.
    def call_copy_slices_prologue(self, *args):
        self.ran.add(self.node_index)
        return self._record(hooks.copy_slices_prologue, args)

    def call_copy_slices_epilogue(self, *args):
        return self._record(hooks.copy_slices_epilogue, args)

    def allocate_dummy(self, *_) -> torch.Tensor:
        with disable_proxy_modes_tracing():
            return torch.empty(0)

    def bind_backward_state(self, index: int):
        raise Uncapturable(f"{self.node}: Dynamo's BackwardState")

    def __getattr__(self, name: str) -> Any:
        """A method this torch's engine calls that this class lacks (its protocol changes
        between releases; 2.11's and 2.13's calls are all here): the backward runs eagerly,
        the method named, rather than failing inside the engine. An AttributeError too, so
        `getattr(capture, name, default)` still works."""
        if name.startswith("_"):
            raise AttributeError(name)
        raise MissingMethod(f"torch {torch.__version__}'s autograd engine calls {name}(), "
                            "which aotgrad's compiled autograd does not implement")

    # -- helpers -----------------------------------------------------------------------
    def _call(self, fn: Callable, *args: Any) -> fx.Proxy:
        if self.failure is not None:  # the stand-ins are not in the graph: stop at once
            raise Uncapturable(self.failure)
        proxy = super()._call(fn, *args)
        proxy.node.meta[ENGINE_NODE] = self.node_index  # for order_like_eager
        return proxy

    def _record(self, fn: Callable, args: tuple, graph_args: tuple | None = None) -> Any:
        """One call of the program: run on the fakes (for the engine to walk on), recorded
        as a call (for specialize.py to trace with the sizes of each run)."""
        with disable_proxy_modes_tracing():
            result = fn(*args)
        proxy = self._call(fn, *(args if graph_args is None else graph_args))
        track_tensor_tree(result, proxy, constant=None, tracer=self.tracer)
        return result

    def _effect(self, fn: Callable, *args: Any) -> Any:
        """A call the graph keeps (a hook, .grad accumulation): a stand-in for its result."""
        result = hooks.RESULT_LIKE[fn](*args)
        track_tensor_tree(result, self._call(fn, *args), constant=None, tracer=self.tracer)
        return result


def _bound(name: str) -> tuple[Callable, bool]:
    if name not in hooks.BOUND:  # bound before aotgrad's capture saw it (torch's instance)
        raise Uncapturable(f"the engine bound {name} to another compiled autograd; "
                           "call torch._C._dynamo.compiled_autograd.clear_cache()")
    return hooks.BOUND[name]


def _meta(meta: Any) -> Any:
    """(layout, device, dtype, size) of an output, its size a list (FX holds no torch.Size
    of symbols), from either form the engine passes: a Python backward's
    `(layout, device, dtype, size)`, or a C++ formula's packed InputMetadata,
    `(options, size, is_subclass[, grad_dtype])` (torch 2.11 and 2.13), its options
    `(requires_grad, memory_format, device, dtype, layout, pinned)` with ScalarType and Layout
    as their enums' ints."""
    if meta is None:
        return None
    if not isinstance(meta[0], tuple):
        return (*meta[:3], list(meta[3]))
    options, size = meta[0], meta[1]
    return (_enum(options[4], "layout", torch.strided), options[2],
            _enum(options[3], "dtype", torch.get_default_dtype()), list(size))


def _no_data_dependent_sizes(shape_env: Any) -> None:
    """Raises where the formula made sizes of its tensors' values (unbacked symbols): the
    program cannot hold them (its calls return only tensors)."""
    pending = getattr(shape_env, "pending_fresh_unbacked_symbols", None)
    if pending:
        symbols = list(pending)
        pending.clear()
        raise RuntimeError(f"sizes read from tensor values: {symbols}")


def _stand_in(meta: Any) -> torch.Tensor | None:
    """An output of a failed call, for the engine to walk on to end_capture. It must not
    raise (the engine would keep the capture's fakes in the node, and the eager rerun
    compute on them): where no tensor of the output's layout can be made, a strided one."""
    try:
        return hooks._empty(_meta(meta))
    except Exception:  # noqa: BLE001 - a sparse or mkldnn layout's own size rules
        with disable_proxy_modes_tracing():
            return torch.empty(0)


def _enum(value: Any, kind: str, default: Any) -> Any:
    """A layout or dtype the engine packed as its C++ enum's int, as torch's object: ATen's
    own ops read those ints back (Python has no public table of them). A compressed sparse
    layout has no 1-d tensor: it is probed 2-d."""
    if value is None:
        return default
    if not isinstance(value, int):
        return value
    for size in ([0], [0, 0]):
        try:
            with disable_proxy_modes_tracing(), torch._C._DisableTorchDispatch():
                probe = torch.ops.aten.empty.memory_format(size, device="meta", **{kind: value})
            return getattr(probe, kind)
        except RuntimeError:
            continue
    raise RuntimeError(f"aotgrad: no {kind} of the engine's enum value {value}")


def _lifted(inputs: Sequence, sizes: Sequence, origins: Any) -> tuple[Lifted, ...]:
    """The key parts a miss is explained by: each lifted tensor and size, with its node."""
    # The engine names each one's node only with its verbose logger on: else its index.
    tensor_origins, size_origins = (origins[0], origins[1]) if origins else ([], [])
    parts = [Lifted(_owner(tensor_origins, i, "input"),
                    "tensor with a .grad" if _has_grad(t) else "tensor", (tuple(t.shape), t.dtype))
             for i, t in enumerate(inputs)]
    parts += [Lifted(_owner(size_origins, i, "size"), "size", (v,)) for i, v in enumerate(sizes)]
    return tuple(parts)


def _owner(origins: Sequence, i: int, what: str) -> str:
    if i < len(origins):
        return f"node {origins[i][0]} {origins[i][1].replace('torch::autograd::', '')}"
    return f"lifted {what} {i}"


def run_captured(captured: Any, inputs: list, sizes: list, scalars: list, hook_list: list,
                 packed: list = ()) -> Any:
    """The engine's runtime wrapper: it calls this with the compiled graph and its inputs.
    The engine runs a backward's final callbacks only where it walked the nodes itself:
    those the graph's hooks queue run here, after it, as eager runs them (one a callback
    queues too); where the graph raises, none runs, as in eager."""
    prior, hooks.QUEUED = hooks.QUEUED, []
    try:
        outputs = captured(inputs, sizes, scalars, hook_list, packed)
        for callback in hooks.QUEUED:  # grows while it runs: a callback may queue another
            callback()
        return outputs
    finally:
        hooks.QUEUED = prior


def _has_grad(t: torch.Tensor) -> bool:
    return t.is_leaf and t.grad is not None  # a non-leaf's .grad warns when read
