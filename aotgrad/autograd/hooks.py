"""What the captured backward graph calls besides ATen ops: the user's hooks, opaque Python
backwards, and gradient accumulation into `.grad`.

Each runs at graph run time on real tensors, so a hook's side effects (appending to a list,
a data-parallel bucket's all-reduce) happen at every backward, in the order the engine
would run them. The engine binds its own C++ functions (a formula, `AccumulateGrad`) once
per process; `BOUND` keeps them by name.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# name -> (function, traceable), as the engine binds them (see capture.bind_function).
BOUND: dict[str, tuple[Callable, bool]] = {}


def run_tensor_hook(hook: Callable, grad: torch.Tensor) -> torch.Tensor:
    """A tensor pre-hook (`register_hook`) or a post-accumulate-grad hook's stand-in."""
    result = hook(grad)
    return grad if result is None else result


def run_node_pre_hook(hook: Callable, grads: list) -> list:
    """`grad_fn.register_prehook(hook)`: hook(grad_outputs) -> new grad_outputs or None."""
    result = hook(grads)
    return grads if result is None else list(result)


def run_node_post_hook(hook: Callable, grad_inputs: list, grad_outputs: list) -> list:
    """`grad_fn.register_hook(hook)`: hook(grad_inputs, grad_outputs) -> new or None."""
    result = hook(grad_inputs, grad_outputs)
    return grad_inputs if result is None else list(result)


def run_post_accumulate_hook(hook: Callable, param: torch.Tensor) -> torch.Tensor:
    if hook(param) is not None:
        raise RuntimeError("post accumulate grad hooks cannot return anything")
    return param


def run_cpp_tensor_hooks(hook_id: int, grad: torch.Tensor) -> torch.Tensor:
    """C++ tensor pre-hooks (`retain_grad`), which the engine keeps and runs by id."""
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


def run_python_backward(ctx: Any, saved: list, *grads: Any) -> tuple:
    """A custom autograd.Function's backward, run as eager runs it (untraced)."""
    out = ctx._forward_cls.backward(_SavedContext(ctx, saved), *grads)
    return out if isinstance(out, tuple) else (out,)


def accumulate_into(variable: torch.Tensor, grad: torch.Tensor, has_post_hooks: bool) -> None:
    """AccumulateGrad: first assignment, in-place accumulation, create_graph's out-of-place
    sum, the gradient layout contract: the engine's own function, so each is eager's."""
    fn, _ = BOUND["AccumulateGrad"]
    variable.grad = fn([grad], variable, variable.grad, has_post_hooks)[0]
