"""Dynamic shapes: one compiled graph for many input sizes.

With `dynamic=True`, capture makes fake inputs whose sizes are symbols of a `ShapeEnv`
(sizes 0 and 1 stay concrete, as in PyTorch, since so much code branches on them); strides
and everything traced after follow as expressions of those symbols. Whatever the trace or a
backend decides about the symbols (`s0 == s1`, `s0 >= 2`, ...) becomes a guard, checked on
each call: a call whose sizes break a guard compiles again (`ShapeGuard`).

Dynamo's symbolic inputs need none of this: Dynamo's own fake mode, ShapeEnv and guards are
reused, and its size inputs (`SymInt`s) become graph inputs like tensors.

Sizes the runtime needs outside the graphs (the geometry of outputs rebuilt as views,
metadata mutations of inputs) are expressions of the symbols; `SizeBindings` evaluates them
from the graph inputs of each call.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from ..schema import FunctionInfo, Geometry

SIZE_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _shapes():
    """torch's symbolic_shapes, imported at first use: it imports sympy, which would make
    `import aotgrad` half a second slower for every user, dynamic shapes or not."""
    from torch.fx.experimental import symbolic_shapes
    return symbolic_shapes


def free_symbols(value: Any) -> set:
    return _shapes().free_symbols(value)


class DynamicShapesUnsupported(NotImplementedError):
    """A construct aotgrad compiles for static shapes only."""


def item_symbol(fake: Any) -> Any:
    """The symbol a fake 0-d input's `.item()` stands for in Dynamo's graph (its memo), else
    None. Read past the memo's validity check: a later trace on the same fake mode (Inductor's
    cold compile) moves its epoch, which hides the memo, not the symbol the graphs hold."""
    memo = getattr(fake, "_item_memo", None)  # no `or`: a symbol's truth value is a guard
    return memo if memo is not None else getattr(fake, "item_memo", None)


def falls_back_to_static(exc: BaseException) -> bool:
    """Whether a failed compile for dynamic shapes is retried for static shapes, one graph
    per shape: any failure but aotgrad's own refusals, which static shapes meet as well."""
    return isinstance(exc, DynamicShapesUnsupported) or not str(exc).startswith("aotgrad")


def warn_static_fallback(name: str, exc: BaseException) -> None:
    first_line = next(iter(str(exc).splitlines()), "")[:200]
    warnings.warn(f"aotgrad: {name} cannot be compiled for dynamic shapes "
                  f"({type(exc).__name__}: {first_line}); compiling it for static shapes "
                  "instead, one graph per shape.", stacklevel=3)


def is_size(value: Any) -> bool:
    """A symbolic scalar (a size, or a value computed from sizes)."""
    return isinstance(value, SIZE_TYPES)


def is_symbolic(value: Any) -> bool:
    """A tensor with symbolic sizes, strides or offset, a symbolic scalar, or a tuple of them."""
    try:
        return bool(free_symbols(value))
    except AssertionError:  # a value holding no sizes (a dtype, a callable...)
        return False


def geometry(t: torch.Tensor) -> Geometry:
    return tuple(t.shape), tuple(t.stride()), t.storage_offset()


def hint(value: Any) -> int:
    """A concrete value for an integer that may be symbolic (its value in the example
    inputs), for estimates only: reading it adds no guard."""
    if not isinstance(value, torch.SymInt):
        return value
    symbolic_shapes = _shapes()
    if hasattr(symbolic_shapes, "optimization_hint"):  # torch >= 2.13
        return symbolic_shapes.optimization_hint(value, fallback=4096)
    if hasattr(symbolic_shapes, "hint_int"):
        return symbolic_shapes.hint_int(value, fallback=4096)
    return int(value.node.shape_env.size_hint(value.node.expr))


# ---- symbolic fake inputs (aotgrad's own front doors) ----------------------------------------

def fresh_unbacked_ignored(mode: FakeTensorMode):
    """A run on fake values that only looks (the analyses): the unbacked symbols it makes
    (`.item()`, `nonzero`) are left pending on the ShapeEnv, and the trace that follows
    refuses symbols none of its ops bound (`PendingUnbackedSymbolNotFound`), as torch's
    AOTAutograd's metadata run avoids this way too."""
    if mode.shape_env is None:
        return contextlib.nullcontext()
    return mode.shape_env.ignore_fresh_unbacked_symbols()


def symbolic_fake_mode() -> FakeTensorMode:
    # Values that depend on tensor data (.item(), nonzero) raise as with static shapes, where
    # the analysis explains them, instead of becoming sizes no input determines.
    env = _shapes().ShapeEnv(allow_scalar_outputs=False, allow_dynamic_output_shape_ops=False)
    return FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)


def symbolic_fake(mode: FakeTensorMode, t: torch.Tensor, index: int) -> torch.Tensor:
    """A fresh fake tensor like `t` whose every size is a symbol of `mode`'s ShapeEnv (0 and
    1 excepted); strides become expressions of the sizes where they follow from them."""
    from torch._dynamo.source import LocalSource
    shapes = _shapes()
    context = shapes.StatelessSymbolicContext(
        dynamic_sizes=[shapes.DimDynamic.DYNAMIC] * t.dim())
    sizes, strides, _ = mode.shape_env.create_symbolic_sizes_strides_storage_offset(
        t, LocalSource(_name(index)), symbolic_context=context)
    with mode:
        fake = torch.empty_strided(sizes, strides, dtype=t.dtype, device=t.device)
    return fake.requires_grad_(t.requires_grad)


def _name(index: int) -> str:
    return f"t{index}"


# ---- guards ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShapeGuard:
    """When a compiled graph serves a call: the ShapeEnv's guards on the symbols, plus the
    sizes and strides the trace kept concrete. `code` reads the graph inputs as L['t0']..."""

    code: str
    check: Callable[[dict], bool]

    def __call__(self, graph_inputs: Sequence[Any]) -> bool:
        try:
            return self.check({_name(i): t for i, t in enumerate(graph_inputs)})
        except ZeroDivisionError:  # a guard divides by a size expression this call makes 0:
            return False  # outside the range the others hold it in (torch orders them as it will)


def shape_guard(mode: FakeTensorMode, fakes: Sequence[torch.Tensor]) -> ShapeGuard:
    """The guard of a finished compile (backends add guards while compiling: call last)."""
    from torch._dynamo.source import LocalSource
    sources = [LocalSource(_name(i)) for i in range(len(fakes))]
    # ignore_static=True leaves out sizes and strides that are concrete, from the start or
    # specialized by the trace (and the storage offset, which the call signature holds);
    # `_static_checks` adds back the sizes and strides.
    guards = mode.shape_env.produce_guards(list(fakes), sources, ignore_static=True)
    code = " and ".join(guards + _static_checks(fakes)) or "True"
    check = eval(compile(f"lambda L: {code}", "<aotgrad shape guard>", "eval"),
                 dict(_shapes().SYMPY_INTERP))
    return ShapeGuard(code, check)


def _static_checks(fakes: Sequence[torch.Tensor]) -> list[str]:
    checks = []
    for i, fake in enumerate(fakes):
        for prop, values in (("size", fake.shape), ("stride", fake.stride())):
            for d, v in enumerate(values):
                value = _static_value(v)
                if value is not None:
                    checks.append(f"L['{_name(i)}'].{prop}()[{d}] == {value}")
    return checks


def _static_value(v) -> int | None:
    """The value of a size that is concrete: from the start (0, 1), or since the trace
    specialized its symbol (branching on it, or an op needing a number: `unbind`)."""
    return v if isinstance(v, int) else v.node.maybe_as_int()


@contextlib.contextmanager
def no_new_guards(mode: FakeTensorMode, what: str):
    """Refuse a trace that adds guards to the ShapeEnv of a finished compile, whose guard
    (ours, or Dynamo's) was produced already: nothing would check them."""
    env = getattr(mode, "shape_env", None)
    before = None if env is None else (len(env.guards), len(env.replacements))
    yield
    if env is not None and (len(env.guards), len(env.replacements)) != before:
        raise DynamicShapesUnsupported(
            f"aotgrad: {what} assumes more about the input sizes than the compiled graphs "
            "do, which no guard checks. Compile with dynamic=False.")


# ---- evaluating sizes at run time ------------------------------------------------------------

def runtime_sizes(info: FunctionInfo, fakes: Sequence[Any]) -> SizeBindings | None:
    """Where the runtime finds the sizes it applies itself (metadata it restores on inputs,
    views it rebuilds, sizes returned as constants), when they vary from call to call."""
    geometry = [x.final_geometry for x in info.inputs if x.mutates_metadata]
    geometry += [o.geometry for o in info.outputs if o.geometry is not None]
    geometry += [o.constant for o in info.outputs if is_symbolic(o.constant)]
    if not is_symbolic(geometry):
        return None
    sizes = SizeBindings(fakes, _outputs_holding_sizes(info))
    unbound = sorted(map(str, sizes.unbound(geometry)))
    _refuse_views_sized_by_data(unbound)
    if unbound:
        raise DynamicShapesUnsupported(
            f"aotgrad: an output view or an input's new metadata has sizes {unbound} that no "
            "input's size determines; compile with dynamic=False.")
    return sizes


def _outputs_holding_sizes(info: FunctionInfo) -> list:
    """The graph outputs' metadata, where the runtime may read a size computed from data;
    None for the user's output views, which the runtime rebuilds (their slots may be empty)."""
    metas = list(info.graph_output_metas)
    for i, o in enumerate(info.outputs):
        if o.geometry is not None:
            metas[info.first_user_output + i] = None
    return metas


def _refuse_views_sized_by_data(unbound: list[str]) -> None:
    """The runtime rebuilds an output view from its base with sizes it reads from the graph
    inputs. A size computed from data (an unbacked symbol `u0`: `nonzero`, a boolean mask,
    `.item()`) is in no input, and static shapes do not help (the default advice)."""
    from_data = [s for s in unbound if s.startswith("u")]
    if from_data:
        raise NotImplementedError(
            f"aotgrad: an output view (or an input's new shape) has sizes {from_data} "
            "computed from tensor data (`nonzero`, a boolean mask, `.item()`), which aotgrad "
            "cannot rebuild at run time; return a `.clone()` of it, or compute it outside "
            "the compiled function.")


# (graph input, "size"/"stride"/"offset"/"value"/"item", dim), or (graph output, "output
# size", dim). An "item" read syncs with the device where the input lives there, as the
# graph's own `.item()` of it does.
Where = tuple[int, str, int]


class SizeBindings:
    """Where each size symbol's value is found among the graph inputs of a call (else among
    its graph outputs), and the values of symbolic expressions computed from them."""

    def __init__(self, fakes: Sequence[Any], output_metas: Sequence[Any] = ()):
        self.where: dict[Any, Where] = {}
        for i, fake in enumerate(fakes):
            for symbol, where in _plain_symbols(i, fake):
                self.where.setdefault(symbol, where)
        for j, meta in enumerate(output_metas):
            for symbol, where in _output_symbols(j, meta):
                self.where.setdefault(symbol, where)
        self.symbols = tuple(self.where)
        self._functions: dict[Any, Callable[..., int]] = {}

    def unbound(self, value: Any) -> set:
        """The symbols of `value` that no graph input holds."""
        return {s for s in free_symbols(value) if s not in self.where}

    def values(self, graph_inputs: Sequence[Any], raw: Sequence[Any] = ()) -> tuple[int, ...]:
        return tuple(_read(graph_inputs, raw, self.where[s]) for s in self.symbols)

    def concrete(self, graph_inputs: Sequence[Any], raw: Sequence[Any] = ()
                 ) -> Callable[[Any], Any]:
        """A function replacing every symbolic int in a value (nested tuples allowed) by its
        value in this call; `raw`: the graph's outputs, where a size computed from data is
        found."""
        values = self.values(graph_inputs, raw)

        def concrete(value):
            if isinstance(value, (tuple, list)):
                return type(value)(concrete(v) for v in value)
            if isinstance(value, torch.SymInt):
                return self._function(value.node.expr)(*values)
            return value
        return concrete

    def _function(self, expr) -> Callable[..., int]:
        """`expr` as Python taking the symbols' values; compiled once per expression."""
        function = self._functions.get(expr)
        if function is None:
            from torch.utils._sympy.printers import PythonPrinter
            names = ", ".join(str(s) for s in self.symbols)
            source = f"lambda {names}: {PythonPrinter().doprint(expr)}"
            function = self._functions[expr] = eval(
                compile(source, "<aotgrad size>", "eval"), dict(_shapes().SYMPY_INTERP))
        return function


def _plain_symbols(i: int, fake: Any):
    """(symbol, where) for each size, stride or offset of a graph input that is one symbol,
    and for the value of a 0-d input Dynamo's graph reads with `.item()` (its fake's memo:
    `x[:n.item()]` returned as a view takes its size from `n`)."""
    if isinstance(fake, torch.SymInt):
        candidates = [(fake, (i, "value", 0))]
    elif isinstance(fake, torch.Tensor) and fake.layout is torch.strided:
        candidates = [(s, (i, "size", d)) for d, s in enumerate(fake.shape)]
        candidates += [(s, (i, "stride", d)) for d, s in enumerate(fake.stride())]
        candidates.append((fake.storage_offset(), (i, "offset", 0)))
        candidates.append((item_symbol(fake), (i, "item", 0)))
    else:
        candidates = []
    for value, where in candidates:
        if isinstance(value, torch.SymInt) and value.node.expr.is_Symbol:
            yield value.node.expr, where


def _output_symbols(j: int, meta: Any):
    """(symbol, where) for each size of graph output `j` that is one symbol: a size computed
    from data (`nonzero`'s count), which no input holds, read off the output that has it."""
    if meta is None or meta.subclass is not None:
        return
    for d, size in enumerate(meta.shape):
        if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
            yield size.node.expr, (j, "output size", d)


def _read(graph_inputs: Sequence[Any], raw: Sequence[Any], where: Where) -> int:
    i, prop, d = where
    if prop == "output size":
        return raw[i].size(d)
    t = graph_inputs[i]
    if prop == "size":
        return t.size(d)
    if prop == "stride":
        return t.stride(d)
    if prop == "offset":
        return t.storage_offset()
    if prop == "item":
        return t.item()
    return t
