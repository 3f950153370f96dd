"""Rematerialization: save the fewest bytes for the backward, recomputing cheap values.

The saved set is a minimum cut of the joint graph. Every forward value `v` becomes an edge
`v.in -> v.out` whose capacity is what saving `v` costs (its buffer's bytes); data flows
along infinite edges. The source feeds what must come from the forward (inputs, and ops
too expensive or unsafe to recompute, per `tables.recompute_class`); the sink is the
backward. Any cut separating them is a valid choice of saved values, and the backward
recomputes the forward values that lie past it, each just before its first use.

Activation checkpointing binds the cut. `torch.utils.checkpoint` with a selective policy
(`create_selective_checkpoint_contexts`) tags every op of the region with
`node.meta["recompute"]` while aotgrad traces; a MUST/PREFER_SAVE value comes from the
forward and a MUST/PREFER_RECOMPUTE value is recomputed, except a region's outputs (which
the code after the region may save, as eager does) and values a second run would change
(random ops). A plain non-reentrant checkpoint recomputes its region by construction: the
backward part of the joint graph holds the second run of the region.
"""

from __future__ import annotations

import itertools
import operator
from typing import Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.utils.flop_counter import flop_registry
from torch.utils.checkpoint import CheckpointPolicy

from ..semantics.dynamic import hint
from .flow import FlowNetwork
from ..schema import OVERWRITTEN, Joint
from .memory import base_of, fused_in_kernels, is_tuple, tensor_bytes
from .realize import saved_to_keep_inlined
from .schedule import as_early_as_possible, backward_schedule, is_view
from .split import ancestors, is_narrowing_cast, joint_of, split_joint
from ..tables import (BUDGETED_KERNELS, CHEAP_REDUCTIONS, SCALINGS, KERNEL_FLOPS_PER_BYTE,
                     KERNEL_LAUNCH_BYTES, TF32_FLOPS_PER_BYTE, Recompute, recompute_class,
                     unsafe_to_recompute)

SOURCE, SINK = "source", "sink"


class Rule:
    """What a partitioner may do with one forward value."""

    INPUT = "input"  # a graph input: alive anyway, so saving it is free
    OVERWRITTEN = "overwritten"  # an input the runtime overwrites: never saved
    FREE = "free"  # a view or tuple element: recomputed from its base at no cost
    CHOOSE = "choose"  # cheap: saved or recomputed, whichever the plan prefers
    # Cheap, but recomputing it costs more than a fused pass: a reduction (it re-reads its
    # whole input); a value a backward matmul or convolution reads with too little
    # arithmetic to hide its recomputation (the backward would write it out again); a
    # small value a fusible op broadcasts (recomputed once per element of the larger one);
    # a value the backward would keep alive across a matmul (min_cut_saved_values); a value
    # whose recomputation would make Inductor write a larger backward value out (`realize`).
    # The min cut saves it (speed first); a memory budget may recompute it.
    MATERIALIZED = "materialized"
    # Expensive (a matmul or convolution, `tables.BUDGETED_KERNELS`): the min cut saves it; a
    # memory budget below 1 may recompute it, at its arithmetic's cost (`node_cost`).
    COSTLY = "costly"
    SAVE = "save"  # comes from the forward: expensive, random, effectful, or policy
    RECOMPUTE = "recompute"  # recomputed: inside a selectively checkpointed region


CHECKPOINT_POLICY_RULES = {
    CheckpointPolicy.MUST_SAVE: Rule.SAVE,
    CheckpointPolicy.PREFER_SAVE: Rule.SAVE,
    CheckpointPolicy.MUST_RECOMPUTE: Rule.RECOMPUTE,
    CheckpointPolicy.PREFER_RECOMPUTE: Rule.RECOMPUTE,
}


def hoist_narrow_copies(j: Joint) -> None:
    """Move each mask or narrowing cast the backward computes from forward values (and the
    views it reads) to just after what it reads: a forward that saves it computes it there,
    while the value it reads is alive anyway, not at its end. Only moves nodes: `j` stays
    right."""
    copies = j.forward - j.computed_forward
    if copies:
        order = as_early_as_possible(list(j.module.graph.nodes), copies)
        for before, node in zip(order, order[1:]):
            before.append(node)
        j.module.recompile()


