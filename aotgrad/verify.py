"""The invariants every graph aotgrad produces must hold. Tests run `verify` after each pass."""

from __future__ import annotations

from torch import fx

from .semantics.dynamic import is_size
from .schema import HELD_FOR_REPLAY
from .tables import ALLOWED_INPUT_MUTATIONS


class GraphInvariantError(AssertionError):
    pass


def verify(gm: fx.GraphModule, *, allow_input_mutation: bool = True) -> fx.GraphModule:
    """Topologically ordered, well formed, functional, every value carrying its fake value.

    The one mutation allowed (unless `allow_input_mutation=False`) is a copy of a new value
    into a graph input: buffers updated in place, as the runtime would do after the call."""
    gm.graph.lint()
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function") and "val" not in node.meta:
            _fail(gm, node, "has no meta['val']")
        if node.op == "call_function" and _is_mutating(node):
            if not (allow_input_mutation and _is_input_copy(node)):
                _fail(gm, node, "mutates its input; graphs must be functional")
    return gm


def verify_partition(fw: fx.GraphModule, bw: fx.GraphModule, num_fw_outputs: int, *,
                     allow_unread: bool = False) -> None:
    """Every saved value is produced by the forward and read by the backward (`allow_unread`:
    or not read, as a user's partitioner may leave it; torch runs such graphs too)."""
    verify(fw)
    verify(bw)
    saved = list(fw.graph.output_node().args[0])[num_fw_outputs:]
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    if len(bw_inputs) < len(saved):
        _fail(bw, None, f"takes {len(bw_inputs)} inputs but the forward saves {len(saved)}")
    for value, inp in zip(saved, bw_inputs):
        if not isinstance(value, fx.Node):
            _fail(fw, None, f"saves a non-node value {value!r}")
        # A saved size may only bind a symbol of the other inputs' shapes for the compiler;
        # a random value may be saved for a double backward's replay alone.
        if not inp.users and not allow_unread and not is_size(inp.meta.get("val")) \
                and not inp.meta.get(HELD_FOR_REPLAY):
            _fail(bw, inp, "is saved by the forward but never read by the backward")


def _is_mutating(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _is_input_copy(node: fx.Node) -> bool:
    return node.target in ALLOWED_INPUT_MUTATIONS and node.args[0].op == "placeholder"


def _fail(gm: fx.GraphModule, node: fx.Node | None, what: str):
    where = f"node {node.format_node()}" if node is not None else "graph"
    raise GraphInvariantError(f"{where} {what}\n{gm.code}")
