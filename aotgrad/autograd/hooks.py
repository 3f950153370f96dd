"""What a captured backward calls: the engine's C++ formulas (`call_formula`), the user's hooks,
opaque Python backwards, and gradient accumulation into `.grad`.

A capture records these calls as one program (capture.py); specializing it for some sizes
(specialize.py) runs the formulas on fake tensors, so their ATen ops land in the graph, and
keeps the rest (`EFFECTS`) as calls, whose results it stands in for by `RESULT_LIKE`.

Each runs at graph run time on real tensors, so a hook's side effects (appending to a list,
a data-parallel bucket's all-reduce) happen at every backward, in the order the engine
would run them. The engine binds its own C++ functions (a formula, `AccumulateGrad`) once
per process; `BOUND` keeps them by name.
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import torch

# name -> (function, traceable), as the engine binds them (see capture.bind_function).
BOUND: dict[str, tuple[Callable, bool]] = {}
# The final callbacks (`Variable._execution_engine.queue_callback`: FSDP's, DDP's static
# graph's) queued while a captured graph runs, for `capture.run_captured` to run after it;
# None outside one (api.py's engine stand-in then hands them to the engine).
QUEUED: list[Callable[[], None]] | None = None


def call_formula(name: str, grads: list, *args: Any) -> list:
    """A C++ node's backward formula (or the engine's `validate_outputs`), as bound."""
    return BOUND[name][0](grads, *args)


def run_region_backward(ctx: Any, saved: list, *grads: Any) -> tuple:
    """An aotgrad region's backward: traced, it runs its partitioned graph op by op."""
    from ..runtime.call import CompiledFunction
    return tuple(CompiledFunction.backward(_SavedContext(ctx, saved), *grads))


def replay_region_backward(ctx: Any, saved: list, *grads: Any) -> tuple:
    """create_graph=True: an aotgrad region's differentiable backward (grad mode on, it
    replays the region's forward from the inputs this run's ctx holds), run at each
    backward: traced, those inputs would be baked into the graph."""
    return run_region_backward(ctx, saved, *grads)


def copy_slices_prologue(inputs: list, base_sizes, base_strides, base_offset, view_sizes,
                         view_strides, view_offset) -> list:
    """CopySlices (an in-place op on a view of a leaf-less base), before the view's formula."""
    grad = inputs[0]
    result = grad.new_empty_strided(base_sizes, base_strides)
    result.copy_(grad)
    grad_slice = result.as_strided(view_sizes, view_strides, view_offset - base_offset)
    return [result, grad_slice, grad_slice.clone(memory_format=torch.contiguous_format)]


def copy_slices_epilogue(needs_input_grad: list, result, res: list, grad_slice) -> list:
    grads = [None] * len(needs_input_grad)
    for i, needed in enumerate(needs_input_grad):
        if needed and res[i] is not None:
            if i == 0:
                grad_slice.copy_(res[0])
            grads[i] = result if i == 0 else res[i]
    return grads


def run_tensor_hook(hook: Callable, grad: torch.Tensor) -> torch.Tensor:
    """A tensor pre-hook (`register_hook`) or a post-accumulate-grad hook's stand-in."""
    result = hook(grad)
    if result is None:
        return grad
    check_hook_result(hook, grad, result)
    return result


def run_node_pre_hook(hook: Callable, grads: list) -> list:
    """`grad_fn.register_prehook(hook)`: hook(grad_outputs) -> new grad_outputs or None."""
    result = hook(tuple(grads))  # a tuple, as eager passes it
    return grads if result is None else check_hook_results(hook, grads, result)


def run_node_post_hook(hook: Callable, grad_inputs: list, grad_outputs: list) -> list:
    """`grad_fn.register_hook(hook)`: hook(grad_inputs, grad_outputs) -> new or None."""
    result = hook(tuple(grad_inputs), tuple(grad_outputs))
    return grad_inputs if result is None else check_hook_results(hook, grad_inputs, result)


def check_hook_results(hook: Callable, given: list, result: Any) -> list:
    """A grad_fn hook's results checked as eager's engine checks them (python_hook.cpp's
    check_result): a tuple of as many values, each like the gradient it replaces."""
    if not isinstance(result, tuple):
        raise TypeError(f"expected tuple, but hook returned '{type(result).__name__}'")
    if len(result) != len(given):
        raise RuntimeError(f"hook '{_hook_name(hook)}' has returned an incorrect number of "
                           f"values (got {len(result)}, but expected {len(given)})")
    for old, new in zip(given, result):
        if new is not None:
            check_hook_result(hook, old, new)
    return list(result)


