"""The compiler instance the autograd engine calls while it walks a backward graph.

On a cache miss the engine (`torch._C._dynamo.compiled_autograd`) creates one
`BackwardCapture`, hands it the tensors, sizes and scalars it lifted out of the graph
(`begin_capture`), then walks the nodes in execution order, calling a method for each thing
it would run: a C++ node's formula (`apply_functional`), a Python node's backward
(`proxy_call_backward`), a hook, a gradient sum, an accumulation into `.grad`. The instance
records each into one FX graph and returns the compiled graph (`end_capture`); the engine
runs it for this backward and every later one with the same key.

Unlike torch's instance, C++ formulas are not kept as opaque calls for a second tracer
(Dynamo) to open: they run here on fake tensors under a proxy mode, so the graph holds
their ATen ops. An aotgrad region's backward is inlined op by op. What stays a Python call
in the graph is what must run as eager runs it: hooks, user autograd.Function backwards,
`.grad` accumulation.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import operator
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import (
    PythonKeyTracer, ProxyTorchDispatchMode, disable_proxy_modes_tracing, fetch_object_proxy,
    track_tensor_tree)

from . import hooks, state
from .cache import CaptureKey, Lifted

log = logging.getLogger("aotgrad.autograd")
# The graph's inputs, in the order the engine passes them to the runtime wrapper.
PLACEHOLDERS = ("inputs", "sizes", "scalars", "hooks", "packed_data")
_ids = itertools.count()


class Uncapturable(RuntimeError):
    """This backward cannot be captured: the engine runs it eagerly (api.py)."""


class BackwardCapture:
    """One capture: made by the engine on a cache miss, driven by its calls."""

    def __init__(self, session: Any):
        self.session = session
        self.stack = contextlib.ExitStack()
        self.walk: list[str] = []
        self.node = "the root"

    # -- setup and teardown -------------------------------------------------------------
    def begin_capture(self, inputs: list, sizes: list, scalars: list, origins=None,
                      accumulate_grad: bool = True, check_nans: bool = False, *_):
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.session.begin(self)
        if check_nans:
            raise Uncapturable("anomaly detection's NaN checks (detect_anomaly)")
        self.key_parts = _lifted(inputs, sizes, origins)
        self.tracer = _new_tracer()
        self.proxies = {name: self.tracer.create_proxy("placeholder", name, (), {})
                        for name in PLACEHOLDERS}
        self.shape_env = ShapeEnv()
        self.fake_mode = FakeTensorMode(allow_fallback_kernels=True,
                                        allow_non_fake_inputs=True, shape_env=self.shape_env)
        self.symbols: dict[Any, fx.Proxy] = {}
        fakes = [self.fake_mode.from_tensor(x) for x in inputs]
        self._bind(fakes, self.proxies["inputs"])
        sym_sizes = [self._symbol(v, "sizes", i) for i, v in enumerate(sizes)]
        sym_scalars = [self._symbol(v, "scalars", i) for i, v in enumerate(scalars)]
        self._enter_modes()
        return f"aotgrad-compiled-autograd-{next(_ids)}", fakes, sym_sizes, sym_scalars

    def _enter_modes(self) -> None:
        from torch._dispatch.python import enable_python_dispatcher
        from torch.fx.experimental.symbolic_shapes import _suppress_guards
        self.stack.enter_context(enable_python_dispatcher())
        self.stack.enter_context(self.fake_mode)
        self.stack.enter_context(ProxyTorchDispatchMode(self.tracer, "symbolic"))
        # Sizes the engine marked dynamic stay symbols: no guard may specialize them.
        self.stack.enter_context(_suppress_guards(self.shape_env))
        state.capturing = True
        self.stack.callback(setattr, state, "capturing", False)

    def _symbol(self, value: int | float, kind: str, index: int):
        """A lifted size or scalar: a symbol, read from the graph's input list."""
        from torch.fx.experimental.symbolic_shapes import DimDynamic
        env, source = self.shape_env, _source(kind, index)
        if isinstance(value, int):
            sym = env.create_unspecified_symint_and_symbol(value, source, DimDynamic.DYNAMIC)
        else:
            sym = env.create_symfloatnode(env.create_unspecified_symbol(
                value, source=source, dynamic_dim=DimDynamic.DYNAMIC), hint=value, source=source)
        if isinstance(sym, (torch.SymInt, torch.SymFloat)):
            proxy = self.proxies[kind][index]
            self.symbols[sym.node] = proxy
            track_tensor_tree(sym, proxy, constant=None, tracer=self.tracer)
        return sym

    def close(self) -> None:
        self.stack.close()

    def end_capture(self, outputs: Sequence[Any]):
        self.tracer.create_node("output", "output",
                                (self.tracer.create_arg(self.to_proxy(list(outputs))),), {})
        self.close()
        order_like_eager(self.tracer.graph)
        drop_unused(self.tracer.graph)
        gm = fx.GraphModule(self.tracer.root, self.tracer.graph, "CompiledAutograd")
        key = CaptureKey(tuple(self.walk), self.key_parts)
        captured = self.session.compile(gm, key)
        return run_captured, captured

    # -- the engine's calls, in the order it walks -----------------------------------
    def set_node_origin(self, name: str, index: int, pyobj: Any = None) -> None:
        self.node = f"node {index} {name.replace('torch::autograd::', '')}"
        self.walk.append(self.node)

    def log_compile_reasons(self, reasons: Sequence[str]) -> None:
        self.engine_reasons = list(reasons)

    def bind_function(self, name: str, fn: Callable, is_custom_function: bool,
                      is_traceable: bool) -> str:
        hooks.BOUND[name] = (fn, is_traceable)
        return name

    def apply_functional(self, name: str, grads: Sequence, args: Any, output_metadata):
        fn, traceable = _bound(name)
        if not traceable:
            raise Uncapturable(f"{self.node}: its C++ backward is not marked traceable")
        return fn(grads, *args)  # its ATen ops land in the graph

    def validate_outputs(self, _name: str, outputs: Sequence, args: Any, output_metadata):
        fn, _ = _bound("validate_outputs")
        return fn(outputs, *args)

    def accumulate(self, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        return torch.add(old, new)

    def accumulate_grad(self, variable: torch.Tensor, *args):
        # torch 2.11: (variable, grad, has_post_hooks) -> None; 2.13 adds the current .grad
        # before grad and returns the new .grad.
        grad, has_post_hooks = (args[0], args[1]) if len(args) == 2 else (args[1], args[2])
        self.walk.append(f"accumulate into .grad ({self.node})")
        proxy = self._call(hooks.accumulate_into, variable, grad, has_post_hooks)
        if len(args) == 2:
            return None
        result = _like(grad)
        self._bind([result], [proxy])
        return result

    def tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        return self._tensor_hook(inputs, i, "tensor hook", hooks.run_tensor_hook,
                                 self.proxies["hooks"][hook_id])

    def cpp_tensor_pre_hook(self, inputs: list, hook_id: int, i: int) -> list:
        return self._tensor_hook(inputs, i, "retain_grad", hooks.run_cpp_tensor_hooks, hook_id)

    def _tensor_hook(self, inputs: list, i: int, what: str, run: Callable, hook: Any) -> list:
        self.walk.append(f"{what} on input {i} of {self.node}")
        proxy = self._call(run, hook, inputs[i])
        inputs[i] = _like(inputs[i])
        self._bind([inputs[i]], [proxy])
        return inputs

    def pre_hook(self, inputs: Sequence, hook_id: int) -> list:
        self.walk.append(f"pre-hook of {self.node}")
        proxy = self._call(hooks.run_node_pre_hook, self.proxies["hooks"][hook_id], list(inputs))
        return self._rebind(inputs, proxy)

    def post_hook(self, outputs: Sequence, inputs: Sequence, hook_id: int) -> list:
        self.walk.append(f"post-hook of {self.node}")
        proxy = self._call(hooks.run_node_post_hook, self.proxies["hooks"][hook_id],
                           list(outputs), list(inputs))
        return self._rebind(outputs, proxy)

    def post_acc_grad_hook(self, param: torch.Tensor, hook_id: int) -> list:
        self.walk.append(f"post-accumulate-grad hook ({self.node})")
        proxy = self._call(hooks.run_post_accumulate_hook, self.proxies["hooks"][hook_id],
                           param)
        fresh = _like(param)
        track_tensor_tree(fresh, proxy, constant=None, tracer=self.tracer)
        return [fresh]

    def unpack_hook(self, hook_id: int, data_id: int) -> torch.Tensor:
        raise Uncapturable("saved-tensor pack/unpack hooks (torch.autograd.graph."
                           "saved_tensors_hooks): an unpacked tensor's shape is unknown "
                           "until the hook runs")

    def proxy_call_backward(self, inputs: Sequence, output_metadatas: Sequence,
                            saved_tensors: Sequence, backward_idx: int, ctx: Any,
                            backward_state_idx: int | None = None, *_) -> tuple:
        from ..runtime.call import CompiledFunction
        if backward_state_idx is not None:
            raise Uncapturable(f"{self.node}: a backward holding Dynamo's BackwardState")
        if ctx._forward_cls is CompiledFunction:  # aotgrad's region: inline its ops
            return tuple(CompiledFunction.backward(hooks._SavedContext(ctx, saved_tensors),
                                                   *inputs))
        self.session.note_opaque(ctx._forward_cls)
        proxy = self._call(hooks.run_python_backward, self.proxies["hooks"][backward_idx],
                           list(saved_tensors), *inputs)
        grads = [_empty(m) for m in output_metadatas]
        self._bind(grads, proxy)
        return tuple(grads)

    # CopySlices (an in-place op on a view of a leaf-less base): its own prologue and
    # epilogue around the view's formula, traced like the formula.
    def call_copy_slices_prologue(self, inputs, base_sizes, base_strides, base_offset,
                                  view_sizes, view_strides, view_offset):
        grad = inputs[0]
        result = grad.new_empty_strided(base_sizes, base_strides)
        result.copy_(grad)
        grad_slice = result.as_strided(view_sizes, view_strides, view_offset - base_offset)
        return [result, grad_slice, grad_slice.clone(memory_format=torch.contiguous_format)]

    def call_copy_slices_epilogue(self, needs_input_grad, result, res, grad_slice):
        grads = [None] * len(needs_input_grad)
        for i, needed in enumerate(needs_input_grad):
            if needed and res[i] is not None:
                if i == 0:
                    grad_slice.copy_(res[0])
                grads[i] = result if i == 0 else res[i]
        return grads

    def allocate_dummy(self, *_) -> torch.Tensor:
        with disable_proxy_modes_tracing():
            return torch.empty(0)

    def bind_backward_state(self, index: int):
        raise Uncapturable(f"{self.node}: Dynamo's BackwardState")

    # -- helpers -----------------------------------------------------------------------
    def to_proxy(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)):
            return type(x)(self.to_proxy(v) for v in x)
        if isinstance(x, (torch.SymInt, torch.SymFloat)):
            found = self.symbols.get(x.node)
            return found if found is not None else fetch_object_proxy(self.tracer, x).force()
        if isinstance(x, torch.Tensor):
            return fetch_object_proxy(self.tracer, x).proxy
        return x

    def _call(self, fn: Callable, *args: Any) -> fx.Proxy:
        return self.tracer.create_proxy("call_function", fn, self.to_proxy(args), {})

    def _bind(self, objects: Sequence, proxies: Any) -> None:
        proxies = [proxies[i] for i in range(len(objects))]
        track_tensor_tree(list(objects), proxies, constant=None, tracer=self.tracer)

    def _rebind(self, tensors: Sequence, proxy: fx.Proxy) -> list:
        """Fresh tensors for what a hook returned, standing for its outputs."""
        fresh = [None if t is None else _like(t) for t in tensors]
        self._bind(fresh, proxy)
        return fresh


