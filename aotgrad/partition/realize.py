"""Saving what keeps a backward value inlined under Inductor's reuse rule.

Inductor writes out a value that several kernels read when its computation, with everything
it inlines, reads more than a few buffers (`memory.realized_on_reuse`). A recomputed forward
chain counts among those reads, and the min cut does not see it: it prices a recomputed
value at nothing when the values it is computed from are saved anyway.

ResNet-50's last ReLU feeds only the average pool, whose backward needs no value, so the
ReLU's backward needs its mask. Recomputed from values the backward holds anyway (the
convolution's output, the batch norm's statistics and weights, the residual), the mask
costs the min cut nothing. But the gradient through the ReLU then reads seven buffers and
has two readers (the batch norm's backward, the residual's gradient), so Inductor writes it
out: 12.25 MiB of bf16, alive at the backward's peak. Saving the 6.125 MiB mask keeps it
inlined, as torch's partitioner does (issue 20: our peak was 1.002x torch's).

The choice is checked against the backward's peak, simulated with the reuse rule: the same
rule at ResNet's stem (a 196 MiB float32 gradient written out, a 49 MiB mask that would
avoid it) is left alone, because the mask would be alive from the backward's start, where
the peak is.
"""

from __future__ import annotations

from typing import Sequence

from torch import fx

from .memory import (REALIZE_READS_THRESHOLD, Buffers, base_of, fused_in_kernels,
                     holds_tensors, is_alias, owners, program, realized_on_reuse, simulate,
                     tensor_bytes)

def saved_to_keep_inlined(order: list[fx.Node], forward: set[fx.Node],
                          grads: Sequence) -> list[fx.Node]:
    """Recomputed forward values to save besides those the backward running `order` reads:
    for each backward value that the reuse rule writes out, the recomputed values that it
    and the backward ops inlined into it read, where they have fewer bytes than it, and
    saving them keeps it inlined without raising the backward's simulated peak."""
    inlined = fused_in_kernels(order, kept=grads)
    written = realized_on_reuse(order, inlined)
    options = {value: frontier for value in order if value in written and value not in forward
               for frontier in [_frontier(value, inlined - written, forward)] if frontier}
    if not options:
        return []
    live = backward_live_bytes(order, inlined - written, grads)
    peak, position, chosen = max(live), {n: i for i, n in enumerate(order)}, {}
    for value, frontier in options.items():
        # Saved, the frontier is alive from the backward's start to the value's computation;
        # the value, no longer written, frees its bytes from there to its last reader.
        start, end = position[value], _last_reader(value, position)
        added = sum(_bytes(n) for n in frontier if n not in chosen)
        freed = _bytes(value)
        if max(max(live[:start], default=0) + added, max(live[start:end + 1]) - freed,
               max(live[end + 1:], default=0)) <= peak:
            live[:start] = [b + added for b in live[:start]]
            live[start:end + 1] = [b - freed for b in live[start:end + 1]]
            chosen.update(dict.fromkeys(frontier))
    return list(chosen)


def _frontier(value: fx.Node, inlined: frozenset, forward: set) -> list[fx.Node]:
    """The recomputed values whose saving keeps `value` inlined, if they have fewer bytes
    than it; else none."""
    frontier = _recomputed_read_by(value, inlined, forward)
    if sum(map(_bytes, frontier)) >= _bytes(value):
        return []
    if len(_reads(value, inlined - set(frontier))) > REALIZE_READS_THRESHOLD:
        return []
    return frontier


def _recomputed_read_by(value: fx.Node, inlined: frozenset, forward: set) -> list[fx.Node]:
    """The recomputed forward values that `value` and the backward ops (and views) inlined
    into it read."""
    found, stack, seen = [], [value], {value}
    while stack:
        for i in stack.pop().all_input_nodes:
            if i in seen:
                continue
            seen.add(i)
            if i in forward and i in inlined:
                found.append(i)
            elif i in inlined or is_alias(i):
                stack.append(i)
    return found


def _reads(value: fx.Node, inlined: frozenset) -> set[fx.Node]:
    """The buffers `value`'s computation reads, inlining the values of `inlined` (and looking
    through views), as `realized_on_reuse` counts them."""
    found, stack, seen = set(), [value], {value}
    while stack:
        for i in stack.pop().all_input_nodes:
            if i in seen:
                continue
            seen.add(i)
            if i in inlined or is_alias(i):
                stack.append(i)
            elif i.op != "call_function" or any(map(holds_tensors, i.all_input_nodes)):
                found.add(base_of(i))
    return found


def _last_reader(node: fx.Node, position: dict[fx.Node, int]) -> int:
    return max((position[u] for u in node.users if u in position), default=position[node])


def backward_live_bytes(order: list[fx.Node], fused: frozenset, grads: Sequence) -> list[int]:
    """Bytes alive after each op of a backward running `order` with the `fused` values
    computed inside their readers: the values it reads from outside (saved, tangents,
    inputs) are alive from its start, each until its last reader; graph inputs and
    gradients stay alive."""
    members, buffers = set(order), Buffers()
    held = list(dict.fromkeys(i for n in order for i in n.all_input_nodes if i not in members))
    for node in held:
        base = base_of(node)
        if base in buffers.owner:
            buffers.owner[node] = buffers.owner[base]
        else:
            buffers.owner[node] = buffers.new(base, _bytes(base))
    steps = program(order, buffers, fused=fused)
    grads = [g for g in grads if isinstance(g, fx.Node) and g in buffers.owner]
    keep = owners(buffers.owner, [*grads, *(n for n in held if n.op == "placeholder")])
    trace: list[int] = []
    simulate(steps, buffers.size, set(buffers.owner[n] for n in held), set(keep), trace)
    return trace


def _bytes(node: fx.Node) -> int:
    return tensor_bytes(node.meta.get("val"))
