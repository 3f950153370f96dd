"""A compiled region's body through aotgrad's own stages, once: its forward and backward graphs.

`semantics.regions` calls `build_region` at a region's first call in a compile (per body,
identifier and operand layout). The body runs through the same analysis and joint trace as
a whole compiled function, then through the compile's partitioner: the forward returns the
outputs and the values it saves, the backward takes those and the tangents. The pipeline's
stages are passed in (they sit above capture); None sends the region to PyTorch's rules.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx

from . import joint
from ..partition.split import call_partitioner, find_joint
from ..replay.random_values import RandomValueTags
from ..schema import JOINT, JOINT_FW_OUTPUTS
from ..semantics.regions import Region, all_tensors, is_plain_body, keep_given_grads


def build_region(options, capture: Callable, trace_joint: Callable, body: fx.GraphModule,
                 identifier: str, fakes: Sequence) -> Region | None:
    """`capture`: pipeline.capture_and_analyze; `trace_joint`: pipeline._trace_joint."""
    _, in_spec = pytree.tree_flatten((tuple(fakes), {}))
    c = capture(body, fakes, in_spec)
    if not is_plain_body(c.info):
        return None
    # each output's tangent layout (TensorMeta.memory_format), as the joint traces it
    formats = tuple(m.memory_format if m is not None else torch.contiguous_format
                    for m in c.info.graph_output_metas)
    if not c.info.needs_autograd:
        gm = joint.trace_inference(c.graph_fn, c.info, c.fakes, c.fake_mode,
                                   options.backend.decompositions)
        n = len(c.info.outputs)
        tuple_outputs(gm)
        return Region(identifier, body, gm, None, n, (False,) * n, (), formats) \
            if all_tensors(gm) else None
    c, joint_gm = trace_joint(c, options, RandomValueTags())
    n = joint_gm.meta[JOINT_FW_OUTPUTS]
    joint_gm.meta[JOINT] = find_joint(joint_gm, n)
    forward, backward = call_partitioner(options.partition_fn, joint_gm, n)
    if not all_tensors(forward):  # a saved size: symbolic shapes, left to PyTorch's rules
        return None
    has_grad = keep_given_grads(backward)
    tuple_outputs(forward)
    tuple_outputs(backward)
    return Region(identifier, body, forward, backward, n, c.info.gets_tangent, has_grad, formats)


def tuple_outputs(gm: fx.GraphModule) -> None:
    """A body called by `invoke_subgraph` returns a tuple: torch 2.11 asserts it (our traces
    return lists)."""
    output = gm.graph.output_node()
    if isinstance(output.args[0], list):
        output.args = (tuple(output.args[0]),)
        gm.recompile()
