"""Errors the user's code meets in a trace, raised as eager raises them.

A fake tensor runs torch's meta kernels and Python checks, not eager's C++ kernels, so an op
eager refuses can fail in a trace with another type or message, or not at the same check:
`x.max()` on a complex tensor that requires grad passes the meta kernel and then fails
autograd's complex-output check (RuntimeError), where eager's kernel raised
NotImplementedError first. The user's `except` then takes another branch than in eager, and
the message names a check eager never reached.

So when an op fails in a trace, the same op runs once more, eagerly, on zero-filled
stand-ins with its tensors' metadata (sizes, strides, dtype, device, requires_grad, whether
a leaf); what eager raises there is raised instead. Only the failure path pays for it.

The other way round too: an op that writes into a tensor (in place, `out=`) can pass in a
trace where eager refuses the dtype it would write. Functionalized, `a.mul_(0.5)` on an
int64 `a` becomes a float `mul` copied into `a`, truncating; eager's kernel raises "result
type Float can't be cast to the desired output type Long" (torch's meta kernels for `mul_`,
`addcmul_` and most `out=` variants do not check); nor does a write into an expanded
tensor fail there, where eager refuses most ("more than one element of the written-to
tensor refers to a single memory location") and the user's `except` takes over. Such a call
runs first, eagerly, on stand-ins of one element a dimension (two sharing memory where the
tensor's dimension is expanded: dtype and overlap rules do not read sizes); where that
fails, on full-sized ones as above, and what eager raises there is raised.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from types import BuiltinFunctionType, MethodDescriptorType, WrapperDescriptorType
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._dispatch.python import no_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.utils._python_dispatch import _disable_current_modes

from ..tables import has_effect

# Errors whose exact type a kernel's check raises. Subclasses (fake tensors' data-dependent
# errors, our own control-flow exceptions, linalg's errors on singular zeros) are left alone.
_CHECK_ERRORS = (RuntimeError, NotImplementedError, ValueError, IndexError, TypeError)
# The tensor types a stand-in can stand for: plain, and the trace's wrappers of plain ones.
_PLAIN = (torch.Tensor, torch.nn.Parameter, FakeTensor, FunctionalTensor)
# Calls whose outcome depends on the autograd graph behind their tensors, which stand-ins
# lack.
_GRAPH_READERS = frozenset({torch.autograd.grad, torch.autograd.backward, torch.Tensor.backward})
_TORCHS_NAMESPACES = frozenset({"aten", "prims"})
# A kernel read a fake tensor's memory (an RNN reading a PackedSequence's batch_sizes):
# capture/user_checks.py says so.
_READ_FAKE_DATA = "data is not allocated yet"
# Stand-ins of more bytes than this are not made: the fake error is kept.
_MAX_STAND_IN_BYTES = 1 << 28


class EagerErrorTypes(torch.overrides.TorchFunctionMode):
    """Around the user's code in a trace: an op that fails raises eager's error for it, so
    that the user's `except` takes it as in eager (`try: x.view(-1) except RuntimeError:
    x.reshape(-1)`, where the fake view check raises ValueError)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        refused = _write_refused(func, args, kwargs)
        if refused is not None:
            raise refused
        try:
            return func(*args, **kwargs)
        except _CHECK_ERRORS as error:
            eager = _eager_error(error, func, args, kwargs) or _view_error(error)
            if eager is None:
                raise
            raise eager from error


def _eager_error(error: Exception, func, args, kwargs) -> Exception | None:
    """Eager's error for `func(*args, **kwargs)`, where it differs from the trace's `error`;
    None where the trace's stands (ours, not a check's, or nothing to compare with)."""
    if type(error) not in _CHECK_ERRORS or str(error).startswith("aotgrad:"):
        return None
    if _READ_FAKE_DATA in str(error):  # eager's, on zero stand-ins, would mislead: not a check
        return None
    if not _runs_again_unseen(func, args, kwargs):
        return None
    eager = _eager_error_for(func, args, kwargs)
    if eager is None or (type(eager) is type(error) and str(eager) == str(error)):
        return None
    return eager


def _eager_error_for(func, args, kwargs) -> Exception | None:
    """What eager raises for the call, on full-sized stand-ins; None where it raises none of
    the checks' errors (or no stand-in can be made)."""
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            stand_in_args, stand_in_kwargs = pytree.tree_map_only(
                torch.Tensor, _stand_in, (args, kwargs))
    except _NoStandIn:
        return None
    eager = _raised(func, stand_in_args, stand_in_kwargs)
    if type(eager) not in _CHECK_ERRORS:
        return None
    return type(eager)(str(eager))


def _write_refused(func, args, kwargs) -> Exception | None:
    """Eager's error for a call of torch's that writes into an argument, where eager's kernel
    refuses it; None where eager runs it (or it cannot be run again unseen)."""
    if not _writes_into_argument(func, kwargs):
        return None
    leaves = pytree.tree_leaves((args, kwargs))
    if _one_float_dtype(leaves) and kwargs.get("out") is None:
        return None  # model code's relu_, add_, mul_: nothing to cast, nothing expanded
    if any(isinstance(leaf, torch.Generator) for leaf in leaves):
        return None  # its draws would show: fork_rng puts back the default generators only
    if not _runs_again_unseen(func, args, kwargs):
        return None
    try:
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            small = pytree.tree_map_only(torch.Tensor, _small_stand_in, (args, kwargs))
    except _NoStandIn:
        return None
    if type(_raised(func, *small)) not in _CHECK_ERRORS:
        return None
    return _eager_error_for(func, args, kwargs)  # a size check of the small ones, maybe


def _one_float_dtype(leaves) -> bool:
    """Every tensor of one floating dtype, none expanded, no complex scalar: an in-place
    op then computes in its target's dtype, and no element of it is shared, so eager's cast
    and overlap checks cannot fail."""
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    if not tensors or not tensors[0].dtype.is_floating_point:
        return False
    return not any(isinstance(leaf, complex) for leaf in leaves) and all(
        t.dtype == tensors[0].dtype and not _expanded(t) for t in tensors)


def _expanded(t: torch.Tensor) -> bool:
    return any(_concrete(s) == 0 and _concrete(n) > 1 for n, s in zip(t.shape, t.stride()))


def _writes_into_argument(func, kwargs) -> bool:
    name = getattr(func, "__name__", "")
    in_place = name in _IN_PLACE_OPERATORS or (name.endswith("_") and not name.startswith("_"))
    if not in_place and kwargs.get("out") is None:
        return False
    # torch's own functions only (builtins; Python ones such as torch.norm), not one of the
    # user's that takes tensors through torch functions, whose second run would show.
    return isinstance(func, _BUILTINS) or bool(
        _TORCHS_MODULE.match(getattr(func, "__module__", None) or ""))


_BUILTINS = (BuiltinFunctionType, MethodDescriptorType, WrapperDescriptorType)
_TORCHS_MODULE = re.compile(r"torch(\.|$)")
_IN_PLACE_OPERATORS = frozenset(
    f"__i{name}__" for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and",
                                "or", "xor", "lshift", "rshift", "matmul"))


def _runs_again_unseen(func, args, kwargs) -> bool:
    """Whether running `func` once more shows the user nothing: not a higher-order op (a
    print, a region of the user's code), no op with effects or of another library than
    torch's (a custom op may count its calls), no callable argument (it would run again)."""
    if func in _GRAPH_READERS or isinstance(func, torch._ops.HigherOrderOperator):
        return False
    if isinstance(func, torch._ops.OpOverload):
        if func.namespace not in _TORCHS_NAMESPACES or has_effect(func):
            return False
    if isinstance(func, torch._ops.OpOverloadPacket):  # its overloads have the effects
        if func._qualified_op_name.split("::")[0] not in _TORCHS_NAMESPACES or any(
                has_effect(getattr(func, name)) for name in func.overloads()):
            return False
    leaves = pytree.tree_leaves((args, kwargs))
    return not any(callable(leaf) and not isinstance(leaf, torch.Tensor) for leaf in leaves)


def _view_error(error: Exception) -> Exception | None:
    # Where no stand-in could be made: torch's Python view check raises ValueError, eager's
    # C++ one RuntimeError.
    if type(error) is ValueError and str(error).startswith("Cannot view a tensor"):
        return RuntimeError(str(error))
    return None


def _raised(func, args, kwargs) -> Exception | None:
    # Outside the trace's modes and the Python dispatcher: eager's kernels on real tensors,
    # warning nothing (a stand-in out= of one element is resized, with a warning). The
    # random states are put back, since an op that passes here may have drawn from them.
    with _disable_current_modes(), torch._C.DisableTorchFunction(), no_python_dispatcher(), \
            _random_states_kept(args, kwargs), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            func(*args, **kwargs)
        except Exception as eager:  # whatever it is, the caller compares its type
            return eager
    return None


def _random_states_kept(args, kwargs) -> contextlib.ExitStack:
    """The default CPU generator's state, and each device's the stand-ins live on, put back
    on exit (`uniform_`, `nn.init.kaiming_uniform_`, `out=` of `randn` draw)."""
    stack = contextlib.ExitStack()
    stack.enter_context(torch.random.fork_rng(devices=[]))
    devices: dict[str, set[int]] = {}
    for t in pytree.tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "meta"):
            devices.setdefault(t.device.type, set()).add(t.device.index or 0)
    for kind, indices in devices.items():
        stack.enter_context(torch.random.fork_rng(devices=sorted(indices), device_type=kind))
    return stack


class _NoStandIn(Exception):
    pass


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """Zeros with `t`'s metadata, a leaf or not as `t` is."""
    _refuse_unplain(t)
    sizes = [_concrete(n) for n in t.shape]
    strides = [_concrete(n) for n in t.stride()]
    extent = 0 if 0 in sizes else 1 + sum((n - 1) * s for n, s in zip(sizes, strides))
    if extent * t.element_size() > _MAX_STAND_IN_BYTES:
        raise _NoStandIn
    try:
        stand_in = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
        stand_in.untyped_storage().fill_(0)
    except (RuntimeError, TypeError) as error:  # a device this process has not got; a
        raise _NoStandIn from error  # storage torch calls invalid (inside a traced set_())
    stand_in.requires_grad_(t.requires_grad)
    if t.requires_grad and not t.is_leaf:
        with torch.enable_grad():
            return stand_in.clone()
    return stand_in


def _small_stand_in(t: torch.Tensor) -> torch.Tensor:
    """Zeros of `t`'s dtype, device and rank, one element a dimension (none where `t` has
    none; two sharing memory where `t`'s dimension is expanded, whose writes eager refuses),
    not requiring grad: autograd's checks are the trace's own."""
    _refuse_unplain(t)
    sizes = [_concrete(n) for n in t.shape]
    expanded = [n > 1 and _concrete(s) == 0 for n, s in zip(sizes, t.stride())]
    try:
        small = torch.zeros([min(n, 1) for n in sizes], dtype=t.dtype, device=t.device)
    except (RuntimeError, TypeError) as error:  # a device this process has not got
        raise _NoStandIn from error
    return small.expand([2 if e else n for e, n in zip(expanded, small.shape)])


def _refuse_unplain(t: torch.Tensor) -> None:
    # a subclass, a sparse or nested tensor: no zeros stand in for it
    if type(t) not in _PLAIN or t.layout != torch.strided or t.is_nested:
        raise _NoStandIn


def _concrete(n: Any) -> int:
    """A size as an int: a symbolic one by its hint (no guard is added)."""
    if isinstance(n, int):
        return n
    hint = getattr(getattr(n, "node", None), "hint", None)
    if hint is None:
        raise _NoStandIn
    return int(hint)
