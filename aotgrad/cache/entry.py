"""One compile's look-up: its key, its entry if there is one, and the store of its result.

A warm entry holds the graphs the partition produced (forward and backward, or the
inference graph), each placeholder's metadata and the flags the runtime reads (donated
saved values, error checks' phase). A hit rebuilds them on fake values and skips the
backend's passes and the partition; the backend compiler then runs on them again, and
Inductor finds its own compiled code in its FX graph cache. What the runtime plan needs
besides comes from the capture and the trace, which run on every compile: they are the key.
This is the second level: a GraphModule is first looked up before its analysis and trace
(program.py), whose entry holds what they found; a miss there comes here after the trace.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch
from torch import fx

from ..backends.fxcache import fill_fake_values
from ..partition.budget import budget_of
from ..partition.remat import min_cut_rematerialization_partition
from ..partition.split import default_partition
from ..schema import DONATED, HELD_FOR_REPLAY, PHASE, RANDOM_VALUE, Partition, TraceFacts
from ..semantics.subclasses import is_subclass
from . import codec, fxkeys, key as keys, store

log = logging.getLogger("aotgrad.cache")
_EVENTS: list[tuple[str, str]] = []  # (event, why), the latest last
_KNOWN_PARTITIONERS = {default_partition: "default_partition",
                       min_cut_rematerialization_partition: "min_cut_rematerialization_partition"}


def events() -> list[tuple[str, str]]:
    """This process's recent cache events: ("hit" | "miss" | "bypass", why)."""
    return list(_EVENTS)


def forget_events() -> None:
    _EVENTS.clear()


def record(event: str, why: str) -> None:
    _EVENTS.append((event, why))
    del _EVENTS[:-100]
    store.count({"hit": "hits", "miss": "misses", "bypass": "bypasses"}[event])
    log.info("aotgrad cache %s: %s", event, why)


class Lookup:
    """Found (`graphs` set) or not; on a miss, `keep` records what to store, written when
    the lookup closes without error (after the forward compiled: a process waiting on this
    entry's lock then finds Inductor's code cached too)."""

    def __init__(self, kind: str, graph: fx.GraphModule | None, c: Any, options: Any,
                 program: Any = None, facts: TraceFacts | None = None):
        self.graphs: list[fx.GraphModule] | None = None
        self._store: store.Store | None = None
        self._payload: dict | None = None
        self._lock = None
        # The level keyed before the trace (program.py): told what the trace learned and
        # the graphs this level stores or finds; its reason for missing joins our event.
        self._program = program
        self._note = program.note() if program is not None else ""
        if program is not None:
            program.learn(c, facts)
        if not store.enabled() or graph is None:
            return
        try:
            self.key = _key(kind, graph, c, options)
        except codec.Unencodable as exc:
            self._record("bypass", f"not cacheable: {exc}")
            return
        except Exception as exc:  # a cache bug must cost a compile, never break one
            log.warning("aotgrad cache: could not key this compile (%r); compiling", exc)
            self._record("bypass", f"key error: {exc!r}")
            return
        path = store.directory()
        if path is None:
            self._record("bypass", "the cache directory is not trusted")
            return
        self._store = store.Store(path)
        self._fake_mode, self._options, self._traced = c.fake_mode, options, graph
        if self._load() or self._wait_for_others() and self._load():
            return
        self._record("miss", keys.explain_miss(self.key.as_dict(), list(self._store.keys())))

    def _record(self, event: str, why: str) -> None:
        record(event, why + self._note)

    def _load(self) -> bool:
        payload = self._store.read(self.key.digest)
        if payload is None:
            return False
        try:
            self.graphs = [decode_stored(rows, self._fake_mode, self._store, self._options)
                           for rows in payload["graphs"]]
            for gm in self.graphs:
                bind_traced_constants(gm, self._traced)
        except Exception as exc:  # an op this torch lacks, a damaged but checksummed entry
            log.warning("aotgrad cache: entry %s unusable (%s); compiling", self.key.digest, exc)
            return False
        self._record("hit", f"{self.key.as_dict()['program']}")
        self._share()
        self._release()
        return True

    def _wait_for_others(self) -> bool:
        """Take this entry's lock (waiting while another process compiles it); whether the
        entry may have appeared meanwhile."""
        self._lock = self._store.lock(self.key.digest)
        return self._lock.__enter__()

    def keep(self, graphs: Sequence[fx.GraphModule]) -> None:
        """Encode the partition's graphs now (a compiler may rewrite them in place)."""
        if self._store is None or self.graphs is not None:
            return
        try:
            self._payload = {"graphs": [encode(gm) for gm in graphs]}
            self._share()
            if uses_inductor(self._options):  # told the keys Inductor compiles them under
                for gm, rows in zip(graphs, self._payload["graphs"]):
                    fxkeys.attach(gm, self._store, rows)
        except codec.Unencodable as exc:
            self._record("bypass", f"not stored: {exc}")
        except Exception as exc:
            log.warning("aotgrad cache: could not encode this compile (%r)", exc)

    def _share(self) -> None:
        """Tell the level before the trace which entry holds the graphs (this one)."""
        if self._program is not None:
            self._program.keep_graphs(self.key.digest)

    def __enter__(self) -> "Lookup":
        return self

    def __exit__(self, exc_type, *_) -> None:
        try:
            if exc_type is None and self._payload is not None:
                self._store.write(self.key.digest, self._payload, self.key.as_dict())
        except Exception as exc:
            log.warning("aotgrad cache: could not write entry (%r)", exc)
        finally:
            self._payload = None
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.__exit__(None, None, None)
            self._lock = None