def forward_rules(j: Joint) -> dict[fx.Node, str]:
    """The `Rule` of every value the forward may compute. A narrowing cast the backward makes
    of forward values (`split.with_narrow_copies`) is saved only where that spares bytes:
    the backward made it before it was a candidate, and would make it again."""
    rules = {node: rule_of(node, j.forward) for node in j.forward}
    for node in j.forward - j.computed_forward:
        if is_narrowing_cast(node) and rules[node] == Rule.MATERIALIZED:
            rules[node] = Rule.CHOOSE
    return rules


def rule_of(node: fx.Node, forward: set[fx.Node]) -> str:
    if node.op == "placeholder":
        return Rule.OVERWRITTEN if node.meta.get(OVERWRITTEN) else Rule.INPUT
    if any(i.meta.get(OVERWRITTEN) for i in node.all_input_nodes if i.op == "placeholder"):
        return Rule.SAVE  # a recomputation would read the overwritten value
    kind = recompute_class(node.target)
    if kind == Recompute.FREE:
        return Rule.FREE
    if unsafe_to_recompute(node.target):
        return Rule.SAVE
    policy = CHECKPOINT_POLICY_RULES.get(node.meta.get("recompute"))
    if policy == Rule.SAVE or (policy == Rule.RECOMPUTE and not _leaves_region(node, forward)):
        return policy
    if kind != Recompute.CHEAP:
        return Rule.COSTLY if node.target in BUDGETED_KERNELS else Rule.SAVE
    if (node.target in CHEAP_REDUCTIONS or _read_by_backward_kernel(node, forward)
            or _broadcast_by_fusible_user(node)):
        return Rule.MATERIALIZED
    return Rule.CHOOSE


def _read_by_backward_kernel(node: fx.Node, forward: set[fx.Node]) -> bool:
    """Does a non-fusible backward op (matmul, convolution, attention) read this value,
    directly or through views, with too little arithmetic to hide a recomputation of it?"""
    return any(not _hides(kernel, node) for kernel in backward_kernels_reading(node, forward))


def backward_kernels_reading(node: fx.Node, forward: set[fx.Node]) -> list[fx.Node]:
    """The non-fusible backward ops that read this value, directly or through views."""
    found, stack = [], list(node.users)
    while stack:
        user = stack.pop()
        if user.op != "call_function":
            continue
        kind = recompute_class(user.target)
        if kind == Recompute.FREE:
            stack.extend(user.users)
        elif user not in forward and kind == Recompute.NEVER:
            found.append(user)
    return found


# The share of a kernel's time a recomputation of one of its inputs may take, hidden.
HIDDEN_SHARE = 0.05


def _hides(kernel: fx.Node, node: fx.Node) -> bool:
    """Would recomputing `node`, a kernel of its own, take less time than `kernel` does
    arithmetic in a HIDDEN_SHARE of its time? Its time: the bytes it moves and its launch.
    (An MLP's float32 activations before a large matmul: yes; a transformer's bfloat16
    layer-norm output before a projection, or the bfloat16 cast of a small weight: no.)"""
    flops = kernel_flops(kernel)
    cost = node_cost(node) + KERNEL_LAUNCH_BYTES
    return flops is not None and (
        cost * _flops_per_byte(kernel.meta["val"].dtype) < HIDDEN_SHARE * flops)


def kernel_flops(kernel: fx.Node) -> int | None:
    """The floating-point operations of a matmul, convolution or attention (None for an op
    without a formula)."""
    formula = flop_registry.get(getattr(kernel.target, "overloadpacket", None))
    val = kernel.meta.get("val")
    if formula is None or not isinstance(val, torch.Tensor):
        return None
    args, kwargs = pytree.tree_map_only(fx.Node, lambda n: n.meta.get("val"),
                                        (kernel.args, kernel.kwargs))
    try:
        return hint(formula(*args, **kwargs, out_val=val))
    except Exception:  # a formula that cannot read these arguments
        return None


