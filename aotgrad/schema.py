"""The nouns that flow between the stages, and every fx `meta` key aotgrad reads or writes.

At the bottom of the package: it imports nothing of aotgrad, so every stage can name these
types without importing another stage. Each type is a frozen dataclass; each key says which
module sets it and which reads it.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import fx


# ---- fx meta keys: aotgrad's own ------------------------------------------------------------
# gm.meta keys are on a GraphModule, node.meta keys on a Node. "sets" / "reads" name modules.
# Every name starts with "aotgrad": backends.compilers drops those from what Inductor hashes.

# sets pipeline; reads backends.compilers, pipeline, artifact.
GRAPH_INFO = "aotgrad"  # gm.meta key holding a GraphInfo
# gm.meta key where a backend reports the strides its outputs really have, when it chose a
# layout of its own (Inductor's channels-last convolutions); the backward is compiled for them.
# sets backends.compilers; reads pipeline (restride_saved).
OUTPUT_STRIDES = "aotgrad_output_strides"
# node.meta key on a backward placeholder given those strides: its value as traced, which the
# backward's ops were traced from. A hit's ops computed again (fill_fake_values) start from it:
# from the new strides, a `view` the trace made of a contiguous value fails.
# sets pipeline (restride_saved); reads backends.fxcache.
TRACED_VAL = "aotgrad_traced_val"
# gm.meta key on a graph aotgrad's cache stores or read: its Inductor FX graph cache keys, by
# the context they were computed in (cache.fxkeys.InductorKeys: `records`, `remember`,
# `loaded`). sets cache.entry, cache.program; reads backends.compilers (inductor_compiler).
INDUCTOR_FX_KEY = "aotgrad_inductor_fx_key"
# node.meta key on a backward's placeholder: a saved value that nothing else holds when the
# backward runs. The compiler may free it early or write into its memory (Inductor does).
# sets partition.donate (mark_donated); reads backends.compilers, pipeline.
DONATED = "aotgrad_donated"
# sets capture.joint, capture.pure; reads pipeline, explanation.
JOINT_FW_OUTPUTS = "aotgrad_num_fw_outputs"  # gm.meta key: how many joint outputs are forward
# sets capture.joint, semantics.aliasing; reads capture.joint, partition.remat.
OVERWRITTEN = "aotgrad_overwritten"  # node.meta key on primals the runtime mutates
# sets partition.budget; reads explanation.
# gm.meta key on a joint graph: the memory/compute curve a budgeted compile computed, which
# explain reuses instead of solving it again
CURVE = "aotgrad_curve"
# sets capture.joint; reads capture.joint, pipeline.
# gm.meta key: (input, eager's in-place op count) per input whose new value the joint graph
# returns after the gradients, written by the backward
BACKWARD_WRITES = "aotgrad_backward_writes"
# sets capture.joint, compat.export; reads schema (TraceFacts.of), capture.joint, compat.export.
TRACED_OUTPUTS = "aotgrad_traced_outputs"  # gm.meta key: a Layout per output before splitting
# sets capture.joint (trace); reads schema.is_tangent (semantics.aliasing, semantics.effects,
# capture.joint, compat.export, partition.split).
JOINT_ROLE = "aotgrad_joint_role"  # node.meta key on a placeholder: PRIMAL or TANGENT
PRIMAL, TANGENT = "primal", "tangent"
# sets capture.joint; reads torch's partitioners (its default_partition finds the forward by it).
TORCH_PARTITIONER_TAG = "partitioner_tag"  # node.meta key: "is_forward" on the forward's ops
# sets pipeline (after the joint passes); reads partition.split (joint_of).
JOINT = "aotgrad_joint"  # gm.meta key: the graph's Joint, found once
# sets and reads semantics.effects.
PHASE = "aotgrad_phase"  # node.meta key of a traced error check: FORWARD or BACKWARD
# sets and reads replay.random_values.
RANDOM_VALUE = "aotgrad_random_value"  # node.meta key: (random op index, output index)
# sets replay.double_backward; reads replay.random_values.
RANDOM_OP = "aotgrad_random_op"  # node.meta key in a replay trace: the random op's index
# sets replay.random_values; reads partition.donate (mark_donated), verify.
HELD_FOR_REPLAY = "aotgrad_held_for_replay"  # node.meta key: a saved value the backward ignores
# set by replay.double_backward (also through replay.custom_functions' grad_mode_key); read
# by replay.double_backward.
GRAD_ENABLED = "aotgrad_grad_enabled"  # node.meta key: the grad mode the op ran under
AUTOGRAD_COPY = "aotgrad_autograd_copy"  # node.meta key: a detach made by autograd itself
# node.meta key in a compiled-autograd capture: the index of the engine's node whose call
# recorded (or traced) it, which orders leaves' accumulations as eager's engine does.
ENGINE_NODE = "aotgrad_engine_node"
# node.meta key on a capture's accumulate_into: the engine node whose output made its
# gradient whole (its last contribution), where eager's engine pushes the AccumulateGrad.
READY = "aotgrad_ready"
# node.meta key on such an accumulation (autograd.ready): what the node that readied it
# pushed onto the engine's ready queue, in its outputs' order, and which push it was.
READY_QUEUE = "aotgrad_ready_queue"

# ---- fx meta keys: torch's, read or written by aotgrad -------------------------------------
# "val" (node): the fake value; set by make_fx, copied by every pass that makes nodes
#   (partition.split, pipeline, capture.joint), read by partition, backends, replay.
# "stack_trace", "seq_nr" (node): set by make_fx/Dynamo; capture.joint copies forward stack
#   traces onto backward ops of the same seq_nr.
# "autograd_backward" (node): set by partition.split (tag_backward) on backward ops, as torch's.
# "recompute", "ac_graph_id" (node): set by torch.utils.checkpoint; read by capture.cse,
#   partition.split and partition.remat.
# "desc" (node): set by compat.descriptors on placeholders and the output node.
# "original_aten" (node): set by make_fx, the op Inductor names a kernel after; stored and
#   restored by cache.entry.
# "user_visible_output_idxs" (output node): set by backends.compilers for Inductor.
# "example_value", "steal_arg", "tensor_dict", "grapharg" (node): Dynamo's; read (and
#   "example_value" set on unpacked elements) by dynamo ("grapharg": the user's input names).
# "unbacked_bindings" (node): Dynamo's symbols for the sizes a node computes from data; read by
#   dynamo (_rebinding_unbacked), which renames the trace's fresh ones to them.
# The persistent cache keys a traced graph by its code and the node meta the later stages
# read (cache.key: JOINT_ROLE, PHASE, AUTOGRAD_COPY, RANDOM_VALUE, "recompute", "ac_graph_id");
# it stores a partition's graphs with "val" of placeholders, DONATED, HELD_FOR_REPLAY, PHASE,
# RANDOM_VALUE and "original_aten", and restores them on a hit (cache.entry). An entry keyed before the
# trace (cache.program) holds TRACED_OUTPUTS, JOINT_FW_OUTPUTS and BACKWARD_WRITES as a
# TraceFacts instead of the traced graph.
# custom_functions' `grad_mode_key` argument: GRAD_ENABLED, passed by replay.double_backward.


# ---- the values of a call -------------------------------------------------------------------

Geometry = tuple[tuple[int, ...], tuple[int, ...], int]  # size, stride, storage offset


@dataclass(frozen=True)
class StorageSwap:
    """Where an input's storage comes from after the call."""

    source: int | None  # the input whose storage it ends on; None: a tensor the graph returns
    # Size, stride and offset from the source's own offset, when they differ from the
    # source's (`x.set_(y[2:])`); None: the source's own geometry, or the graph output's.
    geometry: Geometry | None = None