def bind_traced_constants(gm: fx.GraphModule, traced: fx.GraphModule) -> None:
    """A hit's graph holds copies of its tensor constants, decoded from the entry; the trace
    of this compile holds the tensors themselves (a closed-over tensor, a module's plain
    tensor attribute), which the user's code may change in place later, as eager and a cold
    compile see. Each is bound back by its name (the partition keeps them), its value checked
    as the key holds it. A constant the passes made (none of the trace's) stays as stored,
    as a cold compile's stays as made."""
    for node in gm.graph.find_nodes(op="get_attr"):
        copy, live = getattr(gm, node.target), getattr(traced, node.target, None)
        if live is None:
            continue
        if not (isinstance(live, torch.Tensor) and live.dtype == copy.dtype
                and live.shape == copy.shape and torch.equal(live.detach().cpu(), copy.cpu())):
            raise ValueError(f"its constant {node.target} is not the trace's")
        setattr(gm, node.target, live)


def _key(kind: str, graph: fx.GraphModule, c: Any, options: Any) -> keys.Key:
    """Raises `Unencodable` with the reason where the compile cannot be keyed safely."""
    if any(is_subclass(f) for f in c.fakes) or \
            any(m is not None and m.subclass is not None for m in c.info.graph_output_metas):
        raise codec.Unencodable("tensor subclass inputs or outputs")
    parts = [("format", store.FORMAT), ("kind", kind), ("program", keys.program(graph))]
    parts += [(f"input {i}", keys.describe_input(f)) for i, f in enumerate(c.fakes)]
    parts += [("function info", keys.sha(codec.fingerprint(c.info))),
              ("input aliasing", keys.sha(codec.fingerprint(c.aliasing)))]
    if kind == "training":
        parts += partitioner_components(options.partition_fn)
    parts += keys.backend_components(options.backend)
    parts += [("static inputs", str(options.static_inputs)),
              ("partitioner static inputs", str(options.partitioner_static_inputs)),
              ("keep_inference_input_mutations", str(options.keep_inference_input_mutations))]
    parts += keys.versions(f.device for f in c.fakes if isinstance(f, torch.Tensor))
    return keys.Key(tuple(parts))


def partitioner_components(fn: Callable) -> list[tuple[str, str]]:
    # Our partitioners weigh a float32 matmul's recomputation by the precision it runs at.
    precision = ("float32 matmul precision", torch.get_float32_matmul_precision())
    budget = budget_of(fn)
    if budget is not None:
        return [("partitioner", "budget_partition"), ("memory_budget", str(budget[0])),
                ("solver", str(budget[1])), precision]
    name = _KNOWN_PARTITIONERS.get(fn)
    if name is None:
        raise codec.Unencodable(f"a custom partitioner ({getattr(fn, '__qualname__', fn)})")
    return [("partitioner", name), ("memory_budget", "None"), precision]


