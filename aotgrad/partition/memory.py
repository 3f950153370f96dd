"""Peak-memory model of a training step: buffer liveness over the forward, then the backward.

Each graph is a straight-line program, so memory at every step is the sum of the buffers
alive then. What the model assumes, so that a measurement can be compared with it
(`bench/` compares it with `torch.cuda.max_memory_allocated` on a GPU):

- every value that is not a view owns one buffer of `numel * element_size` bytes; a view
  (and a tuple element of a view op, and `_unsafe_view`) shares its base's buffer;
- a buffer is allocated when its op runs and freed right after the last op that reads it
  or any view of it, as the runtime does (boxed calls clear their inputs; the backward
  frees saved values as it goes); peak is taken after each allocation, before frees;
- parameters, buffers and user inputs are alive throughout; user outputs stay alive until
  the end of the backward (the loss is held); gradients stay alive once made; the
  tangents are alive from the start of the backward until their last use;
- saved values are alive from their op to the end of the forward and from the start of
  the backward to their last use there; values recomputed in the backward are made just
  before their first use (`schedule.backward_schedule`);
- a value made by a fusible op and read only by fusible ops (through views), and neither
  returned nor saved, owns no buffer: a fusing backend (Inductor) computes it inside the
  kernels that read it, so its readers read what it reads (`fused_in_kernels`). A GELU
  recomputed from its input, a loss's float32 upcast of the logits cost no memory of their
  own. (The eager backend fuses nothing: for it the estimate is a lower bound.) Inductor
  writes some of them out all the same (`realized_on_reuse`); only the partitioner's check
  of one choice models that (`realize`): the budget's peak rows (`ilp`) rely on a fused
  value extending the lives of what it reads;
- allocator rounding and caching, kernel workspaces and autograd's own bookkeeping are not
  modelled.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Sequence

import torch
from torch import fx

from ..semantics.dynamic import hint
from ..tables import VIEWS_IN_PRACTICE, Recompute, fuses_into_readers, recompute_class


@dataclass(frozen=True)
class MemoryEstimate:
    input_bytes: int  # parameters, buffers and user inputs: alive throughout
    saved_bytes: int  # new memory the forward keeps for the backward
    forward_peak_bytes: int
    backward_peak_bytes: int

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_peak_bytes, self.backward_peak_bytes)


def tensor_bytes(val) -> int:
    if isinstance(val, torch.Tensor):  # symbolic sizes count as in the example inputs
        return hint(val.numel()) * val.element_size()
    if isinstance(val, (tuple, list)):
        return sum(tensor_bytes(v) for v in val)
    if isinstance(val, dict):  # a user Triton kernel's functional wrapper: outputs by name
        return sum(tensor_bytes(v) for v in val.values())
    return 0


def is_alias(node: fx.Node) -> bool:
    """The node's value shares memory with its first argument."""
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (target.is_view
                                                          or target in VIEWS_IN_PRACTICE)


def is_tuple(node: fx.Node) -> bool:
    """The node returns several values, which its getitems take apart: a tuple, or the dict
    (by argument name) a user Triton kernel's functional wrapper returns. Never saved."""
    return isinstance(node.meta.get("val"), (tuple, list, dict))


def base_of(node: fx.Node) -> fx.Node:
    """The value whose buffer `node` lives in: itself, unless it is a view (or an element
    of a view op's tuple, such as `split`'s)."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], fx.Node) and (
            is_alias(node) or node.target is operator.getitem and is_alias(node.args[0])):
        node = node.args[0]
    return node


class Buffers:
    """Which buffer each value lives in (-1: none, a tuple), and how big each buffer is.

    Values are named by keys: the nodes themselves for one graph, or (phase, node) pairs
    when one joint graph's node is computed in both the forward and the backward."""

    def __init__(self, read_through_fused: bool = True):
        self.owner: dict[Hashable, int] = {}
        self.size: list[int] = []
        self.fused: dict[Hashable, frozenset[int]] = {}  # fused value -> the buffers it reads
        # False: a fused value's readers read nothing of it, so its inputs die at their own
        # last reader (a lower bound on any plan's liveness: the budget's forward rows).
        self.read_through_fused = read_through_fused

    def read_by(self, key: Hashable) -> frozenset[int]:
        """The buffers a reader of this value reads."""
        if key in self.fused:
            return self.fused[key] if self.read_through_fused else frozenset()
        return frozenset((self.owner[key],)) - {-1}

    def new(self, key: Hashable, nbytes: int) -> int:
        self.owner[key] = len(self.size)
        self.size.append(nbytes)
        return self.owner[key]

    def total(self, ids: Iterable[int]) -> int:
        return sum(self.size[i] for i in set(ids) if i >= 0)