def _flops_per_byte(dtype: torch.dtype) -> int:
    if dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest":
        return TF32_FLOPS_PER_BYTE
    return KERNEL_FLOPS_PER_BYTE.get(dtype, max(KERNEL_FLOPS_PER_BYTE.values()))


def node_cost(node: fx.Node) -> int:
    """What recomputing `node` costs, in bytes moved: the bytes it reads and writes (nothing
    for a view), and for a matmul or convolution the bytes that move in the time of its
    arithmetic."""
    if recompute_class(node.target) == Recompute.FREE:
        return 0
    reads = sum(tensor_bytes(i.meta.get("val")) for i in node.all_input_nodes)
    moved = reads + tensor_bytes(node.meta.get("val"))
    if node.target in BUDGETED_KERNELS:
        moved += (kernel_flops(node) or 0) // _flops_per_byte(node.meta["val"].dtype)
    return moved


# A fusible user this many times larger than a value makes recomputing it that much dearer.
BROADCAST_FACTOR = 8
BROADCAST_SEARCH = 32  # users looked at per value: keeps the pass linear


def _broadcast_by_fusible_user(node: fx.Node) -> bool:
    """Does a cheap op read this value at BROADCAST_FACTOR times its size, directly or through
    views and smaller pointwise ops that would fuse with it? (Layer norm's statistics, labels
    padded for a loss.) Values made from no tensor (constants, `iota`) cost nothing per element
    and are not counted."""
    if not node.all_input_nodes or _a_scaling(node):
        return False
    limit = BROADCAST_FACTOR * _numel(node)
    stack, seen = list(node.users), set()
    while stack and len(seen) < BROADCAST_SEARCH:
        user = stack.pop()
        if user in seen or user.op != "call_function":
            continue
        seen.add(user)
        kind = recompute_class(user.target)
        if kind == Recompute.CHEAP and _numel(user) >= limit:
            return True
        if kind == Recompute.FREE or (kind == Recompute.CHEAP
                                      and user.target not in CHEAP_REDUCTIONS):
            stack.extend(user.users)
    return False


def _a_scaling(node: fx.Node) -> bool:
    """An op of `SCALINGS` of one tensor no larger than its result: recomputed in a reader,
    it reads that tensor in its place."""
    tensors = [i for i in node.all_input_nodes if isinstance(i.meta.get("val"), torch.Tensor)]
    return (node.target in SCALINGS and len(tensors) == 1
            and _numel(tensors[0]) <= _numel(node))


def _numel(node: fx.Node) -> int:
    val = node.meta.get("val")
    return hint(val.numel()) if isinstance(val, torch.Tensor) else 0


def _leaves_region(node: fx.Node, forward: set[fx.Node]) -> bool:
    """Is this checkpointed value read after its region (by an untagged forward op, or as
    an output)? Views and tuple elements are looked through."""
    stack = list(node.users)
    while stack:
        user = stack.pop()
        if user.op == "output":
            return True
        if user not in forward:
            continue
        if recompute_class(user.target) == Recompute.FREE:
            stack.extend(user.users)
        elif user.meta.get("recompute") is None:
            return True
    return False


# ---- the minimum cut ----------------------------------------------------------------------

def min_cut_rematerialization_partition(joint_module: fx.GraphModule, _joint_inputs=None,
                                        compiler: str = "inductor", *, num_fwd_outputs: int,
                                        static_lifetime_input_indices=None,
                                        static_lifetime_input_nodes=None):
    """Forward and backward graphs that save a minimum-byte set of values."""
    saved = min_cut_saved_values(joint_module, num_fwd_outputs)
    return split_recomputing_late(joint_module, num_fwd_outputs, saved)