def order_like_eager(graph: fx.Graph) -> None:
    """The engine's walk is a topological order, not eager's: eager runs AccumulateGrad
    (highest priority) as soon as its gradient is ready, then that parameter's
    post-accumulate-grad hooks. Move each accumulation there, with its hooks, so hooks
    observe the same order and `.grad` values as in eager."""
    _hoist_input_reads(graph)
    for acc in [n for n in graph.nodes if n.target is hooks.accumulate_into]:
        followers = _post_accumulate_hooks(acc)
        needs = {a for n in (acc, *followers) for a in n.all_input_nodes} - set(followers)
        anchor = max(needs, key=_position)
        for node in [acc, *followers]:
            anchor.append(node)
            anchor = node


_EFFECTS = frozenset({hooks.accumulate_into, hooks.run_tensor_hook, hooks.run_node_pre_hook,
                      hooks.run_node_post_hook, hooks.run_post_accumulate_hook,
                      hooks.run_cpp_tensor_hooks, hooks.run_python_backward})


def drop_unused(graph: fx.Graph) -> None:
    """Drop what nothing reads: size comparisons the formulas branched on, size reads. The
    Python calls stay: they are run for their effects."""
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and node.target not in _EFFECTS \
                and not _mutates(node.target):
            graph.erase_node(node)


