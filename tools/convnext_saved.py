"""Issue 20, ConvNeXt-T: the values aotgrad's partition saves vs torch's AOTAutograd's.

    PYTHONPATH=.:/tmp/timmpkgs:/tmp/tfpkgs:/tmp/tvstub python tools/convnext_saved.py [--size 64]

On a GPU, Inductor's layout optimization gives each 4-D forward output upstream of a
convolution channels-last strides. ConvNeXt's MLP runs over [N, H, W, C]: a saved 4-D value
there is written transposed by the forward and copied back by the backward to flatten it
for a matmul (two extra kernels a block, 0.48 ms each in stage 1 at batch 64 on an H200).
This prints, per side, the saved values by rank and the 4-D ones whose backward readers are
only reshapes to fewer dimensions (`flattened 4-D saved`, 0 when fixed; torch's is 0).
CPU, bf16 autocast, timm convnext_tiny at random init, Inductor's decompositions, no codegen.

On the GPU (bench/run.py convnext_tiny batch 64, bf16) the fix should remove every
`triton_poi_fused__to_copy_addmm_t_view_*`, `triton_poi_fused_mm_t_view_*` and
`triton_poi_fused_gelu_backward_mm_t_view_*` kernel: 6.5 ms of the 6.9 ms Triton-time gap of
/work/notes/convnext/profile_gap.json (H200: step 24.4 ms vs torch's 17.5 ms before).
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch  # noqa: E402
from torch import fx  # noqa: E402

import aotgrad  # noqa: E402
from aotgrad.backends.compilers import _inductor_decompositions, eager_compiler  # noqa: E402
from aotgrad.schema import Backend  # noqa: E402

FLATTENING = (torch.ops.aten.view.default, torch.ops.aten.reshape.default,
              torch.ops.aten._unsafe_view.default)


def flattened_4d(backward: fx.GraphModule) -> list[str]:
    found = []
    for p in backward.graph.find_nodes(op="placeholder"):
        val = p.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() == 4 and p.users and all(
                u.target in FLATTENING and len(u.args[1]) < 4 for u in p.users):
            found.append(p.name)
    return found


def report(name, forward, backward, num_outputs):
    saved = [n for n in forward.graph.output_node().args[0][num_outputs:]
             if isinstance(n, fx.Node) and n.op != "placeholder"]
    ranks = collections.Counter(n.meta["val"].dim() for n in saved
                                if isinstance(n.meta.get("val"), torch.Tensor))
    total = sum(n.meta["val"].nbytes for n in saved if isinstance(n.meta.get("val"), torch.Tensor))
    bad = flattened_4d(backward)
    print(f"{name:8} saved {len(saved)} values, {total / 2**20:.1f} MiB, by rank "
          f"{dict(sorted(ranks.items()))}; flattened 4-D saved: {len(bad)} {bad[:6]}")


def run_aotgrad(model, x):
    backend = Backend(eager_compiler, eager_compiler, eager_compiler, _inductor_decompositions())
    compiled = aotgrad.compile(model, backend=backend)
    with torch.autocast("cpu", torch.bfloat16):
        loss = compiled(x).float().sum()
    loss.backward()
    art = compiled.artifacts[0]
    report("aotgrad", art.forward_graph, art.backward_graph, 1)


def run_torch(model, x):
    from functorch.compile import aot_module, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    graphs = {}

    def keep(role):
        def compiler(gm, _):
            graphs[role] = gm
            return make_boxed_func(gm)
        return compiler
    compiled = aot_module(model, keep("fw"), keep("bw"), decompositions=select_decomp_table(),
                          partition_fn=min_cut_rematerialization_partition)
    with torch.autocast("cpu", torch.bfloat16):
        loss = compiled(x).float().sum()
    loss.backward()
    report("torch", graphs["fw"], graphs["bw"], 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    args = p.parse_args(argv)
    import timm
    torch.manual_seed(0)
    model = timm.create_model("convnext_tiny").train()
    x = torch.randn(args.batch, 3, args.size, args.size)
    run_aotgrad(model, x)
    run_torch(model, x)


if __name__ == "__main__":
    main()
