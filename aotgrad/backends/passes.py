"""The graph passes before the partition: the backend's own rewrites of the whole graph,
then aotgrad's (masks moved next to what they test, one node per repeated computation).

A persistent cache hit skips them: its entry holds their result (cache/entry.py).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import fx

from ..capture.cse import eliminate_common_subexpressions
from ..partition.memory import base_of
from ..partition.remat import hoist_masks
from ..partition.split import find_joint
from ..schema import JOINT_FW_OUTPUTS, Backend
from ..verify import verify


def inference_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    """The backend's passes, then one node per repeated pure computation (cse.py)."""
    gm = backend_passes(backend, gm)
    eliminate_common_subexpressions(gm)
    return gm


def joint_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    """The backend's passes, masks moved next to what they test, then one node per repeated
    pure computation (cse.py)."""
    gm = backend_passes(backend, gm)
    j = find_joint(gm, gm.meta[JOINT_FW_OUTPUTS])
    hoist_masks(j)
    return eliminate_common_subexpressions(gm, j.forward)


def backend_passes(backend: Backend, gm: fx.GraphModule) -> fx.GraphModule:
    verify(gm)
    if backend.graph_passes is None:
        return gm
    meta = dict(gm.meta)
    fresh = [shared is None for shared in shared_storages(gm)]
    gm = backend.graph_passes(gm)
    gm.meta.update(meta)
    keep_outputs_fresh(gm, fresh)
    return verify(gm)


def keep_outputs_fresh(gm: fx.GraphModule, fresh: Sequence[bool]) -> None:
    """Copy the outputs that a backend's rewrites made share memory with an input or an
    earlier output (Inductor simplifies `zeros(4) + y[:4]` to `y[:4]`): eager returns a
    tensor of their own, which the caller may write to."""
    aliased = [i for i, shared in enumerate(shared_storages(gm))
               if shared is not None and fresh[i]]
    if not aliased:
        return
    output = gm.graph.output_node()
    outs = list(output.args[0])
    for i in aliased:
        with gm.graph.inserting_before(output):
            copy = gm.graph.call_function(torch.ops.aten.clone.default, (outs[i],))
        copy.meta["val"] = outs[i].meta["val"].clone()
        outs[i] = copy
    output.args = (type(output.args[0])(outs),)
    gm.recompile()


def shared_storages(gm: fx.GraphModule) -> list[fx.Node | None]:
    """Per graph output: the graph input or earlier output whose memory it is a view of."""
    seen = set(gm.graph.find_nodes(op="placeholder"))
    shared = []
    for out in gm.graph.output_node().args[0]:
        base = base_of(out) if isinstance(out, fx.Node) else None
        shared.append(base if base in seen else None)
        seen.add(base)
    return shared
