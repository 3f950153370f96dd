"""Differential harness: run a case eagerly and compiled on identical fresh inputs, and
compare everything a user can observe.

A `Case` makes its inputs afresh for every run (seeded), so the eager run and the compiled
run each own an identical copy and may mutate it. After both calls the harness compares
outputs (values and autograd facts, aliasing), the inputs (values, metadata, autograd
facts), module state, then runs backward on both and compares gradients and errors. The
compiled callable is checked twice, so the second (cached) call is covered too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import pytest
import torch
import torch.utils._pytree as pytree

Inputs = tuple[tuple, dict]
# Tests that need a GPU: collected everywhere, reported skipped (with this reason) without one.
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs CUDA: runs on the GPU machine")
SEED_BASE = 100  # call k makes its inputs right after torch.manual_seed(SEED_BASE + k)
CONTEXTS = {  # what a case's call runs under
    "grad": contextlib.nullcontext,
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "autocast_bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


@dataclass(frozen=True)
class Case:
    """One differential test: a function (or a factory of one) and an input factory.

    `inputs()` must build fresh tensors on every call; the harness seeds torch before it.
    `factory()` builds the callable (a module, or a closure over tensors) after seeding, so
    the eager and the compiled run each own one; a module's parameters, buffers and
    gradients are compared too. `before_call(target, call_index)` runs on both targets
    before each call (switch to eval, freeze a parameter, an optimizer step).
    Tags: "inductor" (also run on the slow Inductor front doors), "backward_twice" (a second
    backward without retain_graph), "double_backward" (differentiate the gradients again),
    "first_output_loss" (the loss reads the first differentiable output alone: the others,
    mutated inputs included, get no gradient).
    """

    name: str
    inputs: Callable[[], Inputs]
    fn: Callable | None = None
    factory: Callable[[], Callable] | None = None
    tags: frozenset[str] = frozenset()
    context: str = "grad"  # a key of CONTEXTS
    before_call: Callable[[Callable, int], None] | None = None

    def build(self, seed: int) -> Callable:
        if self.factory is None:
            return self.fn
        torch.manual_seed(seed)
        return self.factory()


@dataclass
class Outcome:
    """What one call left behind, eager or compiled."""

    args: list[Any]  # flat leaves of (args, kwargs), after the call
    versions: list[int | None]  # version counters before the call
    leaves: list[torch.Tensor]  # autograd leaves behind the inputs, found before the call
    result: Any = None
    error: BaseException | None = None
    module: torch.nn.Module | None = None
    backward_errors: list[BaseException | None] = field(default_factory=list)
    first_order_grads: list[torch.Tensor | None] = field(default_factory=list)


# ---- running -----------------------------------------------------------------------------

def check_case(case: Case, compile_fn: Callable[[Callable], Callable], calls: int = 2) -> None:
    """Assert that `compile_fn(case)` behaves like eager on `calls` consecutive calls."""
    eager = case.build(seed=0)
    target = case.build(seed=0)
    compiled = compile_fn(target)
    for call in range(calls):
        if case.before_call is not None:
            case.before_call(eager, call)
            case.before_call(target, call)
        seed = SEED_BASE + call
        expected = run(eager, case, seed, _module(eager))
        actual = run(compiled, case, seed, _module(target))
        compare_outcomes(expected, actual, where=f"call {call}")


def call_index() -> int:
    """Which call an input factory is making inputs for: lets a case change its inputs'
    shapes, aliasing or constants on the second call, as a training loop might."""
    return torch.initial_seed() - SEED_BASE


def _module(target: Callable) -> torch.nn.Module | None:
    return target if isinstance(target, torch.nn.Module) else None


def run(fn: Callable, case: Case, seed: int, module=None) -> Outcome:
    """Call `fn` on fresh inputs and run backward on a fixed weighting of its outputs."""
    torch.manual_seed(seed)
    args, kwargs = case.inputs()
    flat = pytree.tree_leaves((args, kwargs))
    outcome = Outcome(flat, [_version(a) for a in flat], grad_leaves(flat), module=module)
    torch.manual_seed(seed)  # random ops inside draw the same numbers in both runs
    try:
        with CONTEXTS[case.context]():
            outcome.result = fn(*args, **kwargs)
    except Exception as error:  # compared against eager's, never swallowed silently
        outcome.error = error
        return outcome
    outcome.backward_errors = run_backward(outcome, case.tags)
    return outcome


def run_backward(outcome: Outcome, tags: frozenset[str]) -> list[BaseException | None]:
    """Backward of one scalar; the errors of each attempt (None when it worked)."""
    outputs, args = pytree.tree_leaves(outcome.result), outcome.args
    if "first_output_loss" in tags:
        outputs, args = [t for t in outputs if _differentiable(t)][:1], []
    loss = weighted_loss(outputs, args)
    if loss is None:
        return []
    if "double_backward" in tags:
        def step():
            outcome.first_order_grads = double_backward(loss, _trainable(outcome))
        return [_attempt(step)]
    return [_attempt(loss.backward) for _ in range(2 if "backward_twice" in tags else 1)]


def _attempt(step: Callable[[], Any]) -> BaseException | None:
    try:
        step()
    except RuntimeError as error:
        return error
    return None


def double_backward(loss: torch.Tensor, wrt: list[torch.Tensor]) -> list:
    """Backward of a weighted sum of the gradients themselves (a gradient penalty); returns
    the first-order gradients, whose autograd facts are compared too."""
    grads = list(torch.autograd.grad(loss, wrt, create_graph=True, allow_unused=True))
    penalty = weighted_loss([g for g in grads if g is not None], [])
    if penalty is not None:
        penalty.backward()
    return grads


def _trainable(outcome: Outcome) -> list[torch.Tensor]:
    params = [] if outcome.module is None else list(outcome.module.parameters())
    unique = {id(t): t for t in outcome.leaves + params}
    return [t for t in unique.values() if t.requires_grad]


def weighted_loss(outputs: list[Any], args: list[Any]) -> torch.Tensor | None:
    """sum((t * w).sum()) over differentiable outputs and inputs that gained a grad_fn.

    Inputs count too: a mutation by a value that requires grad must reach that value's
    gradient. Weights are fixed random tensors so that no gradient is trivially uniform.
    """
    terms = [t for t in outputs if _differentiable(t)]
    terms += [a for a in args if _differentiable(a) and a.grad_fn is not None]
    if not terms:
        return None
    return sum(_real((t * _weight(t, k)).sum()) for k, t in enumerate(terms))


def _real(t: torch.Tensor) -> torch.Tensor:
    # A complex output's loss term is the real part: autograd differentiates real scalars.
    return t.real if t.is_complex() else t


def _differentiable(t: Any) -> bool:
    return (isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex()))


def _weight(t: torch.Tensor, k: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + k)
    dtype = t.dtype if t.is_complex() else None  # complex weights: both parts weigh in
    return torch.randn(t.shape, generator=g, dtype=dtype).to(t.device, t.dtype)


def grad_leaves(flat: list[Any]) -> list[torch.Tensor]:
    """Every autograd leaf requiring grad that the input tensors come from, in a fixed
    order; non-leaf inputs (`leaf * 1`) hide their leaves behind grad_fn."""
    found: dict[int, torch.Tensor] = {}
    stack = [a for a in reversed(flat) if isinstance(a, torch.Tensor)]
    seen_nodes = set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            if item.is_leaf and item.requires_grad:
                found.setdefault(id(item), item)
            item = item.grad_fn
        if item is None or item in seen_nodes:
            continue
        seen_nodes.add(item)
        if hasattr(item, "variable"):  # AccumulateGrad
            found.setdefault(id(item.variable), item.variable)
        stack.extend(f for f, _ in reversed(item.next_functions) if f is not None)
    return list(found.values())


def _version(a: Any) -> int | None:
    # Inference tensors have no version counter (reading it raises).
    if not isinstance(a, torch.Tensor) or a.is_inference():
        return None
    return a._version


# ---- comparing ---------------------------------------------------------------------------

def compare_outcomes(e: Outcome, c: Outcome, where: str) -> None:
    if compare_errors(e.error, c.error, f"{where}: the call"):
        return
    compare_outputs(e, c, where)
    compare_inputs(e, c, where)
    if e.module is not None:
        compare_module_state(e.module, c.module, where)
    assert len(e.backward_errors) == len(c.backward_errors), (
        f"{where}: eager ran backward {len(e.backward_errors)} times, compiled "
        f"{len(c.backward_errors)} (one side had no differentiable output)")
    for k, (ee, ce) in enumerate(zip(e.backward_errors, c.backward_errors)):
        compare_errors(ee, ce, f"{where}: backward #{k + 1}")
    compare_grads(e, c, where)


def compare_errors(e: BaseException | None, c: BaseException | None, what: str) -> bool:
    """True when eager raised (and compiled raised the same type); re-raises a compiled error
    that eager did not have, so the test shows its traceback."""
    if e is None:
        if c is not None:
            raise AssertionError(f"{what} raised only when compiled: {c!r}") from c
        return False
    assert c is not None, f"{what}: eager raised {e!r}, compiled did not"
    assert isinstance(c, type(e)), f"{what}: eager raised {e!r}, compiled raised {c!r}"
    return True


def compare_outputs(e: Outcome, c: Outcome, where: str) -> None:
    e_flat, e_spec = pytree.tree_flatten(e.result)
    c_flat, c_spec = pytree.tree_flatten(c.result)
    assert e_spec == c_spec, f"{where}: output structure\neager:    {e_spec}\ncompiled: {c_spec}"
    for i, (eo, co) in enumerate(zip(e_flat, c_flat)):
        path = f"{where}: output {i}"
        compare_values(eo, co, path)
        if isinstance(eo, torch.Tensor):
            compare_autograd_facts(eo, co, path)
            e_alias = alias_facts(eo, i, e.args, e_flat)
            c_alias = alias_facts(co, i, c.args, c_flat)
            assert e_alias == c_alias, f"{path} aliasing\neager:    {e_alias}\ncompiled: {c_alias}"


def compare_inputs(e: Outcome, c: Outcome, where: str) -> None:
    """Inputs after the call: mutations, metadata mutations and autograd facts."""
    for i, (ea, ca) in enumerate(zip(e.args, c.args)):
        path = f"{where}: input {i} after the call"
        compare_values(ea, ca, path)
        if not isinstance(ea, torch.Tensor):
            continue
        compare_autograd_facts(ea, ca, path)
        e_bumped = _version(ea) != e.versions[i]
        c_bumped = _version(ca) != c.versions[i]
        assert e_bumped == c_bumped, (
            f"{path}: version counter changed in eager: {e_bumped}, compiled: {c_bumped} "
            "(autograd's in-place checks would differ)")
        if ea._base is not None:
            compare_values(ea._base, ca._base, f"{path}: its _base")


def compare_module_state(e: torch.nn.Module, c: torch.nn.Module, where: str) -> None:
    e_state = dict(e.named_parameters()) | dict(e.named_buffers())
    c_state = dict(c.named_parameters()) | dict(c.named_buffers())
    assert e_state.keys() == c_state.keys(), f"{where}: module state names differ"
    for name in e_state:
        compare_values(e_state[name], c_state[name], f"{where}: module state {name!r}")
        assert e_state[name].requires_grad == c_state[name].requires_grad, (
            f"{where}: module state {name!r}.requires_grad differs")


def compare_grads(e: Outcome, c: Outcome, where: str) -> None:
    assert len(e.leaves) == len(c.leaves), f"{where}: different autograd leaves"
    for k, (eg, cg) in enumerate(zip(e.first_order_grads, c.first_order_grads)):
        compare_grad(eg, cg, f"{where}: create_graph gradient {k}")
        if eg is not None:
            compare_autograd_facts(eg, cg, f"{where}: create_graph gradient {k}")
    for k, (el, cl) in enumerate(zip(e.leaves, c.leaves)):
        compare_grad(el.grad, cl.grad, f"{where}: .grad of input leaf {k}")
    if e.module is not None:
        c_params = dict(c.module.named_parameters())
        for name, p in e.module.named_parameters():
            compare_grad(p.grad, c_params[name].grad, f"{where}: .grad of parameter {name!r}")


def compare_grad(e: torch.Tensor | None, c: torch.Tensor | None, path: str) -> None:
    assert (e is None) == (c is None), f"{path}: eager {_describe(e)}, compiled {_describe(c)}"
    if e is not None:
        compare_values(e, c, path)


def _describe(t: torch.Tensor | None) -> str:
    return "None" if t is None else f"a tensor of shape {tuple(t.shape)}"


def compare_values(e: Any, c: Any, path: str) -> None:
    """Same type; tensors: same shape, dtype, significant strides and values."""
    assert type(e) is type(c), f"{path}: eager {type(e).__name__}, compiled {type(c).__name__}"
    if isinstance(e, torch.Tensor):
        assert (e.shape, e.dtype) == (c.shape, c.dtype), (
            f"{path}: eager {e.dtype}{list(e.shape)}, compiled {c.dtype}{list(c.shape)}")
        assert significant_strides(e) == significant_strides(c), (
            f"{path}: strides eager {e.stride()}, compiled {c.stride()}")
        torch.testing.assert_close(c.detach(), e.detach(), equal_nan=True,
                                   msg=lambda m: f"{path}: {m}", **_tolerance(e.dtype))
    elif isinstance(e, float):
        torch.testing.assert_close(c, e, msg=lambda m: f"{path}: {m}")
    else:
        assert e == c, f"{path}: eager {e!r}, compiled {c!r}"


def _tolerance(dtype: torch.dtype) -> dict:
    # Compilers may reorder float32 reductions; other dtypes keep assert_close's defaults.
    return {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}


def significant_strides(t: torch.Tensor) -> tuple:
    """Strides of the dimensions longer than one; the others do not affect layout."""
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def compare_autograd_facts(e: torch.Tensor, c: torch.Tensor, path: str) -> None:
    assert autograd_facts(e) == autograd_facts(c), (
        f"{path}\neager:    {autograd_facts(e)}\ncompiled: {autograd_facts(c)}")


def autograd_facts(t: torch.Tensor) -> dict:
    return {"requires_grad": t.requires_grad, "is_leaf": t.is_leaf,
            "has_grad_fn": t.grad_fn is not None, "is_view": t._is_view(),
            "is_inference": t.is_inference(), "storage_offset": t.storage_offset(),
            "is_conj": t.is_conj(), "is_neg": t.is_neg()}


def alias_facts(t: torch.Tensor, index: int, args: list[Any], outputs: list[Any]) -> dict:
    """How output `index` relates to the inputs and the other outputs, by position."""
    inputs = [a if isinstance(a, torch.Tensor) else None for a in args]
    others = [o if isinstance(o, torch.Tensor) and k != index else None
              for k, o in enumerate(outputs)]
    return {
        "is_input": _first(inputs, lambda a: a is t),
        "is_earlier_output": _first(others[:index], lambda o: o is t),
        "_base": _base_relation(t._base, inputs, others),
        "shares_storage_with_inputs": _all(inputs, lambda a: same_storage(a, t)),
        "shares_storage_with_outputs": _all(others, lambda o: same_storage(o, t)),
    }


def _base_relation(base: torch.Tensor | None, inputs: list, others: list):
    if base is None:
        return None
    for kind, group in (("input", inputs), ("output", others)):
        k = _first(group, lambda x: x is base)
        if k is not None:
            return kind, k
        k = _first(group, lambda x: x._base is base)
        if k is not None:
            return f"{kind}._base", k
    return "an intermediate"


def _first(items: list, pred: Callable) -> int | None:
    return next((k for k, x in enumerate(items) if x is not None and pred(x)), None)


def _all(items: list, pred: Callable) -> tuple[int, ...]:
    return tuple(k for k, x in enumerate(items) if x is not None and pred(x))


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata
