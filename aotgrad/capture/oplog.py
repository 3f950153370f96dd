"""The analysis run's op log: what a plain function did, as a key for the cache.

A plain Python function's identity is not its code (its globals, closures and callees are
not in its source), so the cache used to key it by the joint graph, after the trace. But the
analysis already runs the function once, on fake inputs, under a dispatch mode that sees
every ATen op it calls. Written down in order (the op, its arguments, each tensor by where
it came from: an input or an earlier op's output, and the grad mode and `requires_grad`
flags that decide what autograd records), that log determines the joint graph: the
backward is the ops' derivative formulas, which the torch version in the key fixes. A
warm process then skips the trace as well.

That holds only where nothing outside the log shapes the backward or the graph. The log is
refused, and the compile keyed after the trace as before, when the function:
- runs a custom autograd.Function or a module backward hook (Python backward code: found
  as a Python node of the autograd graph);
- registers a hook on a tensor, retains a gradient, or reads a `grad_fn` (through which
  hooks are put on autograd nodes): seen as torch function calls by the analysis's
  `TorchFunctionMode` (`note_function`);
- runs its ops under saved-tensor hooks of its own (checkpointing);
- calls an op outside `aten`, `prims` and TorchScript's `prim` (a custom op, a higher-order
  op with Python bodies), passes an argument the log cannot write down, or reads or returns
  a tensor that no logged op made and that is not an input (a constant or a closed-over
  tensor: its values would be in the graph, not in the log);
- runs an analysis inside its own (it calls another compiled function or region);
- takes tensor subclasses or symbolic sizes.

The rest of the key (inputs' metadata, options, global state, versions) and what the
analysis found (the FunctionInfo: mutations, aliasing, output structure) are added by
cache/program.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import threading
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from ..cache import codec

_OP_NAMESPACES = ("aten", "prims", "prim")  # prim: TorchScript's builtins (prim::device)
# Torch functions that attach Python code to the backward (a node's hooks are put on it
# through the tensor's `grad_fn`, whose reads a TorchFunctionMode sees as its getter).
_HOOK_FUNCTIONS = {torch.Tensor.register_hook, torch.Tensor.retain_grad,
                   torch.Tensor.register_post_accumulate_grad_hook}
_GRAD_FN = inspect.getattr_static(torch.Tensor, "grad_fn")

_PLAIN_TYPES = (FakeTensor, FunctionalTensor)  # the analysis's own wrappers of the inputs


class _State(threading.local):
    """Per thread (a compile in another thread has its own): the analysis's session, and
    the log being written while it runs the user's code."""
    session: "Session | None" = None
    active: "OpLog | None" = None


_state = _State()


class Refused(Exception):
    """Why this call's ops cannot key the cache."""


