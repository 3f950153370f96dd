"""Random values a double backward's replay takes from the compiled forward.

A backward with create_graph=True replays the function's ATen ops (double_backward.py). A
random op there must not draw again: eager's gradients use the numbers its forward drew.
Nor can the replay re-seed its way to them: backends draw differently from eager (Inductor
lowers random ops to its own generator). So the replay takes each random op's *value* from
the compiled forward instead of drawing it; random values carry no gradient, so using the
forward's is exact.

- While the joint graph is traced, `RandomValueTags` numbers the random ops the function
  calls, in order, and tags the joint node that holds each drawn output's value: after
  functionalization and the backend's decompositions (dropout's mask may be Inductor's
  `rand_like(x) > p`). `through_passes` carries the tags through the backend's graph passes.
- After partitioning, `hold_random_values` makes each such value a saved value of the
  forward. Most already are (dropout's backward reads its mask); one the backward does not
  read (noise added to an activation) is saved anyway; a first-order backward drops it
  from its arguments, and its compiled graph does not take it.
- The replay is traced with the same ops (under the python dispatcher, as the joint is) and
  `draw_from_forward` makes each random op run under `_ForwardValues`: a dispatch mode,
  below autograd, that hands out the forward's values instead of drawing. Autograd records
  the op as eager does (dropout's node saves the forward's mask); the replay draws nothing,
  so the generator's state after a double backward is eager's.

Cost, only for graphs with random ops: the drawn values the first-order backward would not
have saved stay alive until the backward, and the replay copies each value it uses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import fx
from torch._subclasses.functional_tensor import FunctionalTensor
from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
from torch.utils._python_dispatch import TorchDispatchMode

from ..backends.compilers import copy_graph
from ..tables import DRAWN_OPS, written_arguments
from ..schema import HELD_FOR_REPLAY, RANDOM_OP, RANDOM_VALUE

aten = torch.ops.aten


def is_random(target) -> bool:
    return (isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags)


def draws(target, args: Sequence, kwargs: dict) -> bool:
    """A random op that draws at these arguments. Fused attention kernels are tagged random
    but draw only for dropout: without it, a replay that takes SDPA's math path where the
    compiled forward took a fused kernel (capture/kernel_choice.py) calls the same random
    ops, none."""
    if not is_random(target):
        return False
    schema = target._schema.arguments
    at = next((i for i, a in enumerate(schema) if a.name == "dropout_p"), None)
    if at is None:
        return True
    p = kwargs.get("dropout_p", args[at] if at < len(args) else schema[at].default_value)
    return p != 0


# ---- per op: which outputs are drawn, and how a replay computes the others ------------------

def _dropout_outputs(x: torch.Tensor, p: float, train: bool | None, *, drawn) -> tuple:
    """native_dropout's output given its mask, rounded as the device's kernel rounds it (in
    half precision the CPU kernel scales the mask first, CUDA's computes in float)."""
    (mask,) = drawn
    scale = (0.0 if p == 1 else 1.0 / (1.0 - p)) if train else 1.0
    if x.device.type == "cpu":
        return x * (mask.to(x.dtype) * scale), mask
    return aten.native_dropout_backward(x, mask, scale), mask


# Random ops that also compute from their inputs: op -> (positions of the drawn outputs, a
# function of the op's arguments and drawn values (`drawn=`) returning all its outputs).
PARTLY_DRAWN: dict[Any, tuple[tuple[int, ...], Callable]] = {
    aten.native_dropout.default: ((1,), _dropout_outputs),
}


def drawn_outputs(op) -> tuple[int, ...] | None:
    """The positions of `op`'s drawn outputs; None for a random op a replay cannot take
    from the forward (its other outputs depend on what it draws in a way not tabled)."""
    if op in PARTLY_DRAWN:
        return PARTLY_DRAWN[op][0]
    if op.overloadpacket in DRAWN_OPS:
        return tuple(range(len(op._schema.returns)))
    return None


# ---- tracing the joint: tag the values -----------------------------------------------------

class RandomValueTags(TorchDispatchMode):
    """Numbers the random ops a traced function calls and tags, in the graph being traced,
    the node holding each drawn output's value. Sits above functionalization, so it sees
    the ops the function calls, as a replay's trace does."""

    supports_higher_order_operators = True  # a cond or scan passes through as one op

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """The Dynamo that `scan` or `map` runs to capture its body must not see this mode:
        it would skip the body's frame, and keep skipping it in the user's eager calls."""
        return True

    def __init__(self):
        super().__init__()
        self.ops: list = []  # the random ops, in call order

    def wrap(self, fn: Callable) -> Callable:
        """`fn`, tagging its random ops (the forward's only: not the backward's)."""
        def tagged(*args):
            self.ops.clear()
            with self:
                return fn(*args)
        return tagged

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if draws(func, args, kwargs or {}):
            self._tag(func, out)
        return out

    def _tag(self, func, out) -> None:
        k = len(self.ops)
        self.ops.append(func)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for j in drawn_outputs(func) or ():
            node = _node_of(outs[j])
            if node is not None:
                node.meta[RANDOM_VALUE] = (k, j)


def _node_of(t: Any) -> fx.Node | None:
    if isinstance(t, FunctionalTensor):
        t = t.from_functional()
    if not isinstance(t, torch.Tensor):
        return None
    proxy = get_proxy_slot(t, get_proxy_mode().tracer, None)
    return None if proxy is None else proxy.proxy.node


def through_passes(gm: fx.GraphModule, passes: Callable) -> fx.GraphModule:
    """`passes(gm)` with the tagged values as extra outputs meanwhile: a pass that replaces
    a node (Inductor's seeded random ops) moves the output, not the tag."""
    values = [n for n in gm.graph.nodes if RANDOM_VALUE in n.meta]
    if not values:
        return passes(gm)
    tags = [n.meta[RANDOM_VALUE] for n in values]
    output = gm.graph.output_node()
    num_outputs = len(output.args[0])
    output.args = (tuple(output.args[0]) + tuple(values),)
    gm.recompile()
    gm = passes(gm)
    output = gm.graph.output_node()
    outs = list(output.args[0])
    output.args = (tuple(outs[:num_outputs]),)
    for node, tag in zip(outs[num_outputs:], tags):
        if isinstance(node, fx.Node):
            node.meta[RANDOM_VALUE] = tag
    gm.recompile()
    return gm


# ---- partitioning: save the values ---------------------------------------------------------

@dataclass(frozen=True)
class ForwardRandomValues:
    """The random ops the compiled forward ran, and where it saved their drawn values."""

    ops: tuple = ()  # every random op the function calls, in order
    saved_at: tuple = ()  # ((op index, output index), position among the saved tensors)

    def position(self, value: tuple[int, int]) -> int | None:
        return dict(self.saved_at).get(value)


def hold_random_values(fw: fx.GraphModule, bw: fx.GraphModule, num_fw_outputs: int,
                       ops: Sequence) -> ForwardRandomValues:
    """Make every tagged value the forward computes one of its saved tensors; the backward
    takes the ones it did not save as inputs it does not read."""
    output = fw.graph.output_node()
    outs = list(output.args[0])
    saved = outs[num_fw_outputs:]
    num_tensors = sum(isinstance(n.meta.get("val"), torch.Tensor) for n in saved)
    tensors, sizes = saved[:num_tensors], saved[num_tensors:]
    saved_at = {}
    for node in fw.graph.nodes:
        if RANDOM_VALUE in node.meta and isinstance(node.meta.get("val"), torch.Tensor):
            if node not in tensors:
                _add_backward_input(bw, len(tensors), node)
                tensors.append(node)
            saved_at[node.meta[RANDOM_VALUE]] = tensors.index(node)
    output.args = (tuple(outs[:num_fw_outputs] + tensors + sizes),)
    fw.recompile()
    bw.recompile()  # once: a large backward's code takes a tenth of a second to generate
    return ForwardRandomValues(tuple(ops), tuple(sorted(saved_at.items())))


def _add_backward_input(bw: fx.GraphModule, position: int, value: fx.Node) -> None:
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    if position < len(placeholders):
        where = bw.graph.inserting_before(placeholders[position])
    else:
        where = bw.graph.inserting_after(placeholders[-1])
    with where:
        node = bw.graph.placeholder(value.name)
    node.meta = {**value.meta, HELD_FOR_REPLAY: True}


def compile_without_held_values(compile: Callable[[fx.GraphModule], Callable],
                                bw: fx.GraphModule) -> Callable:
    """`compile(bw)`, but the compiler gets a copy of `bw` without the inputs held for a
    replay, and the compiled (boxed) backward drops them from its arguments. A first-order
    backward so frees them at its start, as it frees the forward's inputs (a compiled graph
    keeps its unused inputs to the end), and the compiler never sees an input it does not
    read (Inductor checks each input's address; a placeholder given None fails there)."""
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    held = [i for i, n in enumerate(placeholders) if n.meta.get(HELD_FOR_REPLAY)]
    if not held:
        return compile(bw)
    stripped = copy_graph(bw)
    for node in stripped.graph.find_nodes(op="placeholder"):
        if node.meta.get(HELD_FOR_REPLAY):
            stripped.graph.erase_node(node)
    stripped.recompile()
    backward = compile(stripped)

    def run(args: list):
        for i in reversed(held):
            del args[i]
        return backward(args)

    run._boxed_call = True
    return run


# ---- the replay: take the values -----------------------------------------------------------

class NotTakenFromForward(Exception):
    """A random op of a replay whose values the compiled forward does not hold."""


def draw_from_forward(graph: fx.Graph, forward: ForwardRandomValues) -> tuple[int, ...]:
    """Make each random op of a replay graph (numbered by its trace, `RANDOM_OP`) take its
    drawn values from new placeholders, after the others; returns the position of each
    among the forward's saved tensors. Raises NotTakenFromForward naming the op."""
    positions = []
    for node in [n for n in graph.nodes if draws(n.target, n.args, n.kwargs)]:
        positions += _take_values(graph, node, forward)
    return tuple(positions)


def _take_values(graph: fx.Graph, node: fx.Node, forward: ForwardRandomValues) -> list[int]:
    k, drawn = node.meta.get(RANDOM_OP), drawn_outputs(node.target)
    if k is None:
        raise NotTakenFromForward(f"{node.target}, called by a backward")
    if drawn is None:
        raise NotTakenFromForward(f"{node.target}, whose other outputs depend on its draw")
    positions = [forward.position((k, j)) for j in drawn]
    if None in positions:
        raise NotTakenFromForward(f"{node.target}, whose value the compiled forward drops")
    values = []
    for j in drawn:
        with graph.inserting_after(_last_placeholder(graph)):
            values.append(graph.placeholder(f"random_{k}_{j}"))
        values[-1].meta["val"] = _output_val(node, j)
    node.args = (tuple(values), *node.args)
    node.target = forward_values_for(node.target)
    return positions


def _last_placeholder(graph: fx.Graph) -> fx.Node:
    return [n for n in graph.nodes if n.op == "placeholder"][-1]


def _output_val(node: fx.Node, j: int):
    val = node.meta["val"]
    return val[j] if isinstance(val, (tuple, list)) else val


@functools.lru_cache(maxsize=None)
def forward_values_for(op) -> Callable:
    """`op`, taking its drawn outputs from its first argument instead of drawing them."""
    def take(values, *args, **kwargs):
        with _ForwardValues(op, values) as mode:
            out = op(*args, **kwargs)
        if not mode.handed_out:  # it drew below autograd under another name: never silently
            raise RuntimeError(f"aotgrad: the replay's {op} did not take the forward's values")
        return out
    take.__name__ = f"{op.__name__.replace('.', '_')}_from_forward"
    return take


class _ForwardValues(TorchDispatchMode):
    """Below autograd: `op` hands out the given values instead of drawing, written into
    the tensor it writes, or as copies (the replay may write to them; they are saved)."""

    def __init__(self, op, values: Sequence[torch.Tensor]):
        super().__init__()
        self.op = op
        self.values = values
        self.handed_out = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not self.op:  # not reached: the trace saw `op` itself below autograd
            return func(*args, **kwargs)
        self.handed_out = True
        written = _written(func, args, kwargs)
        if written is not None:  # bernoulli_, uniform_, out=: one output, the tensor written
            return written.copy_(self.values[0])
        drawn = tuple(v.clone() for v in self.values)
        if func in PARTLY_DRAWN:
            return PARTLY_DRAWN[func][1](*args, **kwargs, drawn=drawn)
        return drawn if len(drawn) > 1 else drawn[0]


def _written(func, args: tuple, kwargs: dict) -> torch.Tensor | None:
    written = written_arguments(func, args, kwargs)
    return written[0] if written else None
