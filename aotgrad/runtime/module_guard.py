"""What `aotgrad.compile(module)`'s graphs took as given beyond the parameters and buffers,
compared at each call: a change compiles the module again (api.CompiledModule), instead of
running graphs that baked the old state. torch.compile guards the same things (Dynamo's
guards); the argument guards are runtime/guards.py.

- which submodule sits where, and its class (`parametrize` swaps it);
- which names each module holds in `_parameters`, `_buffers` and `_modules`, and which of
  them hold None: a name added (`seq.append`, `register_parameter`) or removed, or a None
  entry given a tensor (`register_buffer("shift", None)`, then `self.shift = t`), changes
  what forward reads (`self.parameters()`, a Sequential's loop, `if self.shift is None`);
- the attributes forward may read as constants: numbers (a `scale`, a dropout's `p`),
  strings, None, and plain (unregistered) tensor attributes, by identity; and any other
  attribute whose name the user's forward code or hooks name (a config dict or list, its
  items too, a tuple by its items, an enum, a function);
- the globals the forwards of the user's module classes name, and the methods and
  properties of their classes they reach (`self.forward_head(h)`): a module-level flag, a
  helper function, a custom autograd.Function's forward and backward; as `FunctionReads`
  compares a function's;
- the module hooks, and the global ones: a hook registered anywhere bumps one counter of
  torch's (`RemovableHandle.next_id`), checked first; the hook dicts that held hooks at the
  compile are compared whole, so that a removal is seen too; and what the user's hooks
  read, as `FunctionReads` compares a function's (a schedule's factor a hook scales by).

`hooks_checked` refuses, during a trace, the hooks whose effects a graph cannot keep;
`refuse_traced_attributes`, after it, a traced tensor forward stored in an attribute;
`hook_set_attributes`, the traced tensors torch's own hooks stored (a pruned weight).

`FunctionReads` is the same for `aotgrad.compile(function)`: the values its closure's cells
hold and the globals its code names (through a module of the user's it holds, the names
the code reads of it), and the same for the functions it calls of its own module and of the
user's other modules (not an installed package's, nor the standard library's). A plain list
or dict among them (up to `CONTAINER_ITEMS` items) is compared item by item too. A value
changed deeper inside an object it reads (an attribute of a global object, an item of a
longer list), or a global an installed package's function reads, is not seen.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import operator
import site
import sysconfig
import types
from typing import Any, Callable, Iterable

import torch
from torch.nn.modules import module as module_hooks
from torch.utils.hooks import RemovableHandle

from ..semantics import mends
from .registered_names import GONE, RegisteredNames
from .values import (CONTAINER_ITEMS, Definition, class_code, global_names,  # noqa: F401
                     class_members, contents_of, members_changed, unchanged)

_CONSTANTS = (bool, int, float, str, type(None), torch.Tensor)
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GONE = GONE
_FORWARDS, _GONES = itertools.repeat("forward"), itertools.repeat(_GONE)


class ModuleAttributes:
    def __init__(self, module: torch.nn.Module):
        named = list(module.named_modules())
        modules = [m for _, m in named]
        self.names = RegisteredNames(named)
        self.edges = [(m._modules, n, c, type(c)) for m in modules
                      for n, c in m._modules.items()]
        # Each module's class, and the methods its forward reaches there: a class swapped
        # (`m.__class__ =`) or patched (`Cls.forward = f`) runs other code.
        self.modules, self.module_classes = modules, list(map(type, modules))
        self.hook_dicts = [getattr(m, h) for m in modules for h in _HOOK_DICTS] + [
            module_hooks._global_forward_pre_hooks, module_hooks._global_forward_hooks,
            module_hooks._global_backward_pre_hooks, module_hooks._global_backward_hooks]
        self.hooked = _hooked(self.hook_dicts)
        self.next_hook = RemovableHandle.next_id
        # What the user's hooks read: a schedule's factor in a closure, a global, the
        # attributes of a hook object (a module's are `values`).
        self.hook_reads = [FunctionReads(hook, watch_modules=False)
                           for hooks in self.hook_dicts for hook in hooks.values()
                           if not _is_torchs(hook) and FunctionReads.watchable(hook)]
        # What the forwards of the user's classes read (a module-level flag, a helper), and
        # the code of a custom autograd.Function an attribute holds (`self.reverse.apply`).
        forwards = {type(m): getattr(type(m), "forward", None) for m in modules}.items()
        self.members = [member for cls, forward in forwards if not _is_torchs(forward)
                        for member in class_members(cls, _reached_in_class(cls, forward),
                                                    "forward")]
        functions = [f for cls, forward in forwards for f in _reached_in_class(cls, forward)] + [
            f for m in modules for value in vars(m).values() for f in _code_of(value)
            if isinstance(value, type)]
        code = sorted({f for f in functions
                       if isinstance(f, types.FunctionType) and not _is_torchs(f)},
                      key=lambda f: f.__qualname__)
        self.cells, self.globals = code_reads(code)
        self.globals += mends.fast_path_flag(modules)  # torch's, read by attention modules
        hooks = [r.function for r in self.hook_reads]  # a hook reading `module.config`
        named = set().union(*(global_names(f.__code__) for f in code + hooks))  # attributes
        self.values = [(vars(m), n, v, contents_of(v)) for m in modules for n, v in vars(m).items()
                       if not n.startswith("_") and n not in ("training", "forward")
                       and _watched(n, v, named)]
        # A forward patched on an instance (an adapter wrapping a layer's), or removed again:
        # checked at every call for every module, so in C loops (`map`).
        self.instance_dicts = [vars(m) for m in modules]
        self.instance_forwards = [d.get("forward", _GONE) for d in self.instance_dicts]

    def changed(self) -> str | None:
        """What changed, in words; None if nothing did."""
        for parent, name, child, cls in self.edges:
            if parent.get(name) is not child or type(child) is not cls:
                return f"submodule {name!r}"
        if not all(map(operator.is_, map(type, self.modules), self.module_classes)):
            return "the class of a module"
        changed = members_changed(self.members)
        if changed is not None:
            return changed
        names = self.names.changed()
        if names is not None:
            return names
        for owner, name, value, contents in self.values:
            now = owner.get(name, _GONE)
            if (now is not value or contents is not None) and not unchanged(now, value,
                                                                             contents):
                return f"attribute {name!r}"
        if not all(map(operator.is_, map(dict.get, self.instance_dicts, _FORWARDS, _GONES),
                       self.instance_forwards)):
            return "a submodule's forward, set on the instance"
        return (code_changed(self.cells, self.globals) or self._hooks_changed()
                or self._hook_reads_changed())

    def _hooks_changed(self) -> str | None:
        for hooks, keys in self.hooked:
            if tuple(hooks) != keys:
                return "a module hook"
        if RemovableHandle.next_id != self.next_hook:  # a hook registered somewhere
            if _hooked(self.hook_dicts) != self.hooked:
                return "a module hook"
            self.next_hook = RemovableHandle.next_id  # a tensor's, or another module's
        return None

    def _hook_reads_changed(self) -> str | None:
        for reads in self.hook_reads:
            changed = reads.changed()
            if changed is not None:
                return f"{changed}, read by a module hook"
        return None


def _watched(name: str, value: Any, named: set[str]) -> bool:
    """A module attribute forward may read as a constant: a number, a string, None, a plain
    tensor; or any other value the user's forward code names (a config dict or list, a
    tuple, an enum, a function), its items too where it is a short list or dict."""
    return isinstance(value, _CONSTANTS) or (name in named
                                             and not isinstance(value, torch.nn.Module))


def _reached_in_class(cls: type, start: Any) -> list[types.FunctionType]:
    """`start` (a function of `cls`: a module's forward, a compiled object's `__call__`), and
    the methods and properties of `cls` it reaches by name (`self.forward_head(h)`,
    `self.temperature`), theirs too: what a call of it runs of the class's own code."""
    if not isinstance(start, types.FunctionType):
        return []
    found, todo = {start}, [start]
    while todo:
        for name in sorted(global_names(todo.pop().__code__)):  # attribute names too
            for method in class_code(inspect.getattr_static(cls, name, None)):
                if method not in found and not _is_torchs(method):  # torch's: not followed
                    found.add(method)
                    todo.append(method)
    return list(found)


