"""Call guards: does a new call match what a compiled entry was specialized for?

`signature` builds a hashable key from every argument: about a microsecond per tensor,
on every call. A guard is decided once, when the entry is compiled, and checks only what the
entry depends on:

- the number of flat arguments, and each one's kind: tensor positions by torch's C++
  `TensorGuards` (Python type, dispatch keys, dtype, device, sizes, strides, requires_grad),
  constants by type and value (or identity, when unhashable);
- which positions hold the same tensor, and that the others stay distinct tensors (part of
  the tensor check);
- the storage offset of the inputs whose memory the runtime addresses by absolute geometry
  (outputs that alias them, metadata mutations) and the leaf-ness of mutated inputs (eager
  refuses in-place changes to leaves that require grad): elsewhere neither reaches the graph,
  whose fake inputs start at offset 0;
- grad mode, inference mode, the default dtype and device, deterministic algorithms and
  autocast (`global_state`);
- for an entry compiled for dynamic shapes, each tensor's rank instead of its sizes and
  strides, then the entry's shape guard (`dynamic.ShapeGuard`).

A guard is straight-line Python generated per entry (`GuardPlan.source`). A call it rejects
falls back to the signature key, so a guard only needs to be sound: when it passes, the entry
computes what eager would.
"""

from __future__ import annotations

import contextlib
import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch
from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode
from torch.utils._device import DeviceContext

from ..schema import OutputKind
from ..semantics import subclasses
from .call import CompiledCall, runner_body

_GUARDABLE_TENSORS = (torch.Tensor, torch.nn.Parameter)  # subclasses keep the signature key
_CONSTANT_TYPES = (int, float, bool, type(None))
_PLAIN_TENSORS = frozenset({torch.Tensor, torch.nn.Parameter})  # no subclass signature
# torch.are_deterministic_algorithms_enabled without its Python frame (read at every call).
_DETERMINISTIC = torch._C._get_deterministic_algorithms
_CAST_CACHE = torch._C.is_autocast_cache_enabled


def global_state() -> tuple:
    """The global modes a compiled graph specializes on. Inductor bakes the default dtype
    (a factory's `dtype=None`) and deterministic algorithms (`torch.empty` filled with NaN)
    into its code; the eager backend reads them at each call. A joint trace keeps autocast's
    cast cache as the call has it (semantics/autocast.py)."""
    state = [torch.is_grad_enabled(), torch.is_inference_mode_enabled(),
             torch.get_default_dtype(), _DETERMINISTIC(), _CAST_CACHE()]
    for device in ("cpu", "cuda"):
        on = torch.is_autocast_enabled(device)
        state.append((on, torch.get_autocast_dtype(device)) if on else False)
    return (*state, default_device())


# Any torch function mode on (one C call): the callers' first test, before the Python frame
# of `under_a_function_mode`, which tells a default device from a user's mode.
function_modes_on = torch._C._is_torch_function_mode_enabled


def default_device() -> str | None:
    """The device of `torch.set_default_device` or `with torch.device(...)`, which a trace
    bakes into its factories (`torch.ones(3)`); None where no function mode is on."""
    return str(torch.get_default_device()) if function_modes_on() else None


def under_a_function_mode() -> bool:
    """Under a torch function mode other than a default device (a user's TorchFunctionMode,
    which sees and may rewrite every call): a graph traced without it would not repeat that,
    so the original code runs. A default device is a part of the guards' global state."""
    return function_modes_on() and any(
        type(mode) is not DeviceContext for mode in _get_current_function_mode_stack())