def min_cut_saved_values(joint: fx.GraphModule, num_fwd_outputs: int) -> list[fx.Node]:
    """The saved values of a minimum-byte cut, among the cuts whose recomputed values stay
    inside the backward's fused kernels."""
    j = joint_of(joint, num_fwd_outputs)
    forward, tangents, grads, bw_roots = j.forward, j.tangents, j.grads, j.bw_roots
    rules, unwritten = forward_rules(j), unwritten_unless_saved(j)
    for refinement in range(REFINEMENTS + 1):
        saved = _min_cut(joint, forward, rules, grads, tangents, bw_roots, unwritten)
        if refinement == REFINEMENTS:
            break  # the last refinement's choices, cut
        spanning = [n for n in recomputed_across_kernels(joint, forward, saved, tangents, bw_roots)
                    if rules[n] == Rule.CHOOSE]  # not what a checkpoint policy decided
        spanning = saved_below_peak(spanning, joint, forward, saved, tangents, bw_roots, grads)
        order = _schedule(joint, forward, saved, tangents, bw_roots)
        inlined = [n for n in saved_to_keep_inlined(order, forward, grads)
                   if rules[n] == Rule.CHOOSE]
        if not spanning and not inlined:
            break
        stop = set(saved) | set(tangents)
        rules.update(dict.fromkeys(to_materialize(spanning, kernel_inputs(
            joint, forward, rules, stop, bw_roots), stop), Rule.MATERIALIZED))
        rules.update(dict.fromkeys(inlined, Rule.MATERIALIZED))
    return saved_as_read(saved, forward, rules, set(tangents), bw_roots)


def saved_as_read(saved: list[fx.Node], forward: set[fx.Node], rules: dict[fx.Node, str],
                  tangents: set[fx.Node], bw_roots) -> list[fx.Node]:
    """Each saved value that the backward reads only through a chain of views to fewer
    dimensions, replaced by the flattest of them (same buffer, same bytes), as torch's
    partitioner saves it. Saved whole, a 4-D value upstream of a convolution (ConvNeXt's
    [N, H, W, C] layer-norm and GELU outputs) gets channels-last strides from Inductor's
    layout optimization, a transposed order: the forward then writes it transposed and the
    backward copies it back to flatten it for its matmul (issue 20: two more kernels a
    block). A flattened value keeps the strides it was traced with. An input keeps its own
    strides: it is saved as it is."""
    needed = ancestors(bw_roots, stop=set(saved) | tangents)
    return list(dict.fromkeys(_flattest_read(n, forward, rules, needed) for n in saved))


def _flattest_read(node: fx.Node, forward, rules, needed) -> fx.Node:
    best = node
    if node.op == "placeholder":
        return node
    while True:
        readers = [u for u in node.users if u in needed]
        if not (len(readers) == 1 and readers[0] in forward and rules.get(readers[0]) == Rule.FREE
                and readers[0].all_input_nodes == [node] and not is_tuple(readers[0])):
            return best
        node = readers[0]
        if _ndim(node) < _ndim(best):
            best = node


def _ndim(node: fx.Node) -> int:
    val = node.meta.get("val")
    return val.dim() if isinstance(val, torch.Tensor) else 0


# Refinements per partition at most: each marks the recomputed values that span an unfusible
# kernel, and the next cut saves them. A residual stream is taken a few layers a round (its
# exchanges come alone): ViT-S/16 needs 5 rounds to save all 12 layers', and with 3, whose
# last round's marks were left uncut, it rebuilt 3 layers' stream from up to 10 saved pieces
# in its backward (0.11 ms more kernel time on an H200, issue 20). Most models stop at 1 or 2.
REFINEMENTS = 8


def to_materialize(spanning: list[fx.Node], inputs: list[fx.Node], stop: set[fx.Node]
                   ) -> list[fx.Node]:
    """The values to save so that the `spanning` ones no longer outlive a backward kernel.
    A spanning value is often recomputed before a kernel only to build that kernel's input
    (a layer norm's output, for the weight gradient of the matmul after it), and read again
    after it (by the layer norm's backward). Saving that input, where it has fewer bytes
    than the spanning values it is built from, moves their recomputation past the kernel:
    torch's partitioner saves the same. The other spanning values are saved themselves."""
    spans, chosen, covered = set(spanning), [], set()
    for node in inputs:
        feeds = (ancestors([node], stop=stop) & spans) - covered
        if feeds and _bytes(node) < sum(map(_bytes, feeds)):
            chosen.append(node)
            covered |= feeds
    return chosen + [n for n in spanning if n not in covered]