class FunctionReads:
    """The values a function reads besides its arguments, which its graphs took as they were
    at the trace: each closure cell's content and each global its code (and code nested in
    it) names, a module standing for the names read of it (one of the user's; others are
    left out); the same for the functions of its own module and of the user's
    other modules that it calls by name, and theirs; for a bound method or a callable
    object, the object's attributes (with `watch_modules=False`, not where the object is a
    module: a module hook's own module is watched as a module). Compared by identity; a
    number or string by value; a short plain list or dict item by item too."""

    def __init__(self, fn: Callable, watch_modules: bool = True):
        # A partial's bound keywords are a dict the caller may change (its `args` cannot).
        self.bound = [(fn.keywords, contents_of(fn.keywords))] if _is_partial(fn) else []
        fn, owner = _function_and_owner(fn)
        self.function, self.owner = fn, owner
        watched = hasattr(owner, "__dict__") and (
            watch_modules or not isinstance(owner, torch.nn.Module))
        self.attributes = [(name, value, contents_of(value)) for name, value in
                           (vars(owner).items() if watched else ())]
        reached = [fn] if owner is None else _reached_in_class(type(owner), fn)
        self.cells, self.globals = code_reads(reached)
        # A callable object's class (`__call__` is looked up on it at each call) and the
        # methods its code reaches there; a bound method's, but its own function is fixed.
        self.owner_class = type(owner) if _is_callable_object(fn, owner) else None
        self.members = [] if owner is None else class_members(
            type(owner), reached, "__call__" if self.owner_class else fn.__name__)
        # The modules it reads (a frozen teacher closed over): their graphs baked train or
        # eval, attributes, hooks and the tensors they held. (Not for a hook: its module is
        # the ModuleAttributes that watches it.)
        read = [*(c for _, _, c, _ in self.cells), *(v for _, _, v, _ in self.globals),
                *(v for _, v, _ in self.attributes)]
        read = [v for v in read if isinstance(v, torch.nn.Module)]
        self.modules = ModulesRead(read) if watch_modules and read else None

    @staticmethod
    def watchable(fn: Callable) -> bool:
        """A Python function, a method bound to an object, or an object whose class defines
        `__call__` in Python."""
        return isinstance(_function_and_owner(fn)[0], types.FunctionType)

    def refuse_traced(self) -> None:
        """After the trace: a tensor it left in what it reads is refused (`refuse_traced_reads`),
        or in an attribute of its object."""
        refuse_traced_reads(self.cells, self.globals, "the function")
        if self.owner is not None:
            refuse_traced_attributes(self.owner)

    def changed(self) -> str | None:
        """What changed, in words; None if nothing did."""
        changed = code_changed(self.cells, self.globals)
        if changed is not None:
            return changed
        if self.owner_class is not None and type(self.owner) is not self.owner_class:
            return f"the class of the {self.owner_class.__name__} object"
        changed = members_changed(self.members)
        if changed is not None:
            return changed
        for keywords, contents in self.bound:
            if not unchanged(keywords, keywords, contents):
                return "the keywords of the functools.partial"
        if self.attributes:
            now = vars(self.owner)
            for name, value, contents in self.attributes:
                if not unchanged(now.get(name, _GONE), value, contents):
                    return f"the attribute {name!r} of {type(self.owner).__name__}"
        return self.modules and self.modules.changed()

    def hook_dicts(self) -> list[dict]:
        """The hook dicts of the modules it reads, and the global ones, each once."""
        found = [d for a in (self.modules.attributes if self.modules else ()) for d in a.hook_dicts]
        return list({id(d): d for d in found}.values())