def check_hook_result(hook: Callable, given: Any, result: Any) -> None:
    """A hook's new gradient must be like the one it was given, as eager's engine checks
    (check_variable_result): the graph after the hook was traced for that one, and
    broadcasting a gradient of another size, or reading one of another dtype as this one,
    would give a wrong gradient silently."""
    if given is None:
        raise RuntimeError("can't replace a None gradient with a non-None value")
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"expected Variable, but hook returned '{type(result).__name__}'")
    if (result.dtype, result.layout, result.device.type) != \
            (given.dtype, given.layout, given.device.type):
        raise RuntimeError(f"hook '{_hook_name(hook)}' has changed the type of value (was "
                           f"{_type_name(given)} got {_type_name(result)})")
    if result.shape != given.shape:
        raise RuntimeError(f"hook '{_hook_name(hook)}' has changed the size of value")


def _hook_name(hook: Callable) -> str:
    return str(getattr(hook, "__name__", "<unknown>"))


def _type_name(t: torch.Tensor) -> str:
    try:
        return t.type()  # eager's text: torch.FloatTensor, torch.cuda.HalfTensor
    except (RuntimeError, TypeError):  # a dtype with no legacy tensor type
        return f"{t.device.type} {t.dtype} tensor"


def run_post_accumulate_hook(hook: Callable, param: torch.Tensor) -> torch.Tensor:
    if hook(param) is not None:
        raise RuntimeError("Tensor post accumulate grad hooks should return None.")
    return param


def run_cpp_tensor_hooks(hook_id: int, grad: torch.Tensor) -> torch.Tensor:
    """C++ tensor pre-hooks (`retain_grad`), which the engine keeps and runs by id."""
    if grad is None:  # an undefined gradient (undefined.py): retain_grad keeps nothing, as
        return None   # eager; the engine's binding would crash on None
    return torch._C._dynamo.compiled_autograd.call_cpp_tensor_pre_hooks(hook_id, grad)


def run_unpack_hook(hook: Callable, packed: Any) -> torch.Tensor:
    return hook(packed)


class _SavedContext:
    """The ctx a Python backward sees, with the saved tensors the graph passes it: the
    engine lifted them out of the node, so the node's own may be gone."""

    def __init__(self, ctx: Any, saved: list):
        self._ctx, self._saved = ctx, tuple(saved)

    @property
    def saved_tensors(self) -> tuple:
        return self._saved

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


def run_python_backward(ctx: Any, saved: list, metas: Any, *grads: Any) -> tuple:
    """A custom autograd.Function's backward, run as eager runs it (untraced), its gradients
    then made like its inputs as eager's engine makes them (the graph after it was traced
    for gradients of the inputs' metadata)."""
    out = ctx._forward_cls.backward(_SavedContext(ctx, saved), *grads)
    name = type(ctx).__name__
    out = gradient_per_input(name, out if isinstance(out, tuple) else (out,), metas)
    return tuple(as_input_gradient(name, i, grad, meta)
                 for i, (grad, meta) in enumerate(zip(out, metas)))


def gradient_per_input(name: str, out: tuple, metas: Any) -> tuple:
    """A custom backward's results, one per forward input, checked as eager's engine checks
    them (python_function.cpp): extra Nones dropped, another count raised, a gradient for
    an input that was not a tensor (its meta None) or one that is not a tensor (a float
    the graph would read as a scalar) raised: the graph after it reads one tensor or None
    per input."""
    if len(out) > len(metas) and all(g is None for g in out[len(metas):]):
        out = out[:len(metas)]
    if len(out) != len(metas):
        raise RuntimeError(f"function {name} returned an incorrect number of gradients "
                           f"(expected {len(metas)}, got {len(out)})")
    for i, (grad, meta) in enumerate(zip(out, metas)):
        if grad is not None and meta is None:
            raise RuntimeError(f"function {name} returned a gradient different than None at "
                               f"position {i + 1}, but the corresponding forward input was "
                               "not a Variable")
        if grad is not None and not isinstance(grad, torch.Tensor):
            raise RuntimeError(f"expected Variable or None (got {type(grad).__name__})")
    return out


def as_input_gradient(name: str, index: int, grad: Any, meta: Any) -> Any:
    """A custom backward's gradient for input `index`, as eager's engine validates it
    (engine.cpp's validate_outputs): summed to the input's shape where it broadcasts to it,
    cast to its dtype, a 0-dim one moved to its device; other mismatches raise eager's
    error. `meta`: the input's (layout, device, dtype, size); None where none is needed."""
    if grad is None or meta is None or not isinstance(grad, torch.Tensor):
        return grad
    _, device, dtype, size = meta
    if list(grad.shape) != list(size):
        if not _expandable(size, grad.shape):
            raise RuntimeError(f"Function {name} returned an invalid gradient at index {index}"
                               f" - got {list(grad.shape)} but expected shape compatible with "
                               f"{list(size)}")
        grad = grad.sum_to_size(size)
    if not grad.is_floating_point() and grad.is_complex() != dtype.is_complex:
        raise RuntimeError(f"Function {name} returned an invalid gradient at index {index} - "
                           f"a {grad.dtype} gradient for a {dtype} input")
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    if grad.device != device:
        if grad.dim() != 0:
            raise RuntimeError(f"Function {name} returned an invalid gradient at index {index}"
                               f" - expected device {device} but got {grad.device}")
        grad = grad.to(device)
    return grad


