"""Issue 20: the buffers Inductor makes of aotgrad's partition vs torch's, on one joint.

    PYTHONPATH=.:/tmp/timmpkgs:/tmp/tfpkgs:/tmp/tvstub python tools/lowered_buffers.py swin_t

`tools/saved_compare.py`'s two partitions of a bench model's joint (CPU, fake tensors,
CUDA-like bf16 autocast), each forward and backward lowered by Inductor (`GraphLowering.run`,
on CPU) and stopped there: no scheduling, no code generation. Per graph: its call_function
nodes and the buffers lowering made, by kind; then the computed buffers by the ATen op that
made them, where the sides differ. More buffers mean more kernels and more of Inductor's
compile time (session 25: Swin-T's forward, 460 against torch's 437, compiles 3 s slower on
the GPU). The buffer counts are the CPU lowering's; a GPU's fuses differently afterwards.
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch
import torch._inductor.compile_fx as compile_fx
import torch._inductor.graph as inductor_graph

sys.path.insert(0, str(Path(__file__).resolve().parent))
import saved_compare  # noqa: E402  (sets the cache off, puts bench/ on the path)


class _Lowered(Exception):
    """Raised after lowering, with what it made: the rest of the compile is not needed."""


def _stop_after_lowering():
    run = inductor_graph.GraphLowering.run

    def lowered(self, *args, **kwargs):
        run(self, *args, **kwargs)
        raise _Lowered(list(self.buffers))
    inductor_graph.GraphLowering.run = lowered


def buffers_of(gm: torch.fx.GraphModule, backward: bool) -> list:
    inputs = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    mode = next(v.fake_mode for v in inputs if hasattr(v, "fake_mode"))
    try:
        with mode:
            compile_fx.compile_fx_inner(gm, inputs, is_backward=backward)
    except Exception as error:  # Inductor wraps what a lowering raises
        while error is not None and not isinstance(error, _Lowered):
            error = error.__cause__ or getattr(error, "inner_exception", None)
        if error is None:
            raise
        return error.args[0]
    raise AssertionError("lowering did not run")


def _made_by(buffer) -> str:
    node = getattr(buffer, "origin_node", None)
    if node is None:  # a fused buffer: the last of the nodes it came from
        node = max(getattr(buffer, "origins", ()) or [None], key=lambda n: n and n.name)
    return "?" if node is None else str(node.target)


def both_partitions(model_name: str) -> list[tuple[str, str, torch.fx.GraphModule]]:
    """(side, "forward" or "backward", graph) of the model's two partitions, torch's first:
    the first compile warms Inductor."""
    torch.manual_seed(0)
    model, batch = saved_compare.fake_model(model_name, small=False)
    found = saved_compare.partition_both(model, batch, cuda_like=True)
    return [(side, role, gm) for side in ("torch", "aotgrad")
            for role, gm in zip(("forward", "backward"), found[f"{side} graphs"])]


def main(argv=None):
    graphs = both_partitions((argv or sys.argv[1:] or ["swin_t"])[0])
    _stop_after_lowering()
    by_op = {}
    for side, role, gm in graphs:
        made = buffers_of(gm, backward=role == "backward")
        kinds = collections.Counter(type(b).__name__ for b in made)
        nodes = sum(n.op == "call_function" for n in gm.graph.nodes)
        print(f"{side:8} {role:9} nodes {nodes:5}  buffers {len(made):4}  {dict(kinds)}")
        by_op[side, role] = collections.Counter(
            _made_by(b) for b in made if type(b).__name__ == "ComputedBuffer")
    for role in ("forward", "backward"):
        ours, theirs = by_op["aotgrad", role], by_op["torch", role]
        print(f"\n== {role}: computed buffers by the op that made them, aotgrad / torch")
        for op in sorted(set(ours) | set(theirs), key=lambda k: -abs(ours[k] - theirs[k])):
            if ours[op] != theirs[op]:
                print(f"  {op:44} {ours[op]:5} {theirs[op]:5}")


if __name__ == "__main__":
    main()