def kernel_inputs(joint, forward, rules, stop, bw_roots) -> list[fx.Node]:
    """The recomputed CHOOSE values that a backward matmul, convolution or attention reads,
    directly or through views, in graph order."""
    needed = ancestors(bw_roots, stop=stop)
    found = set()
    for node in needed:
        if node not in forward and _is_unfusible(node):
            found.update(base_of(i) for i in node.all_input_nodes)
    return [n for n in joint.graph.nodes
            if n in found and n in needed and n not in stop and rules.get(n) == Rule.CHOOSE]


def _bytes(node: fx.Node) -> int:
    return tensor_bytes(node.meta.get("val"))


def _min_cut(joint, forward, rules, grads, tangents, bw_roots, unwritten) -> list[fx.Node]:
    network, infinity = _network(joint, forward, rules, set(grads), unwritten)
    # Of the cuts of least bytes, the latest: it leaves the backward the least to recompute.
    value, reachable = network.min_cut(SOURCE, SINK, latest=True)
    assert value < infinity, "min-cut: the checkpoint policies and the op table conflict"
    cut = {n for n in forward if (n, "in") in reachable and (n, "out") not in reachable}
    # Zero-cost edges may be cut without being needed; keep what the backward reads.
    needed = ancestors(bw_roots, stop=cut | set(tangents))
    return [n for n in joint.graph.nodes if n in cut and n in needed]


def recomputed_across_kernels(joint, forward, saved, tangents, bw_roots) -> list[fx.Node]:
    """Recomputed values that the backward would keep alive across a matmul, convolution
    or attention. Such a value cannot fuse into its users: it is a buffer of its own, and
    a chain of them (a residual stream, recomputed layer by layer) is rebuilt whole at the
    backward's start. The min cut's cost, bytes saved, does not see that."""
    order = _schedule(joint, forward, saved, tangents, bw_roots)
    position = {n: i for i, n in enumerate(order)}
    unfusible = list(itertools.accumulate(map(_is_unfusible, order), initial=0))
    spanning = []
    for node in order:
        if node in forward and node.op == "call_function":
            last = _last_use(node, position)
            if unfusible[last] - unfusible[position[node] + 1] > 0:
                spanning.append(node)
    return spanning


def _schedule(joint, forward, saved, tangents, bw_roots) -> list[fx.Node]:
    """The backward's ops in the order they run; saved values are its inputs, computed by
    nothing in it."""
    stop = set(saved) | set(tangents)
    needed = ancestors(bw_roots, stop=stop)
    return backward_schedule([n for n in joint.graph.nodes if n in needed and n not in stop],
                             forward)


def saved_below_peak(spanning, joint, forward, saved, tangents, bw_roots, grads
                     ) -> list[fx.Node]:
    """The `spanning` values that the forward may save without raising the backward's peak.
    Saved, a value is alive from the backward's start, with everything else saved; recomputed,
    only across its span, after the backward has freed what it read before. Where the span
    lies at the peak (a residual stream rebuilt at the backward's start, ALBERT's head), saving
    it costs no memory and spares a buffer the backward would write and read again; further
    on, where the backward has freed more than the value's bytes (EfficientNet's squeeze-and-
    excitation, whose block input spans its two small convolutions), saving it would add its
    bytes to the peak, and torch's partitioner recomputes it too (issue 20).

    Saving a value also frees the saved values the backward read only to recompute it
    (`_exchanged`). Where they have as many bytes (Swin-T's stream values for its branch
    outputs), the exchange saves no more: such exchanges are taken first, under the same
    check, and alone when there are any, since they change what the backward recomputes (a
    drop-path scale recomputed for the stream no longer spans a kernel): the next cut sees
    the rest. Otherwise each value is judged as a plain save, an exchange that adds bytes
    too (ViT's float32 stream for its bfloat16 branch outputs): the peak this check models
    holds only the saved values, the gradients and the spans, so it is trusted no further."""
    order = _schedule(joint, forward, saved, tangents, bw_roots)
    position = {n: i for i, n in enumerate(order)}
    live = _live_bytes(order, position, saved, grads, spanning)
    spanning = sorted(spanning, key=position.__getitem__)
    return (_exchanges(spanning, live, position, saved, set(tangents), bw_roots)
            or _below(spanning, live, position))