@dataclass(frozen=True)
class PlainMeta:
    """A plain tensor: what a fake or zero stand-in for it needs."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    num_plain = 1


@dataclass(frozen=True)
class OpaqueMeta:
    """A part of a subclass's flatten that is not a tensor (DTensor's DeviceMesh, torch >=
    2.13): no graph input; the object itself is handed back to __tensor_unflatten__."""

    value: Any

    num_plain = 0


@dataclass(frozen=True)
class SubclassMeta:
    """How one subclass tensor splits into plain tensors, and how to build it back."""

    cls: type
    attrs: tuple[str, ...]  # inner attributes, from __tensor_flatten__
    ctx: Any  # __tensor_flatten__'s metadata, handed back to __tensor_unflatten__
    inner: tuple["PlainMeta | SubclassMeta | OpaqueMeta", ...]
    size: tuple[int, ...]
    stride: tuple[int, ...]

    @functools.cached_property
    def num_plain(self) -> int:
        return sum(m.num_plain for m in self.inner)


Layout = "PlainMeta | SubclassMeta | None"  # None: not a tensor (a None gradient)


# ---- what eager does (capture.analysis builds it) ----------------------------------------

class OutputKind(enum.Enum):
    PLAIN = "computed by the graph"
    CONSTANT = "a non-tensor value, baked in"
    INPUT = "the input tensor itself"
    VIEW_OF_INPUT = "a view of an input"
    VIEW_OF_INTERMEDIATE = "a view of an intermediate the graph also returns"
    VIEW_OF_OUTPUT = "a view of another user output"
    SAME_AS_OUTPUT = "the same tensor as an earlier output"


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    # How a subclass output's gradient splits into plain tensors: the output's layout, or
    # the one its class picks for gradients (a Partial DTensor's is Replicate).
    subclass: SubclassMeta | None = None
    # The layout the backward graph takes this output's gradient in: the output's own
    # (channels_last for a convolution's), as torch's AOTAutograd does; a gradient that
    # comes in another is copied into it. Contiguous where the shape is symbolic.
    memory_format: torch.memory_format = torch.contiguous_format


@dataclass(frozen=True)
class InputInfo:
    requires_grad: bool
    is_leaf: bool
    mutates_data: bool
    mutates_metadata: bool
    # Every mutation ran under no_grad/inference_mode or through .detach()/.data: the copy back
    # must not be recorded by autograd either.
    mutation_hidden_from_autograd: bool
    version_bumps: int  # how much eager's version counter advances: 0 for .data mutations
    final_geometry: Geometry
    # set_() inside the function: the storage it ends on (then neither mutates_* is set).
    storage_swap: StorageSwap | None = None
    # resize_storage_bytes_() inside the function: the storage's size in bytes after the call
    # (FSDP's parameters: 0 when freed). The runtime resizes the caller's storage.
    storage_bytes: int | None = None
    # requires_grad_() inside the function: the runtime sets it before the graphs run; the
    # trace, which starts without it, gives gradients only through the ops after it.
    gains_requires_grad: bool = False

    @property
    def mutated(self) -> bool:
        return self.mutates_data or self.mutates_metadata

    @property
    def bumps_version(self) -> bool:
        return self.version_bumps != 0


# A symbolic size passed in by Dynamo: read, never mutated, no gradient.
SIZE_INPUT = InputInfo(False, True, False, False, False, 0, ((), (), 0))


@dataclass(frozen=True)
class OutputInfo:
    kind: OutputKind
    source: int | None  # input, intermediate base or output index, depending on kind
    requires_grad: bool
    geometry: Geometry | None = None
    dtype: torch.dtype | None = None
    replay: Callable | None = None  # replays the view chain on a new base
    constant: Any = None
    # A leaf that requires grad, made so inside (requires_grad_() on a tensor computed there
    # or a view of an input): the runtime sets requires_grad on what it returns.
    made_leaf: bool = False
    # A view made under no_grad of a base that requires grad: eager's has no grad_fn, and
    # refuses an in-place change with grad on; the runtime rebuilds it with grad off too.
    made_without_grad: bool = False
    # Made under inference_mode inside a call outside it: a view (eager's has no grad_fn
    # either, and keeps its base's requires_grad, as a leaf) is rebuilt under
    # inference_mode; a computed output is returned as an inference tensor, as eager's is.
    made_in_inference_mode: bool = False
    # A plain output that is a view in eager (made in a custom Function, whose node the
    # compiled one stands for): the graph returns it as a view, not a tensor of its own.
    returned_as_view: bool = False
    # A plain output over this input's memory that is no view (`x.detach()`, of a view of
    # x too): eager's shares x's version counter, so an in-place change through it shows
    # on x; the runtime rebuilds it from the input, at `geometry` (the graph's value of an
    # input it wrote lies elsewhere).
    detached_from: int | None = None
    # A view of an input's `.detach()` (`x.detach()[1:]`, kind VIEW_OF_INPUT): rebuilt from
    # a detach of the input, whose version counter it shares as eager's does.
    detached_base: bool = False
    # A plain output its own autograd node saved for its backward (exp, tanh, relu save
    # their result): (node name, output number, version at the save); the name is None
    # where unknown (capture/own_saves.py). Eager's backward through it raises if the
    # caller then changed it in place; the compiled backward may not read it at all, so
    # the runtime checks its version (stale.SavedOutputs).
    saved_by_node: tuple[str | None, int, int] | None = None


@dataclass(frozen=True)
class FunctionInfo:
    """What one call of the user function does, seen from outside."""

    inputs: tuple[InputInfo, ...]
    outputs: tuple[OutputInfo, ...]
    out_spec: Any
    num_intermediate_bases: int
    # Per graph output (mutated inputs' new values, plain outputs, intermediate bases):
    # whether it is differentiable, i.e. gets a tangent in the backward.
    differentiable: tuple[bool, ...]
    graph_output_metas: tuple[TensorMeta | None, ...]  # None: a symbolic size, not a tensor
    grad_enabled: bool
    # Differentiable graph outputs whose backward reads a saved value the function then
    # modified in place: they get no tangent, and a backward through them raises (stale.py).
    stale_outputs: tuple[int, ...] = ()
    # (plain graph output k, the graph outputs whose autograd history reads it): a hook on
    # k would see their gradients in eager, not in the one compiled node (fed_outputs.py).
    fed_outputs: tuple[tuple[int, tuple[int, ...]], ...] = ()
    # Plain graph outputs the function registered a tensor hook on (`h.register_hook(f);
    # return h`): the compiled node runs it inside its backward, after the caller's hooks on
    # the output, where eager runs it before them (fed_outputs.py).
    hooked_outputs: tuple[int, ...] = ()

    @property
    def data_mutated_inputs(self) -> tuple[int, ...]:
        return tuple(i for i, x in enumerate(self.inputs) if x.mutates_data)

    @property
    def plain_outputs(self) -> tuple[int, ...]:
        return tuple(i for i, o in enumerate(self.outputs) if o.kind is OutputKind.PLAIN)

    @property
    def first_user_output(self) -> int:
        """Graph output index of user output 0: every user output has its slot, in order."""
        return len(self.data_mutated_inputs)

    @property
    def rebuilt_outputs(self) -> tuple[int, ...]:
        """Graph outputs the runtime does not read: user outputs it rebuilds itself (aliases,
        constants). The graph returns them anyway, as functorch's does, so that a compiler
        finds user output i at the same position as there."""
        first = self.first_user_output
        return tuple(first + i for i, o in enumerate(self.outputs)
                     if o.kind is not OutputKind.PLAIN)

    @property
    def num_graph_outputs(self) -> int:
        return len(self.differentiable)

    @property
    def mutations_in_graph(self) -> tuple[int, ...]:
        """Mutated inputs the training graph may copy into itself: data mutations of inputs
        outside autograd (BatchNorm's running statistics). A backend then fuses the copy
        into the kernel computing the new value, instead of one more copy per call."""
        k = {i: n for n, i in enumerate(self.data_mutated_inputs)}
        return tuple(i for i, x in enumerate(self.inputs)
                     if x.mutates_data and not x.mutates_metadata and not x.requires_grad
                     and x.storage_bytes is None and not self.differentiable[k[i]])

    @property
    def inference_mutations_in_graph(self) -> tuple[int, ...]:
        """Mutated inputs an inference graph copies into itself (keep_inference_input_mutations):
        data mutations only. An input whose metadata changes too gets its new geometry from
        the runtime after the graph, so the graph's copy would land in the old layout."""
        return tuple(i for i, x in enumerate(self.inputs)
                     if x.mutates_data and not x.mutates_metadata)

    @property
    def storages_from_graph(self) -> tuple[int, ...]:
        """Inputs set_() to a tensor made inside: the graph returns it, last (swaps.py)."""
        return tuple(i for i, x in enumerate(self.inputs)
                     if x.storage_swap is not None and x.storage_swap.source is None)

    @property
    def gets_tangent(self) -> tuple[bool, ...]:
        """Per graph output: whether the backward graph takes a tangent for it."""
        return tuple(d and k not in self.stale_outputs for k, d in enumerate(self.differentiable))

    @property
    def needs_autograd(self) -> bool:
        # Not `grad_enabled and ...`: an enable_grad() region inside a no_grad call still
        # produces outputs that require grad.
        return any(self.differentiable)


@dataclass(frozen=True)
class TraceFacts:
    """What the stages after the trace read from it besides the graph itself. A persistent
    cache entry keyed before the trace holds them, so that a hit skips the trace."""

    traced_outputs: tuple  # the graph's TRACED_OUTPUTS: a Layout per output
    num_fw_outputs: int | None = None  # JOINT_FW_OUTPUTS; None: an inference graph
    backward_writes: tuple = ()  # BACKWARD_WRITES: (input, eager's in-place op count)
    random_ops: tuple = ()  # the random ops the forward calls, in order (random_values.py)
    # Per gradient a joint graph returns, the tangents it reads as traced (bit j: the j-th
    # tangent), before a pass drops `mul(tangent, 0)`, a path eager's autograd still takes.
    grad_reads: tuple[int, ...] = ()

    @staticmethod
    def of(gm: fx.GraphModule, random_ops=(), grad_reads=()) -> "TraceFacts":
        return TraceFacts(tuple(gm.meta[TRACED_OUTPUTS]), gm.meta.get(JOINT_FW_OUTPUTS),
                          tuple(gm.meta.get(BACKWARD_WRITES, ())), tuple(random_ops),
                          tuple(grad_reads))


# ---- graphs and backends ------------------------------------------------------------------

@dataclass(frozen=True)
class GraphInfo:
    role: str  # "forward", "backward" or "inference"
    static_inputs: tuple[int, ...]  # inputs that live across calls (parameters, buffers)
    user_outputs: range  # outputs the user sees, whose strides must match eager
    # With CUDA graphs asked for: the compile's backends.cudagraphs.CudagraphState, one for
    # its forward and backward together; None otherwise.
    cudagraphs: Any = None


@dataclass(frozen=True)
class Backend:
    """The compilers for the three graph kinds, and the decompositions traced with."""

    fw_compiler: Callable
    bw_compiler: Callable
    inference_compiler: Callable
    decompositions: Mapping | None = None
    # The backend's own rewrites of the whole graph (joint or inference), before partitioning.
    graph_passes: Callable[[fx.GraphModule], fx.GraphModule] | None = None
    # Called with the inputs as each compile starts, before the trace: starts what the
    # compilers will wait on later (Inductor's kernel-compile workers, its CPU ISA probe), so
    # that it gets ready while the trace runs.
    warm_up: Callable[[Sequence[Any]], None] | None = None


# ---- the joint graph ------------------------------------------------------------------------

def is_tangent(node: fx.Node) -> bool:
    """A joint graph's placeholder that takes a tangent: as the trace tagged it, else (a joint
    graph traced elsewhere and handed to our partitioners) by torch's naming convention."""
    role = node.meta.get(JOINT_ROLE)
    return role == TANGENT if role is not None else node.name.startswith("tangents")


def primals_of(graph: fx.Graph) -> list[fx.Node]:
    return [n for n in graph.find_nodes(op="placeholder") if not is_tangent(n)]


@dataclass(frozen=True, eq=False)
class Joint:
    """A joint forward+backward graph and its parts, found once after the joint passes
    (`partition.split.joint_of`); partitioners read them instead of deriving them again."""

    module: fx.GraphModule
    num_fw_outputs: int
    primals: tuple[fx.Node, ...]
    tangents: tuple[fx.Node, ...]
    fw_outputs: tuple[fx.Node | None, ...]
    grads: tuple[fx.Node | None, ...]  # one per primal
    fw_checks: tuple[fx.Node, ...]  # error checks eager runs in the forward (effects.py)
    bw_checks: tuple[fx.Node, ...]  # ... and in the backward
    # The values the forward computes for its outputs, and the sizes it can save cheaply...
    computed_forward: frozenset[fx.Node]
    # ... plus the masks and narrowing casts the backward computes from them: what the
    # forward may save.
    forward: frozenset[fx.Node]

    @property
    def fw_roots(self) -> list:
        """What the forward must compute: a check has no output, being a root keeps it."""
        return [*self.fw_outputs, *self.fw_checks]

    @property
    def bw_roots(self) -> list:
        return [*self.grads, *self.bw_checks]


@dataclass(frozen=True, eq=False)
class Partition:
    """A joint graph split in two: the forward returns its outputs, then the values it saves;
    the backward takes the saved values, then the tangents, and returns one gradient per
    primal (`partition.split.split_joint`)."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    num_fw_outputs: int  # plain forward outputs, before the saved values

    @property
    def saved(self) -> list[fx.Node]:
        """The forward's nodes it saves, in the order the backward takes them."""
        return list(self.forward.graph.output_node().args[0][self.num_fw_outputs:])

    @property
    def saved_inputs(self) -> list[int]:
        """The graph inputs the forward saves as they are, by position."""
        position = {n: i for i, n in enumerate(self.forward.graph.find_nodes(op="placeholder"))}
        return [position[n] for n in self.saved if n in position]
