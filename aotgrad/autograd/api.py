"""`aotgrad.compiled_autograd.enable(compiler)`: every backward inside runs as one graph.

A `Session` is one `enable()` context: the compiler, the keys captured so far (to explain
a miss), counters. While it is active, the engine calls `BackwardCapture` on a cache miss;
a backward that cannot be captured runs on the eager engine instead, its reason logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import fx

from ..cache import autograd as persistent
from . import hooks
from .cache import CaptureKey, CaptureLog
from .capture import BackwardCapture
from .specialize import (Captured, CompiledOnFirstRun, Variant, specialize,
                         specialize_create_graph, unspecialized)

log = logging.getLogger("aotgrad.autograd")


@dataclass
class Stats:
    """What a session did: captures (cache misses), compiles, eager fallbacks."""
    captures: int = 0
    compiles: int = 0  # specializations: a capture's first run, and each guard failure
    miss_reasons: list[str] = field(default_factory=list)
    guard_failures: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)  # Python backwards run untraced


class Session:
    def __init__(self, compiler: Callable[[fx.GraphModule], Callable],
                 differentiable: Callable[[fx.GraphModule], Callable] | None = None):
        self.compiler = compiler
        self.differentiable = differentiable  # create_graph's compiler; None: run the ops
        self.stats = Stats()
        self.keys = CaptureLog()
        self.open_capture: BackwardCapture | None = None
        self.running = False  # a backward is under way (api's wrapper of the engine's run)
        # Graphs whose capture failed, by their nodes' kinds (`_signature`): run eagerly
        # at once, not captured (and logged) again at every backward. Eager is always
        # right, so a graph of the same kinds that could be captured only runs slower.
        self.uncapturable: dict[tuple, str] = {}

    def begin(self, capture: BackwardCapture) -> None:
        self.open_capture = capture
        self.stats.captures += 1

    def captured(self, program: fx.GraphModule, key: CaptureKey) -> Captured:
        # A walk seen before missed on its sizes: specialize it dynamic from the start.
        resized = self.keys.seen_walk(key)
        self.stats.miss_reasons.append(self.keys.record(key))
        self.open_capture = None
        return Captured(self, program, len(self.keys.keys), resized)

    def specialize(self, captured: Captured, args: tuple, failed: str | None) -> Variant:
        """A graph for this run's sizes (its first, or after `failed`: a guard's text)."""
        if failed is not None:
            self.stats.guard_failures.append(failed)
            log.info("compiled autograd: capture %d specializes again: %s", captured.index,
                     failed)
        # Static first; symbolic once a size has changed (a guard failed, or the walk was
        # captured before for other sizes): at most one recompile per new size. Where the
        # symbolic trace fails (a formula whose fake kernel takes its sizes as ints:
        # upsampling's backward), static ones, one per size.
        dynamic = (captured.resized or failed is not None) and not captured.static_only
        for attempt in (dynamic, False) if dynamic else (False,):
            try:
                variant = self._trace(captured, args, attempt)
                break
            except Exception as error:  # noqa: BLE001 - the program itself is eager's backward
                reason = f"{type(error).__name__}: {error}".splitlines()[0]
                captured.static_only = True
        else:
            self.stats.fallbacks.append(reason)
            log.warning("aotgrad: compiled autograd could not trace capture %d for these "
                        "sizes; its formulas run as the eager engine runs them (%s)",
                        captured.index, reason, exc_info=log.isEnabledFor(logging.DEBUG))
            return unspecialized(captured.program)
        if attempt != dynamic:
            log.info("compiled autograd: capture %d specializes for these sizes only: its "
                     "symbolic trace failed (%s)", captured.index, reason)
        self.stats.compiles += 1
        return dataclasses.replace(variant, differentiable=self._for_create_graph(
            captured, attempt))

    def _trace(self, captured: Captured, args: tuple, dynamic: bool) -> Variant:
        # Through the persistent cache: another process may have traced it already.
        trace = functools.partial(specialize, dynamic=dynamic)
        return persistent.specialize(captured.program, args,
                                     self._compiler_now(captured.index), trace)

    def _for_create_graph(self, captured: Captured, dynamic: bool) -> Callable:
        """What a run with grad mode on (create_graph=True) runs: code autograd records.
        Built at the first such run (a graph of its own, compiled differentiably where the
        compiler can); where that fails,
        the program, each formula as the eager engine runs it with grad mode on."""
        def build(args: Sequence) -> Callable:
            # Traced again with grad mode on, as eager runs the formulas (`graph` took
            # their no-grad branches); an aotgrad region's backward stays a call.
            code = specialize_create_graph(captured.program, args, dynamic)
            return code if self.differentiable is None else self.differentiable(code)
        return CompiledOnFirstRun(build, unspecialized(captured.program).graph,
                                  self._failed(captured.index, True))

    def _compiler_now(self, index: int) -> Callable[[fx.GraphModule], Callable]:
        """The compiler for a run without grad mode. A create_graph run specializing a graph
        compiles only the differentiable code it runs (an Inductor compile takes seconds):
        the other waits for a run that needs it."""
        if self.differentiable is None or not torch.is_grad_enabled():
            return self.compiler
        return lambda gm: CompiledOnFirstRun(lambda args: self.compiler(gm), gm,
                                             self._failed(index, False))

    def _failed(self, index: int, create_graph: bool) -> Callable[[Exception], None]:
        """What a failed compile of capture `index` logs: its graph then runs uncompiled."""
        def note(error: Exception) -> None:
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            self.stats.fallbacks.append(f"create_graph: {reason}" if create_graph else reason)
            log.warning("aotgrad: compiled autograd could not compile capture %d%s; its ops "
                        "run uncompiled (%s)", index, " for create_graph=True" if create_graph
                        else "", reason, exc_info=log.isEnabledFor(logging.DEBUG))
        return note

    def note_opaque(self, cls: type) -> None:
        if cls.__qualname__ not in self.stats.opaque:
            self.stats.opaque.append(cls.__qualname__)
            log.info("compiled autograd: %s.backward runs as eager runs it, untraced (a user "
                     "autograd.Function: its Python side effects stay at every backward)",
                     cls.__qualname__)

    def failed_capture(self) -> BackwardCapture | None:
        capture, self.open_capture = self.open_capture, None
        if capture is not None:
            capture.close()
        return capture


def resolve_compiler(compiler: Any) -> Session:
    """A session for `compiler`. "inductor" compiles create_graph's graphs too (through
    aotgrad, differentiable); "eager" and a callable run them op by op, as autograd records."""
    if compiler == "eager":
        return Session(lambda gm: gm)
    if compiler == "inductor":  # its ATen segments; hooks and .grad stay Python calls
        from ..backends.compilers import warm_inductor_workers
        from .inductor import compile_captured, compile_differentiable
        warm_inductor_workers()  # ready by the first backward's kernels, as in torch.compile
        return Session(compile_captured, compile_differentiable)
    if callable(compiler):
        return Session(compiler)
    raise ValueError(f"aotgrad: compiled_autograd.enable takes 'eager', 'inductor' or a "
                     f"callable given the captured GraphModule, not {compiler!r}")


@contextlib.contextmanager
def enable(compiler: Any = "eager", dynamic: bool = True) -> Iterator[Stats]:
    """Run every backward inside as one captured, compiled graph; yields the session's
    counters. `compiler`: "eager", "inductor", or `fn(gm) -> callable`.

        with aotgrad.compiled_autograd.enable("eager") as stats:
            model(x).sum().backward()
        assert stats.captures == 1
    """
    session = resolve_compiler(compiler)
    engine = torch._C._dynamo.compiled_autograd
    # The engine's cache outlives a context: emptied, it holds only this session's graphs,
    # compiled by this compiler (not an earlier session's, nor torch's own instance's).
    engine.clear_cache()
    prior = engine.set_autograd_compiler(functools.partial(BackwardCapture, session), dynamic)
    try:
        with torch.autograd.set_multithreading_enabled(False), _eager_fallback(session), \
                _final_callbacks():
            yield session.stats
    finally:
        engine.set_autograd_compiler(*prior)
        engine.clear_cache()


@contextlib.contextmanager
def _eager_fallback(session: Session) -> Iterator[None]:
    """Both `.backward()` and `autograd.grad` reach the engine through one function of
    torch.autograd: wrapped, a capture that fails reruns on the eager engine (the capture
    ran nothing real, so the graph is intact)."""
    module = torch.autograd
    run = getattr(module, "_engine_run_backward", None)
    if run is None:  # no wrapper point: a failed capture raises
        yield
        return

    def run_backward(*args: Any, **kwargs: Any) -> Any:
        if session.running:
            # A backward inside a running one (reentrant checkpoint's backward, a hook
            # calling autograd.grad): the engine refuses to nest compiled autograd, and
            # eager runs it as a plain backward of its own.
            return _engine_off(run, args, kwargs)
        known = _signature(args[0]) if session.uncapturable else None
        if known in session.uncapturable:
            session.stats.fallbacks.append(session.uncapturable[known])
            return _engine_off(run, args, kwargs)
        session.running = True
        try:
            return run(*args, **kwargs)
        except Exception as error:
            if session.failed_capture() is None and not _uncollectable(error):
                raise  # the captured graph itself raised, as eager would have
            return _run_eagerly(session, run, error, args, kwargs)
        finally:
            session.running = False

    module._engine_run_backward = run_backward
    try:
        yield
    finally:
        module._engine_run_backward = run


def _uncollectable(error: Exception) -> bool:
    """The engine refused a node while collecting the graph's key, before any capture and
    before anything ran (an in-place write through a conjugate view: its CopySlices holds a
    view function): the graph is intact, and the eager engine runs it."""
    return isinstance(error, RuntimeError) and "not supported by compiled autograd" in str(error)


class _CallbackQueue:
    """`Variable._execution_engine` while a session is on: the engine itself, except that a
    final callback queued while a captured graph runs waits in `hooks.QUEUED` (the engine
    would keep it unrun: it runs them only after nodes it walked)."""

    def __init__(self, engine: Any):
        self._engine = engine

    def queue_callback(self, callback: Callable[[], None]) -> None:
        if hooks.QUEUED is None:
            self._engine.queue_callback(callback)
        else:
            hooks.QUEUED.append(callback)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


@contextlib.contextmanager
def _final_callbacks() -> Iterator[None]:
    variable = torch.autograd.Variable
    engine = variable._execution_engine
    variable._execution_engine = _CallbackQueue(engine)
    try:
        yield
    finally:
        variable._execution_engine = engine


def _signature(roots: Any) -> tuple:
    """The kinds of the graph's nodes from `roots` (tensors or gradient edges), depth first:
    what a failed capture is remembered by."""
    stack = [getattr(r, "grad_fn", None) if isinstance(r, torch.Tensor) else r.node
             for r in roots]
    seen, kinds = set(), []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        kinds.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return tuple(kinds)


def _run_eagerly(session: Session, run: Callable, error: Exception, args, kwargs) -> Any:
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    session.stats.fallbacks.append(reason)
    session.uncapturable[_signature(args[0])] = reason  # the graph is intact: walk it again
    log.warning("aotgrad: compiled autograd could not capture this backward; the eager "
                "engine runs it (%s)", reason, exc_info=log.isEnabledFor(logging.DEBUG))
    return _engine_off(run, args, kwargs)


def _engine_off(run: Callable, args, kwargs) -> Any:
    """One backward on the eager engine, compiled autograd set aside for it (and its final
    callbacks left to that engine)."""
    engine = torch._C._dynamo.compiled_autograd
    prior = engine.set_autograd_compiler(None, False)
    queued, hooks.QUEUED = hooks.QUEUED, None
    try:
        return run(*args, **kwargs)
    finally:
        hooks.QUEUED = queued
        engine.set_autograd_compiler(*prior)