def _below(spanning, live, position) -> list[fx.Node]:
    """The values that fit, saved one after the other, below the peak of `live`."""
    peak, chosen = max(live, default=0), []
    for node in spanning:
        changed = _saving(node, [], live, position)
        if max(changed, default=0) <= peak:
            chosen.append(node)
            live = changed
    return chosen


def _exchanges(spanning, live, position, saved, tangents, bw_roots) -> list[fx.Node]:
    """The values whose saving frees as many bytes of saved values, taken one after the
    other where they keep below the peak of `live`."""
    peak, chosen, stop = max(live, default=0), [], set(saved) | tangents
    for node in spanning:
        freed = _exchanged(node, saved, stop, bw_roots)
        if not freed or sum(map(_bytes, _by_base(freed))) < _bytes(node):
            continue
        changed = _saving(node, freed, live, position)
        if max(changed, default=0) <= peak:
            chosen.append(node)
            live = changed
            stop = (stop - set(freed)) | {node}
    return chosen


def _saving(node, freed, live, position) -> list[int]:
    """`live` with `node` alive from the backward's start and the `freed` buffers gone."""
    changed = list(live)
    for base, views in _by_base(freed).items():
        end = max(_last_use(v, position) for v in views)
        changed[:end + 1] = [b - _bytes(base) for b in changed[:end + 1]]
    start = position[node]
    changed[:start] = [b + _bytes(node) for b in changed[:start]]
    return changed


def _exchanged(node, saved, stop, bw_roots) -> list[fx.Node]:
    """The saved values that the backward would no longer read were `node` saved too: those
    it reads only to recompute `node` (a residual stream's branch output, saved to rebuild
    the stream, where the stream itself has as many bytes: Swin-T, issue 20). A buffer is
    freed when none of its views is read. A scaling (`_a_scaling`) frees only its input,
    which costs the backward one instruction a reader to scale, and would cost the forward
    a kernel of its own to write it (a drop-path's scale in place of its mask): no exchange."""
    if _a_scaling(node):
        return []
    needed = ancestors(bw_roots, stop=stop | {node})
    kept = {base_of(n) for n in saved if n in stop and n in needed}
    return [n for n in saved if n in stop and n not in needed and base_of(n) not in kept
            and base_of(n).op != "placeholder"]


