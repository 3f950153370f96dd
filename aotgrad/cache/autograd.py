"""Compiled autograd's graphs in the persistent cache: a captured backward, specialized for
one run's values, stored so that a second process skips the specialization trace.

The key: the captured program (its calls, each C++ formula by the name the engine binds it
under), every lifted tensor's metadata, the lifted sizes and scalars by value, and the
versions. The entry holds the specialized graph before its compiler saw it; a hit decodes
it, recomputes its fake values and compiles it again (Inductor then finds its own code).
A hit is served for exactly the keyed values: its guard compares them, built from this
run's values (the traced guard's clauses are not stored: nothing from an entry is ever
evaluated). Programs that call the user's Python (hooks, custom autograd.Function
backwards) or inline an aotgrad region's backward (its graph is no part of the program,
only of its ctx) are not cached; the bypass says which.
"""

from __future__ import annotations

import logging
import math
from typing import Callable, Sequence

import torch
from torch import fx

from ..autograd import hooks
from ..autograd.guard import exact_guard
from ..autograd.specialize import PLACEHOLDERS, Variant
from . import codec, key as keys, store
from .entry import record

log = logging.getLogger("aotgrad.cache")

# The program's calls a key cannot stand for: what they run is not in the graph.
_UNKEYABLE = {
    hooks.run_tensor_hook: "a tensor hook (register_hook)",
    hooks.run_node_pre_hook: "a grad_fn pre-hook",
    hooks.run_node_post_hook: "a grad_fn hook",
    hooks.run_post_accumulate_hook: "a post-accumulate-grad hook",
    hooks.run_cpp_tensor_hooks: "retain_grad",
    hooks.run_python_backward: "a custom autograd.Function's backward",
    hooks.run_region_backward: "an aotgrad region's backward (its graph is in its ctx, "
                               "not in the program)",
    hooks.run_unpack_hook: "a saved-tensor unpack hook",
}
# The Python functions a program or its specialization may call, by the name entries use.
_TARGETS = {f"aotgrad.autograd.{f.__name__}": f for f in (
    hooks.call_formula, hooks.accumulate_into, hooks.copy_slices_prologue,
    hooks.copy_slices_epilogue, hooks.add_gradients)}


def specialize(program: fx.GraphModule, args: Sequence,
               compiler: Callable[[fx.GraphModule], Callable],
               trace: Callable[..., Variant]) -> Variant:
    """`trace(program, args, compiler)` (specialize.specialize), served from the cache
    where this program was specialized for these values before, in any process."""
    lookup = _lookup(program, args)
    if lookup is None:
        return trace(program, args, compiler)
    path, key = lookup
    found = _load(path, key, args)
    if found is not None:
        return Variant(found, compiler(found), exact_guard(args))
    kept: list = []
    variant = trace(program, args, _keeping(compiler, kept))
    _store(path, key, kept)
    return variant


def _lookup(program: fx.GraphModule, args: Sequence) -> tuple[store.Store, keys.Key] | None:
    if not store.enabled():
        return None
    modes = keys.user_modes()
    if modes is not None:  # the trace runs the formulas' ops through them
        record("bypass", f"compiled autograd: not cacheable: {modes} around the backward")
        return None
    try:
        key = _key(program, args)
    except codec.Unencodable as exc:
        record("bypass", f"compiled autograd: not cacheable: {exc}")
        return None
    except Exception as exc:  # a cache bug must cost a trace, never break a backward
        log.warning("aotgrad cache: could not key this backward (%r); tracing it", exc)
        record("bypass", f"compiled autograd: key error: {exc!r}")
        return None
    path = store.directory()
    if path is None:
        record("bypass", "the cache directory is not trusted")
        return None
    return store.Store(path), key


def _key(program: fx.GraphModule, args: Sequence) -> keys.Key:
    for node in program.graph.nodes:
        if node.target in _UNKEYABLE:
            raise codec.Unencodable(_UNKEYABLE[node.target])
    inputs, sizes, scalars = args[:3]
    rows = codec.encode_graph(program, lambda n: {}, names=lambda i, n: f"n{i}",
                              targets=_TARGETS)
    parts = [("format", store.FORMAT), ("kind", "compiled autograd"),
             ("program", f"sha256:{keys.sha(rows)} ({len(rows)} nodes)")]
    parts += [(f"input {i}", keys.describe_input(t)) for i, t in enumerate(inputs)]
    parts += [("shared storages", _shared_storages(inputs)), ("sizes", str(list(sizes))),
              ("scalars", _scalars(scalars))]
    parts += keys.versions(t.device for t in inputs)
    return keys.Key(tuple(parts))


def _shared_storages(inputs: Sequence[torch.Tensor]) -> str:
    """The lifted tensors that share memory (the trace's fakes share it too), by position."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(inputs):
        groups.setdefault(t.untyped_storage().data_ptr(), []).append(i)
    return str([g for g in groups.values() if len(g) > 1])


def _scalars(scalars: Sequence) -> str:
    for s in scalars:
        if not isinstance(s, (bool, int, float)) or isinstance(s, float) and not math.isfinite(s):
            raise codec.Unencodable(f"a lifted scalar {s!r} (only finite numbers are keyed)")
    return repr(list(scalars))


def _keeping(compiler: Callable, kept: list) -> Callable:
    """The compiler, the graph encoded first (a compiler may rewrite it in place)."""
    def compile_and_keep(gm: fx.GraphModule) -> Callable:
        try:
            kept.append(codec.encode_graph(gm, lambda n: {}, targets=_TARGETS))
        except codec.Unencodable as exc:
            record("bypass", f"compiled autograd: not stored: {exc}")
        return compiler(gm)
    return compile_and_keep


def _load(s: store.Store, key: keys.Key, args: Sequence) -> fx.GraphModule | None:
    payload = s.read(key.digest)
    if payload is not None:
        try:
            gm = codec.decode_graph(payload["graph"], targets=_TARGETS)
            with_fake_values(gm, args)
        except Exception as exc:  # an op this torch lacks; a graph that no longer runs
            log.warning("aotgrad cache: entry %s unusable (%s); tracing", key.digest, exc)
        else:
            record("hit", f"compiled autograd: {key.as_dict()['program']}")
            return gm
    record("miss", "compiled autograd: " + keys.explain_miss(key.as_dict(), list(s.keys())))
    return None


def _store(s: store.Store, key: keys.Key, kept: list) -> None:
    if len(kept) != 1:  # not encodable, or the trace failed before its compiler ran
        return
    try:
        s.write(key.digest, {"graph": kept[0]}, key.as_dict())
    except Exception as exc:
        log.warning("aotgrad cache: could not write entry (%r)", exc)


def with_fake_values(gm: fx.GraphModule, args: Sequence) -> None:
    """`meta["val"]` on every node, as a trace leaves them (for compilers that read them):
    the graph run on fakes of this run's tensors, its Python calls stood in for."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [mode.from_tensor(t) for t in args[0]]
    placeholders = dict(zip(PLACEHOLDERS, (inputs, *args[1:])))
    with mode, torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                node.meta["val"] = placeholders[node.target]
            elif node.op == "call_function":
                fn = hooks.RESULT_LIKE.get(node.target, node.target)
                a, kw = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
                node.meta["val"] = fn(*a, **kw)