class OpLog:
    """Rows of (op, arguments, grad mode) with tensors named by origin; `refused` says why
    none can be used."""

    def __init__(self, inputs: Sequence[Any], own_saved_hooks: Callable):
        self.rows: list[str] = []
        self.refused: str | None = None
        self._names: dict[int, str] = {}
        self._alive: list[Any] = []  # keeps every named tensor alive: ids are not reused
        self._own_saved_hooks = own_saved_hooks
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor):
                self._name(t, f"in{i}")

    def _name(self, t: torch.Tensor, name: str) -> None:
        self._names[id(t)] = name
        self._alive.append(t)

    def note(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        if self.refused is not None:
            return
        try:
            self.rows.append(self._row(func, args, kwargs))
        except Refused as exc:
            self.refuse(str(exc))
            return
        for j, t in enumerate(pytree.tree_leaves(out)):
            if isinstance(t, torch.Tensor) and id(t) not in self._names:
                self._name(t, f"o{len(self.rows) - 1}.{j}")

    def _row(self, func: Any, args: tuple, kwargs: dict) -> str:
        if not isinstance(func, torch._ops.OpOverload) or \
                func.namespace not in _OP_NAMESPACES:
            raise Refused(f"it calls {func}, whose code is not named by the op")
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is not None and top[0] is not self._own_saved_hooks:
            raise Refused(f"{func} runs under saved-tensor hooks of the function's own")
        encoded = [self._encode(list(args)), self._encode(sorted(kwargs.items()))]
        return f"{func.name()} {encoded} grad={torch.is_grad_enabled()}"

    def _encode(self, v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            name = self._names.get(id(v))
            if name is None:
                raise Refused("it reads a tensor that is neither an input nor made by its "
                              "ops (a constant or a closed-over tensor)")
            if type(v) not in _PLAIN_TYPES:
                raise Refused(f"it passes a {type(v).__name__} to an op")
            return name + "*" * v.requires_grad  # what autograd records depends on it
        if isinstance(v, (list, tuple)) and not hasattr(v, "_fields"):
            return [type(v).__name__, *map(self._encode, v)]
        try:
            return codec.encode_value(v)
        except codec.Unencodable as exc:
            raise Refused(f"it passes {exc} to an op") from None

    def refuse(self, why: str) -> None:
        if self.refused is None:
            self.refused = why

    def returned(self, outputs: Any, inputs: Sequence[Any]) -> None:
        """The run is over: name its outputs, and refuse Python code in its backward."""
        tensors = [t for t in pytree.tree_leaves((outputs, list(inputs)))
                   if isinstance(t, torch.Tensor)]
        for node in autograd_nodes(tensors):
            if isinstance(node, torch.autograd.function.BackwardCFunction):
                self.refuse(f"its backward runs Python code ({type(node).__name__}: a custom "
                            "autograd.Function or a module backward hook)")
        names = [self._names.get(id(t)) for t in tensors]
        if None in names:  # its value would be in the graph, not in the log
            self.refuse("it returns a tensor that is neither an input nor made by its ops")
        self.rows.append(f"outputs {names}")

    def digest(self) -> str:
        text = "\n".join(self.rows)
        return f"sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]} " \
            f"({len(self.rows) - 1} ops)"


def autograd_nodes(values: Sequence) -> list:
    """Every autograd node behind the tensors among `values`."""
    roots = [v.grad_fn for v in values if isinstance(v, torch.Tensor) and v.grad_fn]
    seen, todo = set(roots), list(roots)
    while todo:
        for child, _ in todo.pop().next_functions:
            if child is not None and child not in seen:
                seen.add(child)
                todo.append(child)
    return list(seen)


def note(func: Any, args: tuple, kwargs: dict | None, out: Any) -> None:
    """Called by the analysis's dispatch modes for every op; a no-op unless logging."""
    active = _state.active
    if active is not None:
        active.note(func, args, kwargs or {}, out)


class Session:
    """One analysis: `log` is that of its last run of the user's code that returned (the
    analysis may run it twice: without functionalization, then with it)."""

    def __init__(self):
        self.log: OpLog | None = None

    def key(self) -> tuple[str | None, str | None]:
        """(the log's digest, or None and why not)."""
        if self.log is None:
            return None, "the analysis did not log its ops"
        if self.log.refused is not None:
            return None, self.log.refused
        return self.log.digest(), None


@contextlib.contextmanager
def session(enabled: bool) -> Iterator[Session | None]:
    """Around an analysis whose ops may key the cache (`enabled`). Nested (a compile inside
    the user's code: a compiled region, another compiled function), it is the inner
    compile's own; the outer log resumes after it."""
    outer = _state.session, _state.active
    _state.session, _state.active = (Session() if enabled else None), None
    try:
        yield _state.session
    finally:
        _state.session, _state.active = outer


@contextlib.contextmanager
def recording(inputs: Sequence[Any], own_saved_hooks: Callable) -> Iterator[OpLog | None]:
    """Around one run of the user's code in an analysis: a fresh log. `own_saved_hooks`:
    the pack hook the analysis itself runs the code under."""
    session, outer = _state.session, _state.active
    if session is None:
        yield None
        return
    if outer is not None:  # its ops go to this log, not the outer one
        outer.refuse("it runs an analysis inside its own (a compiled region?)")
    log = OpLog(inputs, own_saved_hooks)
    _state.active = log
    try:
        yield log
    finally:
        _state.active = outer
    session.log = log


def note_function(func: Any) -> None:
    """Called by the analysis's TorchFunctionMode for every torch function the user's code
    calls; refuses the log at those that put Python code into the backward."""
    active = _state.active
    if active is None:
        return
    if func in _HOOK_FUNCTIONS:
        active.refuse(f"it calls Tensor.{func.__name__}: Python code in its backward")
    elif getattr(func, "__self__", None) is _GRAD_FN:
        active.refuse("it reads a grad_fn (whose hooks would run Python code in its "
                       "backward)")