def _mutates(target: Any) -> bool:
    return isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable


def _hoist_input_reads(graph: fx.Graph) -> None:
    """`hooks[3]` is read where the hook runs: read every input up front instead, so that
    moving a hook's call never moves it before its read."""
    last = [n for n in graph.nodes if n.op == "placeholder"][-1]
    for node in list(graph.nodes):
        if node.target is operator.getitem and node.args[0].op == "placeholder":
            last.append(node)
            last = node


def _post_accumulate_hooks(acc: fx.Node) -> list[fx.Node]:
    found, node = [], acc.next
    while node.op != "output" and node.target is not hooks.accumulate_into:
        if node.target is hooks.run_post_accumulate_hook and node.args[1] is acc.args[0]:
            found.append(node)
        node = node.next
    return found


def _position(node: fx.Node) -> int:
    position, cursor = 0, node
    while cursor.op != "root":
        cursor, position = cursor.prev, position + 1
    return position


def _source(kind: str, index: int) -> Any:
    """A name for a lifted size's symbol (guards are suppressed: only logs read it)."""
    from torch._dynamo.source import ConstantSource  # Source.name is a property from 2.12
    return ConstantSource(f"{kind}_{index}")


def _new_tracer() -> PythonKeyTracer:
    tracer = PythonKeyTracer()
    tracer.root = torch.nn.Module()
    tracer.graph = fx.Graph(tracer_cls=PythonKeyTracer)
    tracer.tensor_attrs = {}
    return tracer


def _bound(name: str) -> tuple[Callable, bool]:
    if name not in hooks.BOUND:  # bound before aotgrad's capture saw it (torch's instance)
        raise Uncapturable(f"the engine bound {name} to another compiled autograd; "
                           "call torch._C._dynamo.compiled_autograd.clear_cache()")
    return hooks.BOUND[name]


def _like(t: torch.Tensor) -> torch.Tensor:
    with disable_proxy_modes_tracing():
        return t.clone()


def _empty(meta: Any) -> torch.Tensor | None:
    if meta is None:
        return None
    layout, device, dtype, size = meta
    with disable_proxy_modes_tracing():
        return torch.empty(size, dtype=dtype, layout=layout, device=device)


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
    """The engine's runtime wrapper: it calls this with the compiled graph and its inputs."""
    return captured(inputs, sizes, scalars, hook_list, packed)


def _has_grad(t: torch.Tensor) -> bool:
    return t.is_leaf and t.grad is not None  # a non-leaf's .grad warns when read