class ModulesRead:
    """The nn.Modules a compiled function reads besides its arguments, compared at each
    call: what `ModuleAttributes` compares, each submodule's train or eval mode (a compiled
    module's signature holds it), and which tensor each parameter and buffer name holds
    (a closed-over module's tensors are the graph's constants, read where they live). The
    last two in C loops (`map`), as `RegisteredNames`: the Python loop they replace took
    about 200 us a call over a 200-module model's registries (on a loaded machine)."""

    def __init__(self, values: list):
        found = {id(v): v for v in values if isinstance(v, torch.nn.Module)}
        self.attributes = [ModuleAttributes(m) for m in found.values()]
        self.modules = [m for a in self.attributes for m in a.modules]
        self.training = list(map(_TRAINING, self.modules))
        self.registries = [d for m in self.modules for d in (m._parameters, m._buffers)]
        self.count = sum(map(len, self.registries))
        held = [(d, name, value) for d in self.registries for name, value in d.items()]
        self.dicts, self.names, self.values = (list(column) for column in zip(*held)) \
            if held else ([], [], [])

    def changed(self) -> str | None:
        if list(map(_TRAINING, self.modules)) != self.training:
            return "the train or eval mode of a module it reads"
        if (sum(map(len, self.registries)) != self.count
                or not all(map(operator.contains, self.dicts, self.names))
                or not all(map(operator.is_, map(operator.getitem, self.dicts, self.names),
                               self.values))):
            return f"a parameter or buffer of the {self._holder()} it reads"
        for attributes in self.attributes:
            changed = attributes.changed()
            if changed is not None:
                return f"{changed} of a module it reads"
        return None

    def _holder(self) -> str:
        """The class of the first module whose registries changed (once per change)."""
        for m in self.modules:
            for d in (m._parameters, m._buffers):
                at_compile = [(n, v) for dd, n, v in zip(self.dicts, self.names, self.values)
                              if dd is d]
                if len(d) != len(at_compile) or any(d.get(n, _GONE) is not v
                                                    for n, v in at_compile):
                    return type(m).__name__
        return "module"  # not reached: the checks agree


