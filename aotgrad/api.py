"""The native front door: `aotgrad.compile` for functions and modules.

A compiled callable keeps one `CompiledCall` per call signature (shapes, strides, dtypes,
devices, requires_grad, constants, grad mode, autocast) and compiles again when a call does
not match any, up to a cap. Calls of flat arguments first try each entry's guard
(`guards.py`), decided at compile time, and build the signature key only when none passes.
With `dynamic=True` the signature leaves sizes and strides out: the calls of one signature
share compiled graphs, each serving the calls its shape guard accepts (`dynamic.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import warnings
from typing import Any, Callable, Hashable, NamedTuple, Sequence

import torch
import torch.autograd.forward_ad as _fw_ad
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.utils import parametrize
from torch.nn.utils._named_member_accessor import swap_tensor

from . import check
from .semantics.aliasing import AliasingChanged, alias_pattern
from .backends.compilers import resolve_backend
from .backends.settings import compile_settings, with_inductor_settings
from .capture.inputs import TRACES, flatten, lift_state, state_swapped
from .partition.budget import budget_partition
from .runtime.guards import (MISS, function_modes_on, make_guard, make_guarded_run,
                             plan_guard, signature, under_a_function_mode)
from .partition.remat import min_cut_rematerialization_partition
from .semantics.dynamic import falls_back_to_static, warn_static_fallback
from .artifact import Artifact
from .backends.compilers import COMPILES
from .pipeline import Options, compile_call
from .runtime.call import CompiledCall
from .runtime.forward_writes import ForwardWrites
from .runtime.module_call import (call_as_the_module, parametrize_caching,
                                  parametrizations_cached_apart, parametrizations_uncached)
from .runtime.module_guard import (FunctionReads, ModuleAttributes, hook_set_attributes,
                                   hooks_checked, is_traced, refuse_traced_attributes,
                                   refuse_traced_reads)

log = logging.getLogger(__name__)

DEFAULT_MAX_ENTRIES = 8
# Argument types that are pytree leaves: a call made of these alone skips pytree.
_FLAT_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, int, float, bool, type(None)})
# True while Dynamo or export traces (Dynamo folds the call to a constant; in eager it costs
# ~70 ns): a compiled callable then runs the user's code, so that an outer torch.compile
# traces the original ops, as it does through a module that is already torch.compile'd,
# instead of graph-breaking in aotgrad's runtime.
_tracing = torch.compiler.is_compiling
# Not None inside torch.func's transforms (vmap, grad, jacrev): their wrapped inputs are not
# tensors a trace takes, and the graph would not be transformed; the original code runs,
# as in eager (27 ns a call).
_transforming = torch._C._functorch.peek_interpreter_stack


# Nonzero under a dispatch mode: asked first at each call (14 ns over an empty call).
_modes_on = torch._C._len_torch_dispatch_stack
# `_fw_ad._current_level >= 0` inside forward_ad.dual_level(): Inductor's kernels would drop
# the inputs' tangents, where eager's ops carry them; the original code runs.


def _under_a_mode() -> bool:
    """Under a dispatch mode of the caller's (a FlopCounterMode, a selective checkpoint's
    cache, one that rewrites ops), which sees and may change every op as it runs: a graph
    traced without it (or under another) would not repeat that, so the original code runs,
    as in eager and as torch.compile does. Modes that declare themselves infrastructure, or
    blind to compiled code, do not count."""
    return any(not (_asks(mode, "is_infra_mode") or _asks(mode, "ignore_compile_internals"))
               for mode in _get_current_dispatch_mode_stack())


def _asks(mode, question: str) -> bool:
    answer = getattr(mode, question, None)
    return bool(answer()) if callable(answer) else False


def _shape_check(call: CompiledCall) -> Callable[[Sequence[Any]], bool] | None:
    """For an entry compiled for dynamic shapes, its shape guard over the flat arguments."""
    if call.guard is None:
        return None
    guard, positions = call.guard, call.plan.graph_input_positions
    return lambda flat: guard([flat[p] for p in positions])


class CompiledFunction:
    """A function compiled ahead of time: an entry per call signature (or shape guard)."""

    def __init__(self, fn: Callable, options: Options, max_entries: int = DEFAULT_MAX_ENTRIES,
                 watch_reads: bool = False):
        """`watch_reads`: compile again when a value the function reads besides its arguments
        changes (its closure, its globals: `FunctionReads`), as the native door does."""
        self.fn = fn
        self.options = options
        self.max_entries = max_entries
        self.reads = FunctionReads(fn) if watch_reads and FunctionReads.watchable(fn) else None
        self._rereads = 0  # compiles again after a read value changed
        self.entries: dict[Hashable, CompiledCall] = {}
        self.guarded: list[tuple[Callable, CompiledCall]] = []  # entries for flat calls
        # The same entries, each guard and run in one frame (what a call tries first).
        self.guarded_runs: list[Callable[[tuple], Any]] = []
        self.dynamic_entries: dict[Hashable, list[CompiledCall]] = {}  # dynamic=True
        # Signatures that dynamic shapes failed for, and why: compiled for static shapes.
        self.static_only: dict[Hashable, Exception] = {}
        self.__wrapped__ = fn

    def __call__(self, *args, **kwargs):
        if (_tracing() or _transforming() is not None or TRACES.depth
                or function_modes_on() and under_a_function_mode()
                or _modes_on() and _under_a_mode() or _fw_ad._current_level >= 0):
            return self.fn(*args, **kwargs)
        if self.reads is not None and (changed := self.reads.changed()) is not None:
            return self._compile_again(changed, args, kwargs)
        if not kwargs:
            for guarded_run in self.guarded_runs:
                try:
                    out = guarded_run(args)
                except AliasingChanged:  # a later entry may be this aliasing's variant
                    continue
                if out is not MISS:
                    return out
        return self._call_by_signature(args, kwargs)

    def _call_by_signature(self, args: tuple, kwargs: dict):
        if not kwargs and all(type(a) in _FLAT_TYPES for a in args):
            flat, shape = list(args), len(args)  # no pytree: the common case, made cheap
        else:
            flat, shape = flatten((args, kwargs))
        key = (shape, signature(flat))
        dynamic = self.options.dynamic
        call = self._dynamic_call(shape, flat, key) if dynamic else self.entries.get(key)
        if call is None:
            call = self._compile(key, shape, flat, args, kwargs, dynamic)
            if call is None:
                return self._over_cap(args, kwargs)
        try:
            return call.unflatten(call(flat))
        except AliasingChanged:  # same signature, inputs aliased differently: a variant
            key = (key, alias_pattern([t for t in flat if isinstance(t, torch.Tensor)]))
            call = self.entries.get(key) or self._compile(key, shape, flat, args, kwargs)
            if call is None:
                return self._over_cap(args, kwargs)
            return call.unflatten(call(flat))

    def _compile_again(self, changed: str, args, kwargs):
        """Forget the graphs that took the old value; past max_entries such changes, run the
        function eagerly."""
        self._rereads += 1
        if _recompiles_spent(self._rereads, self.max_entries, changed,
                             getattr(self.fn, "__name__", repr(self.fn))):
            return self.fn(*args, **kwargs)
        self._forget()
        self.reads = FunctionReads(self.fn)
        return self(*args, **kwargs)

    def _forget(self) -> None:
        """Drop every compiled entry."""
        for entries in (self.entries, self.guarded, self.guarded_runs, self.dynamic_entries,
                        self.static_only):
            entries.clear()

    def _compile(self, key, shape, flat, args, kwargs, dynamic: bool = False
                 ) -> CompiledCall | None:
        """Compile for this call (None over the cap): for dynamic shapes if asked, unless
        they fail (then, with a warning, for static shapes, under `key`)."""
        if self.num_compiles >= self.max_entries:
            return None
        spec = shape if not isinstance(shape, int) else flatten((args, {}))[1]
        # Hooks of the modules it reads that keep a traced tensor are refused, as a module's;
        # their parametrizations are traced apart from the caller's `parametrize.cached()`.
        with hooks_checked(self.reads.hook_dicts() if self.reads is not None else []), \
                parametrizations_uncached():
            call, failure = self._compile_dynamic(shape, flat, spec) if dynamic else (None, None)
            if call is None:
                static = dataclasses.replace(self.options, dynamic=False)
                call = self.entries[key] = compile_call(self.fn, flat, spec, static)
        if failure is not None:  # warned only now: static shapes may fail alike
            warn_static_fallback(getattr(self.fn, "__name__", repr(self.fn)), failure)
            self.static_only[(shape, signature(flat, dynamic=True))] = failure
        self._add_guard(flat, call, flat_call=isinstance(shape, int))
        if self.reads is not None:  # what its Python set while traced (a counter), as left
            self.reads = FunctionReads(self.fn)
            try:
                self.reads.refuse_traced()
            except NotImplementedError:  # the trace left a traced tensor: keep no entry
                self._forget()
                raise
        return call

    def _compile_dynamic(self, shape, flat: list, spec) -> tuple[CompiledCall | None, Any]:
        """A graph for dynamic shapes; else None, and why they failed (None when they
        failed for this signature before)."""
        key = (shape, signature(flat, dynamic=True))
        if key in self.static_only:
            return None, None
        try:
            call = compile_call(self.fn, flat, spec, self.options)
        except Exception as exc:
            if not falls_back_to_static(exc):
                raise
            return None, exc
        self.dynamic_entries.setdefault(key, []).append(call)
        return call, None

    def _add_guard(self, flat: list, call: CompiledCall, flat_call: bool) -> None:
        plan = plan_guard(flat, call) if flat_call else None
        if plan is not None:
            self.guarded.append((make_guard(plan, flat, _shape_check(call)), call))
            self.guarded_runs.append(make_guarded_run(plan, flat, call, _shape_check(call)))

    def _dynamic_call(self, shape, flat: list, key: Hashable) -> CompiledCall | None:
        """The first graph compiled for this signature whose shape guard accepts the call; then
        one compiled for exactly these shapes (where dynamic shapes fell back to static)."""
        for call in self.dynamic_entries.get((shape, signature(flat, dynamic=True)), ()):
            if _shape_check(call)(flat):
                return call
        return self.entries.get(key)

    @property
    def num_compiles(self) -> int:
        return len(self.entries) + sum(len(calls) for calls in self.dynamic_entries.values())

    def _over_cap(self, args, kwargs):
        warnings.warn(f"aotgrad: {getattr(self.fn, '__name__', self.fn)} was compiled for "
                      f"{self.max_entries} call signatures (max_entries); running this call "
                      "eagerly. Raise max_entries or make the inputs' shapes stable.")
        return self.fn(*args, **kwargs)

    @property
    def artifacts(self) -> list[Artifact]:
        """What each compile produced: graphs, saved values, timings."""
        calls = [*self.entries.values(),
                 *(c for cs in self.dynamic_entries.values() for c in cs)]
        return [c.artifact for c in calls]


class _WithHookSet(NamedTuple):
    """A forward's output with the weights torch's hooks set on submodules before it (prune,
    weight_norm, spectral_norm): eager leaves each call's weight there, so the graph returns
    them where there are any (elsewhere the output alone keeps the runtime's fast path)."""

    out: Any
    attributes: dict[tuple[int, str], torch.Tensor]  # (submodule index, name) -> weight

    def set_on(self, submodules: list[torch.nn.Module]) -> Any:
        for (i, name), value in self.attributes.items():
            setattr(submodules[i], name, value)
        return self.out


# Named, so that the output's structure is written into a cache entry.
pytree._register_namedtuple(_WithHookSet, serialized_type_name="aotgrad.api._WithHookSet")


class CompiledModule(torch.nn.Module):
    """A module whose forward runs compiled; parameters and buffers are graph inputs, so
    updates of buffers in forward (BatchNorm's running statistics) land on the module."""

    def __init__(self, module: torch.nn.Module, options: Options,
                 max_entries: int = DEFAULT_MAX_ENTRIES):
        super().__init__()
        self.orig_module = module
        self._rebinds = 0  # compiles again after an attribute changed (_compile_again)
        self._bind(options, max_entries)

    def _bind(self, options: Options, max_entries: int) -> None:
        """Compile for the module as it is now (its graphs are traced at the first call)."""
        module = self.orig_module
        self._options, self._max_entries = options, max_entries
        self._names = lift_state(module).names
        self._slots = [_slot(module, n) for n in self._names]
        self._state_dicts = [_state_dict_of(owner, attr) for owner, attr in self._slots]
        self._submodules = list(module.modules())
        # Caching parametrizations changes what forward computes where one is stateful
        # (spectral_norm's power iteration steps once a weight computation): a flag of the
        # call's signature, after the training flags, for parametrized modules.
        self._flags = len(self._submodules) + any(map(parametrize.is_parametrized,
                                                      self._submodules))
        self._attributes = ModuleAttributes(module)
        self._lazy = _uninitialized(module)  # the first call refuses them (_refuse_lazy)
        self._traced = False
        self._writes: ForwardWrites | None = None  # while a compile runs forward's Python
        self._written: str | None = None  # what the last trace's forward changed, in words
        options = dataclasses.replace(
            options, static_inputs=tuple(range(len(self._names))),
            input_names=(*self._names, *[""] * self._flags), named_like=module.forward)
        self.compiled = CompiledFunction(self._functional_forward, options, max_entries)

    def _functional_forward(self, *flat, **kwargs):
        # flat: the state, each submodule's training flag (for the signature), whether
        # parametrizations are cached (where there are), the arguments.
        self._traced = True  # forward's Python runs: it may set attributes
        state = flat[:len(self._names)]
        args = flat[len(self._names) + self._flags:]
        caching = self._flags > len(self._submodules) and flat[len(self._names) + self._flags - 1]
        with state_swapped(self.orig_module, dict(zip(self._names, state))), \
                hooks_checked(self._attributes.hook_dicts), parametrizations_cached_apart(caching):
            if self._writes is None:  # the compile's first run
                self._writes = ForwardWrites(self._submodules)
            self._writes.start()  # a later run (the joint trace) starts where the first did
            try:
                out = self.orig_module(*args, **kwargs)
            finally:  # a run stopped by an error (one the pipeline retries) wrote too
                self._writes.record()
            rebound = self._rebound_buffers(state)
        refuse_traced_attributes(self.orig_module)
        refuse_traced_reads(self._attributes.cells, self._attributes.globals, "forward")
        hook_set = {**hook_set_attributes(self._submodules), **rebound}
        return _WithHookSet(out, hook_set) if hook_set else out

    def _rebound_buffers(self, state) -> dict[tuple[int, str], torch.Tensor]:
        """The buffers forward bound to a tensor it computed (a rotary cache grown with
        `register_buffer` again, `self.last = h.detach()`), as `_WithHookSet` keys them: the
        graph returns them and each call binds them, as eager leaves them. Another tensor
        (a parameter rebound, a buffer bound to a tensor the graph does not make) is refused."""
        rebound = {}
        for name, (owner, attr), value in zip(self._names, self._slots, state):
            now = getattr(owner, attr)
            if now is value:
                continue
            if attr not in owner._buffers or not isinstance(now, torch.Tensor) \
                    or not is_traced(now):
                raise NotImplementedError(
                    f"aotgrad: forward assigns a new tensor to {name!r}; the assignment would "
                    "be lost. Update it in place instead (e.g. self.buf.copy_(...) or add_).")
            if self._options.cudagraphs and now.is_cuda:  # the next replay overwrites it
                raise NotImplementedError(
                    f"aotgrad: forward binds the buffer {name!r} to a new tensor, which "
                    "cudagraphs=True cannot keep (the next replay overwrites it). Update it "
                    "in place (self.buf.copy_(...)), or compile without cudagraphs.")
            rebound[(self._submodules.index(owner), attr)] = now
        return rebound

    def __call__(self, *args, **kwargs):
        return call_as_the_module(self, args, kwargs)  # the global hooks are the module's

    def forward(self, *args, **kwargs):
        # Inside an outer compile (torch.compile, export, aotgrad's), a torch.func transform
        # or a dispatch mode: the module's own code, which the outer one records or
        # transforms, or the mode sees.
        if (_tracing() or _transforming() is not None or TRACES.depth
                or function_modes_on() and under_a_function_mode()
                or _modes_on() and _under_a_mode() or _fw_ad._current_level >= 0):
            return self.orig_module(*args, **kwargs)
        changed = self._written or self._attributes.changed()
        if changed is not None:
            return self._compile_again(changed, args, kwargs)
        if self._lazy:
            self._refuse_lazy()
        # Train/eval mode changes what forward computes: part of the call's signature.
        training_flags = [m.training for m in self._submodules]
        if self._flags > len(training_flags):
            training_flags.append(parametrize_caching())
        state = COMPILES.stable_read(self._read_state)  # not another thread's trace's fakes
        try:
            out = self.compiled(*state, *training_flags, *args, **kwargs)
        finally:
            if self._traced:
                self._traced_since()
        if type(out) is _WithHookSet:
            out = out.set_on(self._submodules)
        return out

    def _traced_since(self) -> None:
        """After a call that traced: the attributes as its forward left them, once (as an
        eager call does); a graph traced from a forward that changed one baked the old
        value, so the next call compiles again (runtime/forward_writes.py)."""
        writes, self._writes, self._traced = self._writes, None, False
        self._attributes = ModuleAttributes(self.orig_module)
        if writes is not None:
            self._written = writes.describe()

    def _refuse_lazy(self) -> None:
        """A lazy module (nn.LazyLinear) infers its parameters' shapes from its first call's
        inputs, in eager; its initializing hook runs Python on real values, which a trace on
        fake tensors cannot, and an eager call of the whole module first would update state
        (BatchNorm's statistics) once more than eager does. So the user runs that call."""
        self._lazy = _uninitialized(self.orig_module)  # initialized since: the guard rebinds
        if self._lazy:
            name, lazy = self._lazy[0]
            where = f"submodule {name!r}" if name else "the module"
            raise RuntimeError(
                f"aotgrad: {where} ({type(lazy).__name__}, a lazy module) has parameters "
                "not initialized yet: eager infers their shapes at the first call. Run one "
                "eager forward of the module first (module(example_input)) to initialize "
                "them, then call the compiled module.")

    def _compile_again(self, changed: str, args, kwargs):
        self._rebinds += 1
        if _recompiles_spent(self._rebinds, self._max_entries, changed,
                             type(self.orig_module).__name__):
            return self.orig_module(*args, **kwargs)
        self._bind(self._options, self._max_entries)
        return self.forward(*args, **kwargs)

    def _read_state(self) -> list:
        """The current parameters and buffers, read each call: in-place updates and
        reassignments show as they do in eager. Straight from the owners' dicts (what
        nn.Module.__getattr__ reads, without its Python frame), else through getattr."""
        try:
            return [d[attr] for d, attr in self._state_dicts]
        except KeyError:  # moved since (deleted, parametrized): ask the module
            return [getattr(owner, attr) for owner, attr in self._slots]

    @property
    def artifacts(self) -> list[Artifact]:
        return self.compiled.artifacts

    # What `_bind` derives from the module: left out of a copy or pickle (the compiled
    # entries hold locks and generated code), derived again for the copy's own module. An
    # EMA model is `copy.deepcopy(model)` after some steps; torch.save(model) pickles it.
    _BOUND = frozenset({"_names", "_slots", "_state_dicts", "_submodules", "_flags",
                        "_attributes", "_lazy", "_traced", "_writes", "_written", "compiled"})

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in self._BOUND}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._bind(self._options, self._max_entries)

    def __getattr__(self, name: str):
        """Attributes the wrapper lacks are the original module's, as torch.compile's
        OptimizedModule does: `compiled.fc`, and `functional_call(compiled, params)` with the
        original's names (MAML), which swaps the original's tensors that each call reads."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "orig_module":  # not set yet (__init__): no recursion
                raise
            return getattr(self.orig_module, name)

    # The wrapper's own attributes; any other is the original module's, set and deleted
    # there (`compiled.temperature = 0.5`, `compiled.head = nn.Linear(...)` set on the
    # wrapper were never read by forward); functional_call's plain tensor for a parameter
    # (`{"weight": w}`) is put in the original's `_parameters`, as torch does on a module.
    _OWN = _BOUND | {"orig_module", "_rebinds", "_options", "_max_entries"} | set(
        vars(torch.nn.Module()))  # nn.Module's bookkeeping (an old pickle's, restored)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN or hasattr(type(self), name) or "_modules" not in self.__dict__:
            return super().__setattr__(name, value)
        if sys._getframe(1).f_globals.get("__name__") == "torch.nn.utils._named_member_accessor":
            return swap_tensor(self.orig_module, name, value)
        setattr(self.orig_module, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._OWN or hasattr(type(self), name):
            return super().__delattr__(name)
        delattr(self.orig_module, name)

    @property
    def training(self) -> bool:  # type: ignore[override]
        """The original module's flag: its forward reads it."""
        return self.__dict__["_modules"]["orig_module"].training

    @training.setter
    def training(self, mode: bool) -> None:
        modules = self.__dict__.get("_modules")
        if modules is not None and "orig_module" in modules:  # not nn.Module.__init__'s
            modules["orig_module"].training = mode