@contextlib.contextmanager
def function_modes_off():
    """The block runs with the torch function mode stack empty, then the stack is put back:
    for code that already holds what the caller's modes did (Dynamo's graph, which inlined
    their `__torch_function__`). The modes are taken off rather than disabled, so that
    aotgrad's own modes work in a compile the block may start."""
    modes = [_pop_mode() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            _push_mode(mode)


@dataclass(frozen=True)
class GuardPlan:
    """What one entry's guard checks, by flat argument position."""

    num_args: int
    tensors: tuple[int, ...]  # first position of each distinct tensor
    same_as: tuple[tuple[int, int], ...]  # (position, earlier position of the same tensor)
    storage_offsets: tuple[tuple[int, int], ...]  # (position, offset)
    leaves: tuple[tuple[int, bool], ...]  # (position, is_leaf)
    constants: tuple[tuple[int, Any], ...]  # (position, value)
    global_state: tuple

    @property
    def source(self) -> str:
        return _guard_source(self)[0]


def plan_guard(flat_args: Sequence[Any], call: CompiledCall) -> GuardPlan | None:
    """The guard for an entry compiled for `flat_args`; None where only the key will do."""
    if not all(_guardable(a) for a in flat_args):
        return None
    first: dict[int, int] = {}
    same_as = []
    for pos, a in enumerate(flat_args):
        if isinstance(a, torch.Tensor):
            earlier = first.setdefault(id(a), pos)
            if earlier != pos:
                same_as.append((pos, earlier))
    addressed, mutated = _addressed_and_mutated(call)
    return GuardPlan(
        num_args=len(flat_args),
        tensors=tuple(first.values()),
        same_as=tuple(same_as),
        storage_offsets=tuple((p, flat_args[p].storage_offset()) for p in addressed),
        leaves=tuple((p, flat_args[p].is_leaf)
                     for p in sorted({*mutated, *_leafness_read(flat_args)})),
        constants=tuple((p, a) for p, a in enumerate(flat_args)
                        if not isinstance(a, torch.Tensor)),
        global_state=global_state(),
    )


class InputsChanged(RuntimeError):
    """A call to a graph compiled once for fixed inputs (`aot_module_simplified`) whose
    inputs break an assumption of that graph."""


def fixed_inputs_check(example: Sequence[Any]) -> Callable[[Sequence[Any]], None]:
    """For a graph compiled once, for `example` (its caller, Dynamo, guards everything
    else): raise `InputsChanged` where a call's inputs differ in what the graph bakes in and
    no later check catches. Each tensor's requires_grad (the graph returns gradients only for
    the inputs that required them), and the positions that held one tensor (the graph takes
    it once and would ignore the others). Distinct tensors passed as one are left to the
    aliasing check: they change nothing unless mutated, and then it raises."""
    expected = _fixed_facts(example)
    terms = [f"len(a) == {len(example)}"]
    terms += [f"a[{p}] is a[{e}]" if type(e) is int else f"a[{p}].requires_grad is {e}"
              for p, e in enumerate(expected) if e is not None]
    scope = {"_raise": functools.partial(_raise_inputs_changed, expected)}
    body = " and\n            ".join(terms)
    source = f"def check(a):\n    if not ({body}):\n        _raise(a)\n"
    exec(compile(source, "<aotgrad fixed inputs check>", "exec"), scope)
    return scope["check"]


def _fixed_facts(example: Sequence[Any]) -> list[Any]:
    """Per position: None (not a tensor), the earlier position of the same tensor, or the
    tensor's requires_grad (read now: the example tensors themselves may change later)."""
    first: dict[int, int] = {}
    facts: list[Any] = []
    for p, t in enumerate(example):
        if not isinstance(t, torch.Tensor):
            facts.append(None)
            continue
        q = first.setdefault(id(t), p)
        facts.append(q if q != p else t.requires_grad)
    return facts


def _raise_inputs_changed(expected: Sequence[Any], args: Sequence[Any]) -> None:
    raise InputsChanged(
        f"aotgrad: {_first_change(expected, args)}, unlike the inputs this graph was "
        "compiled for (aot_module_simplified compiles once, for its example inputs, and its "
        "caller must guard them, as Dynamo does). Call it with inputs like the example ones, "
        "or compile again for these (aot_function and aotgrad.compile compile per "
        "signature).")


def _first_change(expected: Sequence[Any], args: Sequence[Any]) -> str:
    if len(args) != len(expected):
        return f"the call passes {len(args)} inputs instead of {len(expected)}"
    for p, (e, a) in enumerate(zip(expected, args)):
        if type(e) is int and a is not args[e]:
            return f"inputs {e} and {p} are distinct tensors where one tensor was passed twice"
        if type(e) is bool and getattr(a, "requires_grad", None) is not e:
            return f"input {p} has requires_grad={getattr(a, 'requires_grad', None)}"
    return "the inputs changed"


def _guardable(a: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return type(a) in _GUARDABLE_TENSORS and a.layout is torch.strided
    return type(a) in _CONSTANT_TYPES


def _leafness_read(flat_args: Sequence[Any]) -> list[int]:
    """Positions whose leafness the graph may bake in: under autocast, the trace of a call
    whose inputs that require grad are all leaves reuses one cast per input, as eager's cast
    cache does for leaves only (semantics/autocast.py). A parameter is a leaf at any call."""
    return [p for p, a in enumerate(flat_args) if isinstance(a, torch.Tensor)
            and a.requires_grad and type(a) is not torch.nn.Parameter]


def _addressed_and_mutated(call: CompiledCall) -> tuple[list[int], list[int]]:
    """Flat positions of the inputs that outputs alias or that are mutated (addressed by
    absolute geometry at run time), and of the mutated ones."""
    info, positions = call.plan.info, call.plan.graph_input_positions
    # Graph inputs past the arguments are the bases of aliased mutated inputs (aliasing.py):
    # the aliasing check of each call covers them and their members' offsets.
    aliased = {o.source for o in info.outputs
               if o.kind in (OutputKind.INPUT, OutputKind.VIEW_OF_INPUT)
               and o.source < len(positions)}
    mutated = [i for i, x in enumerate(info.inputs) if x.mutated]
    addressed = sorted(aliased | set(mutated))
    return [positions[i] for i in addressed], [positions[i] for i in mutated]


def make_guard(plan: GuardPlan, flat_args: Sequence[Any],
               shapes: Callable[[Sequence[Any]], bool] | None = None
               ) -> Callable[[Sequence[Any]], bool]:
    """`plan` as one boolean expression over the call's flat arguments. With `shapes` (an
    entry for dynamic shapes), sizes and strides are left to `shapes(flat_args)`."""
    source, scope = _guard_source(plan, flat_args, shapes)
    exec(compile(source, "<aotgrad guard>", "exec"), scope)
    guard = scope["guard"]
    guard.source = source
    return guard


MISS = object()  # what a guarded run returns for a call its guard rejects


def make_guarded_run(plan: GuardPlan, flat_args: Sequence[Any], call: CompiledCall,
                     shapes: Callable[[Sequence[Any]], bool] | None = None
                     ) -> Callable[[Sequence[Any]], Any]:
    """The entry's guard and its run in one frame: flat arguments -> the user's outputs, or
    `MISS`. The run's body is inlined where the plan has a direct runner, and does not read
    again the grad mode the guard checked. Generated per entry (`guarded_run.source`)."""
    condition, scope = _guard_condition(plan, flat_args, shapes)
    body = runner_body(call, grad=plan.global_state[0])
    if body is None:
        lines, names = "    return _run(a)\n", {"_run": call.run}
    else:
        lines, names = body
    assert all(scope.get(k, v) is v for k, v in names.items()), "clashing names"
    source = f"def guarded_run(a):\n    if not ({condition}):\n        return _MISS\n{lines}"
    scope.update(names, _MISS=MISS)
    exec(compile(source, "<aotgrad guarded run>", "exec"), scope)
    run = scope["guarded_run"]
    run.source = source
    return run


def _guard_source(plan: GuardPlan, flat_args: Sequence[Any] | None = None,
                  shapes: Callable | None = None):
    condition, scope = _guard_condition(plan, flat_args, shapes)
    return f"def guard(a):\n    return ({condition})\n", scope


def _guard_condition(plan: GuardPlan, flat_args: Sequence[Any] | None,
                     shapes: Callable | None) -> tuple[str, dict]:
    scope: dict[str, Any] = {"_grad": torch.is_grad_enabled,
                             "_inference": torch.is_inference_mode_enabled,
                             "_state": global_state, "_shapes": shapes}
    terms = [f"len(a) == {plan.num_args}"]
    terms += _global_terms(plan.global_state, scope)  # first: grad mode is the usual miss
    terms += _tensor_terms(plan, flat_args, scope, dynamic=shapes is not None)
    terms += [f"a[{p}] is a[{q}]" for p, q in plan.same_as]
    terms += [f"a[{p}].storage_offset() == {offset}" for p, offset in plan.storage_offsets]
    terms += [f"a[{p}].is_leaf is {leaf}" for p, leaf in plan.leaves]
    terms += [_constant_term(p, value, scope) for p, value in plan.constants]
    terms += ["_shapes(a)"] if shapes is not None else []
    return " and\n            ".join(terms), scope


def _tensor_terms(plan: GuardPlan, flat_args, scope: dict, dynamic: bool = False) -> list[str]:
    if not plan.tensors:
        return []
    args = ", ".join(f"a[{p}]" for p in plan.tensors)
    if flat_args is not None:
        scope["_tensors"] = tensor_check([flat_args[p] for p in plan.tensors], dynamic)
    return [f"_tensors({args})"]


def signature(flat_args, dynamic: bool = False) -> tuple:
    """The key of a call that no entry's guard took: what a compiled graph specializes on
    (with `dynamic`, sizes and strides are left to the shape guards)."""
    if dynamic:
        return dynamic_signature(flat_args)
    seen: dict[int, int] = {}
    parts: list[Hashable] = []
    for a in flat_args:
        if isinstance(a, torch.Tensor) and subclasses.unsized_nested(a):
            parts.append((type(a), id(a)))  # the compile refuses it, saying why
        elif isinstance(a, torch.Tensor):
            strided = a.layout is torch.strided
            parts.append((type(a), a.shape, a.stride() if strided else None,
                          a.storage_offset() if strided else None, a.dtype, a.device, a.layout,
                          a.requires_grad, a.is_leaf, seen.setdefault(id(a), len(seen))))
            if type(a) not in _PLAIN_TENSORS and subclasses.is_subclass(a):
                parts.append(subclasses.signature(a, seen))
        else:
            parts.append(constant_key(a))
    return tuple(parts), global_state()


def dynamic_signature(flat_args) -> tuple:
    seen: dict[int, int] = {}
    parts: list[Hashable] = []
    for a in flat_args:
        if isinstance(a, torch.Tensor):
            offset = a.storage_offset() if a.layout is torch.strided else None
            parts.append((type(a), a.dim(), offset, a.dtype, a.device, a.layout,
                          a.requires_grad, a.is_leaf, seen.setdefault(id(a), len(seen))))
        else:
            parts.append(constant_key(a))
    return tuple(parts), global_state()


def constant_key(value: Any) -> Hashable:
    """A constant argument's part of a call signature (`signature`)."""
    if isinstance(value, float):  # by its bits: 0.0 == -0.0 (1 / x differs), nan != nan
        return type(value), value.hex()
    if type(value) is slice:  # unhashable before Python 3.12: by identity, each call compiled
        return slice, tuple(map(constant_key, (value.start, value.stop, value.step)))
    try:
        hash(value)
    except TypeError:
        return type(value), id(value), _attributes(value)
    return type(value), value, _attributes(value)


def _attributes(value: Any) -> tuple:
    """An object argument's attributes, one level deep, numbers and strings by value: the
    trace took `cfg.scale` as a constant of the graph, and the same object with another
    scale must compile again (torch.compile guards it too). Deeper values by identity."""
    names = getattr(value, "__dict__", None)
    if type(names) is not dict or isinstance(value, (type, enum.Enum)):
        return ()
    return tuple((k, constant_key(v) if type(v) in _VALUE_TYPES else (type(v), id(v)))
                 for k, v in names.items())


_VALUE_TYPES = (int, float, bool, str, type(None), complex, torch.dtype, torch.device)


def _constant_term(p: int, value: Any, scope: dict) -> str:
    if value is None or isinstance(value, bool):
        return f"a[{p}] is {value}"
    if isinstance(value, float) and (value == 0 or value != value):  # as constant_key
        scope[f"_t{p}"], scope[f"_c{p}"] = type(value), value.hex()
        return f"type(a[{p}]) is _t{p} and a[{p}].hex() == _c{p}"
    scope[f"_t{p}"], scope[f"_c{p}"] = type(value), value  # nan and inf have no literal
    return f"type(a[{p}]) is _t{p} and a[{p}] == _c{p}"


def _global_terms(state: tuple, scope: dict) -> list[str]:
    grad, inference, dtype, deterministic, cast_cache, *autocast, device = state
    scope["_dtype"], scope["_expected_dtype"] = torch.get_default_dtype, dtype
    scope["_deterministic"], scope["_cast_cache"] = _DETERMINISTIC, _CAST_CACHE
    terms = [f"_grad() is {grad}", f"_inference() is {inference}",
             "_dtype() is _expected_dtype", f"_deterministic() is {deterministic}",
             f"_cast_cache() is {cast_cache}"]
    if any(autocast) or device is not None or _ANY_AUTOCAST is None:
        scope["_expected_state"] = state
        return terms + ["_state() == _expected_state"]
    scope["_any_autocast"], scope["_function_modes_on"] = _ANY_AUTOCAST, function_modes_on
    return terms + ["not _any_autocast()", "not _function_modes_on()"]


# One C++ call for "no autocast on any device" (stricter than the key's cpu/cuda: sound).
_ANY_AUTOCAST = getattr(torch._C, "_is_any_autocast_enabled", None)


def tensor_check(examples: Sequence[torch.Tensor], dynamic: bool = False) -> Callable[..., bool]:
    """A check that tensors are distinct and match `examples` in type, dispatch keys, dtype,
    device, sizes (with `dynamic`, rank only), strides and requires_grad: torch's C++
    TensorGuards, else Python."""
    free = [[None] * t.dim() for t in examples] if dynamic else None
    try:
        from torch._C._dynamo.guards import TensorGuards
        return TensorGuards(*examples, dynamic_dims_sizes=free, dynamic_dims_strides=free).check
    except (ImportError, AttributeError, TypeError, RuntimeError):
        return _python_tensor_check(examples, dynamic)


def _python_tensor_check(examples: Sequence[torch.Tensor],
                         dynamic: bool = False) -> Callable[..., bool]:
    expected = [_tensor_facts(t, dynamic) for t in examples]

    def check(*tensors):
        try:
            facts = [_tensor_facts(t, dynamic) for t in tensors]
        except AttributeError:  # not a tensor
            return False
        return facts == expected and len({id(t) for t in tensors}) == len(tensors)
    return check


def _tensor_facts(t: torch.Tensor, dynamic: bool = False) -> tuple:
    geometry = (t.dim(),) if dynamic else (t.shape, t.stride())
    return (type(t), t.dtype, t.device, *geometry, t.requires_grad, t.is_conj(), t.is_neg())