_TRAINING = operator.attrgetter("training")


def code_reads(functions: list[types.FunctionType]) -> tuple[list, list]:
    """What `functions` read besides their arguments: (closure cells with their contents,
    globals as (their module's dict, name, value, items)), following the functions of the
    same module, and of the user's other modules, they call. A module read as a global is
    left out, but in one of the user's own, the names the code reads that the module holds
    (`helpers.EPS`, `helpers.normalize(x)`) are read too."""
    cells, reads, read, seen, todo = [], [], set(), set(functions), list(functions)
    while todo:
        f = todo.pop()
        own = [(name, cell, cell.cell_contents, contents_of(cell.cell_contents)) for name, cell
               in zip(f.__code__.co_freevars, f.__closure__ or ()) if _filled(cell)]
        cells += own
        definition = Definition(f)
        reads += [(definition, part, getattr(f, part), contents_of(getattr(f, part)))
                  for part in definition.parts()]
        names = sorted(global_names(f.__code__))
        scopes = [f.__globals__, *(vars(value) for _, _, value, _ in own  # a module imported
                                   if isinstance(value, types.ModuleType)  # in a function
                                   and _users_module(value))]
        while scopes:
            scope = scopes.pop()
            for name in names:
                if (id(scope), name) in read or name not in scope:
                    continue
                read.add((id(scope), name))
                value = scope[name]
                if isinstance(value, types.ModuleType):
                    if scope is f.__globals__ and _users_module(value):
                        scopes.append(vars(value))  # its attributes the code names
                    continue
                reads.append((scope, name, value, contents_of(value)))
                todo += _helpers(value, f, seen)
        for _, _, value, _ in own:  # a closed-over helper (a factory's inner function)
            todo += _helpers(value, f, seen)
    return cells, reads


def _helpers(value: Any, caller: types.FunctionType, seen: set) -> list[types.FunctionType]:
    """The functions a call of `value` runs that `code_reads` follows, not `seen` before
    (now marked): the same module's as `caller`, or another of the user's."""
    found = [h for h in _code_of(value) if h not in seen and (
        h.__globals__ is caller.__globals__ or _users_code(h))]
    seen.update(found)
    return found


def _code_of(value: Any) -> list[types.FunctionType]:
    """The functions a traced call of `value` runs: a function itself; a custom
    autograd.Function's forward and backward (the trace runs both: a global its backward
    reads, a schedule's factor, is baked in as much as forward's)."""
    if isinstance(value, types.FunctionType):
        return [value]
    if isinstance(value, type) and issubclass(value, torch.autograd.Function):
        methods = (getattr(m, "__func__", m) for m in vars(value).values())
        return [m for m in methods if isinstance(m, types.FunctionType)]
    return []


# Where the installed packages and the standard library lie: their functions' globals are
# not followed (a library's state is not the user's model; following it would watch much).
_LIBRARIES = tuple({*(sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib",
                                                         "platlib")),
                    *getattr(site, "getsitepackages", list)(),  # absent in old virtualenvs
                    site.getusersitepackages()})


def _users_code(fn: types.FunctionType) -> bool:
    """Is `fn` the user's own code: not torch's or aotgrad's, nor an installed package's?"""
    return _users_file(fn.__module__, fn.__code__.co_filename)


def _users_module(module: types.ModuleType) -> bool:
    return _users_file(module.__name__, getattr(module, "__file__", None))


