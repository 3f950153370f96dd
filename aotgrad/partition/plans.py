"""The plans a partitioner chooses between, and what each one costs.

A plan is a choice of saved values; the backward recomputes the other forward values it
reads. Plans are scored by the estimated peak of the whole step (`memory`) and by the
compute they add (`node_cost`: bytes read and written, since cheap ops are bound by memory
traffic). `PlanSpace` holds what every plan of one joint graph shares, so that scoring a
plan is one pass over the joint graph: no graph modules are built, but the programs
simulated are exactly those `remat.split_recomputing_late` would produce.

Solvers (`budget`) search the canonical plans: those named by the set of `Rule.CHOOSE`
values they recompute. Views are recomputed from their bases (which are saved instead),
tuple elements go with their tuple, and the bound rules (SAVE, RECOMPUTE) are obeyed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import fx

from .memory import Buffers, MemoryEstimate, TwoPhase, fused_in_kernels, owners, program
from .split import ancestors, joint_of
from .remat import CHOICES, Rule, forward_rules, min_cut_saved_values, node_cost
from .schedule import backward_schedule


@dataclass(frozen=True)
class Plan:
    saved: tuple[str, ...]
    recomputed: tuple[str, ...]  # forward values the backward computes again
    memory: MemoryEstimate
    recompute_cost: int  # bytes read and written by the recomputation

    @property
    def peak_bytes(self) -> int:
        return self.memory.peak_bytes


class PlanSpace:
    """Everything the plans of one joint graph share."""

    def __init__(self, joint: fx.GraphModule, num_fwd_outputs: int, kernels: bool = True):
        """`kernels`: may plans recompute matmuls and convolutions (`Rule.COSTLY`)?"""
        self.joint, self.num_fwd_outputs = joint, num_fwd_outputs
        j = joint_of(joint, num_fwd_outputs)
        self.primals, self.tangents, self.fw_outs, self.grads = \
            j.primals, j.tangents, j.fw_outputs, j.grads
        self.fw_roots, self.bw_roots = j.fw_roots, j.bw_roots
        self.nodes = list(joint.graph.nodes)
        self.position = {node: i for i, node in enumerate(self.nodes)}
        self.forward = j.forward
        self.rules = forward_rules(j)
        if not kernels:
            self.rules.update((n, Rule.SAVE) for n, r in self.rules.items() if r == Rule.COSTLY)
        self.base_forward = ancestors(self.fw_roots) | set(self.primals)
        self.fixed = self._fixed_backward()
        self.read_by_fixed = self._read_by_fixed()
        # Forward values a backward could ever read, and the free choices among them.
        self.reachable = ancestors(self.read_by_fixed, stop=set(self.primals)) & self.forward
        self.candidates = [n for n in self.nodes
                           if n in self.reachable and self.rules[n] in CHOICES]
        self.mincut = min_cut_saved_values(joint, num_fwd_outputs)

    def _fixed_backward(self) -> list[fx.Node]:
        """The ops every backward runs, those not in the forward that the gradients need, in
        the order they run (views deferred, as in every plan's backward)."""
        needed = ancestors(self.bw_roots, stop=self.forward)
        return backward_schedule([n for n in self.nodes if n in needed and n.op == "call_function"
                                  and n not in self.forward], self.forward)

    def _read_by_fixed(self) -> set[fx.Node]:
        reads = {i for n in self.fixed for i in n.all_input_nodes if i in self.forward}
        return reads | {g for g in self.grads if g in self.forward}

    # ---- plans -----------------------------------------------------------------------

    def saved_for(self, chosen: Iterable[fx.Node]) -> list[fx.Node]:
        """The saved values of the canonical plan recomputing the CHOOSE values `chosen`."""
        chosen = set(chosen)
        memo: dict[fx.Node, bool] = {}
        saved, seen = set(), set()
        stack = list(self.read_by_fixed)
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if self._recomputed(node, chosen, memo):
                stack.extend(node.all_input_nodes)
            else:
                saved.add(node)
        return [n for n in self.nodes if n in saved]

    def _recomputed(self, node: fx.Node, chosen: set, memo: dict) -> bool:
        if node not in memo:
            rule = self.rules[node]
            if rule == Rule.FREE and node.target is operator.getitem:
                memo[node] = self._recomputed(node.args[0], chosen, memo)
            else:
                memo[node] = rule in (Rule.FREE, Rule.RECOMPUTE) or (
                    rule in CHOICES and node in chosen)
        return memo[node]

    def evaluate(self, saved: Sequence[fx.Node]) -> Plan:
        """Score the plan that saves `saved` (as `split_recomputing_late` would run it)."""
        saved_set = set(saved)
        needed = ancestors(self.bw_roots, stop=saved_set | set(self.tangents))
        missing = [n.name for n in needed if n.op == "placeholder" and n not in saved_set
                   and n not in self.tangents]
        assert not missing, f"plan: {missing} are needed but not saved"
        recomputed = [n for n in self.nodes if n in needed and n in self.forward
                      and n not in saved_set and n.op != "placeholder"]
        two_phase = self.programs(saved, needed)
        return Plan(tuple(n.name for n in saved), tuple(n.name for n in recomputed),
                    two_phase.estimate(), sum(map(node_cost, recomputed)))

    def forward_base(self) -> tuple[list[fx.Node], list, Buffers, frozenset, frozenset]:
        """The forward program when nothing is saved, its fused values extending no input's
        life: (nodes, steps, buffers, input buffers, output buffers); the last step is the
        output."""
        buffers = Buffers(read_through_fused=False)
        nodes = [n for n in self.nodes if n in self.base_forward]
        steps = program(nodes, buffers, fused=fused_in_kernels(nodes, kept=self.fw_outs))
        steps.append((-1, tuple(owners(buffers.owner, self.fw_outs))))
        return (nodes, steps, buffers, owners(buffers.owner, self.primals),
                owners(buffers.owner, self.fw_outs))

    def backward_floor(self) -> tuple[int, list[tuple[int, int]], list[frozenset]]:
        """Live bytes in the backward not counting forward values (inputs and outputs
        excepted): at its start, and after each allocating op `k` of `self.fixed`; and the
        forward values each op `k` reads (through the values fused into it)."""
        saved = [n for n in self.nodes if n in self.read_by_fixed]
        needed = set(self.fixed) | set(self.tangents) | set(saved)
        two_phase = self.programs(saved, needed)
        size = two_phase.buffers.size
        for b in two_phase.saved - two_phase.inputs - two_phase.user_outputs:
            size[b] = 0
        trace: list[int] = []
        two_phase.estimate(bw_trace=trace)
        start = sum(size[b] for b in two_phase.inputs | two_phase.user_outputs
                    | two_phase.saved | two_phase.tangents)
        offset = len(saved) + len(self.tangents)
        steps = [(k, trace[offset + k]) for k in range(len(self.fixed))
                 if two_phase.backward[offset + k][0] >= 0]
        held: dict[int, list[fx.Node]] = {}  # buffer -> the saved values in it
        for v in saved:
            held.setdefault(two_phase.buffers.owner[v], []).append(v)
        readers = [frozenset(v for b in two_phase.backward[offset + k][1] for v in held.get(b, ()))
                   for k in range(len(self.fixed))]
        return start, steps, readers

    def programs(self, saved: Sequence[fx.Node], needed: set) -> TwoPhase:
        """The forward and backward programs of a plan, over shared buffers."""
        buffers = Buffers()
        saved_set = set(saved)
        # What the forward runs: its outputs' ancestors, and the saved values with theirs (a
        # tuple's element, a mask the backward would have computed).
        computed = self.base_forward | ancestors(saved, stop=self.base_forward)
        fw_nodes = [n for n in self.nodes if n in computed]
        forward = program(fw_nodes, buffers, fused=fused_in_kernels(fw_nodes,
                                                                   kept=[*self.fw_outs, *saved]))
        ordered_saved = sorted(saved, key=lambda n: not _is_tensor(n))  # as split_joint
        bw_body = [n for n in self.nodes if n in needed and n.op != "placeholder"
                   and n not in saved_set]
        body = backward_schedule(bw_body, self.forward)

        def bw_key(node):
            return node if node in saved_set else ("bw", node)
        # Saved values come in as placeholders: in the forward's buffers, reading nothing.
        bw_nodes = [*self.tangents, *body]
        bw_steps = [(-1, ())] * len(saved) + program(
            bw_nodes, buffers, bw_key, fused_in_kernels(bw_nodes, kept=self.grads))
        owner = buffers.owner
        # Each output step reads what its graph returns.
        bw_steps.append((-1, tuple(owners(owner, self.grads, bw_key))))
        fw_steps = forward + [(-1, tuple(owners(owner, [*self.fw_outs, *ordered_saved])))]
        return TwoPhase(buffers, fw_steps, bw_steps,
                        inputs=owners(owner, self.primals),
                        user_outputs=owners(owner, self.fw_outs),
                        saved=owners(owner, saved),
                        tangents=owners(owner, self.tangents, bw_key),
                        grads=owners(owner, self.grads, bw_key))


def _is_tensor(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)
