"""The first level of the cache: a program keyed before its capture is analyzed and traced.

Where the compiled thing is a GraphModule (Dynamo's graph through `torch.compile(backend=
"aotgrad")`, `aot_function(gm)`, `aot_module_simplified(gm)`), its identity is its graph:
every call names a function whose name determines its code (an ATen op, a torch function,
`operator.add`), so the graph, canonicalized (nodes renamed by position), keys what a trace
of it produces, given the inputs' metadata, the options, the global state a trace reads and
the versions. A hit holds what the analysis and the trace learned (`FunctionInfo`,
`TraceFacts`, as JSON: cache/info.py) and names the entry keyed after the trace, which
holds the partition's graphs (one copy on disk): the compile skips analysis, trace, passes
and partition. An entry whose graphs' entry was evicted is a miss that says so.

A plain Python function's identity is not its code (what its globals, closures and callees
do is not in its source): it is keyed after its analysis, by the ops the analysis ran
(capture/oplog.py), with what the analysis found; a hit skips the trace, passes and
partition. Where the log is refused (Python code in the backward, constants...), the
compile keeps the key taken after the trace (cache/entry.py).
Where a graph cannot be keyed safely here (a call of a user's function, a submodule or a
constant tensor, a custom op, custom decompositions) or its analysis cannot be written down
(inputs sharing memory with a mutated one, an output view whose replay takes a symbolic
size; other output views' replays are written as their ATen view ops: cache/views.py), the
compile goes to the second level, and its event says why.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, Callable

import torch
from torch import fx

from ..capture.graph_runs import runs_its_graph
from ..schema import TraceFacts
from ..semantics import aliasing
from ..semantics.dynamic import is_symbolic
from . import codec, info as info_codec, key as keys, store, views
from .entry import decode_stored, partitioner_components, record

log = logging.getLogger("aotgrad.cache")
_TRUSTED_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_UNTRUSTED_MODULES = ("torch._dynamo",)  # compiled autograd's ops refer to per-process tables
_OP_NAMESPACES = ("aten", "prims")  # a custom op's name does not determine its code


class ProgramLookup:
    """The lookup keyed before the trace. `hit`: `info`, `facts` and `graphs` are set from
    the entry. Otherwise the build tells it what it learned (`learn`, `keep_graphs`) and the
    entry is written when the lookup closes without error. `note()` explains, for the
    second level's event, why this level did not hit."""

    def __init__(self, fn: Callable, c: Any, options: Any):
        self.hit = False
        self.graphs = None
        self.why_not: str | None = None  # not keyed, or refused: the reason
        self._store = self.key = self._payload = self._lock = None
        self._fake_mode, self._options = c.fake_mode, options
        self.keys_by_ops = False
        modes = keys.user_modes()
        if modes is not None:  # the trace runs the ops through them: the traced graph keys it
            self.why_not = f"not keyed before the trace: {modes} around the compile"
            return
        program = _program_of(fn)
        # A plain function is keyed by the ops its analysis logs (`after_analysis`).
        self.keys_by_ops = program is None and store.enabled() and not is_symbolic(c.fakes)
        if program is not None and store.enabled():
            self._key_and_open(lambda: _key(program_code(*program), c, options))

    def after_analysis(self, c: Any, ops: str | None, why: str | None) -> None:
        """Key a plain function by its analysis's op log (`ops`, capture/oplog.py), with
        what the analysis found: the entry then holds the trace's results too."""
        if ops is None:
            self.why_not = f"not keyed before the trace: {why}"
            return
        self._key_and_open(lambda: _ops_key(ops, c, self._options))

    def _key_and_open(self, make_key: Callable[[], keys.Key]) -> None:
        """Key this compile, then look the key up; a key that cannot be made says why."""
        try:
            self.key = make_key()
        except codec.Unencodable as exc:
            self.why_not = f"not keyed before the trace: {exc}"
            return
        except Exception as exc:  # a cache bug must cost a compile, never break one
            log.warning("aotgrad cache: could not key this compile (%r)", exc)
            return
        path = store.directory()
        if path is not None:
            self._store = store.Store(path)
            self._load()

    def _load(self) -> None:
        payload = self._store.read(self.key.digest)
        if payload is None and self._wait_for_others():
            payload = self._store.read(self.key.digest)
        if payload is None:
            self.why_not = "before the trace: " + keys.explain_miss(
                self.key.as_dict(), list(self._store.keys()))
            return
        if "refused" in payload:
            self.why_not = f"not cached before the trace: {payload['refused']}"
            self._store = None  # already says why: nothing to write
            self._release()
            return
        try:
            self.info = info_codec.decode(payload["info"])
            self.facts = info_codec.decode(payload["facts"])
            self.graphs = [decode_stored(rows, self._fake_mode, self._store, self._options)
                           for rows in self._graph_rows(payload)]
        except Exception as exc:  # an op this torch lacks, a damaged but checksummed entry
            log.warning("aotgrad cache: entry %s unusable (%s); compiling", self.key.digest, exc)
            self.why_not, self.graphs = f"before the trace: entry unusable ({exc})", None
            return
        self.hit = True
        self._release()
        record("hit", f"before the trace: {self.key.as_dict()['program']}")

    def _graph_rows(self, payload: dict) -> list:
        """The graphs live in the entry keyed after the trace (one copy on disk): read it
        (which also marks it used, for eviction)."""
        holder = self._store.read(payload["graphs_in"])
        if holder is None:
            raise LookupError("the entry holding its graphs is gone")
        return holder["graphs"]

    def _wait_for_others(self) -> bool:
        """Take this entry's lock, held until the lookup closes: processes compiling the
        same program at once trace it once. Whether another may have written it meanwhile."""
        self._lock = self._store.lock(self.key.digest)
        return self._lock.__enter__()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock, lock = None, self._lock
            lock.__exit__(None, None, None)

    def captured(self, c: Any) -> Any:
        """The capture `c` with what its analysis found, as the entry holds it."""
        return dataclasses.replace(c, info=self.info,
                                   aliasing=aliasing.plan_aliasing(c.inputs, self.info))

    def learn(self, c: Any, facts: TraceFacts) -> None:
        """The analysis and the trace of a miss, to store; or why they cannot be stored."""
        if self._store is None or self.hit:
            return
        reason = _unstorable(c)
        try:
            if reason is None:
                info = views.with_encodable_replays(c.info, c.fakes)
                self._payload = {"info": info_codec.encode(info),
                                 "facts": info_codec.encode(facts)}
        except codec.Unencodable as exc:
            reason = str(exc)
        except Exception as exc:  # a cache bug must cost an entry, never the compile
            log.warning("aotgrad cache: could not encode the analysis (%r)", exc)
            reason = f"the analysis could not be encoded ({exc!r})"
        if reason is not None:
            self._payload = {"refused": reason}
            self.why_not = f"not cached before the trace: {reason}"

    def keep(self, graphs) -> None:
        """A hit's graphs hold every mark already (the build calls this on misses only)."""

    def keep_graphs(self, digest: str) -> None:
        """The second level's entry that holds the partition's graphs (its miss or hit)."""
        if self._payload is not None and "refused" not in self._payload:
            self._payload["graphs_in"] = digest

    def note(self) -> str:
        return f"; {self.why_not}" if self.why_not else ""

    def __enter__(self) -> "ProgramLookup":
        return self

    def __exit__(self, exc_type, *_) -> None:
        payload, self._payload = self._payload, None
        try:
            if exc_type is not None or payload is None or self._store is None:
                return
            if "refused" not in payload and "graphs_in" not in payload:
                return  # the second level did not store either (it says why)
            holder = payload.get("graphs_in")
            self._store.write(self.key.digest, payload, self.key.as_dict(),
                              reads=(holder,) if holder else ())
        except Exception as exc:
            log.warning("aotgrad cache: could not write entry (%r)", exc)
        finally:
            self._release()