def _users_file(module: str | None, filename: str | None) -> bool:
    if (module or "").split(".")[0] in ("torch", "aotgrad") or filename is None:
        return False
    return not filename.startswith(_LIBRARIES)


def code_changed(cells: list, reads: list) -> str | None:
    """Which of `code_reads`'s values changed, in words; None if none did."""
    for name, cell, value, contents in cells:
        try:
            now = cell.cell_contents
        except ValueError:  # emptied since
            return f"the closed-over {name!r}"
        if (now is not value or contents is not None) and not unchanged(now, value, contents):
            return f"the closed-over {name!r}"
    for names, name, value, contents in reads:
        now = names.get(name, _GONE)
        if (now is not value or contents is not None) and not unchanged(now, value, contents):
            if isinstance(names, Definition):
                return f"the {name} of {names.function.__qualname__}"
            return f"the global {name!r}"
    return None


def _function_and_owner(fn: Callable) -> tuple[Any, Any]:
    """The Python function a call runs, and the object it is bound to (None for a plain
    function)."""
    if isinstance(fn, types.MethodType):
        return fn.__func__, fn.__self__
    if isinstance(fn, types.FunctionType):
        return fn, None
    if _is_partial(fn):  # what it calls reads the same globals
        return _function_and_owner(fn.func)
    return getattr(type(fn), "__call__", None), fn  # a callable object


def _is_callable_object(fn: Callable, owner: Any) -> bool:
    return owner is not None and getattr(type(owner), "__call__", None) is fn


def _is_partial(fn: Callable) -> bool:
    return type(fn) is functools.partial and type(fn.keywords) is dict


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a variable of the enclosing function not assigned yet
        return False
    return True


def _hooked(dicts: list) -> list:
    return [(d, tuple(d)) for d in dicts if d]


@contextlib.contextmanager
def hooks_checked(hook_dicts: list):
    """Around a trace of a compiled module: a hook of the user's that stores a traced tensor
    where it can be read later (a list of features, a dict of gradients its closure or
    module globals hold) is refused. It runs once, on the trace's fake tensors, and never
    when the compiled module runs: the user would find fake tensors where eager leaves a
    call's values. Hooks whose effects are the tensors' own (a returned value,
    `requires_grad_()` on the output) are traced, as are torch's own hooks."""
    originals = [(hooks, dict(hooks)) for hooks in hook_dicts if hooks]
    for hooks, before in originals:
        for key, hook in before.items():
            if not _is_torchs(hook):
                hooks[key] = _checked(hook)
    try:
        yield
    finally:
        for hooks, before in originals:
            hooks.update(before)


def _checked(hook: Callable) -> Callable:
    @functools.wraps(hook)
    def checked(*args, **kwargs):
        out = hook(*args, **kwargs)
        if any(_holds_traced(obj) for obj in _reachable(hook)):
            name = getattr(hook, "__qualname__", type(hook).__qualname__)
            raise NotImplementedError(
                f"aotgrad: the module hook {name} keeps a tensor of the trace (in a list, a "
                "dict, an object it can reach): it runs once, while aotgrad.compile traces "
                "the module on fake tensors, and never when the compiled module runs. Use "
                "torch.compile(backend='aotgrad'), which runs it at each call.")
        return out
    return checked


def _reachable(hook: Callable) -> list:
    """What a hook can store into: its closure's cells, the globals its code names, the
    object it is bound to, a partial's arguments, and the hook itself where it is an object
    with a `__call__` (a logger whose list keeps what it is given)."""
    objects = []
    fn = hook
    if isinstance(fn, functools.partial):
        objects += [*fn.args, *fn.keywords.values()]
        fn = fn.func
    if not isinstance(fn, (types.FunctionType, types.MethodType)):
        objects.append(fn)  # a callable object: its attributes
    objects.append(getattr(fn, "__self__", None))
    fn = getattr(fn, "__func__", fn)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            objects.append(cell.cell_contents)
        except ValueError:  # empty cell
            pass
    code, names = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is not None:
        objects += [names[n] for n in code.co_names if n in names]
    return [o for o in objects if o is not None and not isinstance(o, torch.nn.Module)]


_LOOKED_AT_MOST = 10_000  # objects one check walks: a hook naming a large global stays cheap