def _expandable(shape: Any, target: Any) -> bool:
    """Does `shape` broadcast to `target` (the broadcast rule, from the trailing dims)?"""
    if len(shape) > len(target):
        return False
    return all(s == 1 or s == t for s, t in zip(reversed(list(shape)), reversed(list(target))))


def none_as_zeros(grad: Any, meta: Any) -> Any:
    """A custom backward's None gradient (no contribution, in eager) where the compiled ops
    after it take a tensor: zeros of the input's metadata, which those ops (linear in the
    gradient) turn into the same values eager's skipped contribution leaves."""
    if grad is not None:
        return grad
    layout, device, dtype, size = meta
    return torch.zeros(size, dtype=dtype, layout=layout, device=device)


def undefined_if_none(grad: Any, *defining: Any) -> Any:
    """A gradient as eager has it: undefined (None) where every custom backward result it
    is made of is None (undefined.py; the traced ops made it of zeros instead)."""
    return None if all(d is None for d in defining) else grad


def or_else(grad: Any, fallback: Any) -> Any:
    """What the traced ops after a hook read: its result, or where it was given None and
    returned None, the zeros the traced ops had made for that None."""
    return fallback if grad is None else grad


def add_gradients(old: Any, new: Any) -> Any:
    """Two contributions to one gradient, summed; None (a custom backward's "no
    gradient") contributes nothing, as in eager's input buffers."""
    if old is None or new is None:
        return new if old is None else old
    return torch.add(old, new)


def accumulate_into(variable: torch.Tensor, grad: torch.Tensor, has_post_hooks: bool) -> None:
    """AccumulateGrad: first assignment, in-place accumulation, create_graph's out-of-place
    sum, the gradient layout contract: the engine's own function, so each is eager's."""
    fn, _ = BOUND["AccumulateGrad"]
    variable.grad = fn([grad], variable, variable.grad, has_post_hooks)[0]


def in_layout(grad: torch.Tensor, order: tuple[int, ...]) -> torch.Tensor:
    """A hook's gradient in the layout that the compiled code after it was traced with:
    dense, its dims in memory in `order` (outermost first)."""
    if grad is None or list(grad.stride()) == dense_strides(grad.shape, order):
        return grad
    out = torch.empty_permuted(grad.shape, order, dtype=grad.dtype, device=grad.device)
    return out.copy_(grad)


def dense_strides(sizes: Any, order: tuple[int, ...]) -> list[int]:
    stride, strides = 1, [0] * len(sizes)
    for d in reversed(order):
        strides[d] = stride
        stride *= sizes[d]
    return strides


def _like(t: Any) -> Any:
    if t is None:
        return None
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    with disable_proxy_modes_tracing():
        return t.clone()


def _empty(meta: Any) -> torch.Tensor | None:
    if meta is None:
        return None
    layout, device, dtype, size = meta
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    with disable_proxy_modes_tracing():
        return torch.empty(size, dtype=dtype, layout=layout, device=device)


# What a trace stands in for each call's result, given the call's arguments: the calls run
# only when the graph runs, so a hook is assumed to return what it was given (a hook that
# changes a gradient's shape breaks eager's own checks as well).
RESULT_LIKE: dict[Callable, Callable[..., Any]] = {
    accumulate_into: lambda variable, grad, has_post_hooks: _like(grad),
    run_tensor_hook: lambda hook, grad: _like(grad),
    run_cpp_tensor_hooks: lambda hook_id, grad: _like(grad),
    run_node_pre_hook: lambda hook, grads: [_like(g) for g in grads],
    run_node_post_hook: lambda hook, grad_inputs, grad_outputs: [_like(g) for g in grad_inputs],
    run_post_accumulate_hook: lambda hook, param: _like(param),
    run_python_backward: lambda ctx, saved, metas, *grads: tuple(_empty(m) for m in metas),
}
# Run for their effects (or, the replay, for what they read at run time; `none_as_zeros`
# and `in_layout`, for a value or layout only the run knows): never dropped, never traced
# into. The replay's results are stood in for by the region's traced backward.
EFFECTS = frozenset(RESULT_LIKE) | {replay_region_backward, none_as_zeros, in_layout,
                                    undefined_if_none, or_else}

# A tensor's hooks (given one gradient) and a node's (given its list of gradients).
TENSOR_HOOKS = (run_tensor_hook, run_cpp_tensor_hooks)
NODE_HOOKS = (run_node_pre_hook, run_node_post_hook)


def traced_users(node: Any) -> list:
    """The ATen ops that read a graph node (not a Python call, nor an item of one)."""
    return [u for u in node.users if u.op == "call_function" and u.target not in EFFECTS
            and u.target is not operator.getitem]