def _unstorable(c: Any) -> str | None:
    """Why what the analysis of `c` found cannot be held by an entry, if it cannot."""
    if c.stale is not None:
        return "an output whose backward reads a value modified in place (stale.py)"
    if c.aliasing is not None and c.aliasing.groups:
        return "inputs that share memory with a mutated input"
    if any(m is not None and m.subclass is not None for m in c.info.graph_output_metas):
        return "tensor subclass outputs"
    return None


# ---- the key ------------------------------------------------------------------------------

def _program_of(fn: Callable) -> tuple[fx.GraphModule, tuple[str, ...]] | None:
    """The graph `fn` runs, and the names of the module state it reads by get_attr (lifted
    into inputs by compat.aot_module_simplified, which marks its function so). None where
    a call runs other code than its graph (capture/inputs.py): keyed by the ops it ran."""
    if isinstance(fn, fx.GraphModule):  # run by its code where that is not its graph's
        return (fn, ()) if runs_its_graph(fn) else None
    return getattr(fn, "aotgrad_program", None)


def _key(program: str, c: Any, options: Any, found: list | None = None) -> keys.Key:
    inputs = [t for t in c.inputs]
    parts = [("format", store.FORMAT), ("kind", "program"), ("program", program),
             *(found or ()),
             ("call layout", f"{c.layout.in_spec} -> {c.layout.graph_input}"),
             ("constants", keys.sha(codec.encode_value(list(c.layout.constants))))]
    parts += [(f"input {i}", _describe(t)) for i, t in enumerate(inputs)]
    classes: dict = {}
    parts += [("input storages", str([classes.setdefault(k, i) for i, k in
                                       enumerate(aliasing.storage_keys(inputs))])),
              ("global state", global_state())]
    parts += partitioner_components(options.partition_fn)
    parts += keys.backend_components(options.backend)
    parts += [("decompositions", decompositions(options.backend.decompositions)),
              ("static inputs", str(options.static_inputs)),
              ("partitioner static inputs", str(options.partitioner_static_inputs)),
              ("keep_inference_input_mutations", str(options.keep_inference_input_mutations))]
    parts += keys.versions(t.device for t in inputs if isinstance(t, torch.Tensor))
    return keys.Key(tuple(parts))


