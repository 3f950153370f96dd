"""`aotgrad.compiled_autograd.enable(compiler)`: every backward inside runs as one graph.

A `Session` is one `enable()` context: the compiler, the keys captured so far (to explain
a miss), counters. While it is active, the engine calls `BackwardCapture` on a cache miss;
a backward that cannot be captured runs on the eager engine instead, its reason logged.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import fx

from ..cache import autograd as persistent
from .cache import CaptureKey, CaptureLog
from .capture import BackwardCapture
from .specialize import Captured, Variant, specialize, unspecialized

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
    def __init__(self, compiler: Callable[[fx.GraphModule], Callable]):
        self.compiler = compiler
        self.stats = Stats()
        self.keys = CaptureLog()
        self.open_capture: BackwardCapture | None = None

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
        try:
            # Through the persistent cache: another process may have traced it already.
            # Static first; symbolic once a size has changed (a guard failed, or the walk
            # was captured before for other sizes): at most one recompile per new size.
            dynamic = captured.resized or failed is not None
            trace = functools.partial(specialize, dynamic=dynamic)
            variant = persistent.specialize(captured.program, args, self.compiler, trace)
        except Exception as error:  # noqa: BLE001 - the program itself is eager's backward
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            self.stats.fallbacks.append(reason)
            log.warning("aotgrad: compiled autograd could not trace capture %d for these "
                        "sizes; its formulas run as the eager engine runs them (%s)",
                        captured.index, reason, exc_info=log.isEnabledFor(logging.DEBUG))
            return unspecialized(captured.program)
        self.stats.compiles += 1
        return variant

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


def resolve_compiler(compiler: Any) -> Callable[[fx.GraphModule], Callable]:
    if compiler == "eager":
        return lambda gm: gm
    if compiler == "inductor":  # its ATen segments; hooks and .grad stay Python calls
        from .inductor import compile_captured
        return compile_captured
    if callable(compiler):
        return compiler
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
    session = Session(resolve_compiler(compiler))
    engine = torch._C._dynamo.compiled_autograd
    # The engine's cache outlives a context: emptied, it holds only this session's graphs,
    # compiled by this compiler (not an earlier session's, nor torch's own instance's).
    engine.clear_cache()
    prior = engine.set_autograd_compiler(functools.partial(BackwardCapture, session), dynamic)
    try:
        with torch.autograd.set_multithreading_enabled(False), _eager_fallback(session):
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
        try:
            return run(*args, **kwargs)
        except Exception as error:
            if session.failed_capture() is None:
                raise  # the captured graph itself raised, as eager would have
            return _run_eagerly(session, run, error, args, kwargs)

    module._engine_run_backward = run_backward
    try:
        yield
    finally:
        module._engine_run_backward = run


def _run_eagerly(session: Session, run: Callable, error: Exception, args, kwargs) -> Any:
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    session.stats.fallbacks.append(reason)
    log.warning("aotgrad: compiled autograd could not capture this backward; the eager "
                "engine runs it (%s)", reason, exc_info=log.isEnabledFor(logging.DEBUG))
    engine = torch._C._dynamo.compiled_autograd
    prior = engine.set_autograd_compiler(None, False)
    try:
        return run(*args, **kwargs)
    finally:
        engine.set_autograd_compiler(*prior)