def _by_base(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    found: dict[fx.Node, list[fx.Node]] = {}
    for node in nodes:
        found.setdefault(base_of(node), []).append(node)
    return found


def _live_bytes(order, position, saved, grads, spanning) -> list[int]:
    """Bytes alive at each step of the backward: the saved buffers until their last reader,
    the gradients once made, the `spanning` recomputed values across their span."""
    delta = [0] * (len(order) + 1)
    spans = {base_of(n): (0, _last_use(n, position)) for n in saved}
    spans.update({base_of(g): (position[g], len(order) - 1) for g in grads
                  if isinstance(g, fx.Node) and g in position})
    spans.update({n: (position[n], _last_use(n, position)) for n in spanning})
    for node, (start, end) in spans.items():
        if node.op != "placeholder" and end >= start:
            delta[start] += _bytes(node)
            delta[end + 1] -= _bytes(node)
    return list(itertools.accumulate(delta[:-1]))


def _is_unfusible(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is not operator.getitem
            and recompute_class(node.target) == Recompute.NEVER)


def _last_use(node: fx.Node, position: dict[fx.Node, int]) -> int:
    """The position of the last op reading `node`, directly or through views (its own for
    an op no one reads; -1 for a value from outside the schedule no one reads)."""
    last, stack = position.get(node, -1), [node]
    while stack:
        for user in stack.pop().users:
            if user in position:
                last = max(last, position[user])
                if is_view(user):
                    stack.append(user)
    return last


def _network(joint, forward, rules, grads, unwritten) -> tuple[FlowNetwork, int]:
    # More than any cut of finite edges: the sum of them all (surcharges, ties included).
    infinity = 1 + sum(3 * tensor_bytes(base_of(n).meta.get("val")) + 4 for n in forward)
    net = FlowNetwork()
    for node in joint.graph.nodes:
        if node not in forward:
            continue
        rule = rules[node]
        net.add_edge((node, "in"), (node, "out"), _save_cost(node, rule, infinity, unwritten))
        if rule in (Rule.INPUT, Rule.OVERWRITTEN, Rule.SAVE, Rule.COSTLY, Rule.MATERIALIZED):
            net.add_edge(SOURCE, (node, "in"), infinity)
        for user in node.users:
            if user in forward:
                net.add_edge((node, "out"), (user, "in"), infinity)
            elif user.op == "call_function":
                net.add_edge((node, "out"), SINK, infinity)
        if node in grads:
            net.add_edge((node, "out"), SINK, infinity)
    return net, infinity


TIE_BREAK = {Rule.CHOOSE: 0, Rule.MATERIALIZED: 0, Rule.COSTLY: 1, Rule.SAVE: 1, Rule.FREE: 2}
# A scaling of one tensor as large (`mask / keep`) that neither pass would write spares no
# recomputation worth a write: a tie goes to its input, which a kernel writes anyway (a small
# value's write surcharge rounds to nothing: Swin-T's forward wrote 22 drop-path scales in
# kernels of their own).
SCALING_TIE = 2
CHOICES = (Rule.CHOOSE, Rule.MATERIALIZED, Rule.COSTLY)  # the rules a memory budget may decide


# Saving a value that neither pass would otherwise write (the forward's kernels and, were it
# recomputed, the backward's keep it in registers) adds a write to the forward: a surcharge
# of 1/WRITE_SHARE of its bytes, which decides between cuts of nearly equal bytes. A language
# model's loss: its log-softmax output (bf16) against the logits the matmul writes anyway
# plus two per-row statistics, 32 KiB more. Saved, the logits' buffer is the one the
# backward overwrites with their gradient; the log-softmax, laid out by Inductor with padded
# rows, was 4 elements too short for it (DeBERTa-v2: a second 1001 MB buffer at the
# backward's peak). A value a backward matmul reads is written by one pass or the other.
WRITE_SHARE = 256


def unwritten_unless_saved(j: Joint) -> frozenset[fx.Node]:
    """The forward values a fusing compiler computes inside the kernels that read them, in
    the forward and (recomputed) in the backward: only fusible ops read them, and the forward
    does not return them; and the narrowing casts of the backward's that no backward kernel
    reads, which the forward makes only to save them."""
    computed = [n for n in j.module.graph.nodes if n in j.computed_forward]
    returned = {n for n in j.fw_outputs if isinstance(n, fx.Node)}  # not a constant (slice)
    candidates = fused_in_kernels(computed, kept=returned) | (j.forward - j.computed_forward)
    return frozenset(n for n in candidates if not backward_kernels_reading(n, j.forward))


def _save_cost(node: fx.Node, rule: str, infinity: int, unwritten: frozenset) -> int:
    """Twice the bytes kept alive, a surcharge for a value the forward would not otherwise
    write, and a tie-breaker: among equal costs save the value that spares the most
    recomputation (a cheap op's result over its expensive input), and a base over a view
    of it. A view keeps its whole base alive, so it costs the base."""
    if rule == Rule.INPUT:
        return 0  # alive anyway
    if rule in (Rule.OVERWRITTEN, Rule.RECOMPUTE) or is_tuple(node):
        return infinity
    base = base_of(node)
    size = tensor_bytes(base.meta.get("val"))
    if base not in unwritten:
        return 2 * size + TIE_BREAK[rule]
    return 2 * size + size // WRITE_SHARE + TIE_BREAK[rule] + (
        SCALING_TIE if _a_scaling(base) else 0)


# ---- the backward's schedule --------------------------------------------------------------

def split_recomputing_late(joint: fx.GraphModule, num_fwd_outputs: int,
                           saved: Sequence[fx.Node]) -> tuple[fx.GraphModule, fx.GraphModule]:
    """`split_joint`, the backward recomputing each forward value just before its first
    use: in joint order they would all run, and be alive, at its start."""
    forward = joint_of(joint, num_fwd_outputs).forward
    return split_joint(joint, num_fwd_outputs, saved,
                       lambda nodes: backward_schedule(nodes, forward))