Step = tuple[int, tuple[int, ...]]  # (the buffer the op allocates or -1, the buffers it reads)
Key = Callable[[fx.Node], Hashable]


def program(nodes: Sequence[fx.Node], buffers: Buffers, key: Key = lambda n: n,
            fused: frozenset = frozenset()) -> list[Step]:
    """Assign buffers to the values of `nodes` (in execution order) and list the steps.
    Values whose key already has a buffer (inputs carried over) allocate nothing, nor do
    the `fused` values and their views."""
    steps = []
    for node in nodes:
        made = -1
        k = key(node)
        reads = frozenset().union(*(buffers.read_by(key(i)) for i in node.all_input_nodes))
        if k not in buffers.owner and node.op != "output":
            if node in fused or _views_fused(node, buffers, key):
                buffers.owner[k] = -1
                buffers.fused[k] = reads
            else:
                made = _assign(node, k, buffers, key)
        steps.append((made, tuple(reads)))
    return steps


def _views_fused(node: fx.Node, buffers: Buffers, key: Key) -> bool:
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return first is not None and key(first) in buffers.fused and (
        is_alias(node) or node.target is operator.getitem)


def fused_in_kernels(nodes: Sequence[fx.Node], kept: Iterable[fx.Node] = ()) -> frozenset:
    """The values of `nodes` a fusing backend computes inside the kernels that read them:
    made by a fusible op, read (directly or through views) only by fusible ops among
    `nodes`, and not `kept` (an `output` node among `nodes` keeps what it returns)."""
    members, kept = set(nodes), set(kept)
    return frozenset(n for n in nodes if n.op == "call_function" and n not in kept
                     and fuses_into_readers(n.target) and read_only_in_kernels(n, members, kept))


# Inductor writes out a value that it would inline into more than one reader when its
# computation, with all it inlines, reads more than this many buffers: each reader would read
# them all again (`torch._inductor.config.realize_reads_threshold`).
REALIZE_READS_THRESHOLD = 4


def realized_on_reuse(nodes: Sequence[fx.Node], inlined: frozenset) -> frozenset:
    """The values of `inlined` that Inductor writes out all the same: read by more than one
    op of `nodes` (topologically ordered), with more than `REALIZE_READS_THRESHOLD` buffers
    read by their computation. Every other value of `nodes` is a buffer; a view reads what
    its base reads; a value made from no tensor (`full`, `iota`) reads nothing."""
    members = set(nodes)
    reads: dict[fx.Node, frozenset] = {}
    realized = set()
    for node in nodes:
        tensors = [i for i in node.all_input_nodes if holds_tensors(i)]
        if node.op == "call_function" and not tensors:
            reads[node] = frozenset()  # `full`, `iota`: index arithmetic inside the kernel
        elif node in inlined or node.op == "call_function" and (
                is_alias(node) or node.target is operator.getitem):
            reads[node] = frozenset().union(*(reads.get(i, {base_of(i)}) for i in tensors))
        else:
            reads[node] = frozenset((node,))
        if (node in inlined and len(reads[node]) > REALIZE_READS_THRESHOLD
                and sum(1 for u in node.users if u in members) > 1):
            realized.add(node)
            reads[node] = frozenset((node,))
    return frozenset(realized)


def holds_tensors(node: fx.Node) -> bool:
    """A tensor, or a tuple of them; not a size."""
    return isinstance(node.meta.get("val"), (torch.Tensor, tuple, list, dict))


def read_only_in_kernels(node: fx.Node, members: set, kept: set = frozenset()) -> bool:
    """Do only fusible ops among `members` read `node` (directly or through views not
    `kept`)?"""
    stack = [node]
    while stack:
        for user in stack.pop().users:
            if user not in members:
                continue
            kind = recompute_class(user.target) if user.op == "call_function" else None
            if kind == Recompute.FREE and user not in kept:
                stack.append(user)
            elif kind != Recompute.CHEAP:
                return False
    return True


def _assign(node: fx.Node, k: Hashable, buffers: Buffers, key: Key) -> int:
    """Give one value its buffer; return it if newly allocated, else -1."""
    owner = buffers.owner
    base = owner.get(key(node.args[0]), -1) if node.args and isinstance(node.args[0],
                                                                        fx.Node) else -1
    if node.op == "call_function" and base >= 0 and (
            is_alias(node) or node.target is operator.getitem):
        owner[k] = base  # a view, or an element of a view op's tuple (split, unbind)
        return -1
    if node.op == "call_function" and is_tuple(node):
        owner[k] = -1  # a tuple owns nothing; its getitems own its elements
        return -1
    return buffers.new(k, tensor_bytes(node.meta.get("val")))


