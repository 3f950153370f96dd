"""What the analysis refuses or explains in the user's code while it runs on traced inputs.

A trace runs the function once: closed-over tensors become constants, Python's random draws
are frozen, `.grad` and hooks of the traced inputs are not the caller's, data-dependent
values cannot be seen. Each check here turns one of those into an `aotgrad:` error (or a
warning) naming the construct and what to do, instead of a graph that differs from eager.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import linecache
import os
import sys
import threading
import traceback
import warnings
from typing import Any, Callable, Sequence

import torch
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                          DynamicOutputShapeException, FakeTensor)
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.overrides import TorchFunctionMode
import torch.utils._pytree as pytree

from ..semantics import hops, mends, subclasses
from . import oplog


@contextlib.contextmanager
def user_code_checks(inputs: Sequence[Any]):
    """Around the user's code on traced `inputs`: refuse closed-over state, explain what
    tracing cannot see."""
    with _RefuseClosedOverState(inputs), _explain_data_dependence(), _explain_opaque_subclass(), \
            _python_draws_warned(), _global_reseeds_refused():
        yield


# Python's own random draws (module `random`, numpy's), where loaded (else the function
# cannot call them): a trace calls them once.
_PYTHON_DRAWS = {
    "random": ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle",
               "sample", "gauss", "normalvariate", "getrandbits", "betavariate",
               "expovariate", "triangular"),
    "numpy.random": ("random", "rand", "randn", "randint", "uniform", "normal", "choice",
                     "shuffle", "permutation", "random_sample", "binomial", "beta"),
}


@contextlib.contextmanager
def _python_draws_warned():
    """A draw of Python's `random` runs once, while traced: the graph keeps that value (a
    layer dropped or not, a crop's offset), where eager draws again at each call. Warned,
    not refused: a draw whose value changes nothing (HF's LayerDrop at probability 0) is
    common in models that compile right."""
    drawn: list[str] = []

    def noted(name: str, draw: Callable) -> Callable:
        @functools.wraps(draw)
        def draw_noted(*args, **kwargs):
            drawn.append(name)
            return draw(*args, **kwargs)
        return draw_noted

    with contextlib.ExitStack() as stack:
        for module_name, names in _PYTHON_DRAWS.items():
            module = sys.modules.get(module_name)
            if module is not None:
                stack.enter_context(mends.patched(module, **{
                    name: noted(f"{module_name}.{name}", vars(module)[name])
                    for name in names if name in vars(module)}))
        yield
    if drawn:
        warnings.warn(
            f"aotgrad: the function called {drawn[0]}() while traced: the compiled "
            "graph keeps the value drawn then, where eager draws a new one at each call. "
            "Draw it outside the compiled function and pass it in, or use torch.rand "
            "(which the graph draws at each call).", stacklevel=2)


# The functions that set the global generator's state. No op records them: a trace runs
# them once, and the graph then draws from wherever the generator is at each call, where
# eager seeds (or restores) it again each call.
_GLOBAL_RESEEDS = {"torch": ("manual_seed", "seed", "set_rng_state"),
                   "torch.random": ("manual_seed", "seed", "set_rng_state", "fork_rng")}


@contextlib.contextmanager
def _global_reseeds_refused():
    """`torch.manual_seed(5)` inside the function: the first call drew from seed 5 (the
    trace seeded it just before), later calls silently did not; `fork_rng` left the state
    advanced by the graph's draws, where eager restores it. Refused by name where the user's
    code calls them; torch's own code (Dynamo tracing a `cond` branch, for one) saves and
    restores the state around what it runs, which changes nothing, and goes through."""
    import torch._dynamo  # noqa: F401  (its import wraps torch.manual_seed once: the real one)
    tracing = threading.get_ident()  # other threads run eager code meanwhile: theirs go through
    with contextlib.ExitStack() as stack:
        for module_name, names in _GLOBAL_RESEEDS.items():
            module = sys.modules[module_name]
            stack.enter_context(mends.patched(module, **{
                name: _refused_from_user_code(name, getattr(module, name), tracing)
                for name in names}))
        yield


def _refused_from_user_code(name: str, original: Callable, thread: int) -> Callable:
    @functools.wraps(original)
    def refused(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.split(".")[0] in ("torch", "aotgrad") or threading.get_ident() != thread:
            return original(*args, **kwargs)
        raise _global_reseed(name)
    return refused


def _global_reseed(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"aotgrad: the function sets the global generator's state ({name}: "
        "torch.manual_seed, set_rng_state, fork_rng) while traced; "
        "no op records it, so the compiled graph would draw from the global generator "
        "without it at each call. Seed or restore the generator outside the compiled "
        "function, pass a torch.Generator seeded there, or use "
        "torch.compile(backend='aotgrad').")


class _RefuseClosedOverState(TorchFunctionMode):
    """Real tensors the function closes over become constants of the graph. That is only
    right for tensors that neither need a gradient nor get mutated: refuse the others. And
    the `.grad` and hooks of the traced `inputs`, which the graph cannot take."""

    def __init__(self, inputs: Sequence[Any]):
        super().__init__()
        self.inputs = {id(a) for a in inputs if isinstance(a, torch.Tensor)}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_dynamo_compiling():  # torch.cond's Dynamo capturing a branch:
            return func(*args, **kwargs)  # the op it records meets this mode after
        if func is torch.Tensor.data_ptr and not _is_real(args[0]):
            raise _address_read()
        if func is torch.Tensor.retain_grad and not args[0].is_leaf:
            raise _retained_grad()
        if getattr(func, "__self__", None) in _GRAD_SLOTS and id(args[0]) in self.inputs:
            raise _grad_slot_used(func)
        if func in _INPUT_HOOKS and id(args[0]) in self.inputs:
            raise _input_hooked(func)
        if isinstance(func, torch._ops.HigherOrderOperator):
            hops.refuse_without_shape_env(func)
        if isinstance(kwargs.get("generator"), torch.Generator) and \
                not mends.generators_traceable():
            raise _generator_untraceable(func)
        oplog.note_function(func)  # hooks: Python code in the backward the log cannot see
        for i, t in enumerate(pytree.tree_leaves((args, kwargs))):
            if _is_real(t):
                _refuse(func, t, mutated=i == 0 and _is_inplace(func))
        return func(*args, **kwargs)


class RefuseRequiresGradOff(TorchFunctionMode):
    """`requires_grad_(False)` on an input leaf: eager allows it, but the ops before it still
    reach the input's gradient, which a trace cannot tell apart from those after it. (Here
    the input is a wrapper that is no leaf: autograd itself would raise an error eager
    does not.)"""

    def __init__(self, args: Sequence[Any], is_leaf: Sequence[bool]):
        super().__init__()
        self.leaves = {id(a) for a, leaf in zip(args, is_leaf)
                       if isinstance(a, torch.Tensor) and leaf and a.requires_grad}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_dynamo_compiling():  # as _RefuseClosedOverState
            return func(*args, **kwargs)
        if func in _REQUIRES_GRAD_SETTERS and id(args[0]) in self.leaves and \
                not (args[1] if len(args) > 1 else kwargs.get("requires_grad", True)):
            raise requires_grad_turned_off()
        return func(*args, **kwargs)


# `.grad` (and `._grad`): a TorchFunctionMode sees their reads and writes as the getter's
# and setter's calls (`__self__` is the slot).
_GRAD_SLOTS = (inspect.getattr_static(torch.Tensor, "grad"),
               inspect.getattr_static(torch.Tensor, "_grad"))
# Hooks on an input stay on the caller's tensor in eager, for every later backward through
# it; a trace would apply them inside the graph (twice: the analysis's hook stays on the
# fake input the joint trace takes too), and never on the caller's tensor.
_INPUT_HOOKS = (torch.Tensor.register_hook, torch.Tensor.register_post_accumulate_grad_hook)
_REQUIRES_GRAD_SETTERS = (torch.Tensor.requires_grad_, torch.Tensor.requires_grad.__set__)


def _address_read() -> NotImplementedError:
    """A traced tensor has no memory: its address is 0, and a kernel launched on it (a user
    Triton kernel, a C extension) would write through that, or the trace would go on without
    its effect. Named here, at the first read."""
    return NotImplementedError(
        "aotgrad: the function reads a tensor's data_ptr() while it is traced (a user Triton "
        "kernel or C extension launched directly?). Call the kernel from a custom op "
        "(torch.library.custom_op with a register_fake), which aotgrad traces as one op.")


def _generator_untraceable(func) -> NotImplementedError:
    return NotImplementedError(
        f"aotgrad: {getattr(func, '__name__', func)}(generator=...) draws from a "
        f"torch.Generator, which torch {torch.__version__}'s tracer cannot hold in a graph "
        "(torch >= 2.13 can). Draw the numbers outside the compiled function and pass them "
        "in, or use the default generator.")


def _retained_grad() -> NotImplementedError:
    """The compiled function's outputs are new tensors made after the graph ran: the one
    retain_grad() marked is the trace's, and eager's `.grad` would stay None."""
    return NotImplementedError(
        "aotgrad: the function calls retain_grad() on a tensor it computes; its .grad would "
        "stay None. Return the tensor and call retain_grad() on it after the compiled call "
        "(an output no other output is computed from: capture/fed_outputs.py), or use "
        "torch.compile(backend='aotgrad').")


def _grad_slot_used(func) -> NotImplementedError:
    """A traced input has no `.grad`: a read gives None where eager gives the caller's
    gradient (an SGD step `p.add_(p.grad, alpha=-lr)` failed; one behind `if p.grad is not
    None` was skipped, silently), and a write would be lost."""
    access = "assigns" if func.__name__ == "__set__" else "reads"
    return NotImplementedError(
        f"aotgrad: the function {access} the .grad of an input (or parameter) while it is "
        "traced, where the graph cannot follow the caller's .grad from call to call. Pass "
        "the gradient as an argument (f(p, p.grad)) and update .grad outside, or use "
        "torch.compile(backend='aotgrad'), which does.")


def _input_hooked(func) -> NotImplementedError:
    return NotImplementedError(
        f"aotgrad: the function calls {func.__name__}() on an input (or parameter) while it "
        "is traced; eager keeps the hook on the caller's tensor for every later backward, "
        "which a graph cannot. Register it before calling the compiled function, or use "
        "torch.compile(backend='aotgrad').")


def requires_grad_turned_off() -> NotImplementedError:
    return NotImplementedError(
        "aotgrad: the function calls requires_grad_(False) (or detach_()) on an input that "
        "requires grad; call it before the compiled function, or use x.detach() inside.")


def _is_real(t) -> bool:
    if subclasses.is_subclass(t):  # real when what it wraps is
        return any(_is_real(inner) for inner in subclasses.unwrap(t))
    if isinstance(t, torch.Tensor) and torch._C._functorch.is_functorch_wrapped_tensor(t):
        # torch.func's wrapper (vmap's batched tensor) of a traced tensor, inside the trace
        return _is_real(torch._C._functorch.get_unwrapped(t))
    return (isinstance(t, torch.Tensor) and not isinstance(t, (FakeTensor, FunctionalTensor))
            and not torch._is_functional_tensor(t))


def _is_inplace(func) -> bool:
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _refuse(func, t: torch.Tensor, mutated: bool) -> None:
    if t.requires_grad:
        raise RuntimeError(
            f"aotgrad: {getattr(func, '__name__', func)} reads a tensor of shape {tuple(t.shape)} "
            "that requires grad but is not an input of the compiled function (a closed-over "
            "parameter?); its gradient would be lost. Pass it as an argument, or compile the "
            "module that owns it: aotgrad.compile(module).")
    if mutated:
        raise RuntimeError(
            f"aotgrad: {func.__name__} mutates a tensor of shape {tuple(t.shape)} that is not "
            "an input of the compiled function; the mutation would be lost. Pass it as an "
            "argument.")


@contextlib.contextmanager
def _explain_data_dependence():
    """Data-dependent values cannot be traced with fake tensors; say what to do instead."""
    try:
        yield
    except (DataDependentOutputException, DynamicOutputShapeException) as e:
        raise NotImplementedError(
            f"aotgrad: {e.func} produces a value that depends on tensor data (.item(), "
            f"nonzero, boolean masks...){_line_of(e.__traceback__)}, which ahead-of-time "
            "tracing cannot see. Move it out of the compiled function, or use "
            "torch.compile(backend='aotgrad'), which splits the function around it.") from e
    except RuntimeError as e:
        if _FAKE_DATA_READ not in str(e):
            raise
        raise NotImplementedError(
            f"aotgrad: an op reads the values of a tensor in C++ while it is traced"
            f"{_line_of(e.__traceback__)} (an RNN given a PackedSequence reads its "
            "batch_sizes), which tracing with fake tensors cannot see. Move it out of the "
            "compiled function, or use torch.compile(backend='aotgrad').") from e


# torch's error where a kernel reads the memory of a fake tensor, which has none.
_FAKE_DATA_READ = "data is not allocated yet"


# Frames of the tracing machinery, not of the code traced (torch's dispatch, fake tensors).
# torch/overrides.py dispatches `x in t` and other Tensor dunders to our modes: its frame is
# never the line the user wrote.
_MACHINERY = (os.sep + "aotgrad" + os.sep, os.sep + "torch" + os.sep + "_",
              os.sep + "torch" + os.sep + "utils" + os.sep, os.sep + "torch" + os.sep + "fx",
              os.sep + "torch" + os.sep + "overrides.py")


def _line_of(tb) -> str:
    """Where the traced code asked for the value: the innermost frame outside the machinery
    (a user's `.item()`, or torch's own: BatchNorm with momentum=None reads its count)."""
    frames = [(f.f_code.co_filename, line) for f, line in traceback.walk_tb(tb)]
    code = [(name, line) for name, line in frames if not any(m in name for m in _MACHINERY)]
    if not code:
        return ""
    name, line = code[-1]
    text = linecache.getline(name, line).strip()[:100]
    return f" at {os.path.basename(name)}:{line} (`{text}`)" if text else ""


@contextlib.contextmanager
def _explain_opaque_subclass():
    """`x.as_subclass(C)` inside the function hides the tensor from functionalization, which
    then fails with an error that does not say why."""
    try:
        yield
    except RuntimeError as e:
        if "FunctionalTensor on its own" not in str(e):
            raise
        raise NotImplementedError(
            "aotgrad: the function made a tensor that tracing cannot follow, most likely a "
            "tensor subclass that is not a traceable wrapper subclass (x.as_subclass(C) with "
            "C lacking __tensor_flatten__/__tensor_unflatten__). Make C a traceable wrapper "
            "subclass, or build it outside the compiled function.") from e