def _holds_traced(obj: Any) -> bool:
    """Whether a traced tensor sits in `obj`: in its containers, or the attributes of a
    plain object of the user's, a few levels down (a log of (name, [gradients]) entries)."""
    stack, seen = [(obj, 4)], set()
    while stack and len(seen) < _LOOKED_AT_MOST:
        obj, depth = stack.pop()
        if isinstance(obj, torch.Tensor):
            if is_traced(obj):
                return True
            continue
        if depth == 0 or id(obj) in seen:
            continue
        seen.add(id(obj))
        stack += [(item, depth - 1) for item in _contained(obj)]
    return False


def _contained(obj: Any) -> Iterable:
    if isinstance(obj, dict):
        return obj.values()
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return obj
    if _is_plain_object(obj):
        return vars(obj).values()
    return ()


def _is_plain_object(obj: Any) -> bool:
    """An instance of a user's class: not a Python module, a class, a function, nor a torch
    object (an nn.Module's attributes are `refuse_traced_attributes`')."""
    module = type(obj).__module__
    return (hasattr(obj, "__dict__") and module != "torch" and not module.startswith("torch.")
            and not isinstance(obj, (types.ModuleType, type, types.FunctionType,
                                     types.MethodType, torch.nn.Module)))


def _is_torchs(hook: Callable) -> bool:
    """A hook torch registers (spectral_norm's, parametrizations'): its effects are traced."""
    hook = getattr(hook, "func", hook)  # functools.partial
    module = getattr(hook, "__module__", None) or type(hook).__module__
    return module == "torch" or module.startswith("torch.")


def refuse_traced_attributes(owner: Any) -> None:
    """Forward ran once, traced: a tensor it computed and stored in a plain attribute (the
    last attention map, for a later look) holds a traced tensor, not a call's values, and
    later calls would not store theirs. `owner`: a module (and its submodules), or the
    object a compiled method is bound to. (A module with a hook of torch's is left alone:
    its attributes are `hook_set_attributes`'.)"""
    owners = owner.modules() if isinstance(owner, torch.nn.Module) else [owner]
    for owner in owners:
        if isinstance(owner, torch.nn.Module) and _has_torchs_hook(owner):
            continue
        for name, value in getattr(owner, "__dict__", {}).items():
            if isinstance(value, torch.Tensor) and is_traced(value):
                raise NotImplementedError(
                    f"aotgrad: forward stores a tensor it computes in the attribute {name!r} "
                    f"of {type(owner).__name__}; aotgrad.compile runs forward's Python once, "
                    "when it traces, so the attribute would hold a traced tensor and no "
                    "call's values. Return the tensor, copy_ it into a registered buffer, or "
                    "use torch.compile(backend='aotgrad').")


def hook_set_attributes(modules: list[torch.nn.Module]) -> dict[tuple[int, str], torch.Tensor]:
    """The traced tensors that torch's hooks stored in plain attributes during a trace, by
    (index in `modules`, name): the weight that `prune`, `weight_norm` and `spectral_norm`
    compute before each forward. Eager leaves each call's weight there (a pruning script
    reads `module.weight` to count zeros); the compiled module returns them from its graph
    and sets them after each call, where the trace left fake tensors."""
    return {(i, name): value for i, m in enumerate(modules) if _has_torchs_hook(m)
            for name, value in vars(m).items()
            if isinstance(value, torch.Tensor) and is_traced(value)}


def _has_torchs_hook(module: torch.nn.Module) -> bool:
    return any(_is_torchs(hook) for name in _HOOK_DICTS for hook in getattr(module, name).values())


def refuse_traced_reads(cells: list, reads: list, who: str) -> None:
    """`who` ran once, traced: a tensor it computed and left where it can be read later
    (appended to a closed-over or global list, set in a dict) is a traced tensor, not a
    call's values, and later calls would not leave theirs."""
    # As they are now: the trace may have rebound one (`global CACHE; CACHE = [y]`).
    for kind, name, value in [*(("closed-over", n, c.cell_contents) for n, c, _, _ in cells
                                if _filled(c)),
                              *(("global", n, scope.get(n)) for scope, n, _, _ in reads)]:
        if _holds_traced(value):
            raise NotImplementedError(
                f"aotgrad: {who} leaves a tensor it computes in the {kind} {name!r}; "
                f"aotgrad.compile runs its Python once, when it traces, so {name!r} would "
                "hold a traced tensor and no call's values. Return the tensor, or use "
                "torch.compile(backend='aotgrad').")


def is_traced(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t) or torch._is_functional_tensor(t)