def simulate(steps: Sequence[Step], size: Sequence[int], live: set[int], keep: set[int],
             trace: list[int] | None = None) -> int:
    """Run the steps; return the peak of live bytes. `live` (the buffers alive at the
    start) is updated in place; `trace`, if given, receives the live bytes after each
    step's allocation."""
    last: dict[int, int] = {b: 0 for b in live}
    for i, (made, reads) in enumerate(steps):
        if made >= 0:
            last.setdefault(made, i)
        for b in reads:
            last[b] = i
    deaths: dict[int, list[int]] = {}
    for b, i in last.items():
        if b not in keep:
            deaths.setdefault(i, []).append(b)
    current = peak = sum(size[b] for b in live)
    for i, (made, _) in enumerate(steps):
        if made >= 0 and made not in live:
            live.add(made)
            current += size[made]
            peak = max(peak, current)
        if trace is not None:
            trace.append(current)
        for b in deaths.get(i, ()):
            if b in live:
                live.discard(b)
                current -= size[b]
    return peak


@dataclass(frozen=True)
class TwoPhase:
    """A forward and a backward program over shared buffers, ready to simulate."""

    buffers: Buffers
    forward: list[Step]
    backward: list[Step]
    inputs: frozenset[int]
    user_outputs: frozenset[int]
    saved: frozenset[int]
    tangents: frozenset[int]
    grads: frozenset[int]

    def estimate(self, fw_trace: list | None = None, bw_trace: list | None = None
                 ) -> MemoryEstimate:
        size = self.buffers.size
        kept = self.inputs | self.user_outputs | self.saved
        fw_peak = simulate(self.forward, size, set(self.inputs), kept, fw_trace)
        live = set(kept | self.tangents)
        bw_peak = simulate(self.backward, size, live, self.inputs | self.user_outputs
                           | self.grads, bw_trace)
        saved = self.saved - self.inputs - self.user_outputs
        return MemoryEstimate(self.buffers.total(self.inputs), self.buffers.total(saved),
                              fw_peak, bw_peak)


def chain_peak(estimates: Sequence[MemoryEstimate]) -> int:
    """The peak of graphs that run one after another (a model Dynamo split at graph breaks):
    the forwards in order, then the backwards in reverse. While a graph runs, the graphs
    before it hold their inputs and saved values; what it returns to the next is counted in
    both (its user outputs, the next one's inputs) only from the next one's start."""
    held, peak = 0, 0
    for estimate in estimates:
        peak = max(peak, held + estimate.peak_bytes)
        held += estimate.input_bytes + estimate.saved_bytes
    return peak


def estimate_peak(fw: fx.GraphModule, bw: fx.GraphModule, num_fw_outputs: int) -> MemoryEstimate:
    """Estimated peak bytes of one forward+backward with this partition."""
    return two_phase(fw, bw, num_fw_outputs).estimate()


def two_phase(fw: fx.GraphModule, bw: fx.GraphModule, num_fw_outputs: int) -> TwoPhase:
    buffers = Buffers()
    fw_nodes = list(fw.graph.nodes)
    forward = program(fw_nodes, buffers, fused=fused_in_kernels(fw_nodes))
    owner = buffers.owner
    outs = [o for o in fw.graph.output_node().args[0]]
    saved_outs = outs[num_fw_outputs:]
    bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
    for ph, value in zip(bw_inputs, saved_outs):
        owner[ph] = owner[value]
    bw_nodes = list(bw.graph.nodes)
    backward = program(bw_nodes, buffers, fused=fused_in_kernels(bw_nodes))
    return TwoPhase(
        buffers, forward, backward,
        inputs=owners(owner, [n for n in fw_nodes if n.op == "placeholder"]),
        user_outputs=owners(owner, outs[:num_fw_outputs]),
        saved=owners(owner, saved_outs),
        tangents=owners(owner, bw_inputs[len(saved_outs):]),
        grads=owners(owner, bw.graph.output_node().args[0]))


def owners(owner: dict, values: Iterable, key: Key = lambda n: n) -> frozenset[int]:
    return frozenset(owner[key(v)] for v in values if isinstance(v, fx.Node)) - {-1}