def _ops_key(ops: str, c: Any, options: Any) -> keys.Key:
    """The key of a plain function: the ops its analysis ran, and what the analysis found."""
    reason = _unstorable(c)
    if reason is not None:
        raise codec.Unencodable(reason)
    found = info_codec.encode(views.with_encodable_replays(c.info, c.fakes))
    return _key(f"ops {ops}", c, options, [("function info", keys.sha(found))])


def _describe(t: Any) -> str:
    """An input as the key's other level says it, plus what the analysis reads of it."""
    flags = [name for name, on in (("parameter", isinstance(t, torch.nn.Parameter)),
                                   ("non-leaf", not getattr(t, "is_leaf", True)),
                                   ("view", isinstance(t, torch.Tensor) and t._is_view())) if on]
    return " ".join([keys.describe_input(t), *flags])


def program_code(gm: fx.GraphModule, state: tuple[str, ...] = ()) -> str:
    """The graph, nodes renamed by position, each call by a name that determines its code:
    `sha256:<digest> (<n> nodes)`. Unencodable where a call's name does not."""
    if type(gm.graph._codegen) is not fx.graph.CodeGen:  # a pytree codegen runs more code
        raise codec.Unencodable("a graph with its own code generator")
    renamed: dict[fx.Node, str] = {}
    rows = []
    for i, node in enumerate(gm.graph.nodes):
        renamed[node] = f"n{i}"
        ref = renamed.__getitem__
        rows.append([node.op, _target(node, state), codec.encode_value(node.args, ref),
                     [[k, codec.encode_value(v, ref)] for k, v in node.kwargs.items()]])
    return f"sha256:{keys.sha(rows)} ({len(rows)} nodes)"