def _recompiles_spent(count: int, max_entries: int, changed: str, name: str) -> bool:
    """Has `name` been compiled again for changed state more than max_entries times? Then it
    runs eagerly, with a warning the first time."""
    if count <= max_entries:
        log.info("aotgrad: %s of %s changed since it was compiled: compiling it again",
                 changed, name)
        return False
    if count == max_entries + 1:
        warnings.warn(
            f"aotgrad: {changed} of {name} changed after each of {max_entries} compiles "
            "(max_entries); running it eagerly from now on. Pass the value as an argument, "
            "or use torch.compile(backend='aotgrad'), which makes a changing number an "
            "input.")
    return True


def _uninitialized(module: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The lazy submodules whose parameters or buffers are not initialized yet."""
    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, LazyModuleMixin) and m.has_uninitialized_params()]


def _slot(module: torch.nn.Module, name: str):
    *path, attr = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, attr


def _state_dict_of(owner: torch.nn.Module, attr: str) -> tuple[dict, str]:
    return (owner._parameters if attr in owner._parameters else owner._buffers), attr


def choose_partitioner(partitioner: Callable | None, memory_budget: float | None) -> Callable:
    if memory_budget is None:
        return partitioner or min_cut_rematerialization_partition
    if partitioner not in (None, min_cut_rematerialization_partition):
        raise ValueError("aotgrad: memory_budget works with the min-cut partitioner only; "
                         "pass partitioner=None")
    return budget_partition(memory_budget)


def checked_options(where: str, *, backend: Any, partitioner: Callable | None,
                    memory_budget: float | None, decompositions, dynamic: bool = False,
                    keep_inference_input_mutations: bool = False, max_entries: int = 1,
                    compile_backward: str = "lazy", cudagraphs: bool = False,
                    mode: str | None = None, options: dict | None = None) -> Options:
    """The Options of `aotgrad.compile` and `aotgrad.backend`, each argument checked first;
    `mode` and `options` are torch.compile's (backends/settings.py)."""
    check.compile_options(where, partitioner=partitioner, memory_budget=memory_budget,
                          decompositions=decompositions, dynamic=dynamic,
                          keep_inference_input_mutations=keep_inference_input_mutations,
                          max_entries=max_entries, mode=mode, options=options)
    check.flag(where, "cudagraphs", cudagraphs)
    base = Options(resolve_backend(backend, decompositions),
                   choose_partitioner(partitioner, memory_budget),
                   keep_inference_input_mutations, dynamic=dynamic,
                   compile_backward=compile_backward, cudagraphs=cudagraphs)
    return with_settings(base, compile_settings(mode, options))


def with_settings(base: Options, settings: dict[str, Any]) -> Options:
    """`base` under Inductor `settings` (`compile_settings`'s): "triton.cudagraphs" turns on
    aotgrad's own CUDA graphs (backends/cudagraphs.py), the others reach Inductor."""
    settings = dict(settings)
    cudagraphs = settings.pop("triton.cudagraphs", None)
    if cudagraphs is None:
        cudagraphs = base.cudagraphs
    check.flag("options", "triton.cudagraphs", cudagraphs)
    return dataclasses.replace(base, backend=with_inductor_settings(base.backend, settings),
                               cudagraphs=cudagraphs)


def compile(fn_or_module: Callable, *, backend: Any = "inductor",
            partitioner: Callable | None = None, memory_budget: float | None = None,
            decompositions=None, dynamic: bool = False,
            keep_inference_input_mutations: bool = False,
            max_entries: int = DEFAULT_MAX_ENTRIES, compile_backward: str = "lazy",
            cudagraphs: bool = False, mode: str | None = None, options: dict | None = None):
    """Compile a function or module ahead of time for training and inference.

    `partitioner` decides what the forward saves for the backward (default: the min-cut
    rematerialization partitioner); `memory_budget` in [0, 1] trades recomputation for a
    lower estimated peak (1: the min-cut plan, 0: recompute everything recomputable).
    `compile_backward`: "lazy" compiles a backward at its first use (a call under no_grad,
    or one whose outputs never see backward, compiles none); "ahead" with its forward.
    `cudagraphs=True` replays each graph on CUDA from a recorded CUDA graph (torch's
    `mode="reduce-overhead"`): a module's parameters and buffers are recorded in place,
    other inputs are copied in; where a graph cannot be recorded it runs as compiled and
    the "aotgrad" logger says why (backends/cudagraphs.py). `mode` and `options` are
    torch.compile's, for Inductor (`mode="max-autotune"`, `options={"cpp_wrapper": True}`;
    `mode="reduce-overhead"` is `cudagraphs=True`).

    >>> import torch, aotgrad
    >>> f = aotgrad.compile(lambda x: (x.sin() * 2).sum(), backend="eager")
    >>> x = torch.randn(4, requires_grad=True)
    >>> f(x).backward()
    >>> torch.allclose(x.grad, 2 * x.cos())
    True
    """
    check.function_or_module("compile", fn_or_module)
    chosen = checked_options(
        "compile", backend=backend, partitioner=partitioner, memory_budget=memory_budget,
        decompositions=decompositions, dynamic=dynamic, max_entries=max_entries,
        keep_inference_input_mutations=keep_inference_input_mutations,
        compile_backward=compile_backward, cudagraphs=cudagraphs, mode=mode, options=options)
    if isinstance(fn_or_module, torch.nn.Module):
        check.not_data_parallel("compile", fn_or_module)
        return CompiledModule(fn_or_module, chosen, max_entries)
    return CompiledFunction(fn_or_module, chosen, max_entries, watch_reads=True)