# ---- graphs ------------------------------------------------------------------------------

def encode(gm: fx.GraphModule) -> list:
    rows = codec.encode_graph(gm, _stored_meta)
    first: dict[str, int] = {}  # a trace many nodes share is stored once, then by its row
    for i, meta in enumerate(row[5] for row in rows):
        trace = meta.get("trace")
        if trace in first:
            meta["trace"] = first[trace]
        elif trace is not None:
            first[trace] = i
    return rows


def _stored_meta(node: fx.Node) -> dict:
    meta = {}
    if node.op == "placeholder":
        meta["val"] = codec.encode_tensor_meta(node.meta.get("val"))
        for flag, name in ((DONATED, "donated"), (HELD_FOR_REPLAY, "held")):
            if node.meta.get(flag):
                meta[name] = True
    if PHASE in node.meta:
        meta["phase"] = node.meta[PHASE]
    if RANDOM_VALUE in node.meta:  # a drawn value a double backward's replay reuses
        meta["random"] = list(node.meta[RANDOM_VALUE])
    aten = node.meta.get("original_aten")  # the op Inductor names a kernel after
    if isinstance(aten, torch._ops.OpOverload):
        meta["aten"] = codec.encode_target(aten)
    if isinstance(node.meta.get("stack_trace"), str):  # the user's line, for a compiler that
        meta["trace"] = node.meta["stack_trace"]  # reads it (a hit's graphs had none)
    return meta


def decode(rows: list, fake_mode, fake_values: bool = True) -> fx.GraphModule:
    """The graph with its placeholders' fake values as stored, and (`fake_values`) every
    other node's computed from them (so that views share their base's fake storage, as
    when traced)."""
    gm = codec.decode_graph(rows)
    for node, row in zip(gm.graph.nodes, rows):
        meta = row[5]
        if node.op == "placeholder":
            node.meta["val"] = codec.fake_from_meta(meta["val"], fake_mode)
        if node.op == "get_attr":
            node.meta["val"] = fake_mode.from_tensor(getattr(gm, node.target))
        if meta.get("donated"):
            node.meta[DONATED] = True
        if meta.get("held"):
            node.meta[HELD_FOR_REPLAY] = True
        if "phase" in meta:
            node.meta[PHASE] = meta["phase"]
        if "random" in meta:
            node.meta[RANDOM_VALUE] = tuple(meta["random"])
        if "aten" in meta:
            node.meta["original_aten"] = codec.decode_target(meta["aten"])
        if "trace" in meta:  # or the row that holds it
            trace = meta["trace"]
            node.meta["stack_trace"] = rows[trace][5]["trace"] if isinstance(trace, int) \
                else trace
    if fake_values:
        fill_fake_values(gm, fake_mode)
    return gm


def decode_stored(rows: list, fake_mode, path: store.Store, options: Any) -> fx.GraphModule:
    """A hit's graph. Where Inductor compiles it and holds its code under a key we stored,
    the ops' fake values are left out: Inductor loads by the key and needs none, and the
    rest of the compile reads the placeholders' alone (its compiler computes them where
    the key is not found)."""
    if not uses_inductor(options):
        return decode(rows, fake_mode)
    gm = decode(rows, fake_mode, fake_values=False)
    found = fxkeys.attach(gm, path, rows).records
    if not (found and _defers_fake_values(options)):
        fill_fake_values(gm, fake_mode)
    return gm


def _compilers(options: Any) -> tuple:
    b = options.backend
    return b.fw_compiler, b.bw_compiler, b.inference_compiler


def uses_inductor(options: Any) -> bool:
    from ..backends.settings import is_inductor
    return any(is_inductor(c) for c in _compilers(options))


def _defers_fake_values(options: Any) -> bool:
    """Every graph goes to Inductor, none to CUDA graphs (whose checks read every value)."""
    from ..backends.settings import is_inductor
    return all(is_inductor(c) for c in _compilers(options)) and not options.cudagraphs


def partition_of(graphs: list[fx.GraphModule], num_fw_outputs: int) -> Partition:
    return Partition(graphs[0], graphs[1], num_fw_outputs)