def _target(node: fx.Node, state: tuple[str, ...]) -> str | None:
    if node.op in ("placeholder", "output"):
        return None
    if node.op == "call_method":
        return node.target
    if node.op == "get_attr" and node.target in state:
        return f"state:{node.target}"
    if node.op != "call_function":
        raise codec.Unencodable(f"a {node.op} node ({node.target}): its code or value is not "
                                "in the graph")
    return function_name(node.target)


def function_name(f: Any) -> str:
    """`op:aten::add.Tensor`, `torch.nn.functional.relu`: names that find `f` again."""
    if isinstance(f, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = f.name() if isinstance(f, torch._ops.OpOverload) else f._qualified_op_name
        if name.partition("::")[0] not in _OP_NAMESPACES:
            raise codec.Unencodable(f"a call of the custom op {name}")
        return f"op:{name}"
    module = getattr(f, "__module__", None) or \
        getattr(getattr(f, "__objclass__", None), "__module__", None)
    qualname = getattr(f, "__qualname__", None)
    # torch.cat's qualified name is `_VariableFunctionsClass.cat`; `torch.cat` finds it.
    for name in dict.fromkeys((qualname, getattr(f, "__name__", None))):
        if module and name and _trusted(module) and _resolve(module, name) is f:
            return f"{module}.{name}"
    raise codec.Unencodable(f"a call of {qualname or f!r} (module {module}), whose name "
                            "does not determine its code")


def _trusted(module: str) -> bool:
    return module.split(".")[0] in _TRUSTED_MODULES and \
        not module.startswith(_UNTRUSTED_MODULES)


def _resolve(module: str, qualname: str) -> Any:
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    except (ImportError, AttributeError):
        return None


def decompositions(table) -> str:
    """The decomposition table by its ops and functions' names; Unencodable where one has
    no name that finds it (a closure, a lambda: its code is the user's)."""
    from ..backends.compilers import INDUCTOR_DECOMPOSITIONS
    if table is None:
        return "None"
    if table is INDUCTOR_DECOMPOSITIONS:  # Inductor's, of this torch and its config
        return "inductor"
    try:
        named = sorted((function_name(op), function_name(fn)) for op, fn in table.items())
    except codec.Unencodable as exc:
        raise codec.Unencodable(f"custom decompositions ({exc})") from None
    return f"sha256:{keys.sha(named)} ({len(named)} ops)"


def global_state() -> str:
    """What a trace reads besides its inputs: grad mode, autocast, default dtype and the
    flags that choose kernels or decompositions. A graph keyed before its trace calls
    composite ops (`scaled_dot_product_attention`, `lstm`, `batch_norm`) whose ATen ops
    these flags choose; Dynamo does not guard all of them."""
    cuda = torch.backends.cuda
    state = {"grad": torch.is_grad_enabled(), "inference_mode": torch.is_inference_mode_enabled(),
             "default dtype": torch.get_default_dtype(),
             "default device": torch.get_default_device(),
             "deterministic": torch.are_deterministic_algorithms_enabled(),
             "autocast cache": torch.is_autocast_cache_enabled(),
             "matmul precision": torch.get_float32_matmul_precision(),
             "tf32": (torch.backends.cudnn.allow_tf32, cuda.matmul.allow_tf32),
             "sdp": tuple(_flag(cuda, name) for name in _SDP_FLAGS),
             "mkldnn, cudnn": (torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled),
             "mha fast path": torch.backends.mha.get_fastpath_enabled()}
    for device in ("cpu", "cuda"):
        state[f"autocast {device}"] = (torch.is_autocast_enabled(device) and
                                       torch.get_autocast_dtype(device))
    return ", ".join(f"{k} {v}" for k, v in state.items())


# Which SDPA kernel attention traces into, and whether its math decomposition upcasts
# half-precision inputs; each where this torch has it.
_SDP_FLAGS = ("flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled",
              "cudnn_sdp_enabled", "fp16_bf16_reduction_math_sdp_allowed")


def _flag(module, name: str):
    read = getattr(module, name, None)
    return read() if read is not None else None
